"""Tests for topology.classify: layers, pods and groups inferred from the shape alone.

The builders' `layer` and `pod` node attributes are the ground truth; the
classifier must find the same structure after node names are replaced by
random ones and dpids are shuffled, and from a graph rebuilt by
`discovered_graph`. Broken topologies must raise TopologyError with a message
that says what is wrong.
"""

from __future__ import annotations

import random
from collections import defaultdict

import networkx as nx
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from btree.fake_network import FakeNetwork, expected_intervals
from btree.flows import FlowPlanner
from client_lib.cidr import Block
from topology.builders import (
    LAYERS,
    attach_app_cluster,
    client_hosts,
    fat_tree,
    storage_hosts,
    switches,
    three_tier,
    two_tier,
)
from topology.classify import (
    ROOT,
    TopologyError,
    build_fabric,
    build_tree,
    classify,
    discovered_graph,
    map_topology,
)

SPACE = Block.parse("100.64.0.0/10")

GRAPHS = {
    "fat4": lambda: fat_tree(4),
    "fat6": lambda: fat_tree(6),
    "fat8": lambda: fat_tree(8),
    "fat4_spread": lambda: fat_tree(4, servers=9, placement="spread"),
    "fat6_packed_2pods": lambda: fat_tree(6, servers=18),
    "three": lambda: three_tier(),
    "three_clients": lambda: three_tier(core=2, agg=4, edges=8, servers_per_edge=3, clients_per_edge=2),
    "three_2blocks": lambda: three_tier(core=2, agg=4, edges=6, servers_per_edge=4, edge_uplinks=2),
    "two": lambda: two_tier(),
    "two_wide": lambda: two_tier(core=4, edges=6, servers_per_edge=2, clients_per_edge=1),
    "fat4_app_core": lambda: attach_app_cluster(fat_tree(4), switches=2, hosts_per_switch=3),
    "three_app_agg": lambda: attach_app_cluster(three_tier(core=2, agg=2, edges=4, servers_per_edge=3),
                                                attach_to="agg"),
    "two_app_edge": lambda: attach_app_cluster(two_tier(), attach_to="edge"),
}
DEPTH = {name: (3 if name.startswith("two") else 4) for name in GRAPHS}


def relabel(g: nx.Graph, mapping: dict) -> nx.Graph:
    """Rename nodes, keeping the `ports` dicts keyed by the new names."""
    h = nx.relabel_nodes(g, mapping, copy=True)
    for _, _, d in h.edges(data=True):
        d["ports"] = {mapping.get(k, k): p for k, p in d["ports"].items()}
    return h


def storage_below(g: nx.Graph, s: str) -> bool:
    """Ground truth from the builders' layers: storage reachable going only down."""
    rank = {layer: i for i, layer in enumerate(LAYERS)}
    seen, stack = {s}, [s]
    while stack:
        node = stack.pop()
        for n in g.adj[node]:
            d = g.nodes[n]
            if d["kind"] == "host":
                if d["role"] == "storage":
                    return True
            elif n not in seen and d["layer"] != "client" and rank[d["layer"]] > rank[g.nodes[node]["layer"]]:
                seen.add(n)
                stack.append(n)
    return False


def builder_pods(g: nx.Graph) -> set[frozenset]:
    by_pod = defaultdict(set)
    for s in switches(g):
        if g.nodes[s]["pod"] is not None:
            by_pod[g.nodes[s]["pod"]].add(s)
    return {frozenset(p) for p in by_pod.values()}


def structure(c, name_of=lambda x: x):
    """Everything about a classification that must not depend on names or dpids."""
    members = {gid: frozenset(name_of(s) for s in ms) for gid, ms in c.groups.items()}
    parent = {}
    for node, p in c.parent.items():
        key = members[node] if node in members else name_of(node)
        parent[key] = members[p]
    return {
        "level": {name_of(s): lv for s, lv in c.level.items()},
        "layer": {name_of(s): layer for s, layer in c.layer.items()},
        "groups": set(members.values()),
        "root": members[ROOT],
        "parent": parent,
        "pods": {frozenset(name_of(s) for s in p) for p in c.pods},
        "storage": {name_of(h) for h in c.storage},
        "depth": c.depth,
        "edge_level": c.edge_level,
    }


# -- ground truth -------------------------------------------------------------------------


