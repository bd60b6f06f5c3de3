"""Mininet topologies built from `topology.builders` graphs, without translation.

The controller classifies what it discovers (dpids, port numbers, host
addresses, storage roles), so a Mininet network is only a faithful test of it
when those are exactly the builder's. `GraphTopo` copies them one to one:
each switch gets the builder's dpid (as the 16-hex-digit string Mininet
wants), each link the builder's port numbers (Mininet requests them from OVS
as ``ofport_request``), each host its IP (/8), MAC and role.

Node names are Mininet's usual ``h<n>``/``s<dpid>`` behind a prefix:
``<prefix>h5`` is the host with address 10.0.0.5, ``<prefix>s3`` the switch
with dpid 3. Names must be short because Linux interface names
(``<node>-eth<port>``, and the scenario's ``<host>-mgmt``) have at most 15
characters, and unique on the machine because OVS bridges and root-namespace
interfaces are shared by everyone on it; the prefix takes care of the second.

From the command line (``mn`` execs this file; it needs the repository and
networkx, so run ``mn`` with the venv's interpreter)::

    .venv/bin/python /usr/bin/mn --custom mininet_scenarios/topos.py \\
        --topo fattree,4,prefix=mf --controller remote,port=6653 \\
        --switch ovs,datapath=user,protocols=OpenFlow10

Beware that ``mn`` answers any exception, and Ctrl-C, with its full cleanup
(``mn -c``), which removes every Mininet network on the machine, not only
its own; on a shared machine use `scenario.Scenario`, which removes exactly
what it made.

From Python: ``GraphTopo(graph, prefix="mf")`` or ``FatTreeTopo(4, prefix="mf")``.
"""

from __future__ import annotations

import ipaddress

import networkx as nx
from mininet.topo import Topo

from topology import builders
from topology.classify import discovered_graph

# The builders number hosts inside 10.0.0.0/8 (host n is 10.0.0.0 + n).
HOST_NETWORK = ipaddress.IPv4Network("10.0.0.0/8")
DEFAULT_PREFIX = "mf"
IFNAME_MAX = 15  # IFNAMSIZ - 1
# A scenario gives every host a management interface "<host>-mgmt" (mgmt.py),
# so host names are checked against that length here as well.
MGMT_SUFFIX = "-mgmt"


class GraphTopo(Topo):
    """A Mininet `Topo` holding exactly one builder graph.

    After construction: `source` is the builder graph, `prefix` the name
    prefix, `names` maps builder node -> Mininet node and `graph_names` back.
    Every Mininet node carries its builder name as the ``graph_name`` param.
    """

    def build(self, graph: nx.Graph, prefix: str = DEFAULT_PREFIX) -> None:
        check_prefix(prefix)
        self.source = graph
        self.prefix = prefix
        self.names = {node: mininet_name(graph, node, prefix) for node in graph}
        self.graph_names = {name: node for node, name in self.names.items()}
        if len(self.graph_names) != len(self.names):
            raise ValueError("two builder nodes map to one Mininet name (duplicate dpid or address?)")
        for switch in builders.switches(graph):
            self.addSwitch(self.names[switch], dpid=f"{graph.nodes[switch]['dpid']:016x}", graph_name=switch)
        for host in builders.hosts(graph):
            data = graph.nodes[host]
            self.addHost(self.names[host], ip=f"{data['ip']}/{HOST_NETWORK.prefixlen}", mac=data["mac"],
                         role=data["role"], graph_name=host)
        for u, v, data in graph.edges(data=True):
            ports = data["ports"]
            self.addLink(self.names[u], self.names[v], port1=ports[u], port2=ports[v])
        _check_interface_names(self)


class FatTreeTopo(GraphTopo):
    """`builders.fat_tree` as a Topo: ``--topo fattree,4[,servers=N][,placement=spread]``."""

    def build(self, k: int, servers: int | None = None, placement: str = "packed",  # type: ignore[override]
              prefix: str = DEFAULT_PREFIX) -> None:
        super().build(builders.fat_tree(k, servers, placement), prefix)


