"""The rewrite for real: a client namespace sends to MetaDataIDs, the server
namespace runs the Rewriter and a plain echo service on 0.0.0.0:9000.

Each test builds its own namespace pair (`tests/netns.py`) and checks on
teardown that no namespace or interface is left. Needs root, iproute2 and
iptables; the processes in the namespaces are `rewrite_peers.py`.
"""

from __future__ import annotations

import json
import os
import select
import shlex
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from mininet_scenarios.netns_pair import Namespace, NetnsPair

pytestmark = [
    pytest.mark.skipif(os.geteuid() != 0 or not all(map(shutil.which, ("ip", "iptables"))),
                       reason="needs root, iproute2 and iptables"),
    pytest.mark.timeout(180),
]

PEERS = str(Path(__file__).with_name("rewrite_peers.py"))
SPACE = "100.64.0.0/10"
MDIDS = ["100.64.0.1", "100.93.7.41", "100.127.255.254"]
RULES = {"kernel": 2, "nfqueue": 4}


@pytest.fixture
def make_net() -> Iterator[Callable[..., NetnsPair]]:
    """Build NetnsPairs; on teardown close them and check nothing is left."""
    pairs: list[NetnsPair] = []

    def make(**kwargs) -> NetnsPair:
        pair = NetnsPair(prefix="mfrw", space=SPACE, **kwargs)
        pairs.append(pair)
        return pair.__enter__()

    yield make
    for pair in pairs:
        pair.close()
        namespaces = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
        links = subprocess.run(["ip", "-o", "link"], capture_output=True, text=True).stdout
        for name in pair.names():
            assert name not in namespaces.split()
            assert f" {name}@" not in links and f" {name}:" not in links


def start_rewriter(ns: Namespace, mode: str, own_ip: str,
                   tag: str) -> tuple[subprocess.Popen, dict]:
    """Run the Rewriter in `ns`; return the process and its first stats."""
    process = ns.popen(sys.executable, PEERS, "rewriter", mode, SPACE, own_ip, tag,
                       stdout=subprocess.PIPE, text=True)
    return process, json.loads(_read_line(process, 60))


def stop_rewriter(process: subprocess.Popen) -> dict:
    """SIGTERM the rewriter; return the stats it printed before stopping."""
    process.send_signal(signal.SIGTERM)
    out, _ = process.communicate(timeout=60)
    assert process.returncode == 0
    return json.loads(out.splitlines()[-1])


def start_echo(ns: Namespace) -> subprocess.Popen:
    process = ns.popen(sys.executable, PEERS, "echo", "9000", stdout=subprocess.PIPE, text=True)
    assert _read_line(process, 30) == "ready"
    return process


def round_trips(net: NetnsPair, size: int, addresses: list[str], timeout: float = 5) -> list[dict]:
    out = net.client.run(sys.executable, PEERS, "client", "9000", str(size), str(timeout),
                         *addresses).stdout
    return json.loads(out)


def tagged(ns: Namespace, tag: str) -> list[str]:
    """The `iptables-save` lines in `ns` whose comment is exactly `tag`."""
    lines = []
    for line in ns.run("iptables-save").stdout.splitlines():
        words = shlex.split(line)
        if "--comment" in words and words[words.index("--comment") + 1] == tag:
            lines.append(line)
    return lines


def _read_line(process: subprocess.Popen[str], timeout: float) -> str:
    stdout = process.stdout
    assert stdout is not None, "started without stdout=PIPE"
    ready, _, _ = select.select([stdout], [], [], timeout)
    assert ready, f"no output from {process.args!r} within {timeout} s"
    line = stdout.readline()
    assert line, f"{process.args!r} exited with {process.wait()}"
    return line.strip()


def stateful_firewall(ns: Namespace) -> None:
    """What a server's INPUT chain typically holds: it turns conntrack on, so
    the rewrite must keep conntrack's view of every connection consistent,
    for clients of an mdid and of our own address alike."""
    for rule in (["-i", "lo", "-j", "ACCEPT"],
                 ["-m", "conntrack", "--ctstate", "ESTABLISHED,RELATED", "-j", "ACCEPT"],
                 ["-m", "conntrack", "--ctstate", "INVALID", "-j", "DROP"],
                 ["-p", "tcp", "--dport", "9000", "-j", "ACCEPT"],
                 ["-p", "udp", "--dport", "9000", "-j", "ACCEPT"]):
        ns.run("iptables", "-A", "INPUT", *rule)
    ns.run("iptables", "-P", "INPUT", "DROP")


