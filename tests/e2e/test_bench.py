"""`metaflowctl bench` for real, small: every scheme runs in Mininet through
the real lookup servers and agents, and the report says what each cost.

Small numbers (short runs, few entries) keep it to about a minute; the
assertions are about what each scheme must do, not how fast it is.
"""

from __future__ import annotations

import json
import warnings

import pytest

from benchmarks.bench import BenchConfig, run_bench
from benchmarks.bench_report import format_report, plot

warnings.filterwarnings("ignore", category=DeprecationWarning)


@pytest.mark.timeout(600)
def test_every_scheme_runs_side_by_side_with_its_costs(tmp_path):
    cfg = BenchConfig(entries=600, seconds=0.8, reps=1, levels=(1, 16), mdtest_files=30, nat_rounds=1,
                      nat_ops=2000)
    report = run_bench(cfg, show_progress=False)
    schemes = report["schemes"]
    assert set(schemes) == {"metaflow", "hash", "central", "onehop", "chord", "ghba"}
    for name, s in schemes.items():
        assert s["errors"] == 0, (name, [r["error_sample"] for r in report["runs"] if r["scheme"] == name])
        assert s["ops_per_s"] > 0 and 0 < s["p50_ms"] <= s["p99_ms"]
        assert s["storage_cpu_us_per_op"] > 0
        assert [p["concurrency"] for p in s["sweep"]][0] == 1
    rpcs = {name: s["lookup_rpcs_per_op"] for name, s in schemes.items()}
    assert rpcs["metaflow"] == rpcs["hash"] == 0
    assert rpcs["central"] == rpcs["onehop"] == 1
    assert rpcs["chord"] >= 1 and rpcs["ghba"] >= 1
    # lookups cost the lookup servers' CPU only for the schemes that make them
    assert schemes["chord"]["lookup_cpu_us_per_op"] > 10 * max(schemes["metaflow"]["lookup_cpu_us_per_op"], 1)
    assert schemes["metaflow"]["nat_cpu_us_per_op"] == report["nat"]["nat_cpu_us_per_op"]
    assert sum(schemes["ghba"]["levels"].values()) > 0
    for name, phases in report["mdtest"].items():
        assert all(p["errors"] == 0 and p["ops_per_s"] > 0 for p in phases.values()), (name, phases)
    # MetaFlow's partition in the switches: the core switches hold prefix entries
    assert any(c["metaflow"] > 0 for c in report["flows"].values() if c["layer"] == "core")
    assert set(report["targets"]) == {"latency_vs_hash", "throughput_vs_hash", "throughput_vs_chord",
                                      "nat_share", "mdtest_create_vs_hash", "mdtest_stat_vs_hash",
                                      "mdtest_remove_vs_hash"}
    json.dumps(report)
    text = format_report(report)
    assert "metaflow" in text and "target latency_vs_hash" in text
    assert all(p.stat().st_size > 10_000 for p in plot(report, tmp_path))
