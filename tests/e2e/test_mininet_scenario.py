"""A real MetaFlow scenario: Mininet, userspace OVS, management network, agents.

The fabric is the builders' two-tier tree with one core switch, so it has no
loop and OVS in fail_mode "standalone" (a plain learning switch) forwards
without a controller. That checks everything the scenario itself provides:
reachability, builder dpids and ports on the real bridges, the management
network, the agents, the clients' route to the gateway, and a teardown that
leaves nothing behind, also after an exception and after SIGTERM.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

pytest.importorskip("mininet.net", reason="Debian's mininet is not importable (make setup links it)")


def _ovs_answers() -> bool:
    try:
        return subprocess.run(["ovs-vsctl", "--timeout=5", "show"], capture_output=True).returncode == 0
    except FileNotFoundError:
        return False


pytestmark = [
    pytest.mark.skipif(os.geteuid() != 0, reason="Mininet needs root"),
    pytest.mark.skipif(shutil.which("mnexec") is None, reason="mnexec (Debian's mininet) is not installed"),
    pytest.mark.skipif(not _ovs_answers(), reason="Open vSwitch is not running (ovs-ctl start)"),
    pytest.mark.filterwarnings("ignore:distutils Version classes are deprecated:DeprecationWarning"),
]

from client_lib.api.admin import ADMIN  # noqa: E402
from client_lib.constants import DEFAULT_GATEWAY  # noqa: E402
from mininet_scenarios.leaks import leaks  # noqa: E402
from mininet_scenarios.mgmt import ManagementNetwork  # noqa: E402
from mininet_scenarios.scenario import Scenario  # noqa: E402
from nat_agent.ports import listen_port  # noqa: E402
from topology import builders  # noqa: E402

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
GRAPH = builders.two_tier(core=1, edges=2, servers_per_edge=2, clients_per_edge=1)
PING = b"*1\r\n$4\r\nPING\r\n"
# One RESP PING over TCP from inside a host: crosses the fabric, so it also
# checks that checksum offload is off (with it on, TCP through the
# userspace datapath hangs).
RESP_PING = ("import socket, sys; s = socket.create_connection((sys.argv[1], 9000), timeout=5); "
             f"s.sendall({PING!r}); print(s.recv(64).decode().strip())")


def _vsctl(*argv: str) -> str:
    return subprocess.run(["ovs-vsctl", "--timeout=5", *argv], capture_output=True, text=True,
                          check=True).stdout.strip().strip('"')


@pytest.fixture(scope="module")
def scenario():
    with Scenario(GRAPH, controller=None, fail_mode="standalone") as sc:
        yield sc


@pytest.mark.timeout(30)
def test_all_pairs_ping(scenario):
    hosts = builders.hosts(GRAPH)
    failed = [(a, b) for a in hosts for b in hosts if a != b and
              scenario.ns(a).run("ping", "-c1", "-W2", GRAPH.nodes[b]["ip"], check=False).returncode]
    assert not failed, f"no ping reply for {failed}"


@pytest.mark.timeout(30)
def test_tcp_across_the_fabric_reaches_every_agent_service(scenario):
    client = builders.client_hosts(GRAPH)[0]
    for server in builders.storage_hosts(GRAPH):
        out = scenario.ns(client).run(sys.executable, "-c", RESP_PING, GRAPH.nodes[server]["ip"], timeout=10)
        assert out.stdout.strip() == "+PONG", (server, out.stdout, out.stderr)


@pytest.mark.timeout(30)
def test_switches_carry_the_builder_dpids_and_port_numbers(scenario):
    """What the controller will see over OpenFlow: the OVS datapath ids and ofports."""
    for switch in builders.switches(GRAPH):
        name = scenario.topo.names[switch]
        assert int(_vsctl("get", "Bridge", name, "datapath_id"), 16) == GRAPH.nodes[switch]["dpid"]
        for neighbor in GRAPH[switch]:
            port = builders.port(GRAPH, switch, neighbor)
            assert int(_vsctl("get", "Interface", f"{name}-eth{port}", "ofport")) == port


@pytest.mark.timeout(30)
def test_agents_answer_over_the_management_network_with_their_data_address(scenario):
    assert set(scenario.agents) == set(builders.storage_hosts(GRAPH))
    for node, agent in scenario.agents.items():
        mgmt_ip = scenario.mgmt_ips[node]
        assert agent.admin_url == f"http://{mgmt_ip}:9001"
        # the root namespace reaches it over the management bridge, not the fabric
        route = subprocess.run(["ip", "route", "get", mgmt_ip], capture_output=True, text=True).stdout
        assert f"dev {scenario.mgmt.bridge} " in route
        health = agent.admin.call(ADMIN.health)  # signed, as the controller calls it
        assert health.status == "ok"
        data = GRAPH.nodes[node]
        assert (health.data_ip, health.data_mac, health.data_port) == (data["ip"], data["mac"], 9000)
        assert health.name == scenario.host(node).name
        assert health.store == "leveldb"


@pytest.mark.timeout(30)
def test_clients_route_the_space_to_the_gateway(scenario):
    for node in builders.client_hosts(GRAPH):
        route = scenario.ns(node).run("ip", "route", "get", "100.64.1.2").stdout
        assert f"via {DEFAULT_GATEWAY} dev {scenario.host(node).defaultIntf().name}" in route
    for node in builders.storage_hosts(GRAPH):  # servers answer from the space, they never route to it
        assert scenario.ns(node).run("ip", "route", "get", "100.64.1.2", check=False).returncode != 0


@pytest.mark.timeout(30)
def test_teardown_leaves_nothing_with_the_prefix(scenario):
    assert scenario.leaks(), "the leak check must see a running scenario"
    scenario.close()
    assert scenario.leaks() == {}
    print(f"bring-up and teardown seconds: {scenario.timings}")


def test_a_management_subnet_already_routed_here_is_refused():
    """Two scenarios on one machine must not share a management subnet (it lives in the root namespace)."""
    routes = [line.split()[0] for line in subprocess.run(["ip", "-4", "route", "show"], capture_output=True,
                                                         text=True).stdout.splitlines()]
    taken = next((r for r in routes if "/" in r), None)
    if taken is None:
        pytest.skip("no IPv4 subnet route to collide with")
    mgmt = ManagementNetwork("mfnone", taken)
    with pytest.raises(RuntimeError, match="overlaps"):
        mgmt.up()
    assert leaks("mfnone") == {}


def test_scenarios_started_at_once_without_a_subnet_take_different_free_ones():
    """The choice is made under a lock: threads racing to `up` never share a subnet."""
    nets = [ManagementNetwork(f"mfsub{i}") for i in range(3)]
    try:
        with ThreadPoolExecutor(len(nets)) as pool:
            list(pool.map(lambda mgmt: mgmt.up(), nets))
        subnets = [mgmt.network for mgmt in nets]
        assert all(not a.overlaps(b) for i, a in enumerate(subnets) for b in subnets[i + 1:]), subnets
        for mgmt in nets:
            route = subprocess.run(["ip", "-4", "route", "show", "dev", mgmt.bridge], capture_output=True,
                                   text=True, check=True).stdout
            assert route.startswith(f"{mgmt.network} "), (mgmt.bridge, route)
    finally:
        for mgmt in nets:
            mgmt.close()
    assert all(leaks(f"mfsub{i}") == {} for i in range(len(nets)))


@pytest.mark.timeout(30)
def test_an_exception_inside_the_scenario_still_tears_everything_down():
    graph = builders.two_tier(core=1, edges=1, servers_per_edge=1, clients_per_edge=1)
    with pytest.raises(RuntimeError, match="boom"):
        with Scenario(graph, controller=None, fail_mode="standalone") as sc:
            raise RuntimeError("boom")
    assert leaks(sc.prefix, sc.netns_inodes) == {}


@pytest.mark.timeout(45)
def test_sigterm_tears_everything_down():
    child = subprocess.Popen([sys.executable, str(HERE / "scenario_child.py")], cwd=ROOT,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        line = child.stdout.readline()
        assert line, f"the child exited with {child.wait()}: {child.stderr.read()[-2000:]}"
        report = json.loads(line)
        assert report["stores"] == ["redis", "redis"]
        assert leaks(report["prefix"], report["inodes"])
        child.send_signal(signal.SIGTERM)
        assert child.wait(timeout=30) == 0, child.stderr.read()[-2000:]
    finally:
        if child.poll() is None:  # a failed check above: still let it tear down
            child.send_signal(signal.SIGTERM)
            try:
                child.wait(timeout=30)
            except subprocess.TimeoutExpired:
                child.kill()
                child.wait()
    assert leaks(report["prefix"], report["inodes"]) == {}


def _openflow_endpoint(port: int, started: list[subprocess.Popen]):
    """A start_controller hook: run openflow_endpoint.py, wait until it listens, return its stopper."""
    def start(scenario: Scenario):
        proc = subprocess.Popen([sys.executable, str(HERE / "openflow_endpoint.py"), str(port)], cwd=ROOT,
                                stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        started.append(proc)
        deadline = time.monotonic() + 15
        while True:
            if proc.poll() is not None:
                _, stderr = proc.communicate()
                raise RuntimeError(f"OpenFlow endpoint exited: {stderr[-2000:]}")
            try:
                socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
                break
            except OSError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.05)

        def stop() -> None:
            proc.terminate()
            proc.wait(10)
        return stop
    return start


@pytest.mark.timeout(45)
def test_secure_mode_connects_to_the_controller_the_hook_started():
    """Bring-up waits until every switch is connected; an empty controller makes them forward nothing."""
    graph = builders.two_tier(core=1, edges=2, servers_per_edge=1)
    port, started = listen_port(), []
    try:
        with Scenario(graph, controller=("127.0.0.1", port),
                      start_controller=_openflow_endpoint(port, started), connect_timeout=15) as sc:
            for switch in builders.switches(graph):
                name = sc.topo.names[switch]
                assert _vsctl("get", "Bridge", name, "fail_mode") == "secure"
                assert _vsctl("get", "Controller", _vsctl("get", "Bridge", name, "controller").strip("[]"),
                              "target") == f"tcp:127.0.0.1:{port}"
            a, b = builders.hosts(graph)
            assert sc.ns(a).run("ping", "-c1", "-W1", graph.nodes[b]["ip"], check=False).returncode != 0
        assert started[0].poll() is not None, "the hook's stopper did not run"
        assert sc.leaks() == {}
    finally:
        for proc in started:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