def assert_rewritten(results: list[dict]) -> None:
    for result in results:
        assert "error" not in result, result
        assert result["echo_ok"] and result["udp_ok"], result
        assert result["peer"] == result["udp_peer"] == result["address"], result


@pytest.mark.parametrize("mode, mtu, gro", [
    ("kernel", 1500, False),
    ("nfqueue", 1500, True),    # GRO'd inbound segments, GSO'd replies
    ("nfqueue", 65000, False),  # whole 40 KB segments must be copied to user space
])
def test_requests_to_mdids_reach_the_service_and_replies_come_from_them(
        make_net: Callable[..., NetnsPair], mode: str, mtu: int, gro: bool) -> None:
    net = make_net(mtu=mtu)
    if gro:
        net.server.run("ethtool", "-K", net.server_if, "gro", "on")
    stateful_firewall(net.server)
    tag = f"metaflow-agent:{mode}"
    rewriter, _ = start_rewriter(net.server, mode, net.server_ip, tag)
    start_echo(net.server)
    assert len(tagged(net.server, tag)) == RULES[mode]

    for size in (100, 40_000):
        assert_rewritten(round_trips(net, size, MDIDS))
    direct = round_trips(net, 100, [net.server_ip])  # our own address still works
    assert direct[0]["echo_ok"] and direct[0]["peer"] == net.server_ip

    stats = stop_rewriter(rewriter)
    assert tagged(net.server, tag) == []
    if mode == "nfqueue":
        assert stats["errors"] == 0
        assert stats["inbound"] > 0 and stats["outbound"] > 0
        assert stats["rewritten"] >= stats["inbound"]


@pytest.mark.parametrize("mode", ["kernel", "nfqueue"])
def test_connections_from_one_client_port_to_several_mdids_stay_apart(
        make_net: Callable[..., NetnsPair], mode: str) -> None:
    """Once the mdid is rewritten away, two connections from one client port
    would be one connection to the server. Kernel mode's conntrack gives the
    second another port; the nfqueue agent's flow table must too, or the
    second SYN meets the first connection and the client's RST kills it."""
    net = make_net()
    stateful_firewall(net.server)
    rewriter, _ = start_rewriter(net.server, mode, net.server_ip, f"metaflow-agent:{mode}")
    start_echo(net.server)
    out = net.client.run(sys.executable, PEERS, "sameport", "9000", "40123", *MDIDS).stdout
    results = json.loads(out)
    for result in results:
        assert "error" not in result, results
        assert result["local_port"] == 40123 and result["peer"] == result["address"], results
        assert result["echoed"] == 3, results
    stats = stop_rewriter(rewriter)
    if mode == "nfqueue":
        assert stats["remapped"] == len(MDIDS) - 1 and stats["errors"] == 0


@pytest.mark.parametrize("mode", ["kernel", "nfqueue"])
def test_a_killed_agent_leaves_rules_that_the_next_start_replaces(
        make_net: Callable[..., NetnsPair], mode: str) -> None:
    net = make_net()
    tag = f"metaflow-agent:{mode}"
    start_echo(net.server)
    first, stats = start_rewriter(net.server, mode, net.server_ip, tag)
    first.kill()
    first.wait()
    assert len(tagged(net.server, tag)) == RULES[mode]
    if mode == "nfqueue":  # the orphaned worker leaves on its own, freeing the queue
        _wait_gone(stats["pid"])

    second, _ = start_rewriter(net.server, mode, net.server_ip, tag)
    assert len(tagged(net.server, tag)) == RULES[mode]
    assert_rewritten(round_trips(net, 1000, MDIDS[:1]))
    stop_rewriter(second)
    assert tagged(net.server, tag) == []


def test_agents_with_different_tags_share_a_namespace(make_net: Callable[..., NetnsPair]) -> None:
    """Purging is by exact tag: ``...:a`` is not a prefix match for ``...:ab``."""
    net = make_net()
    a, _ = start_rewriter(net.server, "kernel", net.server_ip, "metaflow-agent:a")
    ab, _ = start_rewriter(net.server, "nfqueue", net.server_ip, "metaflow-agent:ab")
    stop_rewriter(a)
    assert tagged(net.server, "metaflow-agent:a") == []
    assert len(tagged(net.server, "metaflow-agent:ab")) == RULES["nfqueue"]
    stop_rewriter(ab)
    assert tagged(net.server, "metaflow-agent:ab") == []


