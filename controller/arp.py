"""ARP answered by the controller, pure: bytes in, bytes (or nothing) out.

Two kinds of address are answered: hosts the controller knows (so nothing
is ever flooded on a looped fabric), and the *virtual gateway* of the
MetaDataID space. Clients route the whole space via that gateway, so every
request frame leaves with the gateway's MAC; the last MetaFlow hop rewrites
it to the owning server's MAC. The gateway exists nowhere else.
"""

from __future__ import annotations

from dataclasses import dataclass

from os_ken.lib.packet import arp, ethernet, packet
from os_ken.lib.packet.ether_types import ETH_TYPE_ARP

GATEWAY_MAC = "02:4d:46:00:00:01"   # locally administered, "MF"


@dataclass(frozen=True)
class ArpRequest:
    """Who asked (learned as a host location by the caller) and for what."""

    sender_ip: str
    sender_mac: str
    target_ip: str


def parse_request(data: bytes) -> ArpRequest | None:
    """The ARP request in a frame, or None for anything else (replies included)."""
    pkt = packet.Packet(data)
    req = pkt.get_protocol(arp.arp)
    if req is None or req.opcode != arp.ARP_REQUEST:
        return None
    return ArpRequest(req.src_ip, req.src_mac, req.dst_ip)


def parse_sender(data: bytes) -> ArpRequest | None:
    """Sender of any ARP frame (requests, replies, gratuitous): host discovery."""
    pkt = packet.Packet(data)
    msg = pkt.get_protocol(arp.arp)
    if msg is None:
        return None
    return ArpRequest(msg.src_ip, msg.src_mac, msg.dst_ip)


def reply(request: ArpRequest, mac: str) -> bytes:
    """The ARP reply telling `request`'s sender that its target is at `mac`."""
    pkt = packet.Packet()
    pkt.add_protocol(ethernet.ethernet(dst=request.sender_mac, src=mac, ethertype=ETH_TYPE_ARP))
    pkt.add_protocol(arp.arp(opcode=arp.ARP_REPLY, src_mac=mac, src_ip=request.target_ip,
                             dst_mac=request.sender_mac, dst_ip=request.sender_ip))
    pkt.serialize()
    return bytes(pkt.data)


def answer(data: bytes, known: dict[str, str], gateway_ip: str | None) -> tuple[ArpRequest | None, bytes | None]:
    """(the request, the reply to send back) for a frame; the reply is None
    when the frame is not a request or the target is unknown (then we stay
    silent: an unknown target is not reachable anyway, and flooding is not
    an option)."""
    request = parse_request(data)
    if request is None:
        return None, None
    if request.target_ip == gateway_ip:
        return request, reply(request, GATEWAY_MAC)
    mac = known.get(request.target_ip)
    return request, reply(request, mac) if mac else None
