"""nat_agent.packet against scapy: scapy builds each packet twice, with the
old and the new address, computing every checksum from scratch; our in-place
incremental rewrite of the first must give exactly the bytes of the second."""

from __future__ import annotations

import ipaddress

from hypothesis import given, settings
from hypothesis import strategies as st
from scapy.layers.inet import IP, TCP, UDP, IPOption, fragment
from scapy.packet import Packet, Raw

from nat_agent.packet import (
    IPPROTO_TCP,
    IPPROTO_UDP,
    TCP_FIN,
    TCP_SYN,
    parse,
    replace_destination,
    replace_destination_port,
    replace_source,
    replace_source_port,
)

addresses = st.integers(0, 2**32 - 1)
ports = st.integers(0, 65535)
# Mostly small, sometimes tens of KB (what a GSO/GRO'd segment can hold).
payloads = st.one_of(st.binary(max_size=64),
                     st.integers(0, 40_000).map(lambda size: bytes(i % 253 for i in range(size))))
# IP options: 0..40 bytes (IHL 5..15); scapy pads them to a multiple of 4.
ip_options = st.binary(max_size=40).map(lambda b: [IPOption(b"\x01" * len(b))] if b else [])
tcp_flags = st.integers(0, 0xFF)


def _ip(address: int) -> str:
    return str(ipaddress.IPv4Address(address))


def _packet(proto: str, src: int, dst: int, sport: int, dport: int, options: list,
            flags: int, payload: bytes, udp_checksum_zero: bool = False) -> bytes:
    ip = IP(src=_ip(src), dst=_ip(dst), options=options, id=7, ttl=61)
    l4: Packet
    if proto == "tcp":
        l4 = TCP(sport=sport, dport=dport, flags=flags, seq=12345, window=999)
    else:
        l4 = UDP(sport=sport, dport=dport, chksum=0 if udp_checksum_zero else None)
    return bytes(ip / l4 / Raw(payload))


packets = st.fixed_dictionaries({
    "proto": st.sampled_from(["tcp", "udp"]), "src": addresses, "dst": addresses,
    "sport": ports, "dport": ports, "options": ip_options, "flags": tcp_flags,
    "payload": payloads, "udp_checksum_zero": st.booleans(),
})


@settings(max_examples=300, deadline=None)
@given(packets)
def test_parse_reads_addresses_ports_and_flags(fields: dict) -> None:
    info = parse(_packet(**fields))
    assert info is not None
    assert (info.src, info.dst, info.sport, info.dport) == (
        fields["src"], fields["dst"], fields["sport"], fields["dport"])
    if fields["proto"] == "tcp":
        assert (info.proto, info.tcp_flags) == (IPPROTO_TCP, fields["flags"])
    else:
        assert (info.proto, info.tcp_flags) == (IPPROTO_UDP, 0)


@settings(max_examples=300, deadline=None)
@given(packets, addresses)
def test_replace_destination_matches_scapy(fields: dict, new: int) -> None:
    packet = bytearray(_packet(**fields))
    replace_destination(packet, new)
    assert bytes(packet) == _packet(**{**fields, "dst": new})


@settings(max_examples=300, deadline=None)
@given(packets, addresses)
def test_replace_source_matches_scapy(fields: dict, new: int) -> None:
    packet = bytearray(_packet(**fields))
    replace_source(packet, new)
    assert bytes(packet) == _packet(**{**fields, "src": new})


@settings(max_examples=300, deadline=None)
@given(packets, ports, ports)
def test_replace_ports_matches_scapy(fields: dict, sport: int, dport: int) -> None:
    packet = bytearray(_packet(**fields))
    replace_source_port(packet, sport)
    replace_destination_port(packet, dport)
    assert bytes(packet) == _packet(**{**fields, "sport": sport, "dport": dport})


@given(packets)
def test_udp_checksum_zero_stays_zero(fields: dict) -> None:
    fields = {**fields, "proto": "udp", "udp_checksum_zero": True}
    packet = bytearray(_packet(**fields))
    replace_destination(packet, 0x64400001)
    replace_source_port(packet, fields["sport"] ^ 0x5A5A)
    at = (packet[0] & 0x0F) * 4 + 6
    assert packet[at:at + 2] == b"\x00\x00"


@settings(max_examples=100, deadline=None)
@given(st.sampled_from(["tcp", "udp"]), addresses, addresses, ip_options,
       st.integers(3000, 20_000))
def test_fragments(proto: str, dst: int, new: int, options: list, size: int) -> None:
    """The first fragment is rewritten like a datagram (its TCP/UDP checksum
    covers the pseudo-header); later ones have no ports: parse refuses them,
    and an address rewrite touches only the IP header."""
    def datagram(address: int):
        ip = IP(src="10.1.2.3", dst=_ip(address), options=options, id=99)
        l4 = TCP(sport=40000, dport=9000) if proto == "tcp" else UDP(sport=40000, dport=9000)
        return ip / l4 / Raw(bytes(i % 251 for i in range(size)))

    before = [bytes(f) for f in fragment(datagram(dst), 1000)]
    after = [bytes(f) for f in fragment(datagram(new), 1000)]
    assert len(before) > 1
    assert parse(before[0]) is not None
    for index, (old_fragment, new_fragment) in enumerate(zip(before, after)):
        if index > 0:
            assert parse(old_fragment) is None
        packet = bytearray(old_fragment)
        replace_destination(packet, new)
        assert bytes(packet) == new_fragment


def test_parse_refuses_what_it_must_not_rewrite() -> None:
    tcp = _packet("tcp", 1, 2, 3, 4, [], TCP_SYN | TCP_FIN, b"hello")
    assert parse(tcp) is not None
    assert parse(tcp[:-1]) is None  # truncated copy: total length > bytes at hand
    assert parse(tcp[:30]) is None  # not even the TCP header
    assert parse(b"\x60" + tcp[1:]) is None  # IPv6 version nibble
    icmp = IP(src="1.1.1.1", dst="2.2.2.2", proto=1) / Raw(b"\x08\x00\x00\x00")
    assert parse(bytes(icmp)) is None
    assert parse(b"") is None
