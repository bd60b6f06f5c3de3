"""The queueing model behind the Fig. 13/15 analogues: MVA sanity, the schemes' ordering, calibration, CLI."""

from __future__ import annotations

import json

import pytest

from benchmarks import simulator as sim
from benchmarks.simulator import Calibration, Network, mva, network

NETS = [Network(1, 50.0, 0.0, 0.0), Network(8, 12.5, 0.0, 300.0), Network(99, 1.0, 101.0, 40.0),
        Network(2000, 0.05, 0.0, 150.0)]

BENCH = {
    "config": {"servers": 8, "clients": 8, "concurrency": [8, 32]},
    "schemes": {
        "hash": {"ops_per_s": 2100.0, "mean_ms": 3.1, "storage_cpu_us_per_op": 90.0,
                 "lookup_cpu_us_per_op": 0.0, "lookup_rpcs_per_op": 0.0, "client_cpu_us_per_op": 300.0,
                 "nat_cpu_us_per_op": 0.0, "ovs_cpu_us_per_op": 40.0,
                 "sweep": [{"concurrency": 32, "ops_per_s": 2100.0, "mean_ms": 9.0},
                           {"concurrency": 8, "ops_per_s": 1500.0, "mean_ms": 2.0}]},
        "metaflow": {"nat_cpu_us_per_op": 1.2,
                     "sweep": [{"concurrency": 8, "ops_per_s": 1450.0, "mean_ms": 2.1}]},
        "onehop": {"lookup_cpu_us_per_op": 120.0, "lookup_rpcs_per_op": 2.0},
        "chord": {"lookup_cpu_us_per_op": 500.0, "lookup_rpcs_per_op": 2.5},
        "ghba": {"levels": {"lru": 100, "segment": 50, "group": 5, "global": 2, "miss": 0}, "group_size": 3},
    },
}


@pytest.mark.parametrize("net", NETS)
def test_one_client_sees_no_queue(net):
    ops, ms = mva(net, 1)
    total = net.z + net.k * net.d + net.dx
    assert ms == pytest.approx(total / 1e3)
    assert ops == pytest.approx(1e6 / total)


@pytest.mark.parametrize("net", NETS)
@pytest.mark.parametrize("clients", [1, 2, 7, 50, 600])
def test_throughput_respects_both_asymptotic_bounds(net, clients):
    ops, _ = mva(net, clients)
    per_us = ops / 1e6
    assert per_us <= 1 / max(net.d, net.dx) * (1 + 1e-9)
    assert per_us <= clients / (net.z + net.k * net.d + net.dx) * (1 + 1e-9)


def test_throughput_approaches_the_bottleneck_with_many_clients():
    ops, _ = mva(Network(4, 10.0, 0.0, 100.0), 2000)
    assert ops == pytest.approx(1e5, rel=0.01)


def test_free_lookups_cost_nothing_at_saturation():
    """With lookups ~free on the CPU, a saturated cluster runs DHTs as fast as hash."""
    cal = Calibration().with_lookup(Calibration().storage_us / 1e6)
    hash_ops, _ = mva(network("hash", 50, cal), 5000)
    for scheme in ("onehop", "chord"):
        ops, _ = mva(network(scheme, 50, cal), 5000)
        assert ops == pytest.approx(hash_ops, rel=0.02)


def test_metaflow_without_nat_is_hash():
    cal = Calibration(nat_us=0.0)
    for n in (1, 10, 2000):
        assert network("metaflow", n, cal) == network("hash", n, cal)
        assert mva(network("metaflow", n, cal), 500) == mva(network("hash", n, cal), 500)


def test_paper_ordering_at_ratio_one():
    cal = Calibration()
    ops = {s: mva(network(s, 2000, cal.with_lookup(cal.storage_us)), 500)[0]
           for s in ("metaflow", "onehop", "chord")}
    assert ops["metaflow"] > ops["onehop"] > ops["chord"]


def test_central_coordinator_saturates():
    cal = Calibration()
    ops = [mva(network("central", n, cal), 500)[0] for n in (250, 1000, 2000)]
    assert ops[-1] <= 1e6 / cal.lookup_us
    assert ops[-1] == pytest.approx(ops[0], rel=0.01)


