"""A new rack in a running fabric (`topology.grow`), pure.

A builder topology is built without one of its racks: an edge switch and
its servers absent, a whole pod absent, or an edge switch present but with
only clients under it. The tree is bootstrapped and split at random, then
grown by the whole topology. After the growth: the tree has exactly the
shape a build of the whole topology maps (so a restarted controller
rebuilds the same one), the grown fabric is the one a build maps, every
switch that was there keeps its table entry for entry (only the new groups'
switches get a table), every ID is routed to its one owner, and blocks
moved onto the new servers are routed there too.

Then the controller on fake switches and agents (`controller_world`): a
rack plugged in after the build joins (no `server-not-joined`), a split
lands on it, nothing acknowledged is lost; the new switch disconnecting
mid-push, a controller restarted after the growth, and a rack discovered
only in part.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from typing import Any

import networkx as nx
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from sortedcontainers import SortedList

from btree.bootstrap import Bootstrap
from btree.flows import FlowPlanner
from btree.split import SplitBounds, apply_split, plan_split
from btree.tree import LogicalBTree, State, TreeError
from client_lib.api.rest import Outcome
from client_lib.constants import UPRULE_PRIORITY
from controller.ofmsgs import installed
from controller.steps import LinkUp, ReadFlows, SendFlows, SplitNow, Step, SwitchDown, SwitchUp
from tests.unit.controller_world import ControllerKilled, World, check_consistent, fill
from tests.unit.test_merge import check_routed
from tests.unit.test_tree_split import SPACE
from topology.builders import Topology, fat_tree, port, three_tier, two_tier
from topology.classify import ROOT, TopologyError, build_fabric, build_tree, classify
from topology.grow import grow

TOPOLOGIES: dict[str, Callable[[], Topology]] = {
    "fat4": lambda: fat_tree(4),
    "three": lambda: three_tier(core=1, agg=2, edges=4, servers_per_edge=3, clients_per_edge=1),
    "three_up2": lambda: three_tier(core=2, agg=4, edges=4, servers_per_edge=2, edge_uplinks=2),
    "two": lambda: two_tier(core=2, edges=4, servers_per_edge=3, clients_per_edge=1),
}
VARIANTS = ("new-edge", "new-pod", "client-edge")


def storage_edges(g: Topology) -> list[str]:
    """Edge switches with storage servers, in dpid order."""
    c = classify(g)
    return sorted({next(iter(g.adj[h])) for h in c.storage}, key=lambda s: g.nodes[s]["dpid"])


def without_rack(g: Topology, variant: str, pick: int) -> tuple[Topology, str]:
    """`g` as it was before the rack `pick` chose came online, and that rack's edge switch."""
    edges = storage_edges(g)
    edge = edges[pick % len(edges)]
    before = g.copy()
    hosts = [h for h in g.adj[edge] if g.nodes[h]["kind"] == "host"]
    if variant == "client-edge":
        for h in hosts:
            before.nodes[h]["role"] = "client"
        return before, edge
    gone = {edge, *hosts}
    if variant == "new-pod":
        c = classify(g)
        pod = next(p for p in c.pods if edge in p)
        if len(c.groups) - 1 <= len([gid for gid in c.groups if all(s in pod for s in c.groups[gid])]):
            return before, ""   # the pod is the whole storage tree: nothing would be left
        gone = set(pod) | {h for s in pod for h in g.adj[s] if g.nodes[h]["kind"] == "host"}
    before.remove_nodes_from(gone)
    return before, edge


def shape(tree: LogicalBTree) -> dict[str, list[str]]:
    return {node: tree.children(node) for node in tree.inner_nodes()}


@settings(max_examples=40, deadline=None)
@given(name=st.sampled_from(sorted(TOPOLOGIES)), variant=st.sampled_from(VARIANTS),
       pick=st.integers(0, 50), seed=st.integers(0, 2**32 - 1), splits=st.integers(0, 12))
