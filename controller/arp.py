"""ARP answered by the controller, pure: bytes in, bytes (or nothing) out.

Two kinds of address are answered: in full mode hosts the controller knows
(so nothing is ever flooded on a looped fabric), and in both modes the
*virtual gateway* of the
MetaDataID space. Clients route the whole space via that gateway, so every
request frame leaves with the gateway's MAC; the last MetaFlow hop rewrites
it to the owning server's MAC. The gateway exists nowhere else. In hybrid mode the controller also asks
(`probe`): from the gateway, for a storage server it has not located yet.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from os_ken.lib.packet import arp, ethernet, packet
from os_ken.lib.packet.ether_types import ETH_TYPE_ARP

GATEWAY_MAC = "02:4d:46:00:00:01"   # locally administered, "MF"
BROADCAST = "ff:ff:ff:ff:ff:ff"


@dataclass(frozen=True)
class ArpMessage:
    """Who sent an ARP frame (a host location for the caller to learn), and
    for what address; only requests get an answer."""

    sender_ip: str
    sender_mac: str
    target_ip: str
    is_request: bool


def parse(data: bytes) -> ArpMessage | None:
    """The ARP message in a frame (request, reply or gratuitous), else None."""
    msg = packet.Packet(data).get_protocol(arp.arp)
    if msg is None:
        return None
    return ArpMessage(msg.src_ip, msg.src_mac, msg.dst_ip, msg.opcode == arp.ARP_REQUEST)


def _frame(opcode: int, eth_dst: str, src_mac: str, src_ip: str, dst_mac: str, dst_ip: str) -> bytes:
    pkt = packet.Packet()
    pkt.add_protocol(ethernet.ethernet(dst=eth_dst, src=src_mac, ethertype=ETH_TYPE_ARP))
    pkt.add_protocol(arp.arp(opcode=opcode, src_mac=src_mac, src_ip=src_ip, dst_mac=dst_mac, dst_ip=dst_ip))
    pkt.serialize()
    return bytes(pkt.data)


def reply(request: ArpMessage, mac: str) -> bytes:
    """The ARP reply telling `request`'s sender that its target is at `mac`."""
    return _frame(arp.ARP_REPLY, request.sender_mac, mac, request.target_ip,
                  request.sender_mac, request.sender_ip)


def probe(target_ip: str, gateway_ip: str) -> bytes:
    """Hybrid mode's way to locate a storage server without intercepting its
    traffic: "who has `target_ip`, tell the gateway", broadcast from the
    gateway's MAC. The server's reply goes to the gateway, so its own edge
    switch's gateway-ARP entry brings it up with the right switch and port."""
    return _frame(arp.ARP_REQUEST, BROADCAST, GATEWAY_MAC, gateway_ip, "00:00:00:00:00:00", target_ip)


def answer(message: ArpMessage, mac_of: Callable[[str], str | None],
           gateway_ip: str | None) -> bytes | None:
    """The reply to send back, or None when the message is not a request or
    the target is unknown (then we stay silent: an unknown target is not
    reachable anyway, and flooding is not an option)."""
    if not message.is_request:
        return None
    if message.target_ip == gateway_ip:
        return reply(message, GATEWAY_MAC)
    mac = mac_of(message.target_ip)
    return reply(message, mac) if mac else None