def test_figures_report_latency_relative_to_hash_and_ideal():
    figures = sim.simulate(Calibration(), [10, 40], clients=20)
    assert [p.label for p in figures["throughput"]] == ["100", "2", "1.5", "1", "measured"]
    for panel in figures["throughput"] + figures["latency"]:
        assert all(panel.at("hash", n).latency_vs_hash == 1.0 for n in (10, 40))
        assert all(0 < p.below_ideal < 1 for p in panel.points)


def test_calibration_reads_the_documented_fields():
    cal = Calibration.from_bench(BENCH)
    assert cal.storage_us == 90.0
    assert cal.lookup_us == 60.0                       # onehop 120 us over 2 RPCs
    assert cal.nat_us == 1.2 and cal.client_us == 300.0 and cal.ovs_us == 40.0
    assert cal.rtt_us == pytest.approx(2000.0 - 90.0 - 300.0)   # lowest concurrency (8), not the first listed
    assert cal.f_group == pytest.approx(7 / 157) and cal.f_global == pytest.approx(2 / 157)
    assert cal.sources["storage_us"] == "schemes.hash.storage_cpu_us_per_op"
    assert cal.sources["lookup_us"].startswith("schemes.onehop.")


def test_an_address_cost_below_the_noise_calibrates_to_zero():
    """The local mode's A/B difference can come out negative: no cost, not the default."""
    cal = Calibration.from_bench({"schemes": {"metaflow": {"nat_cpu_us_per_op": -3.0}}})
    assert cal.nat_us == 0.0 and "below the A/B's noise" in cal.sources["nat_us"]


def test_calibration_falls_back_to_chord_and_defaults():
    cal = Calibration.from_bench({"schemes": {
        "chord": {"lookup_cpu_us_per_op": 500.0, "lookup_rpcs_per_op": 2.5},
        "hash": {"sweep": [{"concurrency": 1, "mean_ms": 0.01}]}}})
    assert cal.lookup_us == 200.0 and cal.sources["lookup_us"].startswith("schemes.chord.")
    assert cal.storage_us == Calibration().storage_us and cal.sources["storage_us"] == "default"
    assert cal.rtt_us == sim.RTT_FLOOR_US
    assert Calibration.from_bench({}) == Calibration()


def test_validate_pairs_model_and_measurement():
    cal = Calibration.from_bench(BENCH)
    for cores in (None, 2):
        report = sim.validate(cal, BENCH, shared_cpu_cores=cores)
        assert report["servers"] == 8 and set(report["schemes"]) == {"hash", "metaflow"}
        rows = report["schemes"]["hash"]
        assert [r["concurrency"] for r in rows] == [32, 8]
        assert all(r["model_ops_per_s"] > 0 and r["model_ms"] > 0 for r in rows)
    shared = sim.validate(cal, BENCH, shared_cpu_cores=2)["schemes"]["hash"][0]["model_ops_per_s"]
    # 2 busy cores: 2e6 CPU-us per second over the CPU-us each op costs
    assert shared == pytest.approx(2e6 / (cal.storage_us + cal.client_us + cal.ovs_us), rel=0.01)


def test_cli_writes_json_and_plots(tmp_path, capsys):
    bench = tmp_path / "bench.json"
    bench.write_text(json.dumps(BENCH))
    assert sim.main(["--calibration", str(bench), "--out", str(tmp_path), "--servers", "8,16",
                     "--clients", "20", "--shared-cpu-cores", "2"]) == 0
    assert {"sim.json", "sim_throughput.png", "sim_latency.png"} <= {p.name for p in tmp_path.iterdir()}
    data = json.loads((tmp_path / "sim.json").read_text())
    assert data["calibration"]["storage_us"] == 90.0 and data["validation"]["shared_cpu_cores"] == 2
    assert len(data["throughput"]) == 5 and len(data["latency"]) == 5
    out = capsys.readouterr().out
    assert "MetaFlow/Chord" in out and "Validation at N=8" in out
