"""Two sites for real (issue 29's short form in `make test`):
`mininet_scenarios.sites_net` with the round trip between the paper's two
European regions, an agent per site behind its border, each site's
propagation agent, and nodes in the border namespaces reaching every ID by
the kernel's routes alone.

* The emulated round trip is the one asked for within 10 %, and the bench's
  short form runs the four strategies with no failed operation.
* A WAN link cut (its carrier lost): a request for the far site is refused
  at once with a retryable error, the near site's entries are served, the
  replicated strategy's writes go on and reach the far site once the link is
  mended; nothing acknowledged is lost.
* A WAN link that silently drops everything: requests wait out their
  deadline, then work again once it carries frames; the replicated writes
  made meanwhile arrive.
* A site's agent killed with -9: the other site serves its entries and the
  local copies of local replication; the propagation catches up after the
  agent is back.
"""

from __future__ import annotations

import json
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from benchmarks import sites_bench
from benchmarks.sites_workflows import Scenario
from client_lib.mdid import normalize_path
from client_lib.sites import Strategy
from mininet_scenarios.netns_pair import Namespace
from mininet_scenarios.sites_net import SitesNet

NEAR, FAR = "north-europe", "west-europe"


@pytest.fixture(scope="module")
def net(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SitesNet]:
    with SitesNet(sites_bench.topology(2, 100.0), tmp_path_factory.mktemp("sites"), sync=True, registry=True,
                  fast_open=True) as made:
        yield made


def in_site(net: SitesNet, site: str, body: str, timeout: float = 120) -> Any:
    """Run `body` in `site`'s border namespace, where ``client(strategy)``
    gives a `SiteClient` of that site; what it assigns to ``out``, as JSON."""
    script = textwrap.dedent('''
        import json, time
        from client_lib.errors import MetaFlowError, Unavailable
        from client_lib.site_client import SiteClient, read_layout
        from client_lib.sites import Strategy
        def client(strategy, deadline=3.0):
            return SiteClient(read_layout(LAYOUT), Strategy(strategy), SITE, central=CENTRAL,
                              deadline=deadline)
        out = None
    ''') + textwrap.dedent(body) + "\nprint(json.dumps(out))\n"
    script = script.replace("LAYOUT", repr(str(net.layout_file))).replace("SITE", repr(site)).replace(
        "CENTRAL", repr(NEAR))
    done = net.run_node(site, sys.executable, "-c", script, timeout=timeout)
    return json.loads(done.stdout)


def homed(net: SitesNet, site: str, tag: str, count: int) -> list[str]:
    """`count` paths whose home is `site`."""
    layout = net.topo.layout
    found = (f"/{tag}/{i}" for i in range(100_000))
    return [p for p in found if layout.home_of(normalize_path(p))[0].name == site][:count]


def test_the_round_trip_is_the_one_asked_for_and_every_strategy_runs(net: SitesNet) -> None:
    rtt = sites_bench.measured_rtts(net)[0]
    assert abs(rtt["error"]) <= 0.10, rtt
    for strategy in Strategy:
        run = sites_bench.run_round(net, strategy, 2, 40, f"short-{strategy.value}", NEAR)
        assert run["failures"] == 0 and run["nodes"] == 4, run
        assert all(node["ops"] == 40 for node in run["nodes_detail"])
        assert run["makespan"] > 0 and run["throughput"] > 0


def _tcp_counters(ns: Namespace) -> dict[str, int]:
    """The namespace's TcpExt counters (``/proc/net/netstat`` inside it)."""
    lines = [line.split() for line in ns.run("cat", "/proc/net/netstat").stdout.splitlines()
             if line.startswith("TcpExt:")]
    return dict(zip(lines[0][1:], map(int, lines[1][1:]), strict=True))


def test_a_request_to_a_new_id_rides_in_the_syn_with_fast_open(net: SitesNet) -> None:
    paths = homed(net, FAR, "tfo", 8)
    far_agent_ns = net.agent_ns[1][0]

    def counted() -> tuple[int, int]:   # sent by the near border, taken by the far agent
        return (_tcp_counters(net.borders[0])["TCPFastOpenActive"],
                _tcp_counters(far_agent_ns)["TCPFastOpenPassive"])

    before = counted()
    out = in_site(net, NEAR, f'''
        from client_lib.client import MetaFlowClient
        layout = read_layout(LAYOUT)
        far = MetaFlowClient(layout.named({FAR!r}).prefix, fast_open=True)
        for path in {paths!r}:
            far.put(path, b"in the syn")
        out = [far.get(p) == b"in the syn" for p in {paths!r}] + [far.stats.connects]
    ''')
    assert all(out[:-1]) and out[-1] == len(paths), out
    after = counted()
    assert after[0] - before[0] >= len(paths) and after[1] - before[1] >= len(paths), (before, after)


def test_the_registry_baseline_and_a_workflow_run_on_the_same_sites(net: SitesNet) -> None:
    run = sites_bench.run_round(net, Strategy.DECENTRALIZED, 1, 20, "registry", NEAR, registry=True)
    assert run["failures"] == 0 and run["registry"], run
    flow = sites_bench.run_workflow(net, Strategy.LOCAL_REPLICATION, "montage", Scenario("tiny", 10, 0.2), 4,
                                    "flow", NEAR)
    assert flow["failures"] == 0 and flow["jobs"] == 4 and flow["makespan"] >= 3 * 0.2, flow


