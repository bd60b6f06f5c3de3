"""Abstract entries to OpenFlow 1.0 messages: the only module that knows OF.

`btree.flows` says *what* each switch holds (`FlowEntry`, `SwitchDiff`);
`controller.routing` says where physical addresses go. This module turns
both into os-ken OF1.0 message objects without a datapath (faucet's
valve_of: the shim attaches the datapath when it sends them), so the core
returns them in its steps, and tests check the exact matches, priorities and
actions, or apply them to a fake switch, with no switch at all.

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
from collections.abc import Sequence
from typing import Any

from os_ken.ofproto import ofproto_v1_0, ofproto_v1_0_parser

from btree.flows import FlowEntry, SwitchDiff, Table, diff_tables
from client_lib.cidr import Block
from client_lib.constants import (
    ARP_PRIORITY,
    COOKIE_BASE,
    COOKIE_METAFLOW,
    COOKIE_ROUTE,
    HOST_ROUTE_PRIORITY,
    LLDP_PRIORITY,
    METAFLOW_PORT,
    TABLE_MISS_PRIORITY,
)
from controller.load import EntryCount
from controller.routing import diff_routes

ETH_TYPE_IP = 0x0800
ETH_TYPE_ARP = 0x0806
ETH_TYPE_LLDP = 0x88CC
PROTOCOLS = (6, 17)        # tcp, udp

ofp = ofproto_v1_0
parser = ofproto_v1_0_parser


def metaflow_matches(entry: FlowEntry) -> list[Any]:
    """Up-rules match too: each one is a slice of the space (spread over the
    uplinks), and port 9000 traffic to addresses outside the space (a client
    talking to a server's own address) must fall through to host routes."""
    prefix = entry.prefix
    return [parser.OFPMatch(dl_type=ETH_TYPE_IP, nw_proto=proto, tp_dst=METAFLOW_PORT,
                            nw_dst=prefix.first, nw_dst_mask=prefix.plen)
            for proto in PROTOCOLS]


def metaflow_actions(entry: FlowEntry) -> list[Any]:
    actions: list[Any] = []
    if entry.set_dl_dst:
        actions.append(parser.OFPActionSetDlDst(_mac(entry.set_dl_dst)))
    actions.append(parser.OFPActionOutput(entry.out_port))
    return actions


def _mac(text: str) -> bytes:
    return bytes(int(part, 16) for part in text.split(":"))


def _flow_mod(match: Any, command: int, priority: int, actions: list[Any], cookie: int) -> Any:
    return parser.OFPFlowMod(
        datapath=None, match=match, cookie=cookie, command=command, priority=priority,
        idle_timeout=0, hard_timeout=0, actions=actions)


def diff_messages(diff: SwitchDiff) -> list[Any]:
    """Flow mods for one switch's diff: adds, then modifies, then deletes."""
    out: list[Any] = []
    for entries, command in ((diff.add, ofp.OFPFC_ADD), (diff.modify, ofp.OFPFC_MODIFY_STRICT),
                             (diff.delete, ofp.OFPFC_DELETE_STRICT)):
        for entry in entries:
            actions = [] if command == ofp.OFPFC_DELETE_STRICT else metaflow_actions(entry)
            out += [_flow_mod(match, command, entry.priority, actions, COOKIE_METAFLOW)
                    for match in metaflow_matches(entry)]
    return out


def route_messages(routes: dict[str, int], delete: Sequence[str] = ()) -> list[Any]:
    """Unicast routes for physical addresses: host /32 -> output port."""
    out: list[Any] = []
    for ip, port in routes.items():
        match = parser.OFPMatch(dl_type=ETH_TYPE_IP, nw_dst=int(ipaddress.IPv4Address(ip)))
        out.append(_flow_mod(match, ofp.OFPFC_ADD, HOST_ROUTE_PRIORITY,
                             [parser.OFPActionOutput(port)], COOKIE_ROUTE))
    for ip in delete:
        match = parser.OFPMatch(dl_type=ETH_TYPE_IP, nw_dst=int(ipaddress.IPv4Address(ip)))
        out.append(_flow_mod(match, ofp.OFPFC_DELETE_STRICT, HOST_ROUTE_PRIORITY, [], COOKIE_ROUTE))
    return out


def base_messages() -> list[Any]:
    """What every switch holds from the start: LLDP and ARP to the controller
    (discovery and address answers), and drop for the rest. No wipe: a
    switch that reconnects, or a restarted controller, must not interrupt
    the traffic its entries carry; `resync_messages` fixes differences."""
    to_controller = [parser.OFPActionOutput(ofp.OFPP_CONTROLLER, 0xFFFF)]
    lldp = _flow_mod(parser.OFPMatch(dl_type=ETH_TYPE_LLDP), ofp.OFPFC_ADD, LLDP_PRIORITY,
                     to_controller, COOKIE_BASE)
    arp = _flow_mod(parser.OFPMatch(dl_type=ETH_TYPE_ARP), ofp.OFPFC_ADD, ARP_PRIORITY,
                    to_controller, COOKIE_BASE)
    miss = _flow_mod(parser.OFPMatch(), ofp.OFPFC_ADD, TABLE_MISS_PRIORITY, [], COOKIE_BASE)
    return [lldp, arp, miss]


def _output(actions: list[Any]) -> int | None:
    return next((a.port for a in actions if hasattr(a, "port")), None)


def _destination(match: Any) -> Block:
    """The ``nw_dst`` prefix of a match."""
    wild = (match.wildcards & ofp.OFPFW_NW_DST_MASK) >> ofp.OFPFW_NW_DST_SHIFT
    plen = max(0, 32 - wild)
    return Block(match.nw_dst & (((1 << plen) - 1) << (32 - plen)) if plen else 0, plen)


def entry_counts(stats: list[Any]) -> list[EntryCount]:
    """The counters of our MetaFlow entries (both protocols) among one
    switch's flow stats, for `controller.load.LoadMeter`."""
    out = []
    for stat in stats:
        port = _output(stat.actions)
        if stat.cookie == COOKIE_METAFLOW and port is not None:
            out.append(EntryCount(_destination(stat.match), stat.match.nw_proto, port, stat.packet_count,
                                  stat.duration_sec + stat.duration_nsec / 1e9))
    return out


def installed(stats: list[Any]) -> tuple[Table, dict[str, int]]:
    """Our MetaFlow entries and host routes among one switch's flow stats
    (recognized by cookie; the tcp half of each MetaFlow pair is enough)."""
    table: Table = {}
    routes: dict[str, int] = {}
    for stat in stats:
        match, out = stat.match, _output(stat.actions)
        if out is None:
            continue   # not a shape we write: the resync's add replaces it
        if stat.cookie == COOKIE_METAFLOW and match.nw_proto == PROTOCOLS[0]:
            dl_dst = next((":".join(f"{b:02x}" for b in a.dl_addr) for a in stat.actions
                           if hasattr(a, "dl_addr")), None)
            entry = FlowEntry(stat.priority, _destination(match), out, dl_dst)
            table[entry.match] = entry
        elif stat.cookie == COOKIE_ROUTE:
            routes[str(ipaddress.IPv4Address(match.nw_dst))] = out
    return table, routes


def resync_messages(have: Table, have_routes: dict[str, int],
                    want: list[FlowEntry], want_routes: dict[str, int]) -> list[Any]:
    """Bring a switch from what it holds to what it should hold, touching
    only the entries that differ."""
    changed, deleted = diff_routes(have_routes, want_routes)
    return (base_messages() + diff_messages(diff_tables(have, {e.match: e for e in want}))
            + route_messages(changed, deleted))


def role_request(leading: bool) -> Any:
    """The Nicira role request (NXT_ROLE_REQUEST) a controller sends a switch
    before anything else: MASTER from the leader, SLAVE from a standby (whose
    flow mods and packet-outs the switch then refuses, and which gets no
    packet-ins, only port status)."""
    return parser.NXTRoleRequest(None, ofp.NX_ROLE_MASTER if leading else ofp.NX_ROLE_SLAVE)


def async_config() -> Any:
    """What each role hears (Nicira NXT_SET_ASYNC_CONFIG; masks are [master or
    equal, slave]): a slave hears the packet-ins of the controller-bound
    entries too (ARP, and the leader's LLDP), so a standby keeps its view
    of hosts and links current without sending a thing, and a takeover
    starts from the fabric as it is; port status for both, flow removals
    for the master only."""
    packet_in = (1 << ofp.OFPR_NO_MATCH) | (1 << ofp.OFPR_ACTION)
    port_status = (1 << ofp.OFPPR_ADD) | (1 << ofp.OFPPR_DELETE) | (1 << ofp.OFPPR_MODIFY)
    removed = (1 << ofp.OFPRR_IDLE_TIMEOUT) | (1 << ofp.OFPRR_HARD_TIMEOUT) | (1 << ofp.OFPRR_DELETE)
    return parser.NXTSetAsyncConfig(None, [packet_in, packet_in], [port_status, port_status], [removed, 0])


def refused_as_slave(error_type: int, code: int) -> bool:
    """The error a switch answers a slave's flow mod or packet-out with (EPERM):
    expected from a standby (os-ken's LLDP discovery keeps trying)."""
    return error_type == ofp.OFPET_BAD_REQUEST and code == ofp.OFPBRC_EPERM


def refuses_role(error_type: int, data: bytes) -> bool:
    """An OpenFlow error that refuses our role request: a switch without the
    Nicira extension (not Open vSwitch) answers with a bad-request error
    carrying the start of our request, a vendor message (OFPT_VENDOR)."""
    return error_type == ofp.OFPET_BAD_REQUEST and len(data) >= 2 and data[1] == ofp.OFPT_VENDOR