@pytest.mark.parametrize("name", sorted(GRAPHS))
def test_layers_pods_groups_match_builders(name):
    g = GRAPHS[name]()
    c = classify(g)
    assert c.depth == DEPTH[name]
    assert set(c.storage) == set(storage_hosts(g))
    for s in switches(g):
        want = g.nodes[s]["layer"] if storage_below(g, s) else "client"
        assert c.layer[s] == want, (s, c.layer[s], want)
        assert (s in c.group_of) == (want != "client")
    # levels follow layers
    level_of = {"core": 0, "agg": 1, "edge": c.edge_level}
    for s in switches(g):
        if c.layer[s] != "client":
            assert c.level[s] == level_of[c.layer[s]]
    # the root group is every core switch
    assert set(c.groups[ROOT]) == {s for s in switches(g) if g.nodes[s]["layer"] == "core"}
    # edges are groups of one; aggregation switches group by pod / aggregation block
    for s in switches(g):
        if c.layer[s] == "edge":
            assert c.groups[c.group_of[s]] == (s,)
    aggs = defaultdict(set)
    for s in switches(g):
        if c.layer[s] == "agg":
            aggs[g.nodes[s]["pod"]].add(s)
    assert {frozenset(v) for v in aggs.values()} == \
        {frozenset(ms) for gid, ms in c.groups.items() if c.layer[ms[0]] == "agg"}
    # parents: host -> its edge's group, edge -> agg group of its pod (or root), agg -> root
    for h in storage_hosts(g):
        (sw,) = g.adj[h]
        assert c.parent[h] == c.group_of[sw]
    for gid, ms in c.groups.items():
        if gid == ROOT:
            assert gid not in c.parent
            continue
        above = {c.group_of[n] for s in ms for n in g.adj[s]
                 if g.nodes[n]["kind"] == "switch" and c.level.get(n) == c.level[s] - 1}
        assert {c.parent[gid]} == above
    # pods: components below the root layer; the builders' `pod` for storage switches
    storage_switches = {s for s in switches(g) if c.layer[s] != "client"}
    got = {frozenset(p) & storage_switches for p in c.pods} - {frozenset()}
    want = {p & storage_switches for p in builder_pods(g)} - {frozenset()}
    assert got == want
    if not any(g.nodes[s]["layer"] == "client" for s in switches(g)):
        assert {frozenset(p) for p in c.pods} == builder_pods(g)


@pytest.mark.parametrize("k", [4, 6, 8])
def test_fat_tree_pod_aggregation_switches_form_one_group(k):
    g = fat_tree(k)
    c = classify(g)
    half = k // 2
    assert len(c.groups) == 1 + k + k * half
    for p in range(k):
        aggs = tuple(f"p{p}a{a}" for a in range(half))
        gid = c.group_of[aggs[0]]
        assert c.groups[gid] == aggs
        assert c.parent[gid] == ROOT
        for e in range(half):
            assert c.parent[c.group_of[f"p{p}e{e}"]] == gid
    assert len(c.groups[ROOT]) == half * half
    children = c.children()
    assert len(children[ROOT]) == k
    assert all(len(children[c.group_of[f"p{p}e0"]]) == half for p in range(k))


def test_tree_and_fabric_shape():
    g = fat_tree(4)
    c, tree, fabric = map_topology(g, SPACE)
    assert tree.root == ROOT
    assert set(tree.leaves()) == set(storage_hosts(g))
    assert set(tree.inner_nodes()) == set(c.groups)
    assert fabric.members() == {gid: sorted(g.nodes[s]["dpid"] for s in ms) for gid, ms in c.groups.items()}
    assert set(fabric.hosts) == set(storage_hosts(g)) | set(client_hosts(g))
    assert fabric.leaf_mac == {h: g.nodes[h]["mac"] for h in storage_hosts(g)}
    for s in switches(g):
        sw = fabric.switches[g.nodes[s]["dpid"]]
        assert sw.layer == c.layer[s]
        ups = sorted(g.edges[s, n]["ports"][s] for n in g.adj[s]
                     if g.nodes[n]["kind"] == "switch" and c.level[n] == c.level[s] - 1)
        assert list(sw.up) == ups
        for child, ports in sw.down.items():
            assert tree.parent(child) == sw.group
            for p in ports:
                kind, where = fabric.peer(sw.dpid, p)
                if kind == "host":
                    assert where == child
                else:
                    peer = next(n for n in g.adj[s] if g.edges[s, n]["ports"][s] == p)
                    assert c.group_of[peer] == child


# -- independence from names and dpids --------------------------------------------------------


