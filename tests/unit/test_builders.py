"""Tests for topology.builders: the graph schema, the wiring and the paper's settings."""

from __future__ import annotations

import re
from collections import Counter
from ipaddress import IPv4Address

import networkx as nx
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from topology.builders import (
    DEFAULT_TOPOLOGY,
    LAYERS,
    TOPOLOGIES,
    attach_app_cluster,
    client_hosts,
    fat_tree,
    hosts,
    named,
    paper_testbed,
    parse_topology,
    port,
    storage_hosts,
    switches,
    three_tier,
    two_tier,
    with_clients,
)

MAC_RE = re.compile(r"^([0-9a-f]{2}:){5}[0-9a-f]{2}$")


def check_schema(g: nx.Graph) -> None:
    """Every invariant a builder output must satisfy, whatever the builder."""
    assert isinstance(g.graph["name"], str) and g.graph["name"]
    sws, hs = switches(g), hosts(g)
    assert len(sws) + len(hs) == g.number_of_nodes()

    # dpids: 1..N, in layer order core, agg, edge, client
    assert [g.nodes[s]["dpid"] for s in sws] == list(range(1, len(sws) + 1))
    layer_ranks = [LAYERS.index(g.nodes[s]["layer"]) for s in sws]
    assert layer_ranks == sorted(layer_ranks)
    for s in sws:
        d = g.nodes[s]
        assert (d["pod"] is None) == (d["layer"] in ("core", "client"))
        assert d["pod"] is None or isinstance(d["pod"], int)

    # hosts: n-th host has 10.0.0.0 + n and MAC n; one link to a switch on port 0
    for n, h in enumerate(hs, start=1):
        d = g.nodes[h]
        assert d["role"] in ("storage", "client")
        assert d["ip"] == str(IPv4Address("10.0.0.0") + n)
        assert MAC_RE.match(d["mac"]) and int(d["mac"].replace(":", ""), 16) == n
        assert g.degree(h) == 1
        (sw,) = g.neighbors(h)
        assert g.nodes[sw]["kind"] == "switch"
        assert port(g, h, sw) == 0
    assert len({g.nodes[h]["ip"] for h in hs}) == len(hs)
    assert len({g.nodes[h]["mac"] for h in hs}) == len(hs)

    # links: ports keyed by both endpoints; switch ports unique and contiguous from 1
    for u, v, d in g.edges(data=True):
        assert set(d["ports"]) == {u, v}
    for s in sws:
        ports = sorted(port(g, s, nb) for nb in g.neighbors(s))
        assert ports == list(range(1, g.degree(s) + 1))

    assert nx.is_connected(g)


def by_layer(g: nx.Graph, layer: str) -> list[str]:
    return [s for s in switches(g) if g.nodes[s]["layer"] == layer]


def neighbors_of_kind(g: nx.Graph, node: str, layer: str) -> set[str]:
    return {n for n in g.neighbors(node) if g.nodes[n].get("layer") == layer}


def _edges(g: nx.Graph) -> list[tuple[tuple[str, ...], list[tuple[str, int]]]]:
    return sorted((tuple(sorted((u, v))), sorted(d["ports"].items())) for u, v, d in g.edges(data=True))


def same_graph(a: nx.Graph, b: nx.Graph) -> bool:
    same_nodes = list(a.nodes(data=True)) == list(b.nodes(data=True))
    return a.graph == b.graph and same_nodes and _edges(a) == _edges(b)


# --- fat-tree ------------------------------------------------------------------------


@pytest.mark.parametrize("k", [4, 6, 8])
def test_fat_tree_counts_and_schema(k: int) -> None:
    g = fat_tree(k)
    half = k // 2
    check_schema(g)
    assert g.graph["name"] == f"fattree-k{k}"
    assert len(by_layer(g, "core")) == half * half
    assert len(by_layer(g, "agg")) == k * half
    assert len(by_layer(g, "edge")) == k * half
    assert by_layer(g, "client") == []
    assert len(hosts(g)) == k**3 // 4
    assert g.number_of_edges() == 3 * k**3 // 4
    assert all(g.degree(s) == k for s in switches(g))  # k-port switches, all ports used
    assert len(storage_hosts(g)) == k**3 // 4 and client_hosts(g) == []


