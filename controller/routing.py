"""Forwarding for ordinary (physical-address) traffic and ARP answers, pure.

MetaFlow entries carry requests; everything else, replies included, needs
plain unicast routes. A fat-tree is full of loops, so nothing is ever
flooded: the controller answers every ARP request itself and installs one
/32 route per host on every switch. Each route follows a shortest path
toward the host's edge switch; where several neighbours are equally close
(the fat-tree's equal-cost paths), the host's address picks one, so
different destinations spread over the uplinks while each destination's
path stays fixed (no reordering). Following strictly decreasing distance
makes every route loop-free by construction.

In hybrid mode (`mode_routes`) the fabric forwards ordinary traffic on its
own: no routes, and only the gateway's ARP is answered.
"""

from __future__ import annotations

import hashlib
from collections import Counter

import networkx as nx

from controller.settings import Mode
from topology.builders import port
from topology.classify import hop_distances

Routes = dict[int, dict[str, int]]  # dpid -> {host ip: output port}


def _spread(ip: str) -> int:
    """Which of several equal-cost next hops a host's routes take: a hash of
    its address, the same on every switch."""
    return int.from_bytes(hashlib.blake2b(ip.encode(), digest_size=4).digest(), "big")


def switch_adjacency(g: nx.Graph) -> dict[str, list[str]]:
    """Each switch's switch neighbours."""
    return {s: [n for n in g.neighbors(s) if g.nodes[n].get("kind") == "switch"]
            for s, d in g.nodes(data=True) if d.get("kind") == "switch"}


def next_hops(g: nx.Graph, adjacency: dict[str, list[str]], edge: str) -> dict[int, list[int]]:
    """Per switch (dpid) other than `edge`, its ports one hop closer to
    `edge`, in the order of the neighbours' names: what every host at `edge`
    is routed by, so it is found once per edge switch, not once per host."""
    distance = hop_distances(adjacency, [edge])
    return {g.nodes[s]["dpid"]: [port(g, s, n) for n in sorted(adjacency[s]) if distance.get(n) == dist - 1]
            for s, dist in distance.items() if s != edge}


def routes_to(hops: dict[int, list[int]], edge_dpid: int, edge_port: int, ip: str) -> dict[int, int]:
    """Every switch's output port toward one host (`hops`: its edge's `next_hops`)."""
    spread = _spread(ip)
    out = {dpid: ports[spread % len(ports)] for dpid, ports in hops.items()}
    out[edge_dpid] = edge_port
    return out


def edge_of(g: nx.Graph, host: str) -> str:
    """The one switch a host hangs off."""
    (edge,) = [n for n in g.neighbors(host) if g.nodes[n].get("kind") == "switch"]
    return edge


def host_routes(g: nx.Graph) -> Routes:
    """Per switch, the output port toward every host with an address."""
    adjacency = switch_adjacency(g)
    routes: Routes = {g.nodes[s]["dpid"]: {} for s in adjacency}
    hosts = [(host, data["ip"], edge_of(g, host))
             for host, data in g.nodes(data=True) if data.get("kind") == "host" and data.get("ip")]
    left = Counter(edge for _, _, edge in hosts)
    hops: dict[str, dict[int, list[int]]] = {}   # per edge switch, while it has hosts left
    for host, ip, edge in hosts:
        if edge not in hops:
            hops[edge] = next_hops(g, adjacency, edge)
        for dpid, out in routes_to(hops[edge], g.nodes[edge]["dpid"], port(g, edge, host), ip).items():
            routes[dpid][ip] = out
        left[edge] -= 1
        if not left[edge]:
            del hops[edge]
    return routes


def mode_routes(g: nx.Graph, mode: Mode) -> Routes:
    """The host routes a mode installs: in hybrid mode none (the switches'
    own forwarding, NORMAL, carries physical addresses)."""
    return host_routes(g) if mode == "full" else {}


def diff_routes(old: dict[str, int], new: dict[str, int]) -> tuple[dict[str, int], list[str]]:
    """(routes to add or change, addresses to delete) for one switch."""
    changed = {ip: p for ip, p in new.items() if old.get(ip) != p}
    return changed, [ip for ip in old if ip not in new]
