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
"""

from __future__ import annotations

import random
from collections.abc import Callable

import networkx as nx
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from sortedcontainers import SortedList

from btree.flows import FlowPlanner
from btree.split import SplitBounds, apply_split, plan_split
from btree.tree import LogicalBTree, State, TreeError
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
    assert switches == sorted(d for d, sw in growth.fabric.switches.items() if sw.group in new_groups)
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