def scramble(g: nx.Graph, rng: random.Random) -> tuple[nx.Graph[str], dict[str, str]]:
    names = list(g.nodes)
    fresh = [f"n{rng.getrandbits(40):010x}" for _ in names]
    assert len(set(fresh)) == len(fresh)
    mapping = dict(zip(names, fresh))
    h = relabel(g, mapping)
    sws = [n for n, d in h.nodes(data=True) if d["kind"] == "switch"]
    dpids = [h.nodes[s]["dpid"] for s in sws]
    rng.shuffle(dpids)
    dpids = [d * 7 + 1000 for d in dpids]  # not 1..N any more either
    for s, d in zip(sws, dpids):
        h.nodes[s]["dpid"] = d
    # drop the builders' hints: the classifier must not need them
    for s in sws:
        del h.nodes[s]["layer"], h.nodes[s]["pod"]
    # and shuffle node insertion order
    order = list(h.nodes(data=True))
    rng.shuffle(order)
    edges = list(h.edges(data=True))
    rng.shuffle(edges)
    out: nx.Graph[str] = nx.Graph()
    out.add_nodes_from(order)
    out.add_edges_from(edges)
    return out, mapping


@pytest.mark.parametrize("name", ["fat4", "fat6", "three_clients", "three_2blocks", "two_wide",
                                  "fat4_app_core", "three_app_agg", "two_app_edge", "fat6_packed_2pods"])
