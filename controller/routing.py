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

import networkx as nx

from controller.settings import Mode
from topology.builders import port
from topology.classify import hop_distances

Routes = dict[int, dict[str, int]]  # dpid -> {host ip: output port}


def _pick(choices: list[str], ip: str) -> str:
    digest = hashlib.blake2b(ip.encode(), digest_size=4).digest()
    return sorted(choices)[int.from_bytes(digest, "big") % len(choices)]


def host_routes(g: nx.Graph) -> Routes:
    """Per switch, the output port toward every host with an address."""
    switches = [n for n, d in g.nodes(data=True) if d.get("kind") == "switch"]
    adjacency = {s: [n for n in g.neighbors(s) if g.nodes[n].get("kind") == "switch"] for s in switches}
    routes: Routes = {g.nodes[s]["dpid"]: {} for s in switches}
    for host, data in g.nodes(data=True):
        if data.get("kind") != "host" or not data.get("ip"):
            continue
        (edge,) = [n for n in g.neighbors(host) if g.nodes[n].get("kind") == "switch"]
        routes[g.nodes[edge]["dpid"]][data["ip"]] = port(g, edge, host)
        distance = hop_distances(adjacency, [edge])
        for switch, dist in distance.items():
            if switch == edge:
                continue
            closer = [n for n in adjacency[switch] if distance.get(n) == dist - 1]
            routes[g.nodes[switch]["dpid"]][data["ip"]] = port(g, switch, _pick(closer, data["ip"]))
    return routes


def mode_routes(g: nx.Graph, mode: Mode) -> Routes:
    """The host routes a mode installs: in hybrid mode none (the switches'
    own forwarding, NORMAL, carries physical addresses)."""
    return host_routes(g) if mode == "full" else {}


def diff_routes(old: dict[str, int], new: dict[str, int]) -> tuple[dict[str, int], list[str]]:
    """(routes to add or change, addresses to delete) for one switch."""
    changed = {ip: p for ip, p in new.items() if old.get(ip) != p}
    return changed, [ip for ip in old if ip not in new]
