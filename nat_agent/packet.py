"""IPv4 + TCP/UDP header reading and address rewriting, with `struct` only.

The user-space NAT agent (`nat_agent.nfqueue`) calls these once or twice per
packet, so they avoid every per-packet allocation they can: addresses are
plain ints, rewrites happen in place in a `bytearray`, and checksums are
adjusted incrementally (RFC 1624, eqn. 3) instead of being recomputed over
the payload. scapy would do all of this too, at ~650 µs per packet.

Only what a MetaDataID rewrite needs is understood: an IPv4 header of any
length (options included), followed by TCP or UDP. Non-first fragments carry
no ports and are left alone; the first fragment is rewritten like a whole
datagram, because the TCP/UDP checksum it holds covers the pseudo-header,
which is exactly what changes.
"""

from __future__ import annotations

import struct
from typing import NamedTuple

IPPROTO_TCP = 6
IPPROTO_UDP = 17

TCP_FIN = 0x01
TCP_SYN = 0x02
TCP_RST = 0x04
TCP_ACK = 0x10

_SRC_OFFSET = 12
_DST_OFFSET = 16
_IP_CHECKSUM_OFFSET = 10
# Where the checksum sits inside the transport header.
_L4_CHECKSUM_OFFSET = {IPPROTO_TCP: 16, IPPROTO_UDP: 6}
# Minimum transport header length: it holds the ports, the TCP flags and
# the checksum that a rewrite adjusts.
_L4_MIN_LEN = {IPPROTO_TCP: 20, IPPROTO_UDP: 8}

_ADDR = struct.Struct("!I")
_U16 = struct.Struct("!H")
_PORTS = struct.Struct("!HH")
# version/IHL, total length, flags/fragment offset, protocol, source, destination
_IP_FIELDS = struct.Struct("!B1xH2xH1xB2xII")


class PacketInfo(NamedTuple):
    """What the agent needs to know about one IPv4 TCP/UDP packet."""

    src: int
    dst: int
    proto: int
    sport: int
    dport: int
    tcp_flags: int  # 0 for UDP


def parse(packet: bytes | bytearray) -> PacketInfo | None:
    """Read addresses, protocol, ports and TCP flags.

    Returns None for anything the agent must pass through untouched: not
    IPv4, not TCP/UDP, a non-first fragment (no ports in it), or a packet
    shorter than its own headers or its IP total length (a truncated copy
    must never be rewritten: handing it back to the kernel would cut the
    packet short).
    """
    if len(packet) < 20:
        return None
    version_ihl, total_len, frag, proto, src, dst = _IP_FIELDS.unpack_from(packet)
    if version_ihl >> 4 != 4 or frag & 0x1FFF:
        return None
    l4 = (version_ihl & 0x0F) * 4
    need = _L4_MIN_LEN.get(proto)
    if need is None or l4 < 20 or total_len > len(packet) or l4 + need > total_len:
        return None
    sport, dport = _PORTS.unpack_from(packet, l4)
    flags = packet[l4 + 13] if proto == IPPROTO_TCP else 0
    return PacketInfo(src, dst, proto, sport, dport, flags)


def replace_source(packet: bytearray, address: int) -> None:
    """Set the IPv4 source address in place, fixing the IP and TCP/UDP checksums."""
    _replace_address(packet, _SRC_OFFSET, address)


def replace_destination(packet: bytearray, address: int) -> None:
    """Set the IPv4 destination address in place, fixing the IP and TCP/UDP checksums."""
    _replace_address(packet, _DST_OFFSET, address)


def replace_source_port(packet: bytearray, port: int) -> None:
    """Set the TCP/UDP source port of a packet that `parse` accepted, in
    place, fixing the transport checksum (the IP header holds no port)."""
    _replace_port(packet, 0, port)


def replace_destination_port(packet: bytearray, port: int) -> None:
    """Set the TCP/UDP destination port of a packet that `parse` accepted, in
    place, fixing the transport checksum."""
    _replace_port(packet, 2, port)


def _replace_port(packet: bytearray, offset: int, new: int) -> None:
    """Write `new` at `offset` (0 = source, 2 = destination) of the transport header."""
    l4 = (packet[0] & 0x0F) * 4
    (old,) = _U16.unpack_from(packet, l4 + offset)
    if old == new:
        return
    _U16.pack_into(packet, l4 + offset, new)
    _adjust_l4_checksum(packet, packet[9], l4, old, new)


def _replace_address(packet: bytearray, offset: int, new: int) -> None:
    """Write `new` at `offset` (12 = source, 16 = destination) of a packet that
    `parse` accepted or that is a non-first fragment (then only the IP
    header checksum is adjusted: the transport checksum is not in it)."""
    (old,) = _ADDR.unpack_from(packet, offset)
    if old == new:
        return
    _ADDR.pack_into(packet, offset, new)
    _adjust_checksum(packet, _IP_CHECKSUM_OFFSET, old, new)
    if _U16.unpack_from(packet, 6)[0] & 0x1FFF:
        return
    _adjust_l4_checksum(packet, packet[9], (packet[0] & 0x0F) * 4, old, new)


def _adjust_l4_checksum(packet: bytearray, proto: int, l4: int, old: int, new: int) -> None:
    """Adjust the TCP/UDP checksum (header at `l4`) for a field it covers
    (an address of the pseudo-header, or a port) changed from `old` to `new`."""
    field = _L4_CHECKSUM_OFFSET.get(proto)
    if field is None:
        return
    at = l4 + field
    if proto == IPPROTO_UDP and packet[at] == 0 and packet[at + 1] == 0:
        return  # UDP checksum 0: the sender did not compute one; keep it that way
    _adjust_checksum(packet, at, old, new, zero_means_none=proto == IPPROTO_UDP)


def _adjust_checksum(packet: bytearray, at: int, old: int, new: int,
                     zero_means_none: bool = False) -> None:
    """RFC 1624 eqn. 3, HC' = ~(~HC + ~m + m'), for a field m of 32 bits
    (a 16-bit one is its lower half: adding the upper ~0 adds nothing).

    For UDP a computed 0 is sent as 0xFFFF (RFC 768): 0 means "no checksum".
    """
    (checksum,) = _U16.unpack_from(packet, at)
    total = ((~checksum & 0xFFFF) + (~old >> 16 & 0xFFFF) + (~old & 0xFFFF)
             + (new >> 16) + (new & 0xFFFF))
    total = (total & 0xFFFF) + (total >> 16)
    total = (total & 0xFFFF) + (total >> 16)
    result = ~total & 0xFFFF
    if zero_means_none and result == 0:
        result = 0xFFFF
    _U16.pack_into(packet, at, result)
