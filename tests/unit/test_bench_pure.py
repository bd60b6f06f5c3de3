"""The benchmark's pure parts: the workload mix, run aggregation, targets, report."""

from __future__ import annotations

import collections

import pytest

from benchmarks.bench import TARGETS, aggregate, mdtest_targets, paired_ratio, targets
from benchmarks.bench_report import format_report
from benchmarks.failover import LEADER_TARGET_S, summarize_leader
from benchmarks.mix import MixedOps, entries, mdtest_entries
from client_lib.mdid import normalize_path


def test_namespace_entries_are_keys_with_paper_sized_values():
    population = entries(3000, seed=5)
    assert len(population) == 3000 and len({e.key for e in population}) == 3000
    assert all(normalize_path(e.key) == e.key for e in population)
    sizes = [len(e.value) for e in population]
    assert 150 < sum(sizes) / len(sizes) < 350     # the paper's 250 (file) and 290 (directory) bytes
    assert entries(3000, seed=5) == population      # every client builds the same list
    mine = mdtest_entries("c1", 250)
    assert len({e.key for e in mine}) == 250 and all(e.key.startswith(b"/mdtest/c1/") for e in mine)


@pytest.mark.parametrize("zipf", [0.0, 0.9, 1.2])
def test_mixed_ops_have_the_asked_get_share_and_popularity(zipf):
    ops = MixedOps(5000, get_fraction=0.2, zipf=zipf, seed=3)
    drawn = [next(ops) for _ in range(40000)]
    gets = sum(g for g, _ in drawn) / len(drawn)
    assert 0.18 < gets < 0.22
    counts = collections.Counter(i for _, i in drawn)
    top = counts.most_common(1)[0][1] / len(drawn)
    if zipf == 0.0:
        assert top < 0.002                          # uniform over 5000
    else:
        assert top > 0.05                           # the most popular entry stands out
    assert all(0 <= i < 5000 for _, i in drawn)


def test_mixed_ops_reject_nonsense():
    with pytest.raises(ValueError):
        MixedOps(0, 0.2, 0.9, 1)
    with pytest.raises(ValueError):
        MixedOps(10, 1.5, 0.9, 1)


def _client(ops: int, seconds: float, lat_ms: list[float], rpcs: int = 0) -> dict:
    return {"ops": ops, "seconds": seconds, "latency_us": [int(v * 1000) for v in lat_ms], "errors": 0,
            "error_sample": [], "lookup_rpcs": rpcs, "moved": 0}


def test_aggregate_sums_clients_and_ignores_idle_ones():
    results = [_client(100, 2.0, [1.0] * 99 + [9.0], rpcs=200), _client(50, 1.0, [3.0] * 50, rpcs=100),
               _client(0, 0.0, [])]
    run = aggregate("chord", 8, 0, results, {"storage": 0.3, "lookup": 0.15})
    assert run.ops == 150 and run.ops_per_s == 100.0
    assert run.p50_ms == 1.0 and run.lookup_rpcs_per_op == 2.0
    assert run.cpu_us_per_op == {"storage": 2000.0, "lookup": 1000.0}


def _run(scheme: str, level: int, rep: int, ops: float, p50: float) -> dict:
    return {"scheme": scheme, "level": level, "rep": rep, "ops_per_s": ops, "p50_ms": p50}


def test_targets_are_paired_ratios_within_rounds():
    # round 1 ran on a slower machine for every scheme: a ratio of medians would
    # compare metaflow's slow round with hash's fast one, the paired ratio does not
    runs = [_run("metaflow", 1, 0, 100, 1.02), _run("hash", 1, 0, 100, 1.0), _run("chord", 1, 0, 40, 3.0),
            _run("metaflow", 1, 1, 50, 2.04), _run("hash", 1, 1, 50, 2.0), _run("chord", 1, 1, 20, 6.0),
            _run("metaflow", 1, 2, 95, 1.02), _run("hash", 1, 2, 100, 1.0), _run("chord", 1, 2, 40, 3.0),
            _run("metaflow", 8, 0, 950, 3.0), _run("hash", 8, 0, 1000, 3.0), _run("chord", 8, 0, 400, 9.0),
            _run("metaflow", 8, 1, 475, 6.0), _run("hash", 8, 1, 500, 6.0), _run("chord", 8, 1, 200, 18.0)]
    schemes = {name: {"peak_concurrency": 8} for name in ("metaflow", "hash", "chord")}
    assert paired_ratio(runs, "metaflow", "hash", "p50_ms", 1, 1) == pytest.approx(1.02)
    got = targets(schemes, {"nat_share_of_service": 0.05}, runs)
    assert got["latency_vs_hash"] == {"value": 1.02, "target": TARGETS["latency_vs_hash"], "met": True}
    assert not got["throughput_vs_hash"]["met"] and got["throughput_vs_hash"]["value"] == 0.95
    assert not got["throughput_vs_chord"]["met"] and got["throughput_vs_chord"]["value"] == 2.375
    assert not got["nat_share"]["met"]
    assert paired_ratio(runs, "metaflow", "ghba", "p50_ms", 1, 1) is None
    assert set(targets({"hash": {"peak_concurrency": 1}}, {}, runs)) == set()


