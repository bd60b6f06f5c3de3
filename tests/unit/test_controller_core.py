"""The controller's state machine against fake agents and a fake fabric.

The fake fabric applies diffs to per-switch tables exactly as a switch would,
and a `FakeNetwork` built on those tables answers where every ID goes; the
fake agents keep keys by MetaDataID and follow the migration protocol.
"""

from __future__ import annotations

import random

import pytest

from btree.fake_network import FakeNetwork
from btree.flows import FlowEntry
from btree.split import SplitBounds
from btree.tree import State
from client_lib.cidr import Block
from controller.core import MetaFlowCore
from controller.routing import host_routes
from topology.builders import client_hosts, fat_tree, storage_hosts

SPACE = Block.parse("100.64.0.0/10")


class FakeSwitches:
    def __init__(self) -> None:
        self.tables: dict[int, dict] = {}
        self.host_routes: dict[int, dict[str, int]] = {}
        self.barriers = 0
        self.fail_next_apply = False

    def apply(self, diff) -> None:
        if self.fail_next_apply:
            self.fail_next_apply = False
            raise RuntimeError("barrier timed out")
        for dpid, change in diff.items():
            table = self.tables[dpid]
            for entry in change.delete:
                del table[entry.match]
            for entry in change.add + change.modify:
                table[entry.match] = entry
        self.barriers += 1

    def sync(self, dpid: int, entries: list[FlowEntry], routes: dict[str, int]) -> None:
        self.tables[dpid] = {e.match: e for e in entries}
        self.host_routes[dpid] = dict(routes)

    def routes(self, dpid: int, changed: dict[str, int], deleted: list[str]) -> None:
        table = self.host_routes.setdefault(dpid, {})
        table.update(changed)
        for ip in deleted:
            del table[ip]


class FakeAgent:
    def __init__(self, name: str) -> None:
        self.name = name
        self.keys: dict[int, bytes] = {}
        self.owned: list[Block] = []
        self.migrations: dict[str, tuple[list[Block], str]] = {}
        self.peers: dict[str, FakeAgent] = {}
        self.alive = True

    def health(self) -> dict:
        return {"keys": len(self.keys)}

    def count(self, first: int, last: int) -> int:
        return sum(1 for k in self.keys if first <= k <= last)

    def own(self, blocks, migration=None) -> dict:
        self.owned += [Block.parse(b) for b in blocks]
        return {}

    def migrate(self, blocks, target) -> dict:
        if not self.alive:
            raise ConnectionError(f"{self.name} does not answer")
        ident = f"m{len(self.migrations)}"
        self.migrations[ident] = ([Block.parse(b) for b in blocks], target)
        moving = [k for k in self.keys if any(b.contains(k) for b in self.migrations[ident][0])]
        return {"id": ident, "keys": len(moving)}

    def commit(self, ident) -> dict:
        blocks, target = self.migrations.pop(ident)
        peer = self.peers[target]
        for k in [k for k in self.keys if any(b.contains(k) for b in blocks)]:
            peer.keys[k] = self.keys.pop(k)
        peer.owned += blocks
        self.owned = [b for b in self.owned if b not in blocks]
        return {"state": "committed"}

    def abort(self, ident) -> dict:
        self.migrations.pop(ident)
        return {"state": "aborted"}


@pytest.fixture
def world():
    g = fat_tree(4, servers=8)
    switches = FakeSwitches()
    agents = {}
    storage = storage_hosts(g)
    for host in storage:
        agents[f"http://{host}"] = FakeAgent(host)
    for agent in agents.values():
        agent.peers = agents
    clock = [0.0]
    core = MetaFlowCore(SPACE, switches, agents.__getitem__, SplitBounds(), capacity=100,
                        heartbeat_timeout=5, clock=lambda: clock[0])
    return g, core, switches, agents, clock


@pytest.fixture
def built(world):
    """The world after discovery, registration and the first build."""
    g, core = world[0], world[1]
    register_all(g, core)
    discover(g, core)
    assert core.build()
    return world


def discover(g, core) -> None:
    for node, data in g.nodes(data=True):
        if data["kind"] == "switch":
            core.switch_up(data["dpid"])
    for a, b, data in g.edges(data=True):
        if g.nodes[a]["kind"] == g.nodes[b]["kind"] == "switch":
            core.link_up(g.nodes[a]["dpid"], data["ports"][a], g.nodes[b]["dpid"], data["ports"][b])
    for host in storage_hosts(g) + client_hosts(g):
        (sw,) = list(g.neighbors(host))
        core.host_seen(g.nodes[host]["ip"], g.nodes[host]["mac"], g.nodes[sw]["dpid"],
                       g.edges[host, sw]["ports"][sw])


def register_all(g, core) -> None:
    for host in storage_hosts(g):
        core.register({"name": host, "data_ip": g.nodes[host]["ip"], "data_mac": g.nodes[host]["mac"],
                       "admin_url": f"http://{host}", "capacity": 100})


def fill(agent: FakeAgent, block: Block, count: int, stride: int) -> None:
    """`count` keys spread over `block` at IDs `stride` apart."""
    for i in range(count):
        agent.keys[block.first + i * stride] = b"v"


