"""Translator: the per-packet decision of the nfqueue agent, without a kernel."""

from __future__ import annotations

from scapy.layers.inet import IP, TCP, UDP
from scapy.packet import Raw

from client_lib.mdid import DEFAULT_SPACE
from nat_agent.flowtable import FlowTable
from nat_agent.nfqueue import COUNTERS, Translator

OWN = "10.0.0.2"
CLIENT = "10.0.0.1"
MDID = "100.93.7.41"


def translator() -> Translator:
    return Translator(DEFAULT_SPACE, OWN, 9000, FlowTable(), [0] * len(COUNTERS))


def counts(t: Translator) -> dict[str, int]:
    return {name: value for name, value in zip(COUNTERS, t.counters)
            if value and not name.endswith("_ns")}


def test_request_and_reply_are_rewritten() -> None:
    t = translator()
    request = IP(src=CLIENT, dst=MDID) / TCP(sport=40000, dport=9000, flags="S")
    rewritten = t.translate(bytes(request))
    assert rewritten == bytes(IP(src=CLIENT, dst=OWN) / TCP(sport=40000, dport=9000, flags="S"))
    reply = IP(src=OWN, dst=CLIENT) / TCP(sport=9000, dport=40000, flags="SA") / Raw(b"x" * 30000)
    assert t.translate(bytes(reply)) == bytes(
        IP(src=MDID, dst=CLIENT) / TCP(sport=9000, dport=40000, flags="SA") / Raw(b"x" * 30000))
    assert counts(t) == {"inbound": 1, "outbound": 1, "rewritten": 2, "flows": 1}


def test_udp_round_trip() -> None:
    t = translator()
    assert t.translate(bytes(IP(src=CLIENT, dst=MDID) / UDP(sport=5000, dport=9000) / b"q"))
    reply = t.translate(bytes(IP(src=OWN, dst=CLIENT) / UDP(sport=9000, dport=5000) / b"a"))
    assert reply == bytes(IP(src=MDID, dst=CLIENT) / UDP(sport=9000, dport=5000) / b"a")


def test_everything_else_passes_unchanged() -> None:
    t = translator()
    # a reply to a client that talked to our own address: no flow
    assert t.translate(bytes(IP(src=OWN, dst=CLIENT) / TCP(sport=9000, dport=40001))) is None
    # the space but another port, another source port, outside the space
    assert t.translate(bytes(IP(src=CLIENT, dst=MDID) / TCP(sport=1, dport=9001))) is None
    assert t.translate(bytes(IP(src=OWN, dst=CLIENT) / TCP(sport=9001, dport=1))) is None
    assert t.translate(bytes(IP(src=CLIENT, dst="100.128.0.1") / TCP(dport=9000))) is None
    # unparsable: ICMP, truncated copy
    assert t.translate(bytes(IP(src=CLIENT, dst=MDID, proto=1) / b"\x08\x00\x00\x00")) is None
    assert t.translate(bytes(IP(src=CLIENT, dst=MDID) / TCP(dport=9000) / b"abc")[:-1]) is None
    assert counts(t) == {"outbound": 1, "passed": 6}


def test_a_second_connection_from_one_client_port_is_given_another_port_both_ways() -> None:
    """Two connections from port 40000 to two mdids would be one connection
    to the server: the second gets another source port inbound and its own
    port back on the replies, checksums adjusted (scapy recomputes them)."""
    t = translator()
    other = "100.93.7.42"
    t.translate(bytes(IP(src=CLIENT, dst=MDID) / TCP(sport=40000, dport=9000, flags="S")))
    second = t.translate(bytes(IP(src=CLIENT, dst=other) / TCP(sport=40000, dport=9000, flags="S")
                               / b"syn data"))
    assert second is not None
    moved = IP(bytes(second))[TCP].sport
    assert moved != 40000
    assert second == bytes(IP(src=CLIENT, dst=OWN) / TCP(sport=moved, dport=9000, flags="S") / b"syn data")
    for sport, mdid in ((moved, other), (40000, MDID)):
        reply = IP(src=OWN, dst=CLIENT) / TCP(sport=9000, dport=sport, flags="SA") / Raw(b"y" * 1001)
        assert t.translate(bytes(reply)) == bytes(
            IP(src=mdid, dst=CLIENT) / TCP(sport=9000, dport=40000, flags="SA") / Raw(b"y" * 1001))
    udp = t.translate(bytes(IP(src=CLIENT, dst=MDID) / UDP(sport=40000, dport=9000) / b"q"))
    assert udp == bytes(IP(src=CLIENT, dst=OWN) / UDP(sport=40000, dport=9000) / b"q")  # UDP: its own slot
    assert counts(t)["remapped"] == 1