def test_mdtest_targets_are_each_phase_against_hash():
    phases = {"metaflow": {"create": {"ops_per_s": 960.0}, "stat": {"ops_per_s": 1200.0}},
              "hash": {"create": {"ops_per_s": 1000.0}, "stat": {"ops_per_s": 1000.0}}}
    got = mdtest_targets(phases)
    assert got == {"mdtest_create_vs_hash": {"value": 0.96, "target": 1.0, "met": False},
                   "mdtest_stat_vs_hash": {"value": 1.2, "target": 1.0, "met": True}}
    assert mdtest_targets({"metaflow": phases["metaflow"]}) == {}


def test_the_report_shows_every_scheme_and_every_target():
    row = {"ops_per_s": 1000.0, "peak_concurrency": 32, "p50_ms": 2.0, "p99_ms": 5.0,
           "lookup_rpcs_per_op": 0.0, "server_cpu_us_per_op": 300.0, "lookup_cpu_us_per_op": 0.0,
           "nat_cpu_us_per_op": 0.0, "ovs_cpu_us_per_op": 500.0, "client_cpu_us_per_op": 400.0}
    schemes = {"metaflow": dict(row, nat_cpu_us_per_op=20.0), "hash": row,
               "chord": dict(row, ops_per_s=300.0, p50_ms=6.0, lookup_rpcs_per_op=2.1,
                             throughput_vs_hash=0.3)}
    runs = [_run(name, 32, 0, s["ops_per_s"], s["p50_ms"]) for name, s in schemes.items()]
    report = {"config": {"topology": "fat-tree k=4", "servers": 8, "clients": 8, "store": "leveldb",
                         "entries": 100, "get_fraction": 0.2, "zipf": 0.9, "reuse": False, "reps": 1,
                         "seconds": 1.0},
              "timings": {"total_s": 10.0}, "schemes": schemes, "targets": targets(schemes, {}, runs),
              "nat": {}, "mdtest": {}, "flows": {"c0": {"metaflow": 2, "layer": "core"}}}
    text = format_report(report)
    needles = ("metaflow", "hash", "chord", "target throughput_vs_chord: 3.333", "met", "c0 2", "  0.30 ")
    for needle in needles:
        assert needle in text
    assert text.index("metaflow") < text.index("\nhash") < text.index("\nchord")
    # beside the paper's testbed (LevelDB on SSD, Figs. 14 and 16): ours x hash, then the paper's
    assert "chord 0.30 / nan (paper 0.35 / 5.5)" in text and "onehop" not in text.split("paper's testbed")[1]


def test_agent_memory_is_read_from_smaps_rollup():
    from benchmarks.testbed import parse_rollup

    text = ("55d0-7ffd ---p 00000000 00:00 0    [rollup]\nRss:               55808 kB\n"
            "Pss:               45160 kB\nShared_Clean:      11264 kB\nPrivate_Clean:       512 kB\n"
            "Private_Dirty:     43264 kB\nSwap:                  0 kB\n")
    assert parse_rollup(text) == {"rss_mb": 54.5, "pss_mb": 44.1015625, "uss_mb": 42.75}


def test_fig20_table_gives_medians_and_paired_ratios_against_metaflow():
    from benchmarks.fig20 import KIB, MIB, SCHEMES, report, table

    runs = [{"scheme": s, "file_size": size, "round": r, "errors": 0,
             "seconds": base * (1 + r) * {"metaflow": 1.0, "hash": 1.0, "onehop": 1.2, "chord": 1.5}[s]}
            for size, base in ((64 * KIB, 10.0), (16 * MIB, 40.0)) for r in range(3) for s in SCHEMES]
    rows = table(runs)
    assert list(rows) == ["64 KB", "16 MB"]
    assert rows["64 KB"]["chord"] == {"seconds": 30.0, "vs_metaflow": 1.5, "errors": 0}
    assert rows["64 KB"]["targets"]["onehop"] == {"target": 1.1, "value": 1.2, "met": True}
    assert rows["64 KB"]["targets"]["chord"]["met"] and "targets" not in rows["16 MB"]
    text = report({"setting": {"topology": "t"}, "table": rows})
    assert "onehop >= 1.1x MetaFlow: 1.2x, met" in text and "64 KB" in text


def test_publish_writes_the_json_and_the_plot_and_prints_the_report(tmp_path, capsys):
    from benchmarks.publish import publish

    publish({"a": 1}, tmp_path / "out", "thing", lambda r, p: p.write_bytes(b"png"),
            lambda r: f"a is {r['a']}")
    assert (tmp_path / "out" / "thing.json").read_text() == '{\n  "a": 1\n}\n'
    assert (tmp_path / "out" / "thing.png").read_bytes() == b"png"
    assert capsys.readouterr().out.startswith("a is 1\n\nwritten: ")


def test_the_leader_kill_summary_judges_the_decision_p99_against_3_s() -> None:
    trials = [{"decided_s": d, "elected_s": 1.0, "first_ok_s": {"b": d + 0.2}, "unserved_blocks": 0}
              for d in (2.0, 2.5, 2.9)]
    row = summarize_leader(trials)["leader-kill"]
    assert row["decided_p50_s"] == 2.5 and row["decided_p99_s"] == 2.9 and row["target_met"]
    assert row["serving_max_s"] == 3.1 and row["target_p99_s"] == LEADER_TARGET_S
    late = summarize_leader([*trials, {"decided_s": None, "elected_s": None, "first_ok_s": {"b": None},
                                       "unserved_blocks": 1}])["leader-kill"]
    assert not late["target_met"] and late["undecided"] == 1 and late["unserved_blocks"] == 1
    assert not summarize_leader([{**trials[0], "decided_s": 3.2}])["leader-kill"]["target_met"]