def check_routing(core, switches, samples: int = 300) -> None:
    """Every sampled ID, from every client, reaches its owner through what the switches hold."""
    net = FakeNetwork(core.planner.fabric, switches.tables)
    rng = random.Random(1)
    clients = [h for h, d in core.graph.nodes(data=True) if d.get("role") == "client"]
    for ident in [SPACE.first, SPACE.last] + [rng.randrange(SPACE.first, SPACE.last) for _ in range(samples)]:
        owner = core.tree.owner(ident)
        for client in clients:
            delivered = net.forward(client, ident)
            assert delivered.host == owner, (client, SPACE.address(ident), delivered)
            assert delivered.dl_dst == core.servers[owner].data_mac


def test_build_waits_for_every_server_then_programs_every_switch(world):
    g, core, switches, agents, _ = world
    register_all(g, core)
    assert not core.build() and core.missing()  # servers not located yet
    discover(g, core)
    assert core.build()
    busy = core.tree.leaves_in(State.BUSY)
    assert len(busy) == 4  # pre-allocation: half the servers
    assert {a.name for a in agents.values() if a.owned} == set(busy)
    assert set(switches.tables) == {d["dpid"] for _, d in g.nodes(data=True) if d["kind"] == "switch"}
    check_routing(core, switches)
    assert switches.host_routes == host_routes(core.graph)


def test_split_moves_keys_and_entries_together(built):
    g, core, switches, agents, _ = built
    name = core.tree.leaves_in(State.BUSY)[0]
    agent = agents[f"http://{name}"]
    rng = random.Random(2)
    blocks = core.tree.blocks(name)
    for _ in range(150):
        block = rng.choice(blocks)
        agent.keys[rng.randrange(block.first, block.last + 1)] = b"v"
    core.heartbeat(name, {"keys": len(agent.keys)})
    assert core.due_for_split() == [name]
    record = core.split(name)
    target = agents[f"http://{record['target']}"]
    assert 0.4 * 150 <= len(target.keys) <= 0.6 * 150
    assert len(agent.keys) + len(target.keys) == 150
    for ident in list(agent.keys) + list(target.keys):
        owner = core.tree.owner(ident)
        assert ident in agents[f"http://{owner}"].keys
    check_routing(core, switches)
    assert record["switches"] >= 1 and core.splits == [record]


def test_a_failed_flow_push_aborts_the_migration_and_restores_entries(built):
    g, core, switches, agents, _ = built
    name = core.tree.leaves_in(State.BUSY)[0]
    agent = agents[f"http://{name}"]
    fill(agent, core.tree.blocks(name)[0], 120, 977)
    before = {d: dict(t) for d, t in switches.tables.items()}
    switches.fail_next_apply = True
    result = core.split(name)
    assert result["event"] == "split-aborted"
    assert agent.migrations == {} and len(agent.keys) == 120
    assert switches.tables == before
    check_routing(core, switches)


def test_missing_heartbeats_hand_blocks_to_an_idle_server_and_say_data_is_lost(built):
    g, core, switches, agents, clock = built
    victim = core.tree.leaves_in(State.BUSY)[0]
    blocks = core.tree.blocks(victim)
    agents[f"http://{victim}"].alive = False  # the whole server died, agent included
    clock[0] = 3.0
    for name in core.servers:
        if name != victim:
            core.heartbeat(name, {"keys": 0})
    clock[0] = 7.0
    core.check_heartbeats()
    assert core.servers[victim].failed.startswith("no heartbeat")
    successor = core.tree.owner(blocks[0].first)
    assert successor != victim and core.tree.state(victim) is State.FAILED
    assert set(blocks) <= set(agents[f"http://{successor}"].owned)
    assert core.lost and core.lost[0]["server"] == victim
    assert any(e["event"] == "DATA-LOST" for e in core.events)
    check_routing(core, switches)


def test_edge_port_down_moves_the_data_of_a_still_reachable_server(built):
    g, core, switches, agents, _ = built
    victim = core.tree.leaves_in(State.BUSY)[1]
    agent = agents[f"http://{victim}"]
    fill(agent, core.tree.blocks(victim)[0], 50, 7919)
    host = core.hosts[core.servers[victim].data_ip]
    core.port_down(host.dpid, host.port)
    assert core.servers[victim].failed and core.tree.state(victim) is State.FAILED
    assert agent.keys == {} and sum(len(a.keys) for a in agents.values()) == 50
    assert not core.lost and any(e["event"] == "takeover" and e["salvaged"] for e in core.events)
    check_routing(core, switches)


def test_reconnecting_switch_gets_its_table_back_unchanged(built):
    g, core, switches, agents, _ = built
    dpid = next(iter(switches.tables))
    table = dict(switches.tables[dpid])
    partition = core.tree.partition()
    switches.tables[dpid] = {}
    core.switch_down(dpid)
    core.switch_up(dpid)
    assert switches.tables[dpid] == table and core.tree.partition() == partition


def test_restarted_controller_rebuilds_ownership_from_the_agents(built):
    g, core, switches, agents, clock = built
    partition = sorted(core.tree.partition())
    fresh = MetaFlowCore(SPACE, FakeSwitches(), agents.__getitem__, capacity=100, clock=lambda: clock[0])
    for host in storage_hosts(g):
        agent = agents[f"http://{host}"]
        fresh.register({"name": host, "data_ip": g.nodes[host]["ip"], "data_mac": g.nodes[host]["mac"],
                        "admin_url": f"http://{host}", "owned": [str(b) for b in agent.owned]})
    discover(g, fresh)
    owned_before = {a.name: list(a.owned) for a in agents.values()}
    assert fresh.build()
    assert sorted(fresh.tree.partition()) == partition
    assert {a.name: a.owned for a in agents.values()} == owned_before  # nobody was told to own anything
    check_routing(fresh, fresh.switches)
