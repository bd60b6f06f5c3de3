"""Hybrid mode in Mininet: MetaFlow beside a fabric that forwards on its own.

A loop-free three-tier tree of Open vSwitch bridges, fail-mode secure, each
with an operator's ``priority=0,actions=NORMAL`` entry installed before any
controller exists. Pings between every pair of hosts and TCP transfers
(iperf) work before the controller starts, while it runs in hybrid mode,
after it is killed with SIGKILL, and after it returns. The controller
installs only its own entries: no /32 routes, no drop-all, ARP for the
gateway only; it finds the storage servers with ARP probes (they are never
announced). ``ovs-appctl ofproto/trace`` on a client's edge switch shows a
port-9000 request to an ID taking a MetaFlow entry, and port 9001 and
ordinary traffic taking NORMAL; the MetaFlow entries' packet counters rise
with real requests, and the clients' writes and reads all come back.
"""

from __future__ import annotations

import time
import warnings

import pytest

from client_lib.constants import ADMIN_PORT, COOKIE_METAFLOW, COOKIE_NORMAL, METAFLOW_PORT
from client_lib.mdid import DEFAULT_SPACE, mdid
from controller.arp import GATEWAY_MAC
from mininet_scenarios.metaflow_net import MetaFlowNet
from mininet_scenarios.syscmd import appctl
from topology import builders

warnings.filterwarnings("ignore", category=DeprecationWarning)

GRAPH = builders.three_tier(core=1, agg=2, edges=4, servers_per_edge=2, edge_uplinks=1, clients_per_edge=1)
OPERATOR_NORMAL = "priority=0,actions=NORMAL"
IPERF_PORT = 5001
PING_TIMEOUT = 2
FILES = 60
TCP_PAIRS = [("e0h2", "e3h1"), ("e1h0", "e2h2"), ("e3h2", "e0h0")]
"""(sender, listener) of each iperf run: across the core, clients and servers both ways
(e<edge>h0, h1: storage servers; h2: the edge's client)."""


def iperf(mf: MetaFlowNet, client: str, server: str) -> int:
    """Bytes one 1-second iperf (TCP) moved from `client` to `server`."""
    scenario = mf.running
    listener = scenario.host(server).popen(["iperf", "-s", "-p", str(IPERF_PORT)])
    try:
        for _ in range(20):   # until the listener is up
            done = scenario.ns(client).run("iperf", "-c", scenario.host(server).IP(), "-p", str(IPERF_PORT),
                                           "-t", "1", "-y", "C", check=False, timeout=30)
            lines = done.stdout.strip().splitlines()
            if done.returncode == 0 and lines and len(lines[-1].split(",")) > 7:
                return int(lines[-1].split(",")[7])
            time.sleep(0.25)
        raise AssertionError(f"iperf {client} -> {server}: {done.stdout} {done.stderr}")
    finally:
        listener.terminate()
        listener.wait()


def forwards(mf: MetaFlowNet, when: str) -> None:
    """Every pair of hosts pings; TCP moves data across the tree."""
    assert mf.running.net is not None
    assert mf.running.net.pingAll(timeout=PING_TIMEOUT) == 0, f"ping loss {when}"
    for client, server in TCP_PAIRS:
        assert iperf(mf, client, server) > 100_000, f"iperf {client} -> {server} {when}"


def edge_of(host: str) -> tuple[str, int]:
    """(bridge's builder name, port) where `host` is attached."""
    (switch,) = list(GRAPH.neighbors(host))
    return switch, builders.port(GRAPH, switch, host)


def trace(mf: MetaFlowNet, client: str, nw_dst: str, proto: str, tp_dst: int | None = None) -> str:
    """`ovs-appctl ofproto/trace` of one packet from `client` on its edge switch."""
    switch, port = edge_of(client)
    data = GRAPH.nodes[client]
    flow = (f"in_port={port},{proto},dl_src={data['mac']},dl_dst={GATEWAY_MAC},"
            f"nw_src={data['ip']},nw_dst={nw_dst}" + (f",tp_dst={tp_dst}" if tp_dst else ""))
    return appctl("ofproto/trace", mf.running.topo.names[switch], flow)