class TwoTierTopo(GraphTopo):
    """`builders.two_tier` as a Topo: ``--topo twotier,CORE,EDGES,SERVERS_PER_EDGE[,clients_per_edge=N]``."""

    def build(self, core: int = 2, edges: int = 4, servers_per_edge: int = 4,  # type: ignore[override]
              clients_per_edge: int = 0, prefix: str = DEFAULT_PREFIX) -> None:
        super().build(builders.two_tier(core, edges, servers_per_edge, clients_per_edge), prefix)


class ThreeTierTopo(GraphTopo):
    """`builders.three_tier` as a Topo: ``--topo threetier,CORE,AGG,EDGES,SERVERS_PER_EDGE[,...]``.

    The builder's defaults are the paper's 200-server testbed; pass small
    numbers for Mininet.
    """

    def build(self, core: int = 1, agg: int = 2, edges: int = 10,  # type: ignore[override]
              servers_per_edge: int = 20, edge_uplinks: int = 1, clients_per_edge: int = 0,
              prefix: str = DEFAULT_PREFIX) -> None:
        super().build(builders.three_tier(core, agg, edges, servers_per_edge, edge_uplinks, clients_per_edge),
                      prefix)


# `mn --custom` picks this up.
topos = {"fattree": FatTreeTopo, "twotier": TwoTierTopo, "threetier": ThreeTierTopo}


def check_prefix(prefix: str) -> None:
    """Names go into OVS, ip-link and shell prompts: letters and digits only,
    starting with a letter."""
    if not (prefix.isascii() and prefix.isalnum() and prefix[:1].isalpha()):
        raise ValueError(f"prefix {prefix!r}: want letters and digits, starting with a letter")


def mininet_name(graph: nx.Graph, node: str, prefix: str) -> str:
    """``<prefix>s<dpid>`` for a switch, ``<prefix>h<n>`` for the host at 10.0.0.n."""
    data = graph.nodes[node]
    if data["kind"] == "switch":
        return f"{prefix}s{data['dpid']}"
    return f"{prefix}h{host_number(graph, node)}"


def host_number(graph: nx.Graph, node: str) -> int:
    """n for the host at 10.0.0.n: its number in Mininet names and management addresses."""
    address = ipaddress.IPv4Address(graph.nodes[node]["ip"])
    if address not in HOST_NETWORK:
        raise ValueError(f"host {node} has address {address}, outside {HOST_NETWORK}")
    return int(address) - int(HOST_NETWORK.network_address)


def builder_graph(topo: GraphTopo) -> nx.Graph:
    """The builder graph `topo` was made from (node names are the builder's)."""
    return topo.source


def discovered(topo: GraphTopo) -> nx.Graph:
    """What the controller's discovery would hand the classifier for `topo`.

    Read back from Mininet's own records (dpid strings, link ports, host
    params), not from the builder graph, so comparing it with the builder
    graph's discovered form checks the translation. Hosts are named by IP.
    """
    info = topo.nodeInfo
    dpids = {s: int(info(s)["dpid"], 16) for s in topo.switches()}
    links, hosts = [], []
    for a, b, link in topo.links(withInfo=True):
        ends = {link["node1"]: link["port1"], link["node2"]: link["port2"]}
        switch_ends = [n for n in (a, b) if n in dpids]
        if len(switch_ends) == 2:
            links.append((dpids[a], ends[a], dpids[b], ends[b]))
        else:
            (switch,) = switch_ends
            host = b if switch == a else a
            data = info(host)
            ip = data["ip"].split("/")[0]
            hosts.append((ip, dpids[switch], ends[switch], data["mac"], ip, data["role"]))
    return discovered_graph(dpids.values(), links, hosts)


def _check_interface_names(topo: GraphTopo) -> None:
    """Fail at build time, naming the culprit, instead of inside `ip link`."""
    names = [f"{link[f'node{i}']}-eth{link[f'port{i}']}" for _, _, link in topo.links(withInfo=True)
             for i in (1, 2)]
    names += [f"{host}{MGMT_SUFFIX}" for host in topo.hosts()]
    longest = max(names, key=len, default="")
    if len(longest) > IFNAME_MAX:
        raise ValueError(f"interface name {longest!r} is longer than {IFNAME_MAX} characters; "
                         f"use a shorter prefix than {topo.prefix!r} or a smaller topology")
