"""Two sites, each a MetaFlow fabric of its own (issue 29): Open vSwitch
switches in Mininet, two controllers serving the site's prefix (one leads
through the site's etcd, one stands by), two agents, and a border host where
the site's nodes run and its WAN link ends (`mininet_scenarios.sites_net`
with ``fabric=True``).

* Every strategy runs with no failed operation, and a request from one site
  for an ID homed in the other crosses the WAN and is carried inside the far
  site by that site's MetaFlow entries (their packet counters rise), to the
  agent that the far site's own nodes reach for the same ID.
* A site's leading controller killed with -9: the standby takes over, and
  the site goes on serving, to its own nodes and over the WAN, also IDs and
  hosts that had not spoken before (whose ARP only a controller answers);
  the replicated strategy's updates reach it; the killed controller comes
  back as a standby, and every acknowledged write reads back.
* Teardown leaves nothing named after either net.
"""

from __future__ import annotations

import dataclasses
import subprocess
from collections.abc import Iterator

import pytest

from benchmarks import sites_bench
from client_lib.sites import Strategy
from mininet_scenarios.sites_net import SitesNet
from tests.integration.test_sites_net import FAR, NEAR, homed, in_site


@pytest.fixture(scope="module")
def net(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SitesNet]:
    topo = dataclasses.replace(sites_bench.topology(2, 100.0), agents=2)
    with SitesNet(topo, tmp_path_factory.mktemp("fabrics"), sync=True, fabric=True,
                  controllers=2) as made:
        fabrics = list(made.fabrics)
        yield made
    names = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, check=True).stdout
    links = subprocess.run(["ip", "-o", "link"], capture_output=True, text=True, check=True).stdout
    assert made.base not in names and made.base not in links
    assert len(fabrics) == 2 and not made.fabrics
    assert all(not fabric.net.running.leaks() for fabric in fabrics)


def far_border_switch(net: SitesNet) -> str:
    """The far site's switch where its border host is attached."""
    fabric = net.fabric_of(FAR)
    (switch,) = fabric.net.graph.neighbors(fabric.border)
    return str(switch)


def test_a_site_whose_leader_is_killed_serves_on_through_its_standby(net: SitesNet) -> None:
    """First in the module: no request has crossed either fabric yet, so no
    agent knows the border's address; only a controller answers ARP."""
    far_paths, near_paths = homed(net, FAR, "headless", 15), homed(net, NEAR, "headless", 15)
    fabric = net.fabric_of(FAR)
    fabric.kill_controller()
    assert fabric.killed is not None
    proc = fabric.net.controllers[fabric.killed].proc
    assert proc is not None and proc.poll() is not None
    assert fabric.taken_over() < 30
    try:
        near = in_site(net, NEAR, f'''
            d, r = client("decentralized"), client("replicated")
            for path in {far_paths!r}:
                d.put(path, b"far, headless")
            for path in {far_paths + near_paths!r}:
                r.put("/headless" + path, b"r")
            out = [d.get(p) == b"far, headless" for p in {far_paths!r}]
        ''')
        assert near == [True] * len(far_paths), near
        net.syncs[0].wait_drained(60)
        far = in_site(net, FAR, f'''
            d, r = client("decentralized"), client("replicated")
            for path in {far_paths!r}:
                d.put(path + ".local", b"local, headless")
            out = [d.get(p) == b"far, headless" for p in {far_paths!r}]
            out += [r.get("/headless" + p) == b"r" for p in {far_paths + near_paths!r}]
        ''')
        assert far == [True] * (len(far_paths) * 2 + len(near_paths)), far
    finally:
        fabric.restart_controller()
    assert fabric.killed is None
    after = in_site(net, NEAR, f'''
        d = client("decentralized")
        out = [d.get(p) == b"far, headless" for p in {far_paths!r}]
        out += [d.get(p + ".local") == b"local, headless" for p in {far_paths!r}]
    ''')
    assert after == [True] * (2 * len(far_paths)), after


def test_every_strategy_runs_and_a_far_id_takes_the_far_fabric_entries(net: SitesNet) -> None:
    for strategy in Strategy:
        run = sites_bench.run_round(net, strategy, 2, 30, f"fabric-{strategy.value}", NEAR)
        assert run["failures"] == 0 and run["nodes"] == 4, run
        assert all(node["ops"] == 30 for node in run["nodes_detail"])
    paths = homed(net, FAR, "entries", 20)
    far_net = net.fabric_of(FAR).net
    before = far_net.metaflow_packets(far_border_switch(net))
    in_site(net, NEAR, f'''
        d = client("decentralized")
        for path in {paths!r}:
            d.put(path, b"from near")
    ''')
    assert far_net.metaflow_packets(far_border_switch(net), beyond=before + len(paths)) > before + len(paths)
    seen = in_site(net, FAR, f'''
        d = client("decentralized")
        out = [d.get(p) == b"from near" for p in {paths!r}]
    ''')
    assert seen == [True] * len(paths), seen
