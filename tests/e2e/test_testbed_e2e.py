"""The paper's testbed topology in Mininet, built and torn down (issue 26's short form).

All 14 switches of `builders.paper_testbed` (1 core, 2 aggregation, 10 edges
and the application cluster's client switch under the core) on Open vSwitch,
with 2 storage servers per edge instead of 20 (20 real agents: the 200 take
minutes to start on this machine's 2 cores, docs/testbed.md) and 2 client
hosts. Checked: every switch connected and classified into its declared
layer, the links LLDP discovered are exactly the declared ones port for port,
every agent registered and located, and writes from both clients reach the
owner of their IDs through the switches and read back; then everything is
gone.
"""

from __future__ import annotations

import pytest

from client_lib.api.rest import REST
from mininet_scenarios.metaflow_net import MetaFlowNet
from topology import builders

GRAPH = builders.named("testbed:servers_per_edge=2,clients=2")


def declared_links() -> set[frozenset[tuple[int, int]]]:
    """Switch-to-switch links of the builder graph as {(dpid, port), (dpid, port)}."""
    sw = set(builders.switches(GRAPH))
    return {frozenset({(GRAPH.nodes[u]["dpid"], builders.port(GRAPH, u, v)),
                       (GRAPH.nodes[v]["dpid"], builders.port(GRAPH, v, u))})
            for u, v in GRAPH.edges if u in sw and v in sw}


@pytest.mark.timeout(300)
def test_the_testbed_topology_comes_up_routes_and_goes(tmp_path):
    with MetaFlowNet(GRAPH, capacity=100_000, replicas=1, workdir=tmp_path,
                     controller_args=["--bootstrap", "preallocate:20"]) as mf:
        topo = mf.view(REST.topology)
        layers = {GRAPH.nodes[s]["dpid"]: GRAPH.nodes[s]["layer"] for s in builders.switches(GRAPH)}
        assert {s.dpid: s.layer for s in topo.switches} == layers
        seen = {frozenset({(a, pa), (b, pb)}) for a, pa, b, pb in topo.links}
        assert seen == declared_links()
        assert {h.ip for h in topo.hosts} >= {GRAPH.nodes[h]["ip"] for h in builders.hosts(GRAPH)}
        servers = mf.view(REST.servers).servers
        names = {mf.running.topo.names[h] for h in builders.storage_hosts(GRAPH)}
        assert set(servers) == names and all(s.blocks for s in servers.values())
        results = mf.run_clients(100, tmp_path)
        assert all(r["errors"] == 0 and r["written"] == r["read_back"] == 100 for r in results), results
        net, blocks, clients = mf.real_network()
        owners = [(b, name) for name, bs in blocks.items() for b in bs]
        for block, owner in owners:
            for client in clients:
                assert net.forward(client, block.first).host == owner
        check = mf.verify_acked(tmp_path, [])
        assert check["missing"] == check["wrong"] == 0 and check["checked"] == 2 * 100
    assert not mf.running.leaks()