def test_a_cut_link_refuses_the_far_site_at_once_and_loses_no_replicated_write(net: SitesNet) -> None:
    far_paths, near_paths = homed(net, FAR, "cut", 20), homed(net, NEAR, "cut", 20)
    net.cut(NEAR, FAR)
    try:
        out = in_site(net, NEAR, f'''
            far, near = {far_paths!r}, {near_paths!r}
            d, r = client("decentralized"), client("replicated")
            refusals = []
            for path in far[:3]:
                began = time.monotonic()
                try:
                    d.put(path, b"x")
                    refusals.append(None)
                except Unavailable as exc:
                    refusals.append([time.monotonic() - began, str(exc)])
            for path in near:
                d.put(path, b"near")
            for path in far + near:
                r.put("/replicated" + path, b"r")
            out = {{"refusals": refusals, "near": [d.get(p) == b"near" for p in near],
                   "replicated": [r.get("/replicated" + p) == b"r" for p in far + near]}}
        ''')
        assert all(r is not None and r[0] < 2.5 for r in out["refusals"]), out["refusals"]
        assert all(f"site {FAR} unreachable" in r[1] and "No route to host" in r[1] for r in out["refusals"])
        assert all(out["near"]) and all(out["replicated"]), out
        assert net.syncs[0].backlog()[FAR] == 40
    finally:
        net.mend(NEAR, FAR)
    net.syncs[0].wait_drained(60)
    seen = in_site(net, FAR, f'''
        r = client("replicated")
        out = [r.get("/replicated" + p) == b"r" for p in {far_paths + near_paths!r}]
    ''')
    assert seen == [True] * 40, seen


def test_a_silent_link_delays_requests_until_it_carries_again(net: SitesNet) -> None:
    paths = homed(net, FAR, "silent", 5)
    net.silence(NEAR, FAR)
    try:
        out = in_site(net, NEAR, f'''
            d, r = client("decentralized", deadline=1.5), client("replicated")
            began = time.monotonic()
            try:
                d.put({paths[0]!r}, b"x")
                waited = None
            except Unavailable:
                waited = time.monotonic() - began
            for path in {paths!r}:
                r.put("/quiet" + path, b"q")
            out = waited
        ''')
        assert out is not None and out >= 1.0, out
    finally:
        net.silence(NEAR, FAR, cut=False)
    net.syncs[0].wait_drained(60)
    out = in_site(net, FAR, f'''
        d, r = client("decentralized"), client("replicated")
        d.put({paths[1]!r}, b"again")
        out = [d.get({paths[1]!r}) == b"again"] + [r.get("/quiet" + p) == b"q" for p in {paths!r}]
    ''')
    assert all(out), out


def test_a_dead_site_leaves_the_other_serving_and_the_propagation_catches_up(net: SitesNet) -> None:
    far_agent = net.agents[1][0]
    far_paths = homed(net, FAR, "dead", 10)
    near_paths = homed(net, NEAR, "dead", 10)
    in_site(net, NEAR, f'''
        lr = client("local-replication")
        for path in {far_paths!r}:
            lr.put(path, b"both")
    ''')
    far_agent.kill()
    try:
        out = in_site(net, NEAR, f'''
            lr, d, r = client("local-replication", 1.0), client("decentralized", 1.0), client("replicated")
            for path in {near_paths!r}:
                d.put(path, b"near")
                r.put("/late" + path, b"l")
            lost = []
            for path in {far_paths[:2]!r}:
                try:
                    d.get(path)
                    lost.append(False)
                except MetaFlowError:
                    lost.append(True)
            out = {{"local": [lr.get(p) == b"both" for p in {far_paths!r}],
                   "near": [d.get(p) == b"near" for p in {near_paths!r}], "unreachable": lost}}
        ''')
        assert all(out["local"]) and all(out["near"]) and all(out["unreachable"]), out
        time.sleep(0.5)
        assert net.syncs[0].backlog()[FAR] > 0
    finally:
        far_agent.launch().wait_ready(60)
    net.syncs[0].wait_drained(60)
    out = in_site(net, FAR, f'''
        r, d = client("replicated"), client("decentralized")
        out = [r.get("/late" + p) == b"l" for p in {near_paths!r}]
        out += [d.get(p) == b"both" for p in {far_paths!r}]
    ''')
    assert all(out), out


def test_the_bench_report_has_every_figure(net: SitesNet, tmp_path: Path) -> None:
    results: dict[str, Any] = {"central": NEAR, "entries": [20], "rtts": sites_bench.measured_rtts(net, 3),
                               "fig5": [], "fig7": []}
    for strategy in Strategy:
        results["fig5"].append(sites_bench.run_round(net, strategy, 1, 20, f"rep5-{strategy.value}", NEAR))
        results["fig7"].append(results["fig5"][-1])
    by = {r["strategy"]: r for r in results["fig5"]}
    results["fig6"] = {"decentralized": by["decentralized"], "local-replication": by["local-replication"],
                       "speedup": sites_bench.speedups(by["decentralized"], by["local-replication"])}
    table = sites_bench.report(results)
    assert "Fig. 5" in table and "Fig. 6" in table and "Fig. 7" in table
    assert set(results["fig6"]["speedup"]) == set(sites_bench.PROGRESS)
    sites_bench.plot(results, tmp_path / "sites.png")
    assert (tmp_path / "sites.png").stat().st_size > 10_000