def test_a_tree_grown_by_a_rack_is_the_tree_of_the_whole_fabric_and_routes_every_id(
        name: str, variant: str, pick: int, seed: int, splits: int) -> None:
    whole = TOPOLOGIES[name]()
    before, edge = without_rack(whole, variant, pick)
    if not edge:
        return
    rng = random.Random(seed)
    c = classify(before)
    tree = build_tree(c, SPACE)
    fabric = build_fabric(c)
    tree.bootstrap_preallocate(rng.randint(1, max(1, len(tree.leaves()) // 2)))
    planner = FlowPlanner(tree, fabric)
    keys: SortedList[int] = SortedList(rng.randrange(SPACE.first, SPACE.last) for _ in range(400))

    def oracle(_leaf: str, first: int, last: int) -> int:
        return keys.bisect_right(last) - keys.bisect_left(first)

    for _ in range(splits):
        plan = plan_split(tree, rng.choice(tree.leaves_in(State.BUSY)), oracle, SplitBounds(),
                          "aligned", planner.cost_of)
        if plan.ok:
            planner.update(apply_split(tree, plan))
    tables = planner.tables()

    growth = grow(tree, fabric, whole)
    growth.apply(tree)
    for leaf, group in growth.leaves:
        tree.join(leaf, group)
    switches = planner.extend(growth.fabric)

    mapped = classify(whole)
    assert shape(tree) == shape(build_tree(mapped, SPACE))   # what a restarted controller maps
    assert growth.fabric.switches == build_fabric(mapped).switches
    assert {leaf for leaf, _ in growth.leaves} == set(mapped.storage) - set(c.storage)
    assert tree.parent(next(h for h in whole.adj[edge] if whole.nodes[h]["kind"] == "host")) \
        == mapped.group_of[edge]
    after = planner.tables()
    assert {d: t for d, t in after.items() if d in tables} == tables   # nothing new above the rack
    new_groups = {g for g, _, _ in growth.groups}
    assert whole.nodes[edge]["dpid"] in switches
    assert switches == sorted(d for d, sw in growth.fabric.switches.items()
                              if sw.group in new_groups or d not in fabric.switches)
    tree.check()
    check_routed(planner)

    newcomers = [leaf for leaf, _ in growth.leaves]
    for target in rng.sample(newcomers, min(3, len(newcomers))):   # blocks land on the new rack
        block, _ = rng.choice(tree.partition())
        piece = block if block.plen == SPACE.width else block.halves()[rng.randrange(2)]
        planner.update(tree.transfer([piece], target))
        assert tree.owner(piece.first) == target
    assert planner.tables() == FlowPlanner(tree, growth.fabric).tables()
    tree.check()
    check_routed(planner)


def test_what_is_not_a_new_rack_is_refused_with_the_reason() -> None:
    whole = fat_tree(4, servers=8)   # pods 0 and 1 hold the servers
    c = classify(whole)
    tree, fabric = build_tree(c, SPACE), build_fabric(c)
    tree.bootstrap_organic()
    with pytest.raises(TopologyError, match="no new switch group"):
        grow(tree, fabric, whole)
    half = whole.copy()   # a rack linked to one of its pod's two aggregation switches only
    edge = "p2e0"
    half.nodes["p2e0h0"]["role"] = "storage"
    half.remove_edge(edge, "p2a1")
    with pytest.raises(TopologyError, match="not a new rack|overlapping|one parent"):
        grow(tree, fabric, half)
    deeper = whole.copy()   # a server hanging off an aggregation switch
    deeper.add_node("odd", kind="host", role="storage", ip="10.9.9.9", mac="02:00:00:09:09:09")
    deeper.add_edge("odd", "p2a0", ports={"odd": 0, "p2a0": 9})
    with pytest.raises(TopologyError, match="different depths"):
        grow(tree, fabric, deeper)


def test_a_switch_joining_a_built_group_is_not_a_rack() -> None:
    """A third spine beside the two a leaf-spine fabric was built with would
    change every edge switch's uplinks (their up-rules): refused."""
    whole = two_tier(core=3, edges=3, servers_per_edge=2)
    before = whole.copy()
    before.remove_node(min((s for s, d in whole.nodes(data=True) if d.get("layer") == "core"),
                           key=lambda s: -whole.nodes[s]["dpid"]))
    c = classify(before)
    tree, fabric = build_tree(c, SPACE), build_fabric(c)
    with pytest.raises(TopologyError, match="root|now switches"):
        grow(tree, fabric, whole)


def test_join_group_places_the_group_where_asked_and_only_above_servers() -> None:
    tree = LogicalBTree(SPACE, ROOT, {ROOT: ["e1", "e3"], "e1": ["a"], "e3": ["b"]})
    tree.join_group("e2", ROOT, 1)
    assert tree.children(ROOT) == ["e1", "e2", "e3"]
    with pytest.raises(TreeError, match="servers below"):
        tree.join_group("x", "e1")
    with pytest.raises(TreeError, match="no place"):
        tree.join_group("e4", ROOT, 7)
    tree.join("c", "e2")
    assert tree.leaves() == ["a", "b", "c"] and tree.path("c") == (ROOT, "e2", "c")


def test_the_grown_fabric_keeps_clients_and_takes_servers_seen_as_clients() -> None:
    """A host the built fabric knew as a client, under the switch that becomes
    a rack, is a server now (its port is the same); other hosts stay."""
    whole = fat_tree(4, servers=10)   # p2e0 holds two servers
    before = whole.copy()
    for h in ("p2e0h0", "p2e0h1"):
        before.nodes[h]["role"] = "client"
    nx.relabel_nodes(before, {"p2e0h0": "old-name"}, copy=False)   # as the controller names a client
    before.edges["p2e0", "old-name"]["ports"] = {"p2e0": port(whole, "p2e0", "p2e0h0"), "old-name": 0}
    c = classify(before)
    tree, fabric = build_tree(c, SPACE), build_fabric(c)
    growth = grow(tree, fabric, whole)
    assert "old-name" not in growth.fabric.hosts and growth.fabric.hosts["p2e0h0"] == fabric.hosts["old-name"]
    assert set(fabric.hosts) - {"old-name"} <= set(growth.fabric.hosts)
    assert {g for g, _, _ in growth.groups} == set(classify(whole).groups) - set(tree.inner_nodes())


# -- the controller: a rack plugged into a running fabric ----------------------------------


def unplugged(graph: Topology, switches: list[str], **settings: Any) -> World:
    """A world whose `switches` (and the servers under them) are not there
    when the controller builds the network."""
    world = World(graph, **settings)
    world.offline = set(switches)
    for name, agent in world.agents.items():
        if set(graph.adj[name]) & world.offline:
            agent.dead = True
    world.boot()
    return world


def settle(world: World, ticks: int = 3) -> None:
    for _ in range(ticks):
        world.advance(world.settings.settle_s)
        world.heartbeats()
        world.tick()


def events(world: World, kind: str) -> list[dict[str, Any]]:
    return [e for e in world.core.events if e["event"] == kind]


def programmed(world: World, dpid: int) -> bool:
    """The switch holds exactly the table the planner wants for it (not empty)."""
    planner = world.core.planner
    assert planner is not None
    want = planner.table(dpid)
    return bool(want) and installed(world.switches[dpid].stats())[0] == want


def metaflow(flows: dict[Any, Any]) -> dict[Any, tuple[int, list[Any]]]:
    return {k: (f.priority, f.actions) for k, f in flows.items() if k[0] >= UPRULE_PRIORITY}


def split_onto(world: World, name: str, rack: set[str], acked: dict[int, bytes]) -> str:
    """Fill `name` and split it; the target (asserted to be in `rack`)."""
    acked.update(fill(world, name, 60, seed=len(acked)))
    outcome = world.ask(SplitNow, name=name)
    assert isinstance(outcome, Outcome) and outcome.ok, outcome
    target = outcome.detail["target"]
    assert target in rack, (target, rack)
    return str(target)


@pytest.fixture(params=[1, 2], ids=["r1", "r2"])
def replicas(request: pytest.FixtureRequest) -> int:
    return int(request.param)


def test_a_new_edge_switch_in_a_pod_joins_its_servers_and_a_split_lands_there(replicas: int) -> None:
    """p1e1 and its two servers come online after the build, under pod 1:
    a new edge group below pod 1's aggregation group, its servers idle
    leaves, only p1e1 programmed; the next split from pod 1 lands there."""
    world = unplugged(fat_tree(4, servers=8), ["p1e1"], replicas=replicas)
    tree = world.tree
    before = {dpid: dict(s.flows) for dpid, s in world.switches.items()}
    rack = set(world.plug(["p1e1"]))
    assert rack == {"p1e1h0", "p1e1h1"}
    settle(world)
    assert not events(world, "server-not-joined")
    (added,) = events(world, "rack-added")
    new_dpid = world.graph.nodes["p1e1"]["dpid"]
    assert added["switches"] == [new_dpid] and added["servers"] == ["p1e1h0", "p1e1h1"]
    group = f"edge-{new_dpid}"
    assert tree.children(group) == ["p1e1h0", "p1e1h1"] and tree.parent(group) == tree.parent("edge-"
                                                                                             f"{world.graph.nodes['p1e0']['dpid']}")
    assert all(tree.state(s) is State.IDLE for s in rack)
    assert programmed(world, new_dpid)   # its up-rules: its group owns nothing yet
    for dpid, flows in before.items():   # the MetaFlow entries elsewhere are untouched
        if dpid != new_dpid:
            assert metaflow(world.switches[dpid].flows) == metaflow(flows)
    busy = next(s for s in ("p1e0h0", "p1e0h1") if tree.state(s) is State.BUSY)
    acked: dict[int, bytes] = {}
    first = split_onto(world, busy, {"p1e0h0", "p1e0h1"}, acked)   # the idle one beside it first
    assert first != busy
    split_onto(world, busy, rack, acked)                              # then the new rack, the nearest
    check_consistent(world, acked)


def test_a_new_pod_grows_the_tree_under_the_root_and_placement_spreads_onto_it() -> None:
    """Pod 2 (both aggregation switches, both edges, two servers) comes
    online: a new aggregation group under the root with one edge group (the
    other edge has only clients); every server built in is busy, so the next
    split must land in the new pod, and its backup goes to another rack."""
    graph = fat_tree(4, servers=10)
    pod = ["p2a0", "p2a1", "p2e0", "p2e1"]
    world = unplugged(graph, pod, replicas=2, bootstrap=Bootstrap("preallocate", 8))
    tree = world.tree
    assert not tree.leaves_in(State.IDLE)
    rack = set(world.plug(pod))
    settle(world)
    (added,) = events(world, "rack-added")
    dpid = {s: graph.nodes[s]["dpid"] for s in pod}
    assert added["groups"] == [f"agg-{dpid['p2a0']}", f"edge-{dpid['p2e0']}"]
    assert sorted(added["switches"]) == sorted(dpid.values())   # p2e1 too: a client switch, up-rules
    assert tree.parent(f"agg-{dpid['p2a0']}") == tree.root
    acked: dict[int, bytes] = {}
    target = split_onto(world, tree.leaves_in(State.BUSY)[0], rack, acked)
    sets = world.core.world.replicas_or_raise().of(target)
    assert sets and all(len({tree.parent(m) for m in s.members}) == len(s.members) for s in sets.values())
    check_consistent(world, acked)


def test_the_new_switch_disconnecting_mid_push_is_programmed_when_it_comes_back() -> None:
    world = unplugged(fat_tree(4, servers=8), ["p1e1"], replicas=2)
    new_dpid = world.graph.nodes["p1e1"]["dpid"]

    def lost(step: Step) -> str | None:
        return "unreachable" if isinstance(step, (ReadFlows, SendFlows)) and step.dpid == new_dpid else None

    world.inject = lost
    rack = set(world.plug(["p1e1"]))
    settle(world)
    assert events(world, "rack-added") and events(world, "resync-incomplete")
    assert not installed(world.switches[new_dpid].stats())[0]
    world.inject = lambda step: None
    world.post(SwitchDown(new_dpid))
    world.post(SwitchUp(new_dpid))
    world.run()
    assert programmed(world, new_dpid)
    busy = next(s for s in ("p1e0h0", "p1e0h1") if world.tree.state(s) is State.BUSY)
    acked: dict[int, bytes] = {}
    split_onto(world, busy, {"p1e0h0", "p1e0h1"}, acked)
    split_onto(world, busy, rack, acked)
    check_consistent(world, acked)


def test_a_controller_restarted_after_the_growth_rebuilds_the_same_tree_from_the_claims() -> None:
    world = unplugged(fat_tree(4, servers=10), ["p2a0", "p2a1", "p2e0", "p2e1"], replicas=2,
                      bootstrap=Bootstrap("preallocate", 8))
    rack = set(world.plug(["p2a0", "p2a1", "p2e0", "p2e1"]))
    settle(world)
    acked: dict[int, bytes] = {}
    split_onto(world, world.tree.leaves_in(State.BUSY)[0], rack, acked)
    old = world.tree
    sets = {b: s.members for b, s in world.core.world.replicas_or_raise().sets.items()}
    world.new_core()
    world.boot()
    assert shape(world.tree) == shape(old)
    assert world.tree.partition() == old.partition()
    assert {b: s.members for b, s in world.core.world.replicas_or_raise().sets.items()} == sets
    assert not events(world, "rack-added")   # mapped whole, as a build
    check_consistent(world, acked)


def test_a_rack_that_is_not_a_growth_is_said_once_and_joins_when_the_fabric_is_whole() -> None:
    """p1e1 linked to only one of its pod's aggregation switches at first:
    not a tree of groups; once its second link is up, it joins."""
    graph = fat_tree(4, servers=8)
    world = unplugged(graph, ["p1e1"])
    missing = graph.edges["p1e1", "p1a1"]["ports"]
    graph.remove_edge("p1e1", "p1a1")
    rack = set(world.plug(["p1e1"]))
    settle(world)
    settle(world)
    (said,) = [e for e in events(world, "server-not-joined") if e["server"] == "p1e1h0"]
    assert "restart" in said["why"] or "overlapping" in said["why"] or "parent" in said["why"]
    assert not events(world, "rack-added") and not rack & set(world.tree.leaves())
    graph.add_edge("p1e1", "p1a1", ports=missing)
    world.post(LinkUp(graph.nodes["p1e1"]["dpid"], missing["p1e1"], graph.nodes["p1a1"]["dpid"],
                      missing["p1a1"]))
    world.run()
    settle(world)
    assert events(world, "rack-added") and rack <= set(world.tree.leaves())
    check_consistent(world, {})


def test_servers_under_an_edge_switch_that_had_only_clients_grow_it_into_a_rack() -> None:
    """The issue's case: p1e1 was connected at the build but none of its
    servers was running, so it was mapped as a client switch (up-rules
    only); when they start, it becomes a rack without a controller restart."""
    graph = fat_tree(4, servers=8)
    world = World(graph, replicas=2)
    rack = ["p1e1h0", "p1e1h1"]
    for name in rack:
        world.agents[name].dead = True
        world.cut(name)
    world.boot()
    dpid = graph.nodes["p1e1"]["dpid"]
    assert world.core.planner is not None and world.core.planner.fabric.switches[dpid].group is None
    for name in rack:
        world.agents[name].dead = False
        world.reconnect(name)
        world.register(world.agents[name])
    settle(world)
    assert not events(world, "server-not-joined")
    (added,) = events(world, "rack-added")
    assert added["switches"] == [dpid] and world.tree.children(f"edge-{dpid}") == rack
    assert programmed(world, dpid)
    busy = next(s for s in ("p1e0h0", "p1e0h1") if world.tree.state(s) is State.BUSY)
    acked: dict[int, bytes] = {}
    split_onto(world, busy, {"p1e0h0", "p1e0h1"}, acked)
    split_onto(world, busy, set(rack), acked)
    check_consistent(world, acked)


def test_a_controller_killed_in_the_middle_of_the_push_maps_the_rack_at_its_rebuild() -> None:
    """Killed right after the growth, at the first flows sent to the new
    switch (its table not all there): the next controller maps the whole
    fabric, the rack included, and programs it."""
    world = unplugged(fat_tree(4, servers=8), ["p1e1"], replicas=2)
    new_dpid = world.graph.nodes["p1e1"]["dpid"]
    rack = set(world.plug(["p1e1"]))
    world.inject = lambda step: "kill" if isinstance(step, SendFlows) and step.dpid == new_dpid else None
    with pytest.raises(ControllerKilled):
        settle(world)
    world.inject = lambda step: None
    world.new_core()
    world.boot()
    assert rack <= set(world.tree.leaves()) and programmed(world, new_dpid)
    busy = next(s for s in ("p1e0h0", "p1e0h1") if world.tree.state(s) is State.BUSY)
    acked: dict[int, bytes] = {}
    split_onto(world, busy, {"p1e0h0", "p1e0h1"}, acked)
    split_onto(world, busy, rack, acked)
    check_consistent(world, acked)
