"""Abstract entries to OpenFlow 1.0 messages: the only module that knows OF.

`btree.flows` says *what* each switch holds (`FlowEntry`, `SwitchDiff`);
`controller.routing` says where physical addresses go. This module turns
both into os-ken OF1.0 message objects without a datapath (faucet's
valve_of: the shim attaches the datapath when it sends them), so the core
returns them in its steps, and tests check the exact matches, priorities and
actions, or apply them to a fake switch, with no switch at all.

Layout (ARCHITECTURE.md, "Flow table layout"), full mode:

    2000+len  ip, tcp|udp, tp_dst=9000, nw_dst=prefix  -> [set dl_dst], output
    1999      ip, tcp|udp, tp_dst=9000                  -> output uplink (by ID bits)
    1000      ip, nw_dst=host/32                        -> output
     900      arp                                       -> controller
       0      (any)                                     -> drop (never flood)

Hybrid mode keeps the MetaFlow entries and LLDP, and replaces the rest:

     900      arp, nw_dst=gateway (the ARP target)      -> controller
       0      (any)                                     -> NORMAL (cookie "MN")

A MetaFlow entry is two flow mods, one per transport protocol. Diffs go out
adds first, then modifies, then deletes, so no packet meets a hole between
an old entry leaving and its replacement arriving.
"""

from __future__ import annotations

import ipaddress
import struct
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

from os_ken.ofproto import ofproto_v1_0, ofproto_v1_0_parser

from btree.flows import FlowEntry, SwitchDiff, Table, diff_tables
from client_lib.cidr import Block
from client_lib.constants import (
    ARP_PRIORITY,
    COOKIE_BASE,
    COOKIE_METAFLOW,
    COOKIE_NORMAL,
    COOKIE_ROUTE,
    HOST_ROUTE_PRIORITY,
    LLDP_PRIORITY,
    METAFLOW_PORT,
    TABLE_MISS_PRIORITY,
)
from controller.load import EntryCount
from controller.routing import diff_routes
from controller.settings import Mode

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


@dataclass(frozen=True)
class BaseEntry:
    """One of the entries every switch holds besides MetaFlow's and the
    routes: what `base_entries` wants, and what `installed` reads back (by
    cookie), so a re-sync deletes ours that the mode no longer wants and
    nothing else."""

    priority: int
    dl_type: int | None = None
    """None: any frame."""
    nw_dst: str | None = None
    """Under dl_type ARP, OF1.0's nw_dst is the ARP target address."""
    out: int | None = None
    """An output port (OFPP_CONTROLLER, OFPP_NORMAL); None: drop."""
    cookie: int = COOKIE_BASE

    @property
    def key(self) -> tuple[int, int | None, str | None]:
        """What makes two entries one on a switch (OF1.0: match and priority)."""
        return self.priority, self.dl_type, self.nw_dst


def base_entries(mode: Mode, gateway_ip: str) -> list[BaseEntry]:
    """Full mode: LLDP and every ARP to the controller (discovery and address
    answers), drop for the rest. Hybrid mode: LLDP, and only ARP whose target
    is the gateway (clients asking for it, servers answering our probes); the
    rest goes to the switch's own forwarding, NORMAL, at the lowest priority."""
    lldp = BaseEntry(LLDP_PRIORITY, ETH_TYPE_LLDP, out=ofp.OFPP_CONTROLLER)
    if mode == "full":
        return [lldp, BaseEntry(ARP_PRIORITY, ETH_TYPE_ARP, out=ofp.OFPP_CONTROLLER),
                BaseEntry(TABLE_MISS_PRIORITY)]
    return [lldp, BaseEntry(ARP_PRIORITY, ETH_TYPE_ARP, gateway_ip, ofp.OFPP_CONTROLLER),
            BaseEntry(TABLE_MISS_PRIORITY, out=ofp.OFPP_NORMAL, cookie=COOKIE_NORMAL)]


def _base_match(dl_type: int | None, nw_dst: str | None) -> Any:
    fields: dict[str, int] = {} if dl_type is None else {"dl_type": dl_type}
    if nw_dst is not None:
        fields["nw_dst"] = int(ipaddress.IPv4Address(nw_dst))
    return parser.OFPMatch(**fields)