@pytest.mark.parametrize("k", [4, 6, 8])
def test_fat_tree_wiring(k: int) -> None:
    g = fat_tree(k)
    half = k // 2
    for p in range(k):
        pod_aggs = {f"p{p}a{a}" for a in range(half)}
        for e in range(half):
            edge = f"p{p}e{e}"
            assert g.nodes[edge]["pod"] == p
            assert neighbors_of_kind(g, edge, "agg") == pod_aggs
            for j in range(half):
                assert port(g, edge, f"{edge}h{j}") == 1 + j
            for a in range(half):
                assert port(g, edge, f"p{p}a{a}") == half + 1 + a
                assert port(g, f"p{p}a{a}", edge) == 1 + e
        for a in range(half):
            agg = f"p{p}a{a}"
            assert g.nodes[agg]["pod"] == p
            assert neighbors_of_kind(g, agg, "core") == {f"c{a * half + j}" for j in range(half)}
            for j in range(half):
                assert port(g, agg, f"c{a * half + j}") == half + 1 + j
    for c in range(half * half):
        core = f"c{c}"
        assert g.nodes[core]["pod"] is None
        aggs = neighbors_of_kind(g, core, "agg")
        assert sorted(g.nodes[a]["pod"] for a in aggs) == list(range(k))  # exactly one per pod
        for p in range(k):
            assert port(g, core, f"p{p}a{c // half}") == 1 + p


def test_fat_tree_names_and_dpids_k4() -> None:
    g = fat_tree(4)
    assert switches(g)[:6] == ["c0", "c1", "c2", "c3", "p0a0", "p0a1"]
    assert switches(g)[-1] == "p3e1"
    assert g.nodes["p3e1"]["dpid"] == 20
    assert hosts(g)[:3] == ["p0e0h0", "p0e0h1", "p0e1h0"]
    assert g.nodes["p0e0h0"]["ip"] == "10.0.0.1" and g.nodes["p0e0h0"]["mac"] == "00:00:00:00:00:01"
    assert g.nodes["p3e1h1"]["ip"] == "10.0.0.16" and g.nodes["p3e1h1"]["mac"] == "00:00:00:00:00:10"


def test_fat_tree_is_deterministic() -> None:
    assert same_graph(fat_tree(6, servers=7, placement="spread"), fat_tree(6, servers=7, placement="spread"))


def storage_per_edge(g: nx.Graph) -> list[int]:
    return [sum(g.nodes[h]["role"] == "storage" for h in g.neighbors(e) if g.nodes[h]["kind"] == "host")
            for e in by_layer(g, "edge")]


def test_fat_tree_placement_examples() -> None:
    assert storage_per_edge(fat_tree(4, servers=5)) == [2, 2, 1, 0, 0, 0, 0, 0]
    assert storage_per_edge(fat_tree(4, servers=5, placement="spread")) == [1, 1, 1, 1, 1, 0, 0, 0]
    assert storage_per_edge(fat_tree(4, servers=10, placement="spread")) == [2, 2, 1, 1, 1, 1, 1, 1]
    g = fat_tree(4, servers=10, placement="spread")
    assert g.nodes["p1e0h0"]["role"] == "storage" and g.nodes["p1e0h1"]["role"] == "client"


