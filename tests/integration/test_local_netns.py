"""The ``local`` rewrite for real: the real agent takes the MetaDataID space as
local addresses in a server namespace, and a client namespace probes what
must and must not happen on the wire.

The 5,000-round-trip audit of every reply's source, and the crash and
restart, are in `test_agent_netns.py` (parametrised over the modes).
"""

from __future__ import annotations

import json
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest

from client_lib.cidr import Block
from mininet_scenarios.daemons import AgentProcess
from mininet_scenarios.netns_pair import Namespace, NetnsPair
from nat_agent.anyip_plan import anyip_plan
from tests.integration.test_rewrite_netns import stateful_firewall

pytestmark = pytest.mark.timeout(180)

IDS = ["100.64.0.9", "100.100.3.7", "100.127.255.254"]


@pytest.fixture
def served(tmp_path: Path) -> Iterator[tuple[NetnsPair, AgentProcess]]:
    """A pair whose server runs the agent in local mode behind a stateful
    firewall (INPUT drops what conntrack calls INVALID)."""
    with NetnsPair(prefix="mflo") as net:
        stateful_firewall(net.server)
        agent = AgentProcess(f"leveldb:{tmp_path / 'db'}", own=[net.space], rewrite="local",
                             host="0.0.0.0", port=9000, netns=net.server, name="lo1",
                             log_path=tmp_path / "agent.log")
        agent.argv += ["--data-ip", net.server_ip]
        with agent:
            yield net, agent


def _client(ns: Namespace, script: str) -> dict:
    """Run a Python snippet in the client namespace; it prints one JSON object."""
    return json.loads(ns.run(sys.executable, "-c", textwrap.dedent(script), timeout=60).stdout)


PING_FROM_ONE_PORT = """
import json, socket, time
ids, results, socks = {ids!r}, [], []
for mdid in ids:
    s = socket.socket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind(("0.0.0.0", 41000))  # the same client port for every connection
    s.settimeout(3)
    started = time.monotonic()
    try:
        s.connect((mdid, 9000))
        s.sendall(b"PING\\r\\n")
        results.append([s.getpeername()[0], s.recv(64).decode(), round(time.monotonic() - started, 3)])
        if {quit}:  # the server closes first and keeps the old 4-tuple in TIME_WAIT
            s.sendall(b"QUIT\\r\\n")
            s.recv(64), s.recv(64)
            s.close()
    except OSError as exc:
        results.append([mdid, repr(exc), round(time.monotonic() - started, 3)])
    socks.append(s)
print(json.dumps({{"results": results}}))
"""


@pytest.mark.parametrize("quit_first", [False, True], ids=["open-together", "one-after-another"])
def test_one_client_port_reaches_many_ids(served: tuple[NetnsPair, AgentProcess], quit_first: bool) -> None:
    """Issue 13: after a rewrite, connections from one client port to two
    mdids of one server would be one 4-tuple at the server, so the kernel
    and nfqueue modes give the second another port (`test_rewrite_netns.py`).
    Without a rewrite they are different connections, each answered at
    once from its mdid, whether open together or one after another."""
    net, _ = served
    results = _client(net.client, PING_FROM_ONE_PORT.format(ids=IDS, quit=quit_first))["results"]
    assert [r[:2] for r in results] == [[mdid, "+PONG\r\n"] for mdid in IDS], results
    assert all(seconds < 0.9 for *_, seconds in results), results  # no SYN retransmission (1 s)


def test_no_arp_no_icmp_and_no_forwarding_for_ids(served: tuple[NetnsPair, AgentProcess]) -> None:
    """Only TCP to the service port is local: the server answers no ARP and
    no ping for an mdid, and with forwarding on it still routes none away."""
    net, _ = served
    net.server.run("sysctl", "-qw", "net.ipv4.ip_forward=1")
    # On-link, so the client ARPs for each mdid itself (the fabric never does).
    net.client.run("ip", "route", "replace", net.space, "dev", net.client_if)
    for target in [*IDS, net.server_ip]:
        net.client.run("ping", "-c", "1", "-W", "1", target, check=False)
    neighbours = net.client.run("ip", "neigh", "show", "dev", net.client_if).stdout
    learned = {line.split()[0] for line in neighbours.splitlines() if "lladdr" in line}
    assert net.server_ip in learned  # ARP itself works: the probe could have seen a reply
    assert learned.isdisjoint(IDS), neighbours
    net.client.run("ip", "route", "replace", net.space, "via", net.server_ip)
    echo = net.client.run("ping", "-c", "1", "-W", "1", IDS[0], check=False)
    assert echo.returncode != 0, echo.stdout  # ICMP to an mdid is not local
    served_again = _client(net.client, PING_FROM_ONE_PORT.format(ids=IDS[:1], quit=False))["results"]
    assert served_again[0][1] == "+PONG\r\n"


def test_ids_bypass_conntrack_while_the_firewall_tracks_the_rest(
        served: tuple[NetnsPair, AgentProcess]) -> None:
    """Requests to mdids pass untracked (the firewall's port rule accepts
    them); a client of the server's own address is tracked as before."""
    net, agent = served
    tag = f"metaflow-agent:{agent.name}"
    plan = anyip_plan(Block.parse(net.space), net.server_if, 9000, tag)
    assert str(plan.table) in net.server.run("ip", "rule", "show").stdout
    own = _client(net.client, PING_FROM_ONE_PORT.format(ids=[net.server_ip], quit=False))["results"]
    assert own[0][:2] == [net.server_ip, "+PONG\r\n"]
    before = _notrack_packets(net.server)
    by_id = _client(net.client, PING_FROM_ONE_PORT.format(ids=IDS, quit=False))["results"]
    assert all(r[1] == "+PONG\r\n" for r in by_id), by_id
    # Each connection's handshake, request and replies both ways: at least
    # 3 packets in and 2 out per mdid went through the NOTRACK rules.
    assert _notrack_packets(net.server) - before >= 5 * len(IDS)


def _notrack_packets(ns: Namespace) -> int:
    """Packets counted by the raw table's CT --notrack rules."""
    listing = ns.run("iptables", "-t", "raw", "-L", "-v", "-x", "-n").stdout
    return sum(int(line.split()[0]) for line in listing.splitlines() if "CT notrack" in line)
