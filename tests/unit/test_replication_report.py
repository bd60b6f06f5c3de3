"""The replication benchmark's pure parts: phases around a kill, merged
windows, sync rates, paired ratios and targets, the table and the figure."""

from __future__ import annotations

import pytest

from benchmarks.replication import ReplicationConfig
from benchmarks.replication_report import (
    TARGETS,
    foreground,
    format_report,
    merge_windows,
    phase_of,
    plot,
    ratios,
    repair_intervals,
    summarize,
    sync_rates,
    targets,
)


def _client(name: str, lat_ms: list[float], seconds: float = 1.0, errors: int = 0) -> dict:
    return {"client": name, "ops": len(lat_ms), "seconds": seconds,
            "latency_us": [int(v * 1000) for v in lat_ms], "errors": errors,
            "error_sample": [f"e{i}" for i in range(errors)]}


def test_a_window_belongs_to_the_phase_of_its_midpoint():
    repairs = [(10.5, 11.0), (12.0, 13.0)]
    assert phase_of(9.9, killed=10.0, takeover=11.2, repairs=repairs) == "before"
    # a repair that started before the take-over (a block the victim backed up) is still fail-over time
    assert phase_of(10.8, 10.0, 11.2, repairs) == "failover"
    assert phase_of(11.5, 10.0, 11.2, repairs) == "gap"
    assert phase_of(12.5, 10.0, 11.2, repairs) == "sync"
    assert phase_of(13.5, 10.0, 11.2, repairs) == "after"
    assert phase_of(30.0, 10.0, None, repairs) == "failover"     # never taken over
    assert phase_of(11.5, 10.0, 11.2, []) == "after"


def test_merged_windows_give_percentiles_over_all_requests_and_the_rate_over_measured_time():
    windows = [[_client("c1", [1.0] * 10), _client("c2", [2.0] * 10)],
               [_client("c1", [9.0] * 10, errors=2), _client("c2", [], seconds=0.5)]]
    merged = {r["client"]: r for r in merge_windows(windows)}
    assert merged["c1"]["ops"] == 20 and merged["c1"]["seconds"] == 2.0 and merged["c1"]["errors"] == 2
    assert sorted(merged["c1"]["latency_us"]) == [1000] * 10 + [9000] * 10
    assert merged["c2"]["seconds"] == 1.5 and merged["c1"]["error_sample"] == ["e0", "e1"]
    assert windows[0][0]["latency_us"] == [1000] * 10      # the inputs are left alone


def test_foreground_sorts_windows_into_phases():
    def window(start: float, lat: float, errors: int = 0) -> dict:
        return {"start": start, "end": start + 0.25, "results": [_client("c1", [lat] * 20, 0.25, errors)]}

    windows = [window(9.0, 2.0), window(9.5, 2.0), window(10.1, 50.0, errors=5), window(11.4, 4.0),
               window(11.7, 6.0), window(12.5, 2.0)]
    timeline, phases = foreground(windows, killed=10.0, takeover=11.0, repairs=[(10.9, 12.0)])
    assert [w["phase"] for w in timeline] == ["before", "before", "failover", "sync", "sync", "after"]
    assert timeline[0]["t"] == pytest.approx(-0.875)
    assert phases["before"] == {"windows": 2, "ops": 40, "p50_ms": 2.0, "p99_ms": 2.0, "ops_per_s": 80.0,
                                "errors": 0}
    assert phases["sync"]["ops"] == 40 and phases["sync"]["p50_ms"] == 5.0
    assert phases["failover"]["errors"] == 5 and "gap" not in phases


def test_repairs_and_sync_rates_come_from_events_and_reports():
    events = [{"t": 5.0, "event": "replicated", "seconds": 1.0, "failed": []},          # before the kill
              {"t": 10.3, "event": "repair-failed", "seconds": 0.1},
              {"t": 12.0, "event": "replicated", "seconds": 1.5, "failed": []},
              {"t": 13.0, "event": "replicated", "seconds": 0.5, "failed": ["s3"]},      # its member failed
              {"t": 14.0, "event": "replicated", "seconds": 1.0, "failed": []}]
    repairs = repair_intervals(events, since=10.0)
    assert repairs == [(10.5, 12.0), (13.0, 14.0)]
    rates = sync_rates([{"records": 3000, "seconds": 1.2}, {"records": 1000, "seconds": 0.8},
                        {"records": 0, "seconds": 0.0}], repairs)
    assert rates == {"per_sync_keys_per_s": [2500.0, 1250.0], "records": 4000, "span_s": 3.5,
                     "overall_keys_per_s": 1142.9}
    assert sync_rates([], [])["overall_keys_per_s"] is None


