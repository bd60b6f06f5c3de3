"""The user-space WAN link (`mininet_scenarios.delay_line`) between two real
network namespaces: ping's round trip is the one asked for within 10 %, TCP
crosses it, the ``tbf`` cap holds a bulk transfer to its rate, and SIGTERM
ends it cleanly."""

from __future__ import annotations

import itertools
import os
import re
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass

import pytest

from mininet_scenarios.delay_line import prepare
from mininet_scenarios.netns_pair import Namespace
from mininet_scenarios.syscmd import ip

_counter = itertools.count()
LEFT, RIGHT = "10.78.0.1", "10.78.0.2"


@dataclass
class Wan:
    """Two hosts' namespaces (`left`, `right`) joined through a third (`wire`)
    whose two interfaces the delay line joins."""

    left: Namespace
    wire: Namespace
    right: Namespace
    ends: tuple[str, str]

    def line(self, rtt_ms: float) -> subprocess.Popen[str]:
        line = self.wire.popen(sys.executable, "-m", "mininet_scenarios.delay_line", *self.ends,
                               "--rtt-ms", str(rtt_ms), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                               text=True)
        assert line.stdout is not None and line.stdout.readline().strip() == "ready"
        return line


@pytest.fixture
def wan() -> Iterator[Wan]:
    base = f"mfdl{os.getpid():x}x{next(_counter):x}"
    left, wire, right = (Namespace(f"{base}{side}") for side in "awb")
    made: list[Namespace] = []
    try:
        for ns in (left, wire, right):
            ip("netns", "add", ns.name)
            made.append(ns)
            ns.run("ip", "link", "set", "lo", "up")
        for host, address, end in ((left, LEFT, "a"), (right, RIGHT, "b")):
            ip("link", "add", f"{base}{end}0", "netns", host.name, "type", "veth",
               "peer", "name", f"{base}{end}1", "netns", wire.name)
            host.run("ip", "addr", "add", f"{address}/24", "dev", f"{base}{end}0")
            host.run("ip", "link", "set", f"{base}{end}0", "up")
            host.run("ethtool", "-K", f"{base}{end}0", "tx", "off")
        yield Wan(left, wire, right, (f"{base}a1", f"{base}b1"))
    finally:
        for ns in made:
            ns.stop_processes()
            ip("netns", "del", ns.name)


def _ping_rtt_ms(ns: Namespace, address: str, count: int = 10) -> float:
    out = ns.run("ping", "-c", str(count), "-i", "0.2", "-q", address).stdout
    found = re.search(r"= [\d.]+/([\d.]+)/", out)
    assert found, out
    return float(found.group(1))


@pytest.mark.parametrize("rtt_ms", [20.0, 105.0])
def test_the_round_trip_is_the_one_asked_for_within_ten_percent(wan: Wan, rtt_ms: float) -> None:
    for end in wan.ends:
        prepare(end, netns=wan.wire.command())
    line = wan.line(rtt_ms)
    _ping_rtt_ms(wan.left, RIGHT, count=2)   # ARP resolved, caches warm
    measured = _ping_rtt_ms(wan.left, RIGHT)
    assert abs(measured - rtt_ms) <= 0.1 * rtt_ms, f"{measured} ms for {rtt_ms} ms asked"
    line.terminate()
    assert line.wait(10) == 0
    assert "forwarded" in (line.stderr.read() if line.stderr else "")


_SERVER = """
import socket, sys
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("0.0.0.0", 7700)); s.listen(1); print("listening", flush=True)
c, _ = s.accept(); got = 0
while (data := c.recv(65536)): got += len(data)
c.sendall(str(got).encode()); c.close()
"""

_CLIENT = """
import socket, sys, time
size = int(sys.argv[2]); c = socket.create_connection((sys.argv[1], 7700), timeout=30)
start = time.monotonic(); c.sendall(b"x" * size); c.shutdown(socket.SHUT_WR)
got = c.recv(100); print(got.decode(), time.monotonic() - start)
"""


def test_tcp_crosses_it_and_tbf_caps_a_bulk_transfer(wan: Wan) -> None:
    rate_mbit, size = 8.0, 1_000_000
    for end in wan.ends:
        prepare(end, rate_mbit=rate_mbit, netns=wan.wire.command())
    wan.line(20.0)
    server = wan.right.popen(sys.executable, "-c", _SERVER, stdout=subprocess.PIPE, text=True)
    assert server.stdout is not None and server.stdout.readline().strip() == "listening"
    started = time.monotonic()
    received, seconds = wan.left.run(sys.executable, "-c", _CLIENT, RIGHT, str(size)).stdout.split()
    assert int(received) == size
    mbit_s = size * 8 / 1e6 / float(seconds)
    assert 0.5 * rate_mbit <= mbit_s <= 1.1 * rate_mbit, f"{mbit_s:.2f} Mbit/s, capped at {rate_mbit}"
    assert time.monotonic() - started < 30