def cookie(value: int) -> str:
    return f"cookie {value:#x}"


def check_tables(mf: MetaFlowNet) -> None:
    """Only MetaFlow's own entries, above our NORMAL (which replaced the operator's)."""
    gateway = mf.running.gateway
    for switch in builders.switches(GRAPH):
        text = mf.dump_flows(switch)
        lines = [line for line in text.splitlines() if "priority=" in line]
        assert not [line for line in lines if "priority=1000" in line], f"/32 routes on {switch}"
        assert not [line for line in lines if line.rstrip().endswith("actions=drop")], f"drop on {switch}"
        (normal,) = [line for line in lines if "priority=0" in line and "actions=NORMAL" in line]
        assert f"cookie={COOKIE_NORMAL:#x}" in normal, normal
        arp = [line for line in lines if "arp" in line]
        assert len(arp) == 1 and f"arp_tpa={gateway}" in arp[0] and "CONTROLLER" in arp[0], arp


@pytest.mark.timeout(900)
def test_hybrid_mode_beside_a_fabric_that_forwards_on_its_own(tmp_path):
    with MetaFlowNet(GRAPH, workdir=tmp_path, mode="hybrid",
                     operator_flows=[OPERATOR_NORMAL], controller_later=True, build_timeout=120) as mf:
        forwards(mf, "before the controller starts")
        mf.start_controller()
        check_tables(mf)
        forwards(mf, "while the controller runs")

        client = "e0h2"
        some_id = str(DEFAULT_SPACE.address(mdid("/hybrid/trace", DEFAULT_SPACE)))
        request = trace(mf, client, some_id, "tcp", METAFLOW_PORT)
        assert cookie(COOKIE_METAFLOW) in request and "NORMAL" not in request, request
        admin = trace(mf, client, some_id, "tcp", ADMIN_PORT)
        assert cookie(COOKIE_NORMAL) in admin and cookie(COOKIE_METAFLOW) not in admin, admin
        other = GRAPH.nodes["e3h1"]["ip"]
        for proto, port in (("icmp", None), ("tcp", IPERF_PORT), ("tcp", METAFLOW_PORT)):
            plain = trace(mf, client, other, proto, port)   # a host's own address: never MetaFlow's
            assert cookie(COOKIE_NORMAL) in plain and cookie(COOKIE_METAFLOW) not in plain, plain

        edge, _ = edge_of(client)
        before = mf.metaflow_packets(edge)
        results = mf.run_clients(FILES, tmp_path)
        assert all(r["errors"] == 0 and r["read_back"] == r["written"] == FILES for r in results), results
        count = mf.metaflow_packets(edge, beyond=before + FILES)
        assert count > before + FILES, f"requests did not take MetaFlow's entries ({before} -> {count})"
        tables = mf.switch_tables()

        assert mf.controller is not None
        mf.controller.kill()
        forwards(mf, "after kill -9 of the controller")
        check_tables(mf)
        assert mf.switch_tables() == tables
        read = mf.verify_acked(tmp_path, [])
        assert read["missing"] == read["wrong"] == 0 and read["checked"] == 4 * FILES, read

        mf.restart_controller(kill=True)
        check_tables(mf)
        assert mf.switch_tables() == tables
        forwards(mf, "after the controller returned")
        results = mf.run_clients(FILES, tmp_path, start=FILES)
        assert all(r["errors"] == 0 and r["read_back"] == r["written"] == FILES for r in results), results
        read = mf.verify_acked(tmp_path, [])
        assert read["missing"] == read["wrong"] == 0 and read["checked"] == 2 * 4 * FILES, read