def _run(variant: str, level: int, rnd: int, p50: float, ops: float = 100.0, agents: float = 500.0) -> dict:
    return {"scheme": variant, "level": level, "rep": rnd, "p50_ms": p50, "p99_ms": 3 * p50, "ops_per_s": ops,
            "cpu_us_per_op": {"agents": agents, "ovs": 100.0, "clients": 200.0}, "errors": 0}


def _runs() -> dict[str, list[dict]]:
    """Two rounds; the second ran on a machine twice as slow for both networks."""
    new = [_run("r1", 4, 0, 2.0), _run("r2", 4, 0, 2.6), _run("r1", 4, 1, 4.0), _run("r2", 4, 1, 5.6),
           _run("r1", 128, 0, 50, ops=1000, agents=600), _run("r2", 128, 0, 60, ops=700, agents=900),
           _run("r1", 128, 1, 50, ops=500, agents=600), _run("r2", 128, 1, 60, ops=250, agents=900)]
    reused = [_run("r1", 4, 0, 1.0), _run("r2", 4, 0, 2.0), _run("r1", 4, 1, 2.0), _run("r2", 4, 1, 4.0)]
    return {"new": new, "reused": reused}


def test_ratios_are_paired_within_rounds_and_judged_against_the_targets():
    got = ratios(_runs(), latency_levels=(4,), saturation=128)
    assert set(got) == {"fsync batch"}          # no fsync-off runs: no such pair
    row = got["fsync batch"]
    assert row["p50_c4_new"] == pytest.approx(1.35)           # median of 1.3 and 1.4
    assert row["p99_c4_reused"] == pytest.approx(2.0)
    assert row["ops_c128_new"] == pytest.approx(0.6)          # median of 0.7 and 0.5
    verdict = targets(got, level=4, saturation=128)
    assert verdict["latency_p50_new"] == {"value": 1.35, "target": TARGETS["latency_p50"], "met": True}
    assert verdict["latency_p50_reused"]["met"] is False
    assert verdict["throughput"]["met"] is True                # at least 0.6x


def test_summary_takes_medians_over_rounds_per_variant_and_level():
    summary = summarize(_runs()["new"])
    assert summary["r2"]["128"]["ops_per_s"] == 475.0
    assert summary["r2"]["128"]["agents_cpu_us_per_op"] == 900.0
    assert summary["r1"]["4"]["p50_ms"] == 3.0 and summary["r1"]["4"]["errors"] == 0


def _result() -> dict:
    cfg = ReplicationConfig(latency_levels=(4,), rounds=2)
    runs = _runs()
    pair_ratios = ratios(runs, cfg.latency_levels, cfg.saturation)
    windows = [{"start": s, "end": s + 0.25, "results": [_client("c1", [lat] * 20, 0.25)]}
               for s, lat in ((9.0, 2.0), (10.2, 30.0), (11.4, 4.0), (12.5, 2.0))]
    timeline, phases = foreground(windows, 10.0, 11.0, [(10.9, 12.0)])
    rr = {"sync_rate": 1000, "takeover_s": 1.0, "restored_s": 2.0, "repairs_since_kill": [(0.9, 2.0)],
          "rates": sync_rates([{"records": 1100, "seconds": 1.1}], [(10.9, 12.0)]), "phases": phases,
          "timeline": timeline}
    return {"config": {**vars(cfg), "clients": 8}, "summary": {m: summarize(r) for m, r in runs.items()},
            "ratios": pair_ratios, "targets": targets(pair_ratios, 4, cfg.saturation), "rereplication": [rr],
            "total_s": 12.0}


def test_the_table_shows_the_ratios_the_targets_and_the_rereplication():
    text = format_report(_result())
    for needle in ("| r2 | new | 4.10 / 12.30 | 475 | 900 | 100 | 200 |", "| fsync batch | 1.35 / 1.35 |",
                   "target latency_p50_new: 1.35 (target <= 1.5) met",
                   "target latency_p50_reused: 2.0 (target <= 1.5) MISSED",
                   "target throughput: 0.6 (target >= 0.6) met",
                   "| 1000 | 1100 | 1000 | 1000 | 2.0 | 2.00 / 2.00 | 4.00 / 4.00 | 2.00 / 2.00 | 1 |"):
        assert needle in text, (needle, text)


def test_the_figure_is_drawn(tmp_path):
    path = plot(_result(), tmp_path / "replication.png")
    assert path.stat().st_size > 10_000
