"""MetaFlow end to end in Mininet: real Open vSwitch, controller, agents, clients.

For a k=4 fat-tree and a small three-tier tree: all-pairs ping with no loss;
every client writes and reads back its files through the switches (no
lookup) while low capacity forces splits, and no acknowledged write is lost;
a client's very first packet, before the controller knew it, is answered;
the flow tables *read back from Open vSwitch* deliver sampled IDs from
every client to their owners; and after a server is killed, every ID still
routes to a live owner. The fat-tree runs with a backup per block (the
default, r=2): killing a busy server loses nothing and every block gets its
second copy back; the three-tier runs without (r=1): a cut edge link is
salvaged over the management network.
"""

from __future__ import annotations

import random
import threading
import time
import warnings

import pytest

from client_lib.api.admin import ADMIN
from client_lib.api.rest import REST
from client_lib.cidr import Block
from client_lib.errors import ApiError
from mininet_scenarios.metaflow_net import MetaFlowNet
from topology import builders

warnings.filterwarnings("ignore", category=DeprecationWarning)
SPACE = Block.parse("100.64.0.0/10")
PING_TIMEOUT = 5
"""Seconds for each pair's one ping: the first crosses the controller (ARP
and path set-up), which took over a second on a loaded machine."""


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
                     controller_args=["--bootstrap", "preallocate:2"]) as mf:
        assert mf.scenario.net.pingAll(timeout=PING_TIMEOUT) == 0
        results = mf.run_clients(1000, tmp_path)
        assert all(r["errors"] == 0 and r["read_back"] == r["written"] == 1000 for r in results), results
        wait_for(lambda: len(mf.view(REST.splits).splits) >= 2)
        check_routes(mf)
        result = mf.verify_acked(tmp_path, [])
        assert result["missing"] == result["wrong"] == 0 and result["checked"] == 8 * 1000

        servers = mf.view(REST.servers).servers
        victim = max((n for n, s in servers.items() if s.state == "busy"), key=lambda n: servers[n].keys)
        held = set(servers[victim].blocks)
        mf.scenario.agents.pop(mf.scenario.topo.graph_names[victim]).kill()
        # (on a loaded machine another server may miss heartbeats and be failed
        # over too, safely: the victim's take-over is the one this checks)
        takeover = wait_for(lambda: next((e for e in mf.events("takeover") if e["server"] == victim), None))
        assert {Block.parse(b) for b in takeover["promoted"]} == held, takeover
        assert not mf.events("DATA-LOST")
        blocks = check_routes(mf)
        assert blocks[victim] == [] and mf.view(REST.servers).servers[victim].failed
        result = mf.verify_acked(tmp_path, [])
        assert result["missing"] == result["wrong"] == 0, result
        wait_for(mf.replicated, 60)   # every block has its backup again


@pytest.mark.timeout(600)
def test_three_tier_end_to_end(tmp_path):
    graph = builders.three_tier(core=2, agg=2, edges=3, servers_per_edge=2, edge_uplinks=2,
                                clients_per_edge=1)
    with MetaFlowNet(graph, capacity=800, workdir=tmp_path, replicas=1, silent_clients=True,
                     controller_args=["--bootstrap", "preallocate:2"]) as mf:
        # A client's first packet reaches a server and the answer comes back:
        # the controller answers its ARP only once every switch routes to it.
        server = mf.scenario.host(mf.hosts("storage")[-1])
        for client in mf.hosts("client"):
            out = mf.scenario.host(client).cmd(f"ping -c1 -W{PING_TIMEOUT} {server.IP()}")
            assert " 0% packet loss" in out, (client, out)
        assert mf.scenario.net.pingAll(timeout=PING_TIMEOUT) == 0
        running = mf.start_clients(1000, tmp_path, 0, True)
        # While they run, the controller sees their load in the switches'
        # counters (polled each second), at servers that own blocks only.
        loaded = wait_for(lambda: {n: r for n, r in mf.view(REST.load).servers.items() if r > 0}, 30)
        owners = {n for n, s in mf.view(REST.servers).servers.items() if s.blocks}
        assert set(loaded) <= owners, (loaded, owners)
        results = mf.collect(running)
        assert all(r["errors"] == 0 and r["read_back"] == 1000 for r in results), results
        wait_for(lambda: mf.view(REST.splits).splits)
        check_routes(mf)
        result = mf.verify_acked(tmp_path, [])
        assert result["missing"] == result["wrong"] == 0

        # A server's edge link goes down: the port status alone triggers the
        # take-over, and since its agent still answers over the management
        # network, its data moves to the successor and nothing is lost.
        servers = mf.view(REST.servers).servers
        victim = next(n for n, s in servers.items() if s.state == "busy")
        host = mf.scenario.topo.graph_names[victim]
        (edge,) = list(graph.neighbors(host))
        mf.scenario.net.configLinkStatus(mf.scenario.topo.names[host], mf.scenario.topo.names[edge], "down")
        event = wait_for(lambda: next((e for e in mf.events("takeover") if e["server"] == victim), None), 10)
        assert mf.view(REST.servers).servers[victim].failed.startswith("edge port")
        assert event["salvaged"] and event["seconds"] < 10
        assert not mf.events("DATA-LOST")
        check_routes(mf)
        result = mf.verify_acked(tmp_path, [])
        assert result["missing"] == result["wrong"] == 0, result