@settings(max_examples=40, deadline=None)
@given(data=st.data(), k=st.sampled_from([4, 6, 8]), placement=st.sampled_from(["packed", "spread"]))
def test_fat_tree_storage_placement(data: st.DataObject, k: int, placement: str) -> None:
    total = k**3 // 4
    servers = data.draw(st.integers(1, total), label="servers")
    g = fat_tree(k, servers=servers, placement=placement)
    storage = storage_hosts(g)
    assert len(storage) == servers
    assert sorted(storage + client_hosts(g), key=hosts(g).index) == hosts(g)
    if placement == "packed":
        assert storage == hosts(g)[:servers]
    else:
        counts = storage_per_edge(g)
        assert max(counts) - min(counts) <= 1
        assert counts == sorted(counts, reverse=True)
    for edge in by_layer(g, "edge"):  # per edge, storage hosts are the lowest indices
        roles = [g.nodes[f"{edge}h{j}"]["role"] for j in range(k // 2)]
        assert roles == sorted(roles, key=("storage", "client").index)


def test_fat_tree_paper_scale() -> None:
    g = fat_tree(32, servers=2000)
    check_schema(g)
    assert len(switches(g)) == 1280
    assert len(hosts(g)) == 8192
    assert len(storage_hosts(g)) == 2000 and len(client_hosts(g)) == 6192
    assert Counter(storage_per_edge(g)) == Counter({16: 125, 0: 512 - 125})
    assert g.nodes[hosts(g)[-1]]["ip"] == "10.0.32.0"  # 8192 = 0x2000 wraps into the third octet


# --- tier trees ---------------------------------------------------------------------


def test_three_tier_paper_testbed() -> None:
    g = three_tier()
    check_schema(g)
    assert g.graph["name"] == "threetier-c1-a2-e10"
    assert len(switches(g)) == 13
    assert [len(by_layer(g, layer)) for layer in LAYERS] == [1, 2, 10, 0]
    assert len(storage_hosts(g)) == 200 and client_hosts(g) == []
    assert g.number_of_edges() == 200 + 10 + 2
    assert [g.nodes[f"e{e}"]["pod"] for e in range(10)] == [0] * 5 + [1] * 5
    assert port(g, "e0", "e0h19") == 20 and port(g, "e0", "a0") == 21
    assert [port(g, "a1", f"e{e}") for e in range(5, 10)] == [1, 2, 3, 4, 5]
    assert port(g, "a1", "c0") == 6
    assert port(g, "c0", "a0") == 1 and port(g, "c0", "a1") == 2


def test_testbed_is_the_papers_tree_with_an_application_cluster_under_the_core() -> None:
    g = paper_testbed()
    check_schema(g)
    assert g.graph["name"] == "testbed-200x10"
    assert [len(by_layer(g, layer)) for layer in LAYERS] == [1, 2, 10, 1]
    assert len(storage_hosts(g)) == 200 and client_hosts(g) == [f"app0h{j}" for j in range(10)]
    assert g.number_of_edges() == 200 + 10 + 2 + 10 + 1
    # the storage tree is three_tier()'s, port for port; the client switch hangs off the core's next port
    tree = three_tier()
    assert all(g.edges[u, v]["ports"] == d["ports"] for u, v, d in tree.edges(data=True))
    assert port(g, "c0", "app0") == 3 and port(g, "app0", "c0") == 11
    assert g.nodes["app0h0"]["ip"] == "10.0.0.201"
    small = paper_testbed(servers_per_edge=2, clients=3)
    check_schema(small)
    assert len(switches(small)) == 14 and len(storage_hosts(small)) == 20 and len(client_hosts(small)) == 3
    assert port(small, "e9", "a1") == 3


def test_topologies_by_name() -> None:
    assert same_graph(named("testbed"), paper_testbed())
    assert same_graph(named("fat-tree:8"), fat_tree(8))
    assert same_graph(named("fattree:4,servers=8"), fat_tree(4, servers=8))
    assert same_graph(named(DEFAULT_TOPOLOGY), fat_tree(4, servers=8))
    assert same_graph(named("three-tier:2,2,3,servers-per-edge=4"), three_tier(2, 2, 3, 4))
    assert same_graph(named(" two-tier : core=3 "), two_tier(core=3))
    assert parse_topology("fattree:8,placement=spread") == ("fattree", {"k": 8, "placement": "spread"})
    assert parse_topology("testbed:servers_per_edge=4,clients=2") == (
        "testbed", {"servers_per_edge": 4, "clients": 2})
    assert set(TOPOLOGIES) == {"fattree", "three-tier", "two-tier", "testbed"}


@pytest.mark.parametrize(("spec", "message"), [
    ("ring", "unknown topology 'ring'"),
    ("fattree:q=1", "fattree has no parameter 'q'; it takes k, servers, placement"),
    ("fattree:k=8,16", "bare value '16' after a key=value"),
    ("two-tier:1,2,3,4,5", "beyond the 4 parameters of two-tier"),
    ("fattree:8,k=8", "k given twice"),
    ("fattree:3", "k must be an integer >= 4, got 3"),
    ("testbed:clients=0", "clients must be an integer >= 1, got 0"),
])
def test_topology_names_refused_with_the_reason(spec: str, message: str) -> None:
    with pytest.raises(ValueError, match=re.escape(message)):
        named(spec)


def test_with_clients_adds_an_application_cluster_only_where_there_is_none() -> None:
    all_storage = fat_tree(8)
    g = with_clients(all_storage, 4)
    check_schema(g)
    assert len(storage_hosts(g)) == 128 and len(client_hosts(g)) == 4
    assert neighbors_of_kind(g, "app0", "core") == set(by_layer(g, "core"))
    assert with_clients(g) is g and with_clients(paper_testbed()).graph["name"] == "testbed-200x10"


def test_three_tier_dual_homed() -> None:
    g = three_tier(core=2, agg=4, edges=5, servers_per_edge=2, edge_uplinks=2, clients_per_edge=1)
    check_schema(g)
    assert [g.nodes[f"e{e}"]["pod"] for e in range(5)] == [0, 0, 0, 1, 1]
    assert [g.nodes[f"a{a}"]["pod"] for a in range(4)] == [0, 0, 1, 1]
    assert neighbors_of_kind(g, "e4", "agg") == {"a2", "a3"}
    assert [port(g, "e4", x) for x in ("e4h0", "e4h1", "e4h2", "a2", "a3")] == [1, 2, 3, 4, 5]
    assert [g.nodes[f"e4h{j}"]["role"] for j in range(3)] == ["storage", "storage", "client"]
    assert len(storage_hosts(g)) == 10 and len(client_hosts(g)) == 5


@settings(max_examples=60, deadline=None)
@given(
    core=st.integers(1, 3),
    blocks=st.integers(1, 3),
    edge_uplinks=st.integers(1, 3),
    extra_edges=st.integers(0, 6),
    servers_per_edge=st.integers(1, 4),
    clients_per_edge=st.integers(0, 3),
)
def test_three_tier_random(
    core: int, blocks: int, edge_uplinks: int, extra_edges: int, servers_per_edge: int, clients_per_edge: int
) -> None:
    agg, edges = blocks * edge_uplinks, blocks + extra_edges
    g = three_tier(core, agg, edges, servers_per_edge, edge_uplinks, clients_per_edge)
    check_schema(g)
    per_edge = servers_per_edge + clients_per_edge
    assert [len(by_layer(g, layer)) for layer in LAYERS] == [core, agg, edges, 0]
    assert len(storage_hosts(g)) == edges * servers_per_edge
    assert len(client_hosts(g)) == edges * clients_per_edge
    assert g.number_of_edges() == edges * per_edge + edges * edge_uplinks + agg * core
    pods = [g.nodes[e]["pod"] for e in by_layer(g, "edge")]
    assert pods == sorted(pods) and set(pods) == set(range(blocks))  # contiguous, none empty
    sizes = Counter(pods).values()
    assert max(sizes) - min(sizes) <= 1
    for e, pod in enumerate(pods):
        block = {f"a{a}" for a in range(agg) if g.nodes[f"a{a}"]["pod"] == pod}
        assert len(block) == edge_uplinks and neighbors_of_kind(g, f"e{e}", "agg") == block
        roles = [g.nodes[f"e{e}h{j}"]["role"] for j in range(per_edge)]
        assert roles == ["storage"] * servers_per_edge + ["client"] * clients_per_edge
        assert [port(g, f"e{e}", f"e{e}h{j}") for j in range(per_edge)] == list(range(1, per_edge + 1))
    for a in by_layer(g, "agg"):
        assert neighbors_of_kind(g, a, "core") == set(by_layer(g, "core"))


def test_two_tier_defaults() -> None:
    g = two_tier()
    check_schema(g)
    assert g.graph["name"] == "twotier-c2-e4"
    assert [len(by_layer(g, layer)) for layer in LAYERS] == [2, 0, 4, 0]
    assert len(storage_hosts(g)) == 16
    assert g.number_of_edges() == 16 + 8
    for e in range(4):
        assert neighbors_of_kind(g, f"e{e}", "core") == {"c0", "c1"}
        assert g.nodes[f"e{e}"]["pod"] == e
        assert port(g, f"e{e}", "c0") == 5 and port(g, f"e{e}", "c1") == 6
    assert [port(g, "c1", f"e{e}") for e in range(4)] == [1, 2, 3, 4]


def test_two_tier_with_clients() -> None:
    g = two_tier(core=3, edges=2, servers_per_edge=1, clients_per_edge=2)
    check_schema(g)
    assert hosts(g, "client") == ["e0h1", "e0h2", "e1h1", "e1h2"]
    assert storage_hosts(g) == ["e0h0", "e1h0"]


# --- application cluster ------------------------------------------------------------


def test_attach_app_cluster_to_core() -> None:
    base = fat_tree(4)
    g = attach_app_cluster(base, switches=2, hosts_per_switch=3)
    check_schema(g)
    assert g.graph["name"] == "fattree-k4+app2x3"
    assert by_layer(g, "client") == ["app0", "app1"]
    assert [g.nodes[s]["dpid"] for s in ("app0", "app1")] == [21, 22]
    assert storage_hosts(g) == storage_hosts(base)
    assert client_hosts(g) == [f"app{i}h{j}" for i in range(2) for j in range(3)]
    assert g.nodes["app0h0"]["ip"] == "10.0.0.17"
    for i in range(2):
        assert neighbors_of_kind(g, f"app{i}", "core") == set(by_layer(g, "core"))
        assert [port(g, f"app{i}", f"c{c}") for c in range(4)] == [4, 5, 6, 7]
    assert port(g, "c0", "app0") == 5 and port(g, "c0", "app1") == 6
    # the input is untouched and shares no port dicts with the copy
    assert base.number_of_nodes() == 36 and "app0" not in base
    assert base.edges["c0", "p0a0"]["ports"] is not g.edges["c0", "p0a0"]["ports"]


@pytest.mark.parametrize(
    ("attach_to", "expected"),
    [("agg", {"p0a0"}), ("edge", {"p0e0"}), (["p1e1", "c2"], {"p1e1", "c2"})],
)
def test_attach_app_cluster_targets(attach_to: str | list[str], expected: set[str]) -> None:
    g = attach_app_cluster(fat_tree(4), attach_to=attach_to)
    check_schema(g)
    assert {n for n in g.neighbors("app0") if g.nodes[n]["kind"] == "switch"} == expected
    if attach_to in ("agg", "edge"):
        (target,) = expected
        assert port(g, target, "app0") == 5  # after the 4 ports of a k=4 switch


def test_attach_app_cluster_twice_continues_numbering() -> None:
    g = attach_app_cluster(attach_app_cluster(three_tier(), attach_to="agg"), attach_to=["a1"])
    check_schema(g)
    assert by_layer(g, "client") == ["app0", "app1"]
    assert g.nodes["app1"]["dpid"] == 15
    assert client_hosts(g)[-1] == "app1h3" and g.nodes["app1h3"]["ip"] == "10.0.0.208"
    assert port(g, "a0", "app0") == 7 and port(g, "a1", "app1") == 7


# --- helpers and validation ---------------------------------------------------------


def test_helpers() -> None:
    g = three_tier(core=1, agg=1, edges=1, servers_per_edge=2, clients_per_edge=1)
    assert switches(g) == ["c0", "a0", "e0"]
    assert hosts(g) == ["e0h0", "e0h1", "e0h2"]
    assert hosts(g, "storage") == storage_hosts(g) == ["e0h0", "e0h1"]
    assert hosts(g, role="client") == client_hosts(g) == ["e0h2"]
    assert port(g, "e0", "a0") == 4 and port(g, "a0", "e0") == 1 and port(g, "e0h2", "e0") == 0
    with pytest.raises(ValueError, match="role"):
        hosts(g, "server")


@pytest.mark.parametrize(
    ("build", "kwargs", "argument"),
    [
        (fat_tree, {"k": 2}, "k"),
        (fat_tree, {"k": 5}, "k"),
        (fat_tree, {"k": "4"}, "k"),
        (fat_tree, {"k": True}, "k"),
        (fat_tree, {"k": 408}, "k"),  # more hosts than 10.0.0.0/8 holds
        (fat_tree, {"k": 4, "servers": 0}, "servers"),
        (fat_tree, {"k": 4, "servers": 17}, "servers"),
        (fat_tree, {"k": 4, "placement": "random"}, "placement"),
        (three_tier, {"core": 0}, "core"),
        (three_tier, {"agg": 0}, "agg"),
        (three_tier, {"edges": 0}, "edges"),
        (three_tier, {"servers_per_edge": 0}, "servers_per_edge"),
        (three_tier, {"clients_per_edge": -1}, "clients_per_edge"),
        (three_tier, {"edge_uplinks": 0}, "edge_uplinks"),
        (three_tier, {"edge_uplinks": 3}, "edge_uplinks"),
        (three_tier, {"edges": 1}, "edges"),  # two blocks, one edge: a block would be empty
        (three_tier, {"servers_per_edge": 2**24}, "servers_per_edge"),
        (two_tier, {"core": 0}, "core"),
        (two_tier, {"edges": 1.5}, "edges"),
        (two_tier, {"servers_per_edge": 0}, "servers_per_edge"),
        (two_tier, {"clients_per_edge": -2}, "clients_per_edge"),
    ],
)
def test_builders_reject_bad_arguments(build, kwargs: dict, argument: str) -> None:
    with pytest.raises(ValueError, match=argument):
        build(**kwargs)


@pytest.mark.parametrize(
    ("base", "kwargs", "argument"),
    [
        (fat_tree(4), {"switches": 0}, "switches"),
        (fat_tree(4), {"hosts_per_switch": 0}, "hosts_per_switch"),
        (fat_tree(4), {"hosts_per_switch": 2**24}, "hosts_per_switch"),
        (fat_tree(4), {"attach_to": "spine"}, "attach_to"),
        (two_tier(), {"attach_to": "agg"}, "attach_to"),
        (fat_tree(4), {"attach_to": []}, "attach_to"),
        (fat_tree(4), {"attach_to": ["c0", "nope"]}, "attach_to"),
        (fat_tree(4), {"attach_to": ["p0e0h0"]}, "attach_to"),
        (fat_tree(4), {"attach_to": ["c0", "c0"]}, "attach_to"),
    ],
)
def test_attach_app_cluster_rejects_bad_arguments(base: nx.Graph, kwargs: dict, argument: str) -> None:
    with pytest.raises(ValueError, match=argument):
        attach_app_cluster(base, **kwargs)
