"""What a scale run makes real (`benchmarks.sample`), as pure data, and the
clients' paths confined to blocks (`mininet_scenarios.workload.paths_within`)."""

from __future__ import annotations

import ipaddress

import pytest

from benchmarks.sample import (
    client_port,
    outside,
    sample_edges,
    sample_graph,
    spares,
    under_replicated,
    uplinks,
)
from client_lib.api.rest import ServerInfo
from client_lib.cidr import Block
from client_lib.mdid import mdid
from mininet_scenarios.topos import GraphTopo
from mininet_scenarios.workload import paths_within
from topology import builders

SPACE = Block.parse("100.64.0.0/10")


def test_the_sample_is_the_first_edges_with_servers_their_hosts_and_a_client_each() -> None:
    graph = builders.fat_tree(8, servers=126)
    edges = sample_edges(graph, 2)
    assert edges == ["p0e0", "p0e1"]
    real = sample_graph(graph, edges)
    hosts = {h for e in edges for h in graph.adj[e] if graph.nodes[h]["kind"] == "host"}
    assert set(real) == {*edges, *hosts, "p0e0c", "p0e1c"}
    for node in (*edges, *hosts):   # as the emulated fabric has them
        assert real.nodes[node] == graph.nodes[node]
    taken = {graph.nodes[h][a] for h in builders.hosts(graph) for a in ("ip", "mac")}
    for edge in edges:
        client = f"{edge}c"
        assert real.nodes[client]["role"] == "client"
        assert not {real.nodes[client]["ip"], real.nodes[client]["mac"]} & taken
        assert ipaddress.IPv4Address(real.nodes[client]["ip"]) in ipaddress.IPv4Network("10.0.0.0/8")
        port = builders.port(real, edge, client)
        assert port == client_port(graph, edge)
        assert port not in {builders.port(graph, edge, n) for n in graph.adj[edge]}
    GraphTopo(real, prefix="s0000")   # Mininet takes it (names fit Linux's 15 characters)
    with pytest.raises(ValueError, match="fabric has"):
        sample_edges(builders.fat_tree(4, servers=2), 2)


def test_every_link_from_the_sample_to_the_emulated_fabric_is_an_uplink() -> None:
    graph = builders.fat_tree(4)
    edges = sample_edges(graph, 2)
    ups = uplinks(graph, edges)
    assert len(ups) == 2 * 2   # k/2 aggregation switches above each edge
    for edge, (dpid, port) in ups:
        assert graph.nodes[edge]["dpid"] == dpid
        (peer,) = [n for n in graph.adj[edge] if builders.port(graph, edge, n) == port]
        assert graph.nodes[peer]["layer"] == "agg"


def test_spares_are_a_quarter_of_an_edges_servers_and_at_least_two() -> None:
    assert [spares(n) for n in (2, 4, 8, 16)] == [2, 2, 2, 4]


def _server(blocks: list[str], backups: list[str], failed: str | None = None) -> ServerInfo:
    return ServerInfo("10.0.0.1", "http://x", 0, 10, failed, None, [Block.parse(b) for b in blocks], None,
                      [Block.parse(b) for b in backups])


def test_outside_names_the_sample_blocks_with_a_copy_elsewhere() -> None:
    servers = {"a": _server(["100.64.0.0/12"], ["100.80.0.0/12"]), "b": _server(["100.80.0.0/12"], []),
               "c": _server(["100.96.0.0/12"], ["100.64.0.0/12"]), "d": _server([], ["100.96.0.0/12"])}
    assert outside(servers, ["a", "b", "c", "d"]) == []
    assert outside(servers, ["a", "b"]) == ["100.64.0.0/12"]   # its backup c is not in the sample
    assert outside(servers, ["c", "x"]) == ["100.96.0.0/12"]   # (x: not registered yet)


def test_under_replicated_counts_only_servers_in_service_and_only_led_blocks() -> None:
    servers = {"a": _server(["100.64.0.0/12"], ["100.80.0.0/12"]), "b": _server(["100.80.0.0/12"], []),
               "c": _server([], ["100.64.0.0/12"], failed="port down"), "d": _server([], ["100.96.0.0/12"])}
    # 100.64/12's backup c failed; 100.96/12 is a copy nobody leads (not a block in service)
    assert under_replicated(servers, 2) == ["100.64.0.0/12"]
    assert under_replicated(servers, 1) == []
    servers["d"] = _server([], ["100.64.0.0/12"])
    assert under_replicated(servers, 2) == []


def test_paths_within_blocks_lie_in_them_and_say_when_there_are_too_few() -> None:
    blocks = [Block.parse("100.64.0.0/16"), Block.parse("100.65.16.0/20")]
    paths = paths_within("c1", 20, blocks, SPACE)
    assert len(set(paths)) == 20
    assert all(any(b.contains(mdid(p, SPACE)) for b in blocks) for p in paths)
    assert set(paths).isdisjoint(paths_within("c1", 20, blocks, SPACE, start=1_000_000))
    with pytest.raises(ValueError, match="lies in the space"):
        paths_within("c1", 1, [Block.parse("10.0.0.0/8")], SPACE)
