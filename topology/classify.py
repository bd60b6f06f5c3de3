"""Infer layers, pods and switch groups from any discovered tree topology, and map
it onto the logical B-tree.

The controller feeds this what LLDP and host discovery found, so nothing here
may read names, dpid patterns or the builders' `layer`/`pod` hints. The only
inputs are the shape of the graph, port numbers, and which hosts are storage
servers. The rules:

1. The root layer is the set of switches with the smallest eccentricity toward
   the storage servers' edge switches (the core of a fat-tree or tier tree).
2. Every other switch's level is its hop distance from the root layer; "up" is
   toward a lower level. Storage servers must all hang off one level, the edge.
3. A switch's down-set is the storage servers reachable by only going down.
   Switches of a level with the same down-set form one group (a fat-tree pod's
   aggregation switches); down-sets of different groups must not overlap, or
   the graph is not a tree of groups. Switches with no storage below (the
   application cluster, the paper's SwitchD, or pods without servers) are
   "client" switches: they only carry the default up-rules.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass

import networkx as nx

from btree.fabric import Fabric, SwitchPorts
from btree.flows import UP
from btree.tree import LogicalBTree
from client_lib.cidr import Block
from topology.builders import Topology, port

ROOT = "root"


class TopologyError(ValueError):
    """The graph cannot be mapped onto a logical B-tree; the message says why."""


@dataclass(frozen=True)
class Classification:
    graph: Topology
    level: dict[str, int]                    # switch -> hops from the root layer
    layer: dict[str, str]                    # switch -> core, agg, edge or client
    edge_level: int                          # level of the switches the servers hang off
    groups: dict[str, tuple[str, ...]]       # group id -> member switches
    group_of: dict[str, str]                 # storage-tree switch -> group id
    parent: dict[str, str]                   # group or storage host -> parent group id
    pods: tuple[tuple[str, ...], ...]        # switches below the root layer, by connected part
    storage: tuple[str, ...]                 # storage hosts

    @property
    def depth(self) -> int:
        """B-tree depth counting the leaves: 3 for two-tier, 4 for fat-tree and three-tier."""
        return self.edge_level + 2

    def children(self) -> dict[str, list[str]]:
        out: dict[str, list[str]] = {group: [] for group in self.groups}
        for node, parent in self.parent.items():
            out[parent].append(node)
        for kids in out.values():
            kids.sort(key=self._order)
        return out

    def _order(self, node: str) -> tuple[int, ...]:
        """Tree order: groups by their lowest dpid, hosts by their attachment port."""
        if node in self.groups:
            return (0, min(self.graph.nodes[s]["dpid"] for s in self.groups[node]))
        (switch,) = self.graph.adj[node]
        return (1, self.graph.nodes[switch]["dpid"], port(self.graph, switch, node))


def _validated_parts(g: Topology) -> tuple[list[str], dict[str, list[str]], dict[str, str]]:
    """Switches, switch adjacency, and host -> attachment switch; schema errors raised here."""
    switches: list[str] = []
    attach: dict[str, str] = {}
    for node, data in g.nodes(data=True):
        kind = data.get("kind")
        if kind == "switch":
            if "dpid" not in data:
                raise TopologyError(f"switch {node!r} has no dpid")
            switches.append(node)
        elif kind == "host":
            if data.get("role") not in ("storage", "client"):
                raise TopologyError(f"host {node!r} has role {data.get('role')!r}; "
                                    f"expected 'storage' or 'client'")
            neighbors = list(g.adj[node])
            if len(neighbors) != 1 or g.nodes[neighbors[0]].get("kind") != "switch":
                raise TopologyError(f"host {node!r} must be attached to exactly one switch, "
                                    f"found {neighbors}")
            attach[node] = neighbors[0]
        else:
            raise TopologyError(f"node {node!r} has kind {kind!r}; expected 'switch' or 'host'")
    for u, v, data in g.edges(data=True):
        ports = data.get("ports", {})
        if u not in ports or v not in ports:
            raise TopologyError(f"link {u!r}-{v!r} lacks port numbers for both ends")
    adjacency = {s: [n for n in g.adj[s] if g.nodes[n]["kind"] == "switch"] for s in switches}
    return switches, adjacency, attach


def hop_distances(adjacency: dict[str, list[str]], sources: Iterable[str]) -> dict[str, int]:
    """Hops from the nearest of `sources` to every reachable node (breadth-first)."""
    dist = {s: 0 for s in sources}
    queue = deque(dist)
    while queue:
        node = queue.popleft()
        for nxt in adjacency[node]:
            if nxt not in dist:
                dist[nxt] = dist[node] + 1
                queue.append(nxt)
    return dist


def classify(g: Topology) -> Classification:
    switches, adjacency, attach = _validated_parts(g)
    storage = sorted((h for h in attach if g.nodes[h]["role"] == "storage"),
                     key=lambda h: (g.nodes[attach[h]]["dpid"], port(g, attach[h], h)))
    if not storage:
        raise TopologyError("no storage hosts: nothing to map onto B-tree leaves")
    edges = sorted({attach[h] for h in storage}, key=lambda s: g.nodes[s]["dpid"])

    roots = _root_layer(switches, adjacency, edges, set(attach.values()))
    level = hop_distances(adjacency, roots)

    edge_levels = {level[e] for e in edges}
    if len(edge_levels) != 1:
        by_level = {lv: sorted(e for e in edges if level[e] == lv) for lv in sorted(edge_levels)}
        raise TopologyError(f"storage servers hang off switches at different depths {by_level}; "
                            f"a B-tree needs them all at one level")
    bottom = edge_levels.pop()

    down: dict[str, frozenset[str]] = {}
    for lv in range(bottom, -1, -1):
        for s in (s for s in switches if level[s] == lv):
            below = {h for h in g.adj[s] if h in attach and g.nodes[h]["role"] == "storage"}
            for child in adjacency[s]:
                if level[child] == lv + 1:
                    below |= down.get(child, frozenset())
            if below:
                down[s] = frozenset(below)

    everything = frozenset(storage)
    partial_roots = [s for s in roots if down.get(s) != everything]
    if partial_roots:
        raise TopologyError(f"root-layer switches {sorted(partial_roots)} do not reach every "
                            f"storage server going down; the graph is not a single tree")

    groups: dict[str, tuple[str, ...]] = {}
    group_of: dict[str, str] = {}
    for lv in range(bottom + 1):
        by_set: dict[frozenset[str], list[str]] = {}
        for s in switches:
            if level[s] == lv and s in down:
                by_set.setdefault(down[s], []).append(s)
        _check_laminar(lv, by_set)
        for members in by_set.values():
            members.sort(key=lambda s: g.nodes[s]["dpid"])
            gid = ROOT if lv == 0 else f"{_layer_name(lv, bottom)}-{g.nodes[members[0]]['dpid']}"
            groups[gid] = tuple(members)
            for s in members:
                group_of[s] = gid

    _check_ids(tuple(storage), groups)
    parent: dict[str, str] = {}
    for gid, group in groups.items():
        if gid == ROOT:
            continue
        above = {group_of[n] for s in group for n in adjacency[s]
                 if level[n] == level[s] - 1 and n in group_of}
        if len(above) != 1:
            raise TopologyError(f"switch group {list(group)} hangs below {len(above)} groups "
                                f"{sorted(above)}; a tree needs exactly one parent")
        parent[gid] = above.pop()
    for h in storage:
        parent[h] = group_of[attach[h]]

    layer = {s: (_layer_name(level[s], bottom) if s in down else "client") for s in switches}
    lower = g.subgraph(s for s in switches if level[s] > 0)
    pods = tuple(sorted((tuple(sorted(c, key=lambda s: g.nodes[s]["dpid"]))
                         for c in nx.connected_components(lower)),
                        key=lambda c: g.nodes[c[0]]["dpid"]))
    return Classification(g, level, layer, bottom, groups, group_of, parent, pods, tuple(storage))


def _root_layer(switches: list[str], adjacency: dict[str, list[str]], edges: list[str],
                hosted: set[str]) -> list[str]:
    """The switches with the smallest eccentricity toward the storage edges, lifted
    while a layer of host-less switches sits uniformly one hop above all of them and
    further from every host (the core above a single aggregation block that holds
    all the servers: the center of the servers, but not of the tree)."""
    dist: dict[str, dict[str, int]] = {}
    for edge in edges:
        dist[edge] = hop_distances(adjacency, [edge])
        unreachable = [s for s in switches if s not in dist[edge]]
        if unreachable:
            raise TopologyError(f"the switch graph is disconnected: {sorted(unreachable)[:5]} "
                                f"cannot reach storage edge switch {edge!r}")
    eccentricity = {s: max(dist[e][s] for e in edges) for s in switches}
    best = min(eccentricity.values())
    roots = [s for s in switches if eccentricity[s] == best]
    height = hop_distances(adjacency, hosted)
    while True:
        members = set(roots)
        above = sorted({n for r in roots for n in adjacency[r] if n not in members and n not in hosted})
        depth = {e: min(dist[e][r] for r in roots) for e in edges}
        if not above or not all(height[u] > height[r] for u in above for r in roots) or \
                not all(dist[e][u] == depth[e] + 1 for u in above for e in edges):
            return roots
        roots = above


def _check_ids(storage: tuple[str, ...], groups: dict[str, tuple[str, ...]]) -> None:
    """Storage hosts become leaf ids beside the generated group ids; refuse clashes."""
    clash = [h for h in storage if h in groups or h == UP]   # UP: the next-hop sentinel
    if clash:
        raise TopologyError(f"storage host names {clash[:5]} clash with generated ids "
                            f"('{ROOT}', '<layer>-<dpid>', '{UP}'); rename them")


def _layer_name(lv: int, bottom: int) -> str:
    if lv == bottom:
        return "edge"
    return "core" if lv == 0 else "agg"


def _check_laminar(lv: int, by_set: dict[frozenset[str], list[str]]) -> None:
    owner: dict[str, list[str]] = {}
    for hosts, members in by_set.items():
        for h in hosts:
            if h in owner:
                raise TopologyError(
                    f"switches {owner[h]} and {members} at level {lv} reach overlapping but "
                    f"different storage servers (e.g. {h!r}); they cannot be one B-tree node "
                    f"or two")
            owner[h] = members


def build_tree(c: Classification, space: Block) -> LogicalBTree:
    """All leaves idle: bootstrap decides who owns what."""
    return LogicalBTree(space, ROOT, c.children())


def build_fabric(c: Classification) -> Fabric:
    g = c.graph
    switch_ports: dict[int, SwitchPorts] = {}
    links: dict[tuple[int, int], tuple[int, int]] = {}
    hosts: dict[str, tuple[int, int]] = {}
    for s, lv in c.level.items():
        dpid = g.nodes[s]["dpid"]
        up: list[int] = []
        down: dict[str, list[int]] = {}   # child (group, or a storage host of this switch) -> ports
        for n in g.adj[s]:
            p = port(g, s, n)
            if g.nodes[n]["kind"] == "host":
                hosts[n] = (dpid, p)
                if n in c.parent and c.parent[n] == c.group_of.get(s):
                    down[n] = [p]
                continue
            links[(dpid, p)] = (g.nodes[n]["dpid"], port(g, n, s))
            if c.level[n] == lv - 1:
                up.append(p)
            elif c.level[n] == lv + 1 and s in c.group_of and n in c.group_of:
                down.setdefault(c.group_of[n], []).append(p)
        switch_ports[dpid] = SwitchPorts(
            dpid, c.layer[s], c.group_of.get(s),
            {child: tuple(sorted(ports)) for child, ports in down.items()}, tuple(sorted(up)))
    leaf_mac = {h: g.nodes[h]["mac"] for h in c.storage}
    host_mac = {h: g.nodes[h]["mac"] for h in hosts}
    return Fabric(switch_ports, leaf_mac, links, hosts, host_mac)


def map_topology(g: Topology, space: Block) -> tuple[Classification, LogicalBTree, Fabric]:
    c = classify(g)
    return c, build_tree(c, space), build_fabric(c)


def discovered_graph(switches: Iterable[int], links: Iterable[tuple[int, int, int, int]],
                     hosts: Iterable[tuple[str, int, int, str, str, str]]) -> Topology:
    """Assemble the classifier's input from discovery results: switch dpids, links as
    (dpid, port, dpid, port), hosts as (id, dpid, port, mac, ip, role)."""
    g: Topology = nx.Graph()
    for dpid in switches:
        g.add_node(f"s{dpid}", kind="switch", dpid=dpid)
    for a, pa, b, pb in links:
        g.add_edge(f"s{a}", f"s{b}", ports={f"s{a}": pa, f"s{b}": pb})
    for host, dpid, switch_port, mac, ip, role in hosts:
        g.add_node(host, kind="host", mac=mac, ip=ip, role=role)
        g.add_edge(host, f"s{dpid}", ports={host: 0, f"s{dpid}": switch_port})
    return g