def test_iptables_errors_carry_stderr_and_leave_nothing(make_net: Callable[..., NetnsPair]) -> None:
    net = make_net()
    tag = "metaflow-agent:broken"
    script = f"""
from nat_agent import iptables
from nat_agent.rules import Rule
comment = ("-m", "comment", "--comment", {tag!r})
good = Rule("filter", "INPUT", ("-p", "tcp", *comment, "-j", "ACCEPT"))
bad = Rule("filter", "NO-SUCH-CHAIN", ("-p", "tcp", *comment, "-j", "ACCEPT"))
try:
    iptables.install([good, bad], {tag!r})
except iptables.IptablesError as exc:
    print(exc)
"""
    out = net.server.run(sys.executable, "-c", script).stdout
    assert "NO-SUCH-CHAIN" in out and "iptables -w -t filter -A NO-SUCH-CHAIN" in out
    assert tagged(net.server, tag) == []


def test_queue_bypass_when_the_worker_is_gone(make_net: Callable[..., NetnsPair]) -> None:
    """With the worker dead but its rules still in place, queued packets are
    accepted unchanged instead of waiting for a reader that never comes.

    So replies from our own address (they match the outbound NFQUEUE rule)
    still flow: a client of the server's own address is unaffected. A request
    to an mdid is accepted *unrewritten*; its destination is not ours and
    the server does not forward, so the kernel drops it silently (no ICMP
    from a non-forwarding host) and the client's connect times out. It does
    not hang on the queue: the same connect works again once a worker runs.
    """
    net = make_net()
    tag = "metaflow-agent:bypass"
    start_echo(net.server)
    rewriter, stats = start_rewriter(net.server, "nfqueue", net.server_ip, tag)
    os.kill(stats["pid"], signal.SIGKILL)
    _wait_gone(stats["pid"])

    direct = round_trips(net, 20_000, [net.server_ip])[0]
    assert direct["echo_ok"] and direct["peer"] == net.server_ip
    to_mdid = round_trips(net, 100, MDIDS[:1], timeout=1.5)[0]
    assert to_mdid["error"].startswith("TimeoutError"), to_mdid
    assert to_mdid["seconds"] < 5

    assert stop_rewriter(rewriter)["alive"] is False
    assert tagged(net.server, tag) == []
    again, _ = start_rewriter(net.server, "nfqueue", net.server_ip, tag)
    assert_rewritten(round_trips(net, 100, MDIDS[:1]))
    stop_rewriter(again)


def test_per_packet_cost(make_net: Callable[..., NetnsPair],
                         capsys: pytest.CaptureFixture[str]) -> None:
    """Prints the round-trip time per mode and the nfqueue callback's cost."""
    rounds = 2000
    report = []
    for mode, address in (("none", None), ("kernel", MDIDS[1]), ("nfqueue", MDIDS[1])):
        net = make_net()
        start_echo(net.server)
        rewriter, _ = start_rewriter(net.server, mode, net.server_ip, f"metaflow-agent:{mode}")
        out = net.client.run(sys.executable, PEERS, "pingpong", "9000", str(rounds),
                             address or net.server_ip).stdout
        rtt = json.loads(out)
        stats = stop_rewriter(rewriter)
        assert rtt["peer"] == (address or net.server_ip)
        line = f"{mode:8s} {rtt['us_per_round_trip']:7.1f} µs per 64-byte round trip"
        if mode == "nfqueue":
            assert stats["rewritten"] >= 2 * rounds
            line += (f"; per queued packet: {stats['us_translate_per_packet']:.1f} µs in Python "
                     f"(parse, flow table, rewrite), {stats['us_callback_per_packet']:.1f} µs "
                     f"with the verdict syscall ({stats['rewritten'] + stats['passed']} packets)")
        report.append(line)
    with capsys.disabled():
        print("\n" + "\n".join(report))


def _wait_gone(pid: int, timeout: float = 10) -> None:
    """Wait until `pid` has exited (a zombie counts: it holds no queue)."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            status = Path(f"/proc/{pid}/status").read_text()
        except FileNotFoundError:
            return
        if "\nState:\tZ" in status:
            return
        assert time.monotonic() < deadline, f"process {pid} still running"
        time.sleep(0.05)