@settings(max_examples=8, deadline=None)
@given(seed=st.integers(0, 2**32 - 1))
def test_relabelled_and_shuffled_graph_gives_isomorphic_result(name, seed):
    g = GRAPHS[name]()
    h, mapping = scramble(g, random.Random(seed))
    a = structure(classify(g), mapping.get)
    b = structure(classify(h))
    assert a == b
    # and the mapped network still delivers every ID to its owner
    c, tree, fabric = map_topology(h, SPACE)
    tree.bootstrap_preallocate(max(1, len(tree.leaves()) // 2))
    tables = FlowPlanner(tree, fabric).tables()
    net = FakeNetwork(fabric, tables)
    want = expected_intervals(tree.partition(), 32)
    for dpid in fabric.switches:
        assert net.resolve(dpid) == want


@pytest.mark.parametrize("name", sorted(GRAPHS))
def test_discovered_graph_round_trip(name):
    g = GRAPHS[name]()
    dpid = {s: g.nodes[s]["dpid"] for s in switches(g)}
    links, hosts = [], []
    for u, v, d in g.edges(data=True):
        if g.nodes[u]["kind"] == "switch" and g.nodes[v]["kind"] == "switch":
            links.append((dpid[u], d["ports"][u], dpid[v], d["ports"][v]))
        else:
            h, s = (u, v) if g.nodes[u]["kind"] == "host" else (v, u)
            hd = g.nodes[h]
            hosts.append((h, dpid[s], d["ports"][s], hd["mac"], hd["ip"], hd["role"]))
    random.Random(1).shuffle(links)
    d = discovered_graph(sorted(dpid.values(), reverse=True), links, hosts)
    assert d.number_of_nodes() == g.number_of_nodes() and d.number_of_edges() == g.number_of_edges()
    name_of = {s: f"s{dpid[s]}" for s in dpid}
    for _, data in d.nodes(data=True):
        assert data["kind"] in ("switch", "host")
    c1, c2 = classify(g), classify(d)
    assert structure(c1, lambda x: name_of.get(x, x)) == structure(c2)
    # group ids come from dpids, so they are identical, and so are fabric and tree
    assert c1.groups.keys() == c2.groups.keys()
    assert c1.parent == c2.parent
    assert build_fabric(c1) == build_fabric(c2)
    assert build_tree(c1, SPACE).children(ROOT) == build_tree(c2, SPACE).children(ROOT)


# -- errors -----------------------------------------------------------------------------------


def _link(g: nx.Graph, u: str, v: str) -> None:
    def next_port(n):
        if g.nodes[n]["kind"] == "host":
            return 0
        return 1 + max((d["ports"][n] for _, _, d in g.edges(n, data=True)), default=0)

    g.add_edge(u, v, ports={u: next_port(u), v: next_port(v)})


def test_error_no_storage_hosts():
    g = fat_tree(4)
    for h in storage_hosts(g):
        g.nodes[h]["role"] = "client"
    with pytest.raises(TopologyError, match="no storage hosts"):
        classify(g)


def test_error_disconnected_switch():
    g = two_tier()
    g.add_node("lonely", kind="switch", dpid=99, layer="core", pod=None)
    with pytest.raises(TopologyError, match="disconnected") as e:
        classify(g)
    assert "lonely" in str(e.value)


def test_error_disconnected_storage_trees():
    a = two_tier()
    b = relabel(two_tier(), {n: f"b_{n}" for n in two_tier().nodes})
    for _, d in b.nodes(data=True):
        if d["kind"] == "switch":
            d["dpid"] += 100
    g = nx.union(a, b)
    with pytest.raises(TopologyError, match="disconnected"):
        classify(g)


def test_error_storage_at_different_depths():
    g = three_tier(core=1, agg=2, edges=4, servers_per_edge=2)
    g.add_node("odd", kind="host", role="storage", ip="10.200.0.1", mac="02:00:00:00:00:01")
    _link(g, "a0", "odd")
    with pytest.raises(TopologyError, match="different depths"):
        classify(g)


def test_error_multi_homed_host():
    g = two_tier()
    h = storage_hosts(g)[0]
    _link(g, "e1", h)
    with pytest.raises(TopologyError, match="exactly one switch") as e:
        classify(g)
    assert h in str(e.value)


def test_error_overlapping_groups():
    """a0 has e0, e1; a1 has e2, e3; a2 has e4, e5. An extra e1-a1 link makes a0 and a1
    share e1 while both keep private edges."""
    g = three_tier(core=1, agg=3, edges=6, servers_per_edge=2)
    assert "a0" in g.adj["e1"] and "a1" not in g.adj["e1"] and "a1" in g.adj["e2"]
    _link(g, "e1", "a1")
    with pytest.raises(TopologyError, match="overlapping") as e:
        classify(g)
    assert "a0" in str(e.value) and "a1" in str(e.value)


def test_error_shared_edge_with_two_aggregation_blocks():
    """The same extra link with only two blocks: the shared edge is as central as the core
    (eccentricity 2), so the error is about depths, but it is still a TopologyError."""
    g = three_tier(core=1, agg=2, edges=4, servers_per_edge=2)
    _link(g, "e1", "a1")
    with pytest.raises(TopologyError):
        classify(g)


def test_error_root_layer_not_a_tree():
    """A ring: e0 - a - b - e1 and e0 - c - d - e1; four switches tie for the root."""
    g = discovered_graph(
        [1, 2, 3, 4, 5, 6],
        [(5, 1, 1, 1), (1, 2, 2, 1), (2, 2, 6, 1), (5, 2, 3, 1), (3, 2, 4, 1), (4, 2, 6, 2)],
        [("h0", 5, 10, "02:00:00:00:00:01", "10.0.0.1", "storage"),
         ("h1", 6, 10, "02:00:00:00:00:02", "10.0.0.2", "storage")],
    )
    with pytest.raises(TopologyError, match="not a single tree"):
        classify(g)


@pytest.mark.parametrize("breakage, pattern", [
    ("role", "role"),
    ("kind", "kind"),
    ("dpid", "no dpid"),
    ("ports", "port numbers"),
])
def test_error_schema(breakage, pattern):
    g = two_tier()
    if breakage == "role":
        g.nodes[storage_hosts(g)[0]]["role"] = "database"
    elif breakage == "kind":
        g.add_node("thing", kind="router")
    elif breakage == "dpid":
        del g.nodes["c0"]["dpid"]
    else:
        g.edges["c0", "e0"]["ports"] = {"c0": 1}
    with pytest.raises(TopologyError, match=pattern):
        classify(g)


def test_topology_error_is_value_error():
    assert issubclass(TopologyError, ValueError)


# -- roots and names ------------------------------------------------------------------------------


# The core stays the root even when every server hangs below one aggregation block.
@pytest.mark.parametrize("make", [lambda: three_tier(edge_uplinks=2), lambda: fat_tree(4, servers=4)],
                         ids=["three_tier_edge_uplinks2", "fat4_one_pod"])
def test_single_aggregation_block_keeps_core_as_root(make):
    g = make()
    c = classify(g)
    for s in switches(g):
        if storage_below(g, s):
            assert c.layer[s] == g.nodes[s]["layer"], (s, c.layer[s])
    assert c.depth == 4


@pytest.mark.parametrize("new_name", ["root", "edge-4", "^up"])
def test_host_names_cannot_collide_with_generated_ids(new_name):
    """A storage host named like a generated group id or the UP sentinel would corrupt
    the tree silently; the classifier refuses it and names the host."""
    g = two_tier()                       # groups: root, edge-3 .. edge-6
    h = storage_hosts(g)[0]              # attached to e0 (dpid 3)
    g = relabel(g, {h: new_name})
    with pytest.raises(TopologyError, match="clash"):
        map_topology(g, SPACE)
