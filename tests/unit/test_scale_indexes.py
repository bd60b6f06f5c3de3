"""The indexes and incremental updates that keep the decision thread's
per-event work independent of the fabric's size (issue 26,
docs/decision-thread.md) answer exactly what the straightforward
computations they replaced answered."""

from __future__ import annotations

import hashlib
from typing import Any

import networkx as nx
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from client_lib.api.rest import Registration
from client_lib.cidr import Block
from client_lib.errors import Conflict
from controller.build import _Disjoint, uncovered
from controller.inventory import Host, Inventory
from controller.ofmsgs import installed
from controller.registry import Registry
from controller.routing import Routes, host_routes, mode_routes, switch_adjacency
from controller.steps import LinkDown, SendFlows
from tests.unit.controller_world import World
from topology.builders import client_hosts, fat_tree, port, three_tier, two_tier
from topology.classify import hop_distances

SPACE = Block.parse("100.64.0.0/10")
DPIDS = st.integers(1, 4)
PORTS = st.integers(1, 4)
IPS = st.sampled_from([f"10.0.0.{i}" for i in range(1, 7)])

inventory_ops = st.one_of(
    st.tuples(st.just("switch_up"), DPIDS),
    st.tuples(st.just("switch_down"), DPIDS),
    st.tuples(st.just("link_up"), DPIDS, PORTS, DPIDS, PORTS),
    st.tuples(st.just("link_down"), DPIDS, PORTS, DPIDS, PORTS),
    st.tuples(st.just("learn"), IPS, DPIDS, PORTS),
    st.tuples(st.just("forget"), DPIDS, PORTS),
    st.tuples(st.just("port_down"), DPIDS, PORTS),
    st.tuples(st.just("port_up"), DPIDS, PORTS),
)


def _apply(inv: Inventory, op: tuple[Any, ...]) -> object:
    name, *args = op
    if name == "switch_up":
        inv.switch_up(args[0], ports=(1, 2, 3, 4))
        return None
    if name == "learn":
        ip, dpid, port = args
        return inv.learn(ip, "02:00:00:00:00:01", dpid, port)
    if name == "forget":
        return inv.forget_hosts_at(((args[0], args[1]),))
    return getattr(inv, name)(*args)


def _host_at(inv: Inventory, dpid: int, port: int) -> Host | None:
    return next((h for h in inv.hosts.values() if (h.dpid, h.port) == (dpid, port)), None)


def _is_link_port(inv: Inventory, dpid: int, port: int) -> bool:
    return any((dpid, port) in ((a, pa), (b, pb)) for a, pa, b, pb in inv.links)


def _fabric(inv: Inventory) -> tuple[object, ...]:
    return frozenset(inv.dpids), frozenset(inv.links), tuple(sorted(inv.hosts.items()))


@settings(max_examples=150, deadline=None)
@given(st.lists(inventory_ops, max_size=40))
def test_the_inventory_indexes_agree_with_a_scan_after_any_history(ops: list[tuple[Any, ...]]) -> None:
    inv = Inventory(SPACE, "10.255.255.254")
    for op in ops:
        before, version = _fabric(inv), inv.version
        if op[0] == "forget":
            expected = [h for h in inv.hosts.values() if (h.dpid, h.port) == op[1:]]
            assert _apply(inv, op) == expected
        else:
            _apply(inv, op)
        # what the core's graph is made of never changes without the version
        # (a change of nothing may move it too: the core then only recomputes more)
        assert inv.version != version or _fabric(inv) == before
        if op[0] in ("learn", "forget", "link_up", "link_down", "port_down", "port_up"):
            assert (inv.version != version) == (_fabric(inv) != before)
        for dpid in range(1, 5):
            for number in range(1, 5):
                assert inv.host_at(dpid, number) == _host_at(inv, dpid, number)
                assert inv.is_link_port(dpid, number) == _is_link_port(inv, dpid, number)
        skip = inv.down_ports | {end for a, pa, b, pb in inv.links for end in ((a, pa), (b, pb))}
        assert inv.edge_ports() == sorted((d, p) for d in inv.dpids for p in inv.ports.get(d, ())
                                          if (d, p) not in skip)


def _registration(name: str, ip: str, url: str) -> Registration:
    return Registration(name, ip, "02:00:00:00:00:01", 9000, url, "fake", 100, SPACE, [], "")


@settings(max_examples=100, deadline=None)
@given(st.lists(st.tuples(st.sampled_from("abcd"), IPS, st.sampled_from(["u1", "u2", "u3"])), max_size=20))
def test_the_registry_finds_a_server_by_address_and_refuses_a_taken_one_as_a_scan_would(
        regs: list[tuple[str, str, str]]) -> None:
    registry = Registry(SPACE)
    for name, ip, url in regs:
        owner = next((s.name for s in registry.servers.values()
                      if s.name != name and (s.data_ip == ip or s.admin_url == url)), None)
        known = registry.servers.get(name)
        try:
            registry.register(_registration(name, ip, url), 0.0)
        except Conflict as refused:
            assert (known is not None and known.identity()[::2] != (ip, url)) or \
                (owner is not None and str(refused).endswith(f"belongs to {owner}"))
        else:
            assert owner is None
        for address in {ip for _, ip, _ in regs}:
            found = registry.by_ip(address)
            assert found == next((s for s in registry.servers.values() if s.data_ip == address), None)


