"""MetaFlow end to end in Mininet: real Open vSwitch, controller, agents, clients.

For a k=4 fat-tree and a small three-tier tree: all-pairs ping with no loss;
every client writes and reads back its files through the switches (no
lookup) while low capacity forces splits, and no acknowledged write is lost;
the flow tables *read back from Open vSwitch* deliver sampled IDs from
every client to their owners; and after a server is killed, every ID still
routes to a live owner.
"""

from __future__ import annotations

import random
import time
import warnings

import pytest

from client_lib.cidr import Block
from mininet_scenarios.metaflow_net import MetaFlowNet
from topology import builders

warnings.filterwarnings("ignore", category=DeprecationWarning)
SPACE = Block.parse("100.64.0.0/10")


def wait_for(probe, seconds: float = 20.0):
    """Splits and take-overs follow heartbeats (1 s) and the controller's tick (1 s)."""
    deadline = time.monotonic() + seconds
    while not (value := probe()):
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.5)
    return value


def check_routes(mf: MetaFlowNet, samples: int = 150) -> dict[str, list[Block]]:
    """Every sampled ID, from every client, reaches its owner through the real tables."""
    net, blocks, clients = mf.real_network()
    owners = [(b, name) for name, bs in blocks.items() for b in bs]
    rng = random.Random(3)
    for ident in [SPACE.first, SPACE.last] + [rng.randrange(SPACE.first, SPACE.last) for _ in range(samples)]:
        owner = next(name for b, name in owners if b.contains(ident))
        for client in clients:
            delivered = net.forward(client, ident)
            assert delivered.host == owner, (client, SPACE.address(ident), delivered)
    return blocks


@pytest.mark.timeout(600)
def test_fat_tree_end_to_end(tmp_path):
    graph = builders.fat_tree(4, servers=8)
    with MetaFlowNet(graph, capacity=1000, workdir=tmp_path,
                     controller_args=["--bootstrap", "preallocate:2", "--heartbeat-timeout", "3"]) as mf:
        assert mf.scenario.net.pingAll(timeout=1) == 0
        results = mf.run_clients(1000, tmp_path)
        assert all(r["errors"] == 0 and r["read_back"] == r["written"] == 1000 for r in results), results
        wait_for(lambda: len(mf.rest("/metaflow/splits")) >= 2)
        check_routes(mf)
        result = mf.verify_acked(tmp_path, [])
        assert result["missing"] == result["wrong"] == 0 and result["checked"] == 8 * 1000

        servers = mf.rest("/metaflow/servers")
        victim = max((n for n, s in servers.items() if s["state"] == "busy"), key=lambda n: servers[n]["keys"])
        mf.scenario.agents.pop(mf.scenario.topo.graph_names[victim]).kill()
        wait_for(lambda: any(e["event"] == "takeover" for e in mf.rest("/metaflow/events")))
        lost = [Block.parse(b) for e in mf.rest("/metaflow/events") if e["event"] == "DATA-LOST"
                for b in e["blocks"]]
        assert lost, "the controller must say that the killed server's data is gone"
        blocks = check_routes(mf)
        assert blocks[victim] == [] and mf.rest("/metaflow/servers")[victim]["failed"]
        result = mf.verify_acked(tmp_path, lost)
        assert result["missing"] == result["wrong"] == 0, result


@pytest.mark.timeout(600)
def test_three_tier_end_to_end(tmp_path):
    graph = builders.three_tier(core=2, agg=2, edges=3, servers_per_edge=2, edge_uplinks=2,
                                clients_per_edge=1)
    with MetaFlowNet(graph, capacity=800, workdir=tmp_path,
                     controller_args=["--bootstrap", "preallocate:2"]) as mf:
        assert mf.scenario.net.pingAll(timeout=1) == 0
        results = mf.run_clients(1000, tmp_path)
        assert all(r["errors"] == 0 and r["read_back"] == 1000 for r in results), results
        wait_for(lambda: mf.rest("/metaflow/splits"))
        check_routes(mf)
        result = mf.verify_acked(tmp_path, [])
        assert result["missing"] == result["wrong"] == 0

        # A server's edge link goes down: the port status alone triggers the
        # take-over, and since its agent still answers over the management
        # network, its data moves to the successor and nothing is lost.
        servers = mf.rest("/metaflow/servers")
        victim = next(n for n, s in servers.items() if s["state"] == "busy")
        host = mf.scenario.topo.graph_names[victim]
        (edge,) = list(graph.neighbors(host))
        mf.scenario.net.configLinkStatus(mf.scenario.topo.names[host], mf.scenario.topo.names[edge], "down")
        event = wait_for(lambda: next((e for e in mf.rest("/metaflow/events")
                                       if e["event"] == "takeover" and e["server"] == victim), None), 10)
        assert mf.rest("/metaflow/servers")[victim]["failed"].startswith("edge port")
        assert event["salvaged"] and event["seconds"] < 10
        assert not any(e["event"] == "DATA-LOST" for e in mf.rest("/metaflow/events"))
        check_routes(mf)
        result = mf.verify_acked(tmp_path, [])
        assert result["missing"] == result["wrong"] == 0, result


@pytest.mark.timeout(600)
def test_controller_restart_rebuilds_from_the_agents_without_disturbing_clients(tmp_path):
    graph = builders.fat_tree(4, servers=8)
    with MetaFlowNet(graph, capacity=10_000, workdir=tmp_path) as mf:
        before = mf.rest("/metaflow/tree")["leaves"]
        procs = mf.start_clients(600, tmp_path, concurrency=2)
        time.sleep(2)
        rebuilt = mf.restart_controller()
        results = mf.collect(procs, timeout=300)
        assert all(r["errors"] == 0 and r["written"] == 600 for r in results), results
        after = mf.rest("/metaflow/tree")["leaves"]
        assert {n: l["blocks"] for n, l in after.items()} == {n: l["blocks"] for n, l in before.items()}
        assert any(e["event"] == "network-built" and e["restored"] for e in mf.rest("/metaflow/events"))
        check_routes(mf)
        result = mf.verify_acked(tmp_path, [])
        assert result["missing"] == result["wrong"] == 0, result
        assert rebuilt < 60