def base_messages(mode: Mode, gateway_ip: str) -> list[Any]:
    """What every switch holds from the start (`base_entries`). No wipe: a
    switch that reconnects, or a restarted controller, must not interrupt
    the traffic its entries carry; `resync_messages` fixes differences. An
    operator's entry with the same match and priority (a pre-installed
    priority-0 NORMAL) is replaced by ours, never deleted."""
    return [_base_add(entry) for entry in base_entries(mode, gateway_ip)]


def _base_add(entry: BaseEntry) -> Any:
    actions = [] if entry.out is None else [parser.OFPActionOutput(entry.out, 0xFFFF)]
    match = _base_match(entry.dl_type, entry.nw_dst)
    return _flow_mod(match, ofp.OFPFC_ADD, entry.priority, actions, entry.cookie)


# -- a switch that refuses what we sent (OFPT_ERROR) -----------------------------------

_FLOW_MOD_HEAD = struct.Struct("!BBHI40sQHHHH")
"""The first 64 bytes of an OF1.0 flow mod, which an error message carries
at least of the request it refuses: header, match, cookie, command,
timeouts, priority."""


def refuses_normal(error_type: int, error_code: int, data: bytes) -> bool:
    """The error refuses hybrid mode's NORMAL entry itself: its data begins
    with the refused request, a flow mod with that entry's cookie. Not a
    permission error (EPERM), which a switch answers to every flow mod of a
    controller it holds as a slave: that refuses the role, not the action."""
    if len(data) < _FLOW_MOD_HEAD.size or (error_type, error_code) == (ofp.OFPET_BAD_REQUEST,
                                                                        ofp.OFPBRC_EPERM):
        return False
    version, msg_type, _length, _xid, _match, cookie, _cmd, _idle, _hard, _priority = \
        _FLOW_MOD_HEAD.unpack_from(data)
    return version == ofp.OFP_VERSION and msg_type == ofp.OFPT_FLOW_MOD and cookie == COOKIE_NORMAL


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


class Held(NamedTuple):
    """Ours among one switch's flow stats, recognized by cookie."""

    table: Table
    routes: dict[str, int]
    base: set[tuple[int, int | None, str | None]]
    """`BaseEntry.key`s."""


def _base_key(priority: int, match: Any) -> tuple[int, int | None, str | None]:
    wild = match.wildcards
    dl_type = None if wild & ofp.OFPFW_DL_TYPE else match.dl_type
    exact_dst = (wild & ofp.OFPFW_NW_DST_MASK) >> ofp.OFPFW_NW_DST_SHIFT == 0
    return priority, dl_type, str(ipaddress.IPv4Address(match.nw_dst)) if exact_dst else None


def installed(stats: list[Any]) -> Held:
    """Our MetaFlow entries, host routes and base entries among one switch's
    flow stats (the tcp half of each MetaFlow pair is enough)."""
    held = Held({}, {}, set())
    for stat in stats:
        match, out = stat.match, _output(stat.actions)
        if stat.cookie in (COOKIE_BASE, COOKIE_NORMAL):
            held.base.add(_base_key(stat.priority, match))
        elif out is None:
            continue   # not a shape we write: the resync's add replaces it
        elif stat.cookie == COOKIE_METAFLOW and match.nw_proto == PROTOCOLS[0]:
            dl_dst = next((":".join(f"{b:02x}" for b in a.dl_addr) for a in stat.actions
                           if hasattr(a, "dl_addr")), None)
            entry = FlowEntry(stat.priority, _destination(match), out, dl_dst)
            held.table[entry.match] = entry
        elif stat.cookie == COOKIE_ROUTE:
            held.routes[str(ipaddress.IPv4Address(match.nw_dst))] = out
    return held


def resync_messages(have: Held, want: list[FlowEntry], want_routes: dict[str, int],
                    base: list[BaseEntry]) -> list[Any]:
    """Bring a switch from what it holds to what it should hold, touching
    only the entries that differ; base entries of ours that `base` (the
    mode's) no longer has are deleted, an operator's never (not our cookie)."""
    changed, deleted = diff_routes(have.routes, want_routes)
    stale = have.base - {entry.key for entry in base}
    return ([_base_add(entry) for entry in base]
            + diff_messages(diff_tables(have.table, {e.match: e for e in want}))
            + route_messages(changed, deleted)
            + [_flow_mod(_base_match(*key[1:]), ofp.OFPFC_DELETE_STRICT, key[0], [], COOKIE_BASE)
               for key in sorted(stale, key=repr)])


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
