"""The Mininet topologies carry exactly the builder graphs (pure: nothing is started).

The controller classifies what discovery finds (dpids, link ports, host
addresses and roles), so that is what must survive the translation: the
graph read back from Mininet's own records must equal the builder graph's
discovered form, switch for switch and port for port.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import networkx as nx
import pytest

pytest.importorskip("mininet.topo", reason="Debian's mininet is not importable (make setup links it)")

from mininet.util import buildTopo  # noqa: E402

from mininet_scenarios.topos import (  # noqa: E402
    IFNAME_MAX,
    FatTreeTopo,
    GraphTopo,
    builder_graph,
    discovered,
)
from topology import builders  # noqa: E402
from topology.classify import discovered_graph  # noqa: E402

TOPOS_FILE = Path(__file__).resolve().parents[2] / "mininet_scenarios" / "topos.py"

GRAPHS = {
    "fattree-k4": lambda: builders.fat_tree(4),
    "fattree-k4-spread": lambda: builders.fat_tree(4, servers=6, placement="spread"),
    "twotier": lambda: builders.two_tier(core=2, edges=3, servers_per_edge=2, clients_per_edge=1),
    "twotier-one-core": lambda: builders.two_tier(core=1, edges=2, servers_per_edge=2, clients_per_edge=1),
    "threetier": lambda: builders.three_tier(core=2, agg=4, edges=4, servers_per_edge=2, edge_uplinks=2,
                                             clients_per_edge=1),
    "fattree-k4+app": lambda: builders.attach_app_cluster(builders.fat_tree(4, servers=8), 1, 2),
}


def builder_discovered(g: nx.Graph) -> nx.Graph:
    """The builder graph as discovery would report it, straight from the builder's attributes."""
    dpid = {s: g.nodes[s]["dpid"] for s in builders.switches(g)}
    links = [(dpid[u], d["ports"][u], dpid[v], d["ports"][v])
             for u, v, d in g.edges(data=True) if u in dpid and v in dpid]
    hosts = []
    for h in builders.hosts(g):
        (switch,) = g[h]
        data = g.nodes[h]
        hosts.append((data["ip"], dpid[switch], builders.port(g, switch, h), data["mac"], data["ip"],
                      data["role"]))
    return discovered_graph(dpid.values(), links, hosts)


@pytest.mark.parametrize("name", sorted(GRAPHS))
def test_topo_reads_back_as_the_builder_graph(name):
    g = GRAPHS[name]()
    topo = GraphTopo(g, prefix="mf")
    assert builder_graph(topo) is g
    assert nx.utils.graphs_equal(discovered(topo), builder_discovered(g))
    assert len(topo.switches()) == len(builders.switches(g))
    assert len(topo.hosts()) == len(builders.hosts(g))
    assert len(topo.links()) == g.number_of_edges()


@pytest.mark.parametrize("name", sorted(GRAPHS))
def test_mininet_records_dpids_ports_and_host_params(name):
    """Checked on Mininet's own fields, the ones `Mininet.build` hands to OVS and hosts."""
    g = GRAPHS[name]()
    topo = GraphTopo(g, prefix="mf")
    for switch in builders.switches(g):
        info = topo.nodeInfo(topo.names[switch])
        assert re.fullmatch(r"[0-9a-f]{16}", info["dpid"])
        assert int(info["dpid"], 16) == g.nodes[switch]["dpid"]
    for host in builders.hosts(g):
        info = topo.nodeInfo(topo.names[host])
        data = g.nodes[host]
        assert (info["ip"], info["mac"], info["role"]) == (f"{data['ip']}/8", data["mac"], data["role"])
    for u, v, data in g.edges(data=True):
        assert topo.port(topo.names[u], topo.names[v]) == (data["ports"][u], data["ports"][v])


def test_names_are_prefixed_mininet_style_and_fit_interfaces():
    g = builders.fat_tree(4)
    topo = GraphTopo(g, prefix="mfx1")
    assert set(topo.graph_names) == set(topo.switches()) | set(topo.hosts())
    for node, name in topo.names.items():
        data = g.nodes[node]
        expected = f"s{data['dpid']}" if data["kind"] == "switch" else f"h{data['ip'].rsplit('.', 1)[1]}"
        assert name == f"mfx1{expected}"
        assert topo.nodeInfo(name)["graph_name"] == node
    longest = max(len(f"{n}-eth{p}") for a, b in topo.links() for n, p in zip((a, b), topo.port(a, b)))
    assert longest <= IFNAME_MAX


def test_names_too_long_for_interfaces_are_refused():
    with pytest.raises(ValueError, match="longer than 15 characters"):
        FatTreeTopo(8, prefix="mfabcdefg")
    with pytest.raises(ValueError, match="prefix"):
        FatTreeTopo(4, prefix="mf-1")


def test_mn_custom_file_builds_the_same_topologies() -> None:
    """`mn --custom topos.py --topo ...` execs the file into a dict and calls buildTopo."""
    customs: dict[str, Any] = {}
    exec(compile(TOPOS_FILE.read_text(), str(TOPOS_FILE), "exec"), customs, customs)
    cases = {
        "fattree,4,prefix=mx": builders.fat_tree(4),
        "twotier,1,2,2,clients_per_edge=1": builders.two_tier(1, 2, 2, 1),
        "threetier,1,2,2,2": builders.three_tier(1, 2, 2, 2),
    }
    for spec, g in cases.items():
        topo = buildTopo(customs["topos"], spec)
        assert nx.utils.graphs_equal(discovered(topo), builder_discovered(g)), spec
    assert buildTopo(customs["topos"], "fattree,4,prefix=mx").hosts()[0] == "mxh1"
