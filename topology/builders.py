"""Fat-tree, three-tier and two-tier (leaf-spine) topologies as plain networkx graphs.

Pure data with no I/O, like Mininet's topo.py: the classifier, the B-tree mapping,
the simulator and the Mininet scenarios all start from the same deterministic
names, dpids, addresses and port numbers, so a test can state exactly which port
a flow entry must output to.

Schema: switch nodes carry ``kind="switch"``, ``dpid``, ``layer`` and ``pod``;
host nodes carry ``kind="host"``, ``role`` ("storage" or "client"), ``ip`` and
``mac``; every link carries ``ports = {endpoint: port on that endpoint}`` (hosts
use port 0). ``pod`` is the index of the subtree hanging below the core layer
(the connected component left when the core switches are removed): the fat-tree
pod, the three-tier aggregation block, or in a two-tier tree the edge switch itself.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Iterable
from ipaddress import IPv4Address
from typing import TypeAlias

import networkx as nx

Topology: TypeAlias = "nx.Graph[str]"
"""A topology: nodes are switch and host names, with the attributes above."""

LAYERS = ("core", "agg", "edge", "client")
ROLES = ("storage", "client")
PLACEMENTS = ("packed", "spread")
MAX_HOSTS = 2**24 - 2  # host n gets 10.0.0.0 + n: 10.0.0.1 .. 10.255.255.254
_IP_BASE = int(IPv4Address("10.0.0.0"))


# --- queries other modules use ----------------------------------------------------


def switches(g: Topology) -> list[str]:
    """Switch names in dpid order (core, agg, edge, client for the builders)."""
    found = (n for n, d in g.nodes(data=True) if d["kind"] == "switch")
    return sorted(found, key=lambda n: g.nodes[n]["dpid"])


def hosts(g: Topology, role: str | None = None) -> list[str]:
    """Host names in address order (= builder order), optionally only those with ``role``."""
    if role is not None and role not in ROLES:
        raise ValueError(f"role must be None or one of {ROLES}, got {role!r}")
    found = (n for n, d in g.nodes(data=True) if d["kind"] == "host" and role in (None, d["role"]))
    return sorted(found, key=lambda n: _host_index(g, n))


def storage_hosts(g: Topology) -> list[str]:
    return hosts(g, "storage")


def client_hosts(g: Topology) -> list[str]:
    return hosts(g, "client")


def port(g: Topology, node: str, neighbor: str) -> int:
    """The port on ``node`` that leads to ``neighbor`` (0 when ``node`` is a host)."""
    ports: dict[str, int] = g.edges[node, neighbor]["ports"]
    return ports[node]


# --- builders ---------------------------------------------------------------------


def fat_tree(k: int, servers: int | None = None, placement: str = "packed") -> Topology:
    """Al-Fares k-ary fat-tree of k-port switches with k**3/4 hosts.

    ``servers`` hosts (default: all) are storage servers, the rest clients.
    "packed" makes the first ``servers`` hosts in (pod, edge, host) order storage,
    filling edge switches one after another; "spread" deals them round-robin over
    the edge switches, each edge using its lowest host indices.
    """
    _int_arg("k", k, 4)
    if k % 2:
        raise ValueError(f"k must be even, got {k}")
    half, total = k // 2, k**3 // 4
    _check_host_count(f"k={k}: k**3/4", total)
    servers = total if servers is None else _int_arg("servers", servers, 1)
    if servers > total:
        raise ValueError(f"servers must be at most k**3/4 = {total}, got {servers}")
    if placement not in PLACEMENTS:
        raise ValueError(f"placement must be one of {PLACEMENTS}, got {placement!r}")
    n_edges = k * half

    def role(edge_index: int, j: int) -> str:
        rank = edge_index * half + j if placement == "packed" else j * n_edges + edge_index
        return "storage" if rank < servers else "client"

    g: Topology = nx.Graph(name=f"fattree-k{k}")
    w = _Wiring(g)
    cores = [w.switch(f"c{i}", "core") for i in range(half * half)]
    aggs = [[w.switch(f"p{p}a{a}", "agg", p) for a in range(half)] for p in range(k)]
    edges = [[w.switch(f"p{p}e{e}", "edge", p) for e in range(half)] for p in range(k)]
    for p in range(k):
        for e, edge in enumerate(edges[p]):
            for j in range(half):
                w.host(f"{edge}h{j}", role(p * half + e, j), edge)
            for agg in aggs[p]:
                w.link(edge, agg)
    for p in range(k):
        for a, agg in enumerate(aggs[p]):
            for j in range(half):
                w.link(agg, cores[a * half + j])
    return g


def three_tier(
    core: int = 1,
    agg: int = 2,
    edges: int = 10,
    servers_per_edge: int = 20,
    edge_uplinks: int = 1,
    clients_per_edge: int = 0,
) -> Topology:
    """Core/aggregation/edge tree; the defaults are the paper's testbed.

    Aggregation switches form blocks of ``edge_uplinks`` consecutive switches; edge
    ``e`` joins block ``e * blocks // edges`` and links to every switch of it, and
    every aggregation switch links to every core switch.
    """
    _int_arg("core", core, 1)
    _int_arg("agg", agg, 1)
    _int_arg("edges", edges, 1)
    _int_arg("servers_per_edge", servers_per_edge, 1)
    _int_arg("edge_uplinks", edge_uplinks, 1)
    _int_arg("clients_per_edge", clients_per_edge, 0)
    if agg % edge_uplinks:
        raise ValueError(f"agg ({agg}) must be divisible by edge_uplinks ({edge_uplinks})")
    blocks = agg // edge_uplinks
    if edges < blocks:
        raise ValueError(f"edges ({edges}) must be >= agg / edge_uplinks ({blocks}) "
                         "so that no aggregation block is empty")
    return _tier_tree(f"threetier-c{core}-a{agg}-e{edges}", core, agg, edges, servers_per_edge,
                      clients_per_edge, edge_uplinks)


def two_tier(core: int = 2, edges: int = 4, servers_per_edge: int = 4,
             clients_per_edge: int = 0) -> Topology:
    """Leaf-spine: every edge switch links to every core switch; pod = edge index."""
    _int_arg("core", core, 1)
    _int_arg("edges", edges, 1)
    _int_arg("servers_per_edge", servers_per_edge, 1)
    _int_arg("clients_per_edge", clients_per_edge, 0)
    return _tier_tree(f"twotier-c{core}-e{edges}", core, 0, edges, servers_per_edge, clients_per_edge, 1)


def paper_testbed(servers_per_edge: int = 20, clients: int = 10) -> Topology:
    """The paper's testbed (Section VII-A, Fig. 12): a three-tier tree of 1 core,
    2 aggregation and 10 edge switches of ``servers_per_edge`` storage servers
    (20: 200 servers), and the application cluster's ``clients`` client hosts on
    one client switch under the core (the paper's SwitchD).

    The paper ran 50 client containers, each on a core of its own; here every
    client host runs a client process on the machine's shared cores, so the
    default is 10, and ``clients`` says how many.
    """
    tree = three_tier(core=1, agg=2, edges=10, servers_per_edge=servers_per_edge)
    g = attach_app_cluster(tree, switches=1, hosts_per_switch=_int_arg("clients", clients, 1))
    g.graph["name"] = f"testbed-{10 * servers_per_edge}x{clients}"
    return g


def attach_app_cluster(
    g: Topology, switches: int = 1, hosts_per_switch: int = 4, attach_to: str | list[str] = "core"
) -> Topology:
    """A copy of ``g`` plus client-only switches (the paper's SwitchD), each with client hosts.

    ``attach_to`` is a list of switch names, or "core" (every core switch), or
    "agg"/"edge" (the first switch of that layer). Dpids, host addresses and the
    ports of existing switches continue after their current maxima.
    """
    _int_arg("switches", switches, 1)
    _int_arg("hosts_per_switch", hosts_per_switch, 1)
    targets = _attach_targets(g, attach_to)
    out = g.copy()
    for _, _, d in out.edges(data=True):
        d["ports"] = dict(d["ports"])  # Graph.copy() is shallow; do not share them with g
    w = _Wiring(out)
    _check_host_count("existing hosts + switches * hosts_per_switch",
                      w.last_host + switches * hosts_per_switch)
    out.graph["name"] = f"{g.graph.get('name', 'topology')}+app{switches}x{hosts_per_switch}"
    first = sum(1 for _, d in g.nodes(data=True) if d["kind"] == "switch" and d["layer"] == "client")
    new = [w.switch(f"app{i}", "client") for i in range(first, first + switches)]
    for sw in new:
        for j in range(hosts_per_switch):
            w.host(f"{sw}h{j}", "client", sw)
        for target in targets:
            w.link(sw, target)
    return out


# --- topologies by name -------------------------------------------------------------

TOPOLOGIES: dict[str, Callable[..., Topology]] = {
    "fattree": fat_tree, "three-tier": three_tier, "two-tier": two_tier, "testbed": paper_testbed}
"""Every topology a command line can name (`metaflowctl plan --topology`,
`metaflowctl bench --topology`, `make demo TOPOLOGY=`): name -> builder."""
ALIASES = {"fat-tree": "fattree", "threetier": "three-tier", "twotier": "two-tier"}
DEFAULT_TOPOLOGY = "fattree:4,servers=8"
"""What `make demo` and `metaflowctl bench` run unless told otherwise: 8 servers, 8 clients."""
APP_CLIENTS = 8
"""Client hosts `with_clients` adds by default."""


def parse_topology(spec: str) -> tuple[str, dict[str, int | str]]:
    """``NAME[:ARG,...]`` -> (builder name, keyword arguments).

    An ARG is ``key=value`` (a parameter of the builder; ``-`` may stand for
    ``_``) or a bare value for the next parameter in the builder's order, so
    ``fat-tree:8`` is ``fat_tree(k=8)``, ``fattree:8,servers=64`` keeps 64
    storage servers and ``testbed:servers_per_edge=4`` has 40. Values are
    integers unless they are not digits (``placement=spread``).
    """
    name, _, args = spec.strip().partition(":")
    name = ALIASES.get(name.strip(), name.strip())
    if name not in TOPOLOGIES:
        raise ValueError(f"unknown topology {name!r} in {spec!r}; one of "
                         f"{', '.join(TOPOLOGIES)} (or {', '.join(ALIASES)})")
    params = list(inspect.signature(TOPOLOGIES[name]).parameters)
    kwargs: dict[str, int | str] = {}
    keyed = False
    for position, arg in enumerate(a.strip() for a in args.split(",") if a.strip()):
        key, eq, raw = arg.partition("=")
        keyed = keyed or bool(eq)
        if not eq:
            if keyed or position >= len(params):
                raise ValueError(f"{spec!r}: bare value {arg!r} after a key=value or beyond the "
                                 f"{len(params)} parameters of {name} ({', '.join(params)})")
            key, raw = params[position], arg
        key = key.strip().replace("-", "_")
        if key not in params:
            raise ValueError(f"{spec!r}: {name} has no parameter {key!r}; it takes {', '.join(params)}")
        if key in kwargs:
            raise ValueError(f"{spec!r}: {key} given twice")
        raw = raw.strip()
        kwargs[key] = int(raw) if raw.lstrip("-").isdigit() else raw
    return name, kwargs


def named(spec: str) -> Topology:
    """The topology a name such as ``testbed``, ``fat-tree:8`` or
    ``three-tier:core=2,edges=4`` stands for (see `parse_topology`); a builder's
    own error for a bad value names the parameter."""
    name, kwargs = parse_topology(spec)
    return TOPOLOGIES[name](**kwargs)


def with_clients(g: Topology, clients: int = APP_CLIENTS) -> Topology:
    """``g`` itself if it has client hosts, else ``g`` with an application
    cluster of ``clients`` hosts on one client switch under every core switch
    (a fat-tree whose hosts are all storage servers, as the paper's k=8 one)."""
    return g if client_hosts(g) else attach_app_cluster(g, switches=1, hosts_per_switch=clients)


# --- internals --------------------------------------------------------------------


class _Wiring:
    """Adds nodes and links to a graph, handing out the next dpid, host index and switch port."""

    def __init__(self, g: Topology) -> None:
        self.g = g
        self.last_dpid: int = max((d["dpid"] for _, d in g.nodes(data=True) if d["kind"] == "switch"),
                                  default=0)
        self.last_host = max((_host_index(g, h) for h in hosts(g)), default=0)
        self._last_port: dict[str, int] = {}

    def switch(self, name: str, layer: str, pod: int | None = None) -> str:
        self.last_dpid += 1
        self.g.add_node(name, kind="switch", dpid=self.last_dpid, layer=layer, pod=pod)
        return name

    def host(self, name: str, role: str, switch: str) -> str:
        self.last_host += 1
        n = self.last_host
        mac = ":".join(f"{b:02x}" for b in n.to_bytes(6, "big"))
        self.g.add_node(name, kind="host", role=role, ip=str(IPv4Address(_IP_BASE + n)), mac=mac)
        self.link(switch, name)
        return name

    def link(self, u: str, v: str) -> None:
        self.g.add_edge(u, v, ports={u: self._next_port(u), v: self._next_port(v)})

    def _next_port(self, node: str) -> int:
        if self.g.nodes[node]["kind"] == "host":
            return 0
        if node not in self._last_port:
            self._last_port[node] = max((d["ports"][node] for _, _, d in self.g.edges(node, data=True)),
                                        default=0)
        self._last_port[node] += 1
        return self._last_port[node]


def _tier_tree(name: str, core: int, agg: int, edges: int, servers_per_edge: int, clients_per_edge: int,
               edge_uplinks: int) -> Topology:
    """Shared body of the tier trees; ``agg == 0`` links edges straight to every core."""
    _check_host_count("edges * (servers_per_edge + clients_per_edge)",
                      edges * (servers_per_edge + clients_per_edge))
    g: Topology = nx.Graph(name=name)
    w = _Wiring(g)
    cores = [w.switch(f"c{i}", "core") for i in range(core)]
    aggs = [w.switch(f"a{i}", "agg", i // edge_uplinks) for i in range(agg)]
    pods = [e * (agg // edge_uplinks) // edges if agg else e for e in range(edges)]
    for e, pod in enumerate(pods):
        w.switch(f"e{e}", "edge", pod)
    for e, pod in enumerate(pods):
        for j in range(servers_per_edge + clients_per_edge):
            w.host(f"e{e}h{j}", "storage" if j < servers_per_edge else "client", f"e{e}")
        for up in aggs[pod * edge_uplinks : (pod + 1) * edge_uplinks] if agg else cores:
            w.link(f"e{e}", up)
    for a in aggs:
        for c in cores:
            w.link(a, c)
    return g


def _attach_targets(g: Topology, attach_to: str | Iterable[str]) -> list[str]:
    if isinstance(attach_to, str):
        if attach_to not in ("core", "agg", "edge"):
            raise ValueError(f"attach_to must be 'core', 'agg', 'edge' or a list of switch names, "
                             f"got {attach_to!r}")
        layer = [s for s in switches(g) if g.nodes[s]["layer"] == attach_to]
        if not layer:
            raise ValueError(f"attach_to={attach_to!r}: the graph has no {attach_to} switches")
        return layer if attach_to == "core" else layer[:1]
    targets = list(attach_to)
    if not targets:
        raise ValueError("attach_to must name at least one switch")
    unknown = [t for t in targets if t not in g or g.nodes[t]["kind"] != "switch"]
    if unknown:
        raise ValueError(f"attach_to names nodes that are not switches of the graph: {unknown}")
    if len(set(targets)) != len(targets):
        raise ValueError(f"attach_to names a switch twice: {targets}")
    return targets


def _host_index(g: Topology, host: str) -> int:
    return int(IPv4Address(g.nodes[host]["ip"])) - _IP_BASE


def _int_arg(name: str, value: object, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ValueError(f"{name} must be an integer >= {minimum}, got {value!r}")
    return value


def _check_host_count(what: str, total: int) -> None:
    if total > MAX_HOSTS:
        raise ValueError(f"{what} = {total} hosts, more than the {MAX_HOSTS} addresses of 10.0.0.0/8")