@pytest.mark.timeout(600)
def test_a_split_with_every_server_busy_merges_a_cold_neighbour_away_first(tmp_path):
    """Every server owns a share from the start, so a split finds no idle
    server: the controller first moves a cold server's blocks (and their
    backups' copies) to a neighbour, for real, then splits into the freed
    server; the tables read back from OVS route every ID to its owner and no
    acknowledged write is lost."""
    graph = builders.fat_tree(4, servers=8)
    with MetaFlowNet(graph, capacity=1000, workdir=tmp_path,
                     controller_args=["--bootstrap", "preallocate:8"]) as mf:
        results = mf.run_clients(100, tmp_path)
        assert all(r["errors"] == 0 and r["read_back"] == 100 for r in results), results
        servers = mf.view(REST.servers).servers
        assert all(s.state == "busy" for s in servers.values()), servers
        source = max(servers, key=lambda n: servers[n].keys)
        outcome = mf.api.call(REST.split, name=source)
        assert outcome.ok, outcome
        (merge,) = mf.events("merge")
        assert merge["freed_for"] == source and outcome.detail["target"] == merge["server"]
        assert merge["target"] not in (source, merge["server"])
        check_routes(mf)
        result = mf.verify_acked(tmp_path, [])
        assert result["missing"] == result["wrong"] == 0 and result["checked"] == 8 * 100, result


@pytest.mark.timeout(600)
def test_controller_restart_rebuilds_from_the_agents_without_disturbing_clients(tmp_path):
    graph = builders.fat_tree(4, servers=8)
    with MetaFlowNet(graph, capacity=10_000, workdir=tmp_path) as mf:
        before = mf.view(REST.tree).leaves
        procs = mf.start_clients(600, tmp_path, concurrency=2)
        time.sleep(2)
        rebuilt = mf.restart_controller()
        results = mf.collect(procs, timeout=300)
        assert all(r["errors"] == 0 and r["written"] == 600 for r in results), results
        after = mf.view(REST.tree).leaves
        assert {n: leaf.blocks for n, leaf in after.items()} == {n: leaf.blocks for n, leaf in before.items()}
        assert any(e["restored"] for e in mf.events("network-built"))
        check_routes(mf)
        result = mf.verify_acked(tmp_path, [])
        assert result["missing"] == result["wrong"] == 0, result
        assert rebuilt < 60


@pytest.mark.timeout(600)
def test_controller_killed_mid_split_leaves_no_block_frozen(tmp_path):
    """The controller dies (SIGKILL) while a split copies. Reproduced before:
    the migration stayed `copied` and a quarter of the space refused every
    write for as long as anyone watched. Now the restarted controller finds
    the leftover migration on the agent and aborts it (and its lease would
    have, anyway): every write succeeds and nothing acknowledged is lost."""
    graph = builders.fat_tree(4, servers=8)
    with MetaFlowNet(graph, capacity=1_000_000, workdir=tmp_path,
                     controller_args=["--no-auto-split", "--migration-lease", "30"]) as mf:
        results = mf.collect(mf.start_clients(2500, tmp_path, read_back=False, concurrency=16))
        assert all(r["errors"] == 0 for r in results), results
        servers = mf.view(REST.servers).servers
        source = max((n for n, s in servers.items() if s.state == "busy"), key=lambda n: servers[n].keys)
        splitting = threading.Thread(target=lambda: _quietly(lambda: mf.api.call(REST.split, name=source)))
        splitting.start()
        step = _mid_split(mf)
        rebuilt = mf.restart_controller(kill=True)
        splitting.join(10)
        agent = mf.scenario.agents[mf.scenario.topo.graph_names[source]]
        frozen = wait_for(lambda: not agent.admin.call(ADMIN.health).frozen or None, 15)
        assert frozen, f"killed at step {step}: blocks stayed frozen"
        # Killed at the copy step, the restarted controller found the migration and
        # aborted it, unless the kill came before the source ever received it.
        assert [e for e in mf.events("leftover-migrations")] or step != "copy" \
            or not agent.admin.call(ADMIN.migrations).migrations
        results = mf.run_clients(300, tmp_path, start=10_000)
        assert all(r["errors"] == 0 and r["read_back"] == r["written"] == 300 for r in results), results
        check_routes(mf)
        result = mf.verify_acked(tmp_path, [])
        assert result["missing"] == result["wrong"] == 0, result
        assert rebuilt < 60


def _mid_split(mf: MetaFlowNet) -> str:
    """Wait (polling fast: a copy of a few thousand records takes a fraction
    of a second) until the split has frozen its blocks; its step then."""
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        steps = [op.step for op in mf.view(REST.operations).operations if op.kind == "split"]
        if steps and steps[0] in ("copy", "assign", "flows", "commit"):
            return steps[0]
        assert not mf.view(REST.splits).splits, "the split finished before it could be interrupted"
        time.sleep(0.005)
    raise AssertionError("the split never started copying")


def _quietly(call) -> None:
    """A REST call whose answer dies with the controller."""
    try:
        call()
    except ApiError:
        pass
