"""Abstract entries to OpenFlow 1.0 messages: the only module that knows OF.

`btree.flows` says *what* each switch holds (`FlowEntry`, `SwitchDiff`);
`controller.routing` says where physical addresses go. This module turns
both into os-ken OF1.0 message objects for one datapath, without sending
anything, so tests check the exact matches, priorities and actions with no
switch at all (faucet's split between valve logic and the shim).

Layout (ARCHITECTURE.md, "Flow table layout"):

    2000+len  ip, tcp|udp, tp_dst=9000, nw_dst=prefix  -> [set dl_dst], output
    1999      ip, tcp|udp, tp_dst=9000                  -> output uplink (by ID bits)
    1000      ip, nw_dst=host/32                        -> output
     900      arp                                       -> controller
       0      (any)                                     -> drop (never flood)

A MetaFlow entry is two flow mods, one per transport protocol. Diffs go out
adds first, then modifies, then deletes, so no packet meets a hole between
an old entry leaving and its replacement arriving.
"""

from __future__ import annotations

import ipaddress
from typing import Any

from btree.flows import METAFLOW_PORT, FlowEntry, SwitchDiff

ETH_TYPE_IP = 0x0800
ETH_TYPE_ARP = 0x0806
ETH_TYPE_LLDP = 0x88CC
LLDP_PRIORITY = 0xFFFF
PROTOCOLS = (6, 17)        # tcp, udp
HOST_ROUTE_PRIORITY = 1000
ARP_PRIORITY = 900
TABLE_MISS_PRIORITY = 0
COOKIE_METAFLOW = 0x4D46   # "MF": lets dump-flows tell our entries from others'
COOKIE_ROUTE = 0x4D52      # "MR"
COOKIE_BASE = 0x4D42       # "MB"

Datapath = Any  # os_ken.controller.controller.Datapath, or any object with ofproto/ofproto_parser


def metaflow_matches(dp: Datapath, entry: FlowEntry) -> list:
    """Up-rules match too: each one is a slice of the space (spread over the
    uplinks), and port 9000 traffic to addresses outside the space (a client
    talking to a server's own address) must fall through to host routes."""
    parser = dp.ofproto_parser
    prefix = entry.prefix
    return [parser.OFPMatch(dl_type=ETH_TYPE_IP, nw_proto=proto, tp_dst=METAFLOW_PORT,
                            nw_dst=prefix.first, nw_dst_mask=prefix.plen)
            for proto in PROTOCOLS]


def metaflow_actions(dp: Datapath, entry: FlowEntry) -> list:
    parser = dp.ofproto_parser
    actions = []
    if entry.set_dl_dst:
        actions.append(parser.OFPActionSetDlDst(_mac(entry.set_dl_dst)))
    actions.append(parser.OFPActionOutput(entry.out_port))
    return actions


def _mac(text: str) -> bytes:
    return bytes(int(part, 16) for part in text.split(":"))


def _flow_mod(dp: Datapath, match, command: int, priority: int, actions: list, cookie: int):
    return dp.ofproto_parser.OFPFlowMod(
        datapath=dp, match=match, cookie=cookie, command=command, priority=priority,
        idle_timeout=0, hard_timeout=0, actions=actions)


def diff_messages(dp: Datapath, diff: SwitchDiff) -> list:
    """Flow mods for one switch's diff: adds, then modifies, then deletes."""
    ofp = dp.ofproto
    out = []
    for entries, command in ((diff.add, ofp.OFPFC_ADD), (diff.modify, ofp.OFPFC_MODIFY_STRICT),
                             (diff.delete, ofp.OFPFC_DELETE_STRICT)):
        for entry in entries:
            actions = [] if command == ofp.OFPFC_DELETE_STRICT else metaflow_actions(dp, entry)
            out += [_flow_mod(dp, match, command, entry.priority, actions, COOKIE_METAFLOW)
                    for match in metaflow_matches(dp, entry)]
    return out


def table_messages(dp: Datapath, entries: list[FlowEntry]) -> list:
    """A whole MetaFlow table as adds (for a switch that (re)connects)."""
    return diff_messages(dp, SwitchDiff(add=list(entries)))


def route_messages(dp: Datapath, routes: dict[str, int], delete: list[str] = ()) -> list:
    """Unicast routes for physical addresses: host /32 -> output port."""
    parser, ofp = dp.ofproto_parser, dp.ofproto
    out = []
    for ip, port in routes.items():
        match = parser.OFPMatch(dl_type=ETH_TYPE_IP, nw_dst=int(ipaddress.IPv4Address(ip)))
        out.append(_flow_mod(dp, match, ofp.OFPFC_ADD, HOST_ROUTE_PRIORITY,
                             [parser.OFPActionOutput(port)], COOKIE_ROUTE))
    for ip in delete:
        match = parser.OFPMatch(dl_type=ETH_TYPE_IP, nw_dst=int(ipaddress.IPv4Address(ip)))
        out.append(_flow_mod(dp, match, ofp.OFPFC_DELETE_STRICT, HOST_ROUTE_PRIORITY, [], COOKIE_ROUTE))
    return out


def base_messages(dp: Datapath) -> list:
    """What every switch holds from the start: a clean table, LLDP and ARP to
    the controller (discovery and address answers), and drop for the rest.
    The wipe makes a reconnecting switch's table exactly ours again."""
    parser, ofp = dp.ofproto_parser, dp.ofproto
    to_controller = [parser.OFPActionOutput(ofp.OFPP_CONTROLLER, 0xFFFF)]
    wipe = parser.OFPFlowMod(datapath=dp, match=parser.OFPMatch(), cookie=0,
                             command=ofp.OFPFC_DELETE, out_port=ofp.OFPP_NONE)
    lldp = _flow_mod(dp, parser.OFPMatch(dl_type=ETH_TYPE_LLDP), ofp.OFPFC_ADD, LLDP_PRIORITY,
                     to_controller, COOKIE_BASE)
    arp = _flow_mod(dp, parser.OFPMatch(dl_type=ETH_TYPE_ARP), ofp.OFPFC_ADD, ARP_PRIORITY,
                    to_controller, COOKIE_BASE)
    miss = _flow_mod(dp, parser.OFPMatch(), ofp.OFPFC_ADD, TABLE_MISS_PRIORITY, [], COOKIE_BASE)
    return [wipe, lldp, arp, miss]