def _routes_host_by_host(g: nx.Graph) -> Routes:
    """The routes as they were found before issue 26: one breadth-first search
    per host, every next hop hashed again per switch."""
    adjacency = switch_adjacency(g)
    routes: Routes = {g.nodes[s]["dpid"]: {} for s in adjacency}
    for host, data in g.nodes(data=True):
        if data.get("kind") != "host" or not data.get("ip"):
            continue
        (edge,) = [n for n in g.neighbors(host) if g.nodes[n].get("kind") == "switch"]
        routes[g.nodes[edge]["dpid"]][data["ip"]] = port(g, edge, host)
        distance = hop_distances(adjacency, [edge])
        for switch, dist in distance.items():
            if switch != edge:
                closer = sorted(n for n in adjacency[switch] if distance.get(n) == dist - 1)
                digest = hashlib.blake2b(data["ip"].encode(), digest_size=4).digest()
                choice = closer[int.from_bytes(digest, "big") % len(closer)]
                routes[g.nodes[switch]["dpid"]][data["ip"]] = port(g, switch, choice)
    return routes


@pytest.mark.parametrize("graph", [fat_tree(4), fat_tree(6, servers=20, placement="spread"),
                                   three_tier(), two_tier()], ids=["k4", "k6", "three-tier", "two-tier"])
def test_routes_found_once_per_edge_switch_are_the_routes_found_host_by_host(graph: nx.Graph) -> None:
    assert host_routes(graph) == _routes_host_by_host(graph)


def _tables_agree(world: World) -> None:
    core = world.core
    assert core.world.routes == mode_routes(core.graph_now(), "full")
    for dpid, switch in world.switches.items():
        assert installed(switch.stats()).routes == core.world.routes.get(dpid, {})


def test_a_host_located_after_the_build_gets_the_routes_a_full_recomputation_gives() -> None:
    """One host at a time is routed by itself (`_route_one`); a host that
    moves, and one located after a link changed, too: the controller's routes
    and every switch's table end as if every route had been computed again."""
    g = fat_tree(4, servers=8)
    world = World(g)
    world.boot()
    clients = client_hosts(g)
    graph = world.core.graph
    for i, client in enumerate(clients[:3]):   # new addresses where clients sit
        world.arp(client, ip=f"10.9.0.{i + 1}", mac=f"02:00:00:09:00:{i + 1:02x}")
        world.run()
        assert world.core.graph is graph   # routed by itself, the graph not made again
        _tables_agree(world)
    moved, to = clients[0], clients[5]
    world.cut(to)   # a port that goes down frees it for the host to move to
    world.run()
    world.reconnect(to)
    world.arp(to, ip="10.9.0.1", mac="02:00:00:09:00:01")   # the first new host, elsewhere now
    world.run()
    _tables_agree(world)
    assert world.core.graph is graph
    core, agg = g.nodes["c0"]["dpid"], g.nodes["p0a0"]["dpid"]
    world.post(LinkDown(core, port(g, "c0", "p0a0"), agg, port(g, "p0a0", "c0")))
    world.run()
    world.arp(moved, ip="10.9.0.9", mac="02:00:00:09:00:09")   # after a change: every route again
    world.run()
    now = world.core.graph
    assert now is not None and now is not graph and not now.has_edge(f"s{core}", f"s{agg}")
    _tables_agree(world)


def test_a_build_resyncs_in_batches_and_a_failed_batch_stops_none_after_it(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Batches of 4 switches (k=4 has 20): each batch's messages are computed
    in the event that confirms the batch before, so the decision thread
    handles other events between them; one switch's lost barrier in the
    first batch is said, and every other switch still gets its whole table."""
    monkeypatch.setattr("controller.world.RESYNC_BATCH", 4)
    world = World(fat_tree(4, servers=8))
    lost: set[int] = set()
    batches: list[int] = []
    handle = world.core.handle

    def counted(event: Any) -> list[Any]:
        steps = handle(event)
        tables = [s for s in steps if isinstance(s, SendFlows) and len(s.messages) > 3]   # not base flows
        if tables:
            batches.append(len(tables))
        return steps

    def first_table_lost(step: object) -> str | None:
        if isinstance(step, SendFlows) and len(step.messages) > 3 and not lost:
            lost.add(step.dpid)
            return "barrier timeout, not applied"
        return None

    world.core.handle = counted  # type: ignore[method-assign]
    world.inject = first_table_lost
    world.boot()
    assert batches == [4, 4, 4, 4, 4]
    assert any(e["event"] == "resync-incomplete" for e in world.core.events)
    assert {dpid for dpid, s in world.switches.items() if len(s.flows) == 3} == lost


@settings(max_examples=150, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 6), st.integers(0, 63)), max_size=30))
def test_accepted_claims_found_by_bisection_are_those_a_scan_finds(claims: list[tuple[int, int]]) -> None:
    """`build._Disjoint`, as `restore` fills it: each claim keeps what the
    accepted ones leave uncovered, and the accepted ones it overlaps are those
    that cover it or that it covers."""
    space = Block.parse("10.0.0.0/26")
    accepted: list[Block] = []
    taken = _Disjoint()
    for depth, index in claims:
        size = space.size >> depth
        block = Block(space.first + (index * size) % space.size, space.plen + depth)
        expected = [b for b in accepted if b.covers(block) or block.covers(b)]
        found = taken.overlapping(block)
        assert sorted(found) == sorted(expected)
        pieces = uncovered(block, found)
        accepted += pieces
        taken.add(pieces)
