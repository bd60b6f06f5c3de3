"""An OpenFlow 1.0 switch emulator in the spirit of Cbench: many switches in
one asyncio process, each on its own TCP connection to the real controller.

Why: a k=32 fat-tree has 1,280 switches, far more Open vSwitch bridges than
two cores hold, and the question "does the controller keep up" is about the
controller, not about the datapath. Each emulated switch answers what the
controller asks of a switch (HELLO, FEATURES with the topology's ports,
ECHO, GET/SET_CONFIG, BARRIER in order after the flow mods before it, flow,
port and description stats, the Nicira role request), keeps a real table
(`FlowTable`: the flow mods applied with OpenFlow 1.0's semantics, parsed by
os-ken's own OFP 1.0 parser) and plays the wires of the topology:

- LLDP: a PACKET_OUT of an LLDP frame out of port p comes back as a
  PACKET_IN on the switch and port at the other end of that link
  (`Wiring.peer`), which is how os-ken's topology service finds links;
- hosts: `Emulator.announce` sends the ARP a server sends when it comes up
  ("who has the gateway, tell me") as a PACKET_IN from its edge port, which
  is how the controller locates a server (`controller.arp`, `inventory`);
  a server answers an ARP request for its address (hybrid mode's probe)
  the same way;
- ports: `Emulator.set_port` sends PORT_STATUS for a port taken down or up.

Several controllers (a leader and its standbys, `--etcd`): each switch keeps
one connection to each, as Open vSwitch does with several `set-controller`
targets. Each connection has its own Nicira role; a slave's flow mods and
packet-outs are refused with EPERM, as Open vSwitch refuses them. Every
asynchronous message (PACKET_IN, PORT_STATUS) goes to every connection,
which is what MetaFlow's controllers ask for (`ofmsgs.async_config`: a
standby hears the packet-ins and port status too); the emulator does not
read NXT_SET_ASYNC_CONFIG itself.

The tables are read back as the controller reads a switch's flow stats
(`controller.ofmsgs.installed`), so `btree.fake_network.FakeNetwork` can
forward over exactly what each emulated switch holds.

    python -m benchmarks.ofemu --k 4 --of-port 6653    # until SIGTERM / Ctrl-C
    python -m benchmarks.ofemu --k 4 --of-port 6653 --of-port 6654   # two controllers
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import signal
import struct
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from os_ken.lib.packet import arp as arp_packet
from os_ken.lib.packet import ethernet, packet
from os_ken.lib.packet.ether_types import ETH_TYPE_ARP, ETH_TYPE_LLDP
from os_ken.ofproto import nicira_ext as nx
from os_ken.ofproto import ofproto_common
from os_ken.ofproto import ofproto_v1_0 as ofp
from os_ken.ofproto import ofproto_v1_0_parser as parser

from btree.fabric import Port
from btree.flows import Table
from client_lib.constants import DEFAULT_GATEWAY, OPENFLOW_PORT
from controller import arp, ofmsgs
from topology import builders
from topology.builders import Topology

HEADER = struct.Struct(ofp.OFP_HEADER_PACK_STR)
MAX_MESSAGE = 0xFFFF
"""An OpenFlow 1.0 message's length field is 16 bits: longer stats replies are cut in parts."""
CONNECT_BATCH = 64
"""Switches that open their connection at once (a listen backlog is finite)."""
BROADCAST = "ff:ff:ff:ff:ff:ff"
ARP_RETRY_S = (1.0, 8.0)
"""A server whose ARP for the gateway gets no answer asks again after 1 s,
then after twice as long each time, up to 8 s (a host's traffic retrying;
the controller answers only once it has located the server and every
switch confirmed its route)."""
HELD_LLDP_S = 1.0
"""How long after its FEATURES_REPLY a switch lets out the LLDP frames held for it
(`Emulator.deliver_lldp`)."""
RECONNECT_S = 0.5
"""How long a switch whose connection ended waits before it connects again."""
INACTIVITY_PROBE_S = 60.0
"""Open vSwitch's `inactivity_probe` for a controller: after this long without
a message from it, the switch sends an echo request; after as long again, it
drops the connection and connects again. Open vSwitch's default is 5 s; an
operator of a large fabric raises it (or sets 0: no probe), because a busy
controller answers late: at k=32 with two controllers and the sample, echo
replies came up to 28 s late, and a 30 s probe dropped 3,033 connections in
one run."""


# -- the topology as the switches see it (pure) ------------------------------------


@dataclass(frozen=True)
class Wiring:
    """Which switch has which ports, and what is at the other end of each."""

    names: dict[int, str]
    ports: dict[int, tuple[int, ...]]
    links: dict[Port, Port]
    """Switch port -> switch port, both directions."""
    hosts: dict[str, Port]
    """Host name -> its edge switch port."""
    macs: dict[str, str]
    ips: dict[str, str]

    @classmethod
    def of(cls, g: Topology) -> Wiring:
        names, ports, links, hosts, macs, ips = {}, {}, {}, {}, {}, {}
        for name in builders.switches(g):
            dpid = g.nodes[name]["dpid"]
            names[dpid] = name
            ports[dpid] = tuple(sorted(builders.port(g, name, peer) for peer in g.neighbors(name)))
        for a, b in g.edges():
            if g.nodes[a]["kind"] == "host":
                a, b = b, a
            here = (g.nodes[a]["dpid"], builders.port(g, a, b))
            if g.nodes[b]["kind"] == "host":
                hosts[b] = here
                macs[b], ips[b] = g.nodes[b]["mac"], g.nodes[b]["ip"]
            else:
                there = (g.nodes[b]["dpid"], builders.port(g, b, a))
                links[here], links[there] = there, here
        return cls(names, ports, links, hosts, macs, ips)

    def peer(self, dpid: int, port: int) -> Port | None:
        """Where a frame sent out of (dpid, port) enters a switch; None for a
        host port or no port (frames to hosts leave the emulation)."""
        return self.links.get((dpid, port))


def is_lldp(frame: bytes) -> bool:
    return len(frame) >= 14 and int.from_bytes(frame[12:14], "big") == ETH_TYPE_LLDP


def arp_announcement(mac: str, ip: str, gateway_ip: str = DEFAULT_GATEWAY) -> bytes:
    """The frame a server sends when it first talks: "who has the gateway, tell `ip`"."""
    pkt = packet.Packet()
    pkt.add_protocol(ethernet.ethernet(dst=BROADCAST, src=mac, ethertype=ETH_TYPE_ARP))
    pkt.add_protocol(arp_packet.arp(opcode=arp_packet.ARP_REQUEST, src_mac=mac, src_ip=ip,
                                    dst_mac="00:00:00:00:00:00", dst_ip=gateway_ip))
    pkt.serialize()
    return bytes(pkt.data)


# -- one switch's table (pure) ----------------------------------------------------


@dataclass
class Entry:
    """One flow entry, with the attributes a flow-stats entry has
    (`ofmsgs.installed` reads these)."""

    priority: int
    match: Any
    cookie: int
    actions: list[Any]
    idle_timeout: int = 0
    hard_timeout: int = 0
    since: float = field(default_factory=time.monotonic)


_FIELDS = ((ofp.OFPFW_IN_PORT, "in_port"), (ofp.OFPFW_DL_VLAN, "dl_vlan"), (ofp.OFPFW_DL_SRC, "dl_src"),
           (ofp.OFPFW_DL_DST, "dl_dst"), (ofp.OFPFW_DL_TYPE, "dl_type"), (ofp.OFPFW_NW_PROTO, "nw_proto"),
           (ofp.OFPFW_TP_SRC, "tp_src"), (ofp.OFPFW_TP_DST, "tp_dst"),
           (ofp.OFPFW_DL_VLAN_PCP, "dl_vlan_pcp"), (ofp.OFPFW_NW_TOS, "nw_tos"))


def _match_key(match: Any) -> bytes:
    buf = bytearray(ofp.OFP_MATCH_SIZE)
    match.serialize(buf, 0)
    return bytes(buf)


def _plen(match: Any, shift: int, mask: int) -> int:
    return max(0, 32 - ((match.wildcards & mask) >> shift))


def covers(general: Any, specific: Any) -> bool:
    """OpenFlow 1.0's non-strict matching: every field `general` fixes,
    `specific` fixes to the same value (addresses: a prefix within `general`'s)."""
    for flag, name in _FIELDS:
        if not general.wildcards & flag and (specific.wildcards & flag
                                             or getattr(general, name) != getattr(specific, name)):
            return False
    for name, shift, mask in (("nw_src", ofp.OFPFW_NW_SRC_SHIFT, ofp.OFPFW_NW_SRC_MASK),
                              ("nw_dst", ofp.OFPFW_NW_DST_SHIFT, ofp.OFPFW_NW_DST_MASK)):
        wide, narrow = _plen(general, shift, mask), _plen(specific, shift, mask)
        if wide and (narrow < wide or (getattr(general, name) ^ getattr(specific, name)) >> (32 - wide)):
            return False
    return True


class FlowTable:
    """One table, changed by flow mods as an OpenFlow 1.0 switch changes it."""

    def __init__(self) -> None:
        self.entries: dict[tuple[int, bytes], Entry] = {}

    def apply(self, mod: Any) -> None:
        """ADD replaces an entry of the same match and priority; the STRICT
        commands touch exactly that entry; MODIFY and DELETE every entry the
        match covers (DELETE filtered by out_port; MODIFY adds when it
        changes nothing, as the specification says)."""
        key = (mod.priority, _match_key(mod.match))
        entry = Entry(mod.priority, mod.match, mod.cookie, list(mod.actions), mod.idle_timeout,
                      mod.hard_timeout)
        command = mod.command
        if command == ofp.OFPFC_ADD:
            self.entries[key] = entry
        elif command == ofp.OFPFC_MODIFY_STRICT:
            old = self.entries.get(key)
            if old is None:
                self.entries[key] = entry
            else:
                old.actions = entry.actions
        elif command == ofp.OFPFC_DELETE_STRICT:
            old = self.entries.get(key)
            if old is not None and _outputs_to(old, mod.out_port):
                del self.entries[key]
        elif command == ofp.OFPFC_MODIFY:
            hits = [e for e in self.entries.values() if covers(mod.match, e.match)]
            for old in hits:
                old.actions = entry.actions
            if not hits:
                self.entries[key] = entry
        elif command == ofp.OFPFC_DELETE:
            for k in [k for k, e in self.entries.items() if covers(mod.match, e.match)
                      and _outputs_to(e, mod.out_port)]:
                del self.entries[k]
        else:
            raise ValueError(f"flow mod command {command} is not OpenFlow 1.0's")

    def metaflow(self) -> Table:
        """The MetaFlow entries, as the controller reads them back from a switch."""
        return ofmsgs.installed(list(self.entries.values())).table


def _outputs_to(entry: Entry, port: int) -> bool:
    return port == ofp.OFPP_NONE or any(getattr(a, "port", None) == port for a in entry.actions)


# -- messages a switch sends (pure) -------------------------------------------------


def message(msg_type: int, xid: int, body: bytes = b"") -> bytes:
    return HEADER.pack(ofp.OFP_VERSION, msg_type, HEADER.size + len(body), xid) + body


def phy_port(dpid: int, port: int, name: str, up: bool = True) -> bytes:
    mac = ((dpid & 0xFFFFFF) << 16 | (port & 0xFFFF)).to_bytes(6, "big")
    mac = bytes([0x02]) + mac[1:]   # locally administered, unique per (switch, port)
    state = 0 if up else ofp.OFPPS_LINK_DOWN
    return struct.pack(ofp.OFP_PHY_PORT_PACK_STR, port, mac, name.encode()[:15], 0, state, 0, 0, 0, 0)


def flow_stats(entries: Iterable[Entry], now: float) -> list[bytes]:
    """Each entry as an ofp_flow_stats record."""
    out = []
    for e in entries:
        match = bytearray(ofp.OFP_MATCH_SIZE)
        e.match.serialize(match, 0)
        actions = bytearray()
        for action in e.actions:
            buf = bytearray(action.len)
            action.serialize(buf, 0)
            actions += buf
        age = max(0.0, now - e.since)
        tail = struct.pack(ofp.OFP_FLOW_STATS_1_PACK_STR, int(age), int(age % 1 * 1e9), e.priority,
                           e.idle_timeout, e.hard_timeout, e.cookie, 0, 0)
        size = ofp.OFP_FLOW_STATS_SIZE + len(actions)
        out.append(struct.pack(ofp.OFP_FLOW_STATS_0_PACK_STR, size, 0) + match + tail + actions)
    return out


def stats_replies(stats_type: int, xid: int, records: list[bytes]) -> list[bytes]:
    """Records in as few STATS_REPLY messages as fit 64 KiB, all but the last flagged MORE."""
    room = MAX_MESSAGE - ofp.OFP_STATS_MSG_SIZE
    parts: list[list[bytes]] = [[]]
    size = 0
    for record in records:
        if size + len(record) > room:
            parts.append([])
            size = 0
        parts[-1].append(record)
        size += len(record)
    return [message(ofp.OFPT_STATS_REPLY, xid,
                    struct.pack(ofp.OFP_STATS_MSG_PACK_STR, stats_type,
                                ofp.OFPSF_REPLY_MORE if i < len(parts) - 1 else 0) + b"".join(part))
            for i, part in enumerate(parts)]


# -- the switches on the network ------------------------------------------------------


class Sink(Protocol):
    def write(self, data: bytes) -> None: ...


class _Datapath:
    """What os-ken's parser asks of a datapath: its protocol modules."""

    ofproto = ofp
    ofproto_parser = parser


@dataclass
class Counters:
    connected: dict[int, float] = field(default_factory=dict)
    """dpid -> when its FEATURES_REPLY went out (time.monotonic)."""
    flow_mods: int = 0
    first_mod: float | None = None
    last_mod: float | None = None
    barriers: int = 0
    packet_ins: int = 0
    lldp: int = 0
    dropped: int = 0
    """Frames from real switches that were not LLDP (`Emulator.from_real`)."""
    probes_failed: int = 0
    """Connections dropped by the inactivity probe (`INACTIVITY_PROBE_S`)."""
    echo_rtt_max: float = 0.0
    """The longest a controller took to answer a probe's echo request (s)."""
    loop_lag_max: float = 0.0
    """The longest the emulator's own event loop was late (s): a switch
    cannot answer while the process that plays it is busy elsewhere."""
    session_errors: list[str] = field(default_factory=list)
    """Connections ended by a message the switch failed on (the first few):
    the switch connects again, as after any other end."""


@dataclass(eq=False)
class Channel:
    """A switch's connection to one controller: where its messages go, and
    the role that controller claimed (Nicira: OTHER until it asks)."""

    sink: Sink
    role: int = nx.NX_ROLE_OTHER
    heard: float = field(default_factory=time.monotonic)
    """When the controller last sent anything on it."""
    echoed: float | None = None
    """When the probe's echo request went out, until its reply comes."""


class EmulatedSwitch:
    def __init__(self, emulator: Emulator, dpid: int) -> None:
        self.emulator = emulator
        self.dpid = dpid
        self.name = emulator.wiring.names[dpid]
        self.table = FlowTable()
        self.down: set[int] = set()
        self.channels: list[Channel] = []
        """One per controller connected now."""

    @property
    def connected(self) -> bool:
        return bool(self.channels)

    async def run(self, host: str, port: int) -> None:
        """Stay connected to the controller at host:port: a switch whose
        controller went away keeps its table (fail mode "secure") and connects
        again, as Open vSwitch does."""
        while True:
            try:
                await self._session(host, port)
            except OSError:
                pass
            except Exception as exc:   # a message it failed on: said, and the switch stays
                errors = self.emulator.counters.session_errors
                if len(errors) < 10:
                    errors.append(f"{self.name} (dpid {self.dpid}): {exc!r}")
            await asyncio.sleep(RECONNECT_S)

    async def _session(self, host: str, port: int) -> None:
        reader, writer = await asyncio.open_connection(host, port)
        channel = Channel(writer)
        self.channels.append(channel)
        channel.sink.write(message(ofp.OFPT_HELLO, 0))
        probe = asyncio.create_task(self._probe(channel, writer), name=f"s{self.dpid} probe")
        try:
            while True:
                head = await reader.readexactly(HEADER.size)
                _version, msg_type, length, xid = HEADER.unpack(head)
                body = await reader.readexactly(length - HEADER.size)
                channel.heard = time.monotonic()
                self.handle(channel, msg_type, xid, head + body)
        except asyncio.IncompleteReadError:
            pass
        finally:
            probe.cancel()
            if channel in self.channels:   # (not if `close` came first)
                self.channels.remove(channel)
            writer.close()

    async def _probe(self, channel: Channel, writer: asyncio.StreamWriter) -> None:
        """Open vSwitch's inactivity probe (`INACTIVITY_PROBE_S`): a controller
        that stays silent through an echo request loses the connection."""
        while True:
            await asyncio.sleep(INACTIVITY_PROBE_S)
            silent = time.monotonic() - channel.heard
            if silent >= 2 * INACTIVITY_PROBE_S:
                self.emulator.counters.probes_failed += 1
                writer.transport.abort()   # the session's read ends; it connects again
                return
            if silent >= INACTIVITY_PROBE_S:
                channel.echoed = channel.echoed or time.monotonic()
                writer.write(message(ofp.OFPT_ECHO_REQUEST, 0))

    def close(self) -> None:
        for channel in self.channels:
            if isinstance(channel.sink, asyncio.StreamWriter):
                channel.sink.close()
        self.channels.clear()

    def _send(self, data: bytes) -> None:
        """An asynchronous message: to every controller (module doc)."""
        for channel in self.channels:
            channel.sink.write(data)

    def handle(self, channel: Channel, msg_type: int, xid: int, buf: bytes) -> None:
        """One message from the controller on `channel`; replies are queued in
        order, so a barrier's reply leaves after everything before it was applied."""
        body = buf[HEADER.size:]
        counters = self.emulator.counters
        reply = channel.sink.write
        if msg_type in (ofp.OFPT_FLOW_MOD, ofp.OFPT_PACKET_OUT) and channel.role == nx.NX_ROLE_SLAVE:
            error = struct.pack(ofp.OFP_ERROR_MSG_PACK_STR, ofp.OFPET_BAD_REQUEST, ofp.OFPBRC_EPERM)
            reply(message(ofp.OFPT_ERROR, xid, error + buf[:64]))
        elif msg_type == ofp.OFPT_ECHO_REQUEST:
            reply(message(ofp.OFPT_ECHO_REPLY, xid, body))
        elif msg_type == ofp.OFPT_ECHO_REPLY and channel.echoed is not None:
            counters.echo_rtt_max = max(counters.echo_rtt_max, time.monotonic() - channel.echoed)
            channel.echoed = None
        elif msg_type == ofp.OFPT_FEATURES_REQUEST:
            reply(self.features(xid))
            counters.connected.setdefault(self.dpid, time.monotonic())
            try:   # once os-ken has taken the switch in (a packet-in before that is dropped)
                asyncio.get_running_loop().call_later(HELD_LLDP_S, self._release_held)
            except RuntimeError:   # no event loop: called directly (tests)
                self._release_held()
        elif msg_type == ofp.OFPT_GET_CONFIG_REQUEST:
            config = struct.pack(ofp.OFP_SWITCH_CONFIG_PACK_STR, 0, 128)
            reply(message(ofp.OFPT_GET_CONFIG_REPLY, xid, config))
        elif msg_type == ofp.OFPT_FLOW_MOD:
            mod = parser.OFPFlowMod.parser(_Datapath, ofp.OFP_VERSION, msg_type, len(buf), xid, buf)
            self.table.apply(mod)
            now = time.monotonic()
            counters.flow_mods += 1
            counters.first_mod = counters.first_mod or now
            counters.last_mod = now
        elif msg_type == ofp.OFPT_BARRIER_REQUEST:
            counters.barriers += 1
            reply(message(ofp.OFPT_BARRIER_REPLY, xid))
        elif msg_type == ofp.OFPT_PACKET_OUT:
            self._packet_out(body)
        elif msg_type == ofp.OFPT_STATS_REQUEST:
            for part in self._stats(xid, body):
                reply(part)
        elif msg_type == ofp.OFPT_VENDOR:
            self._vendor(channel, xid, body)
        # HELLO, SET_CONFIG, PORT_MOD, replies: nothing to answer

    def _release_held(self) -> None:
        for port, frame in self.emulator.held.pop(self.dpid, []):
            self.packet_in(port, frame)

    def features(self, xid: int) -> bytes:
        ports = [phy_port(self.dpid, p, f"{self.name}-eth{p}", p not in self.down)
                 for p in self.emulator.wiring.ports[self.dpid]]
        ports.append(phy_port(self.dpid, ofp.OFPP_LOCAL, self.name))
        head = struct.pack(ofp.OFP_SWITCH_FEATURES_PACK_STR, self.dpid, 256, 1, 0, 0xFFF)
        return message(ofp.OFPT_FEATURES_REPLY, xid, head + b"".join(ports))

    def _packet_out(self, body: bytes) -> None:
        _buffer, _in_port, actions_len = struct.unpack_from(ofp.OFP_PACKET_OUT_PACK_STR, body)
        start = struct.calcsize(ofp.OFP_PACKET_OUT_PACK_STR)
        frame = body[start + actions_len:]
        offset = start
        while offset < start + actions_len:
            kind, size = struct.unpack_from("!HH", body, offset)
            if kind == ofp.OFPAT_OUTPUT:
                (out,) = struct.unpack_from("!H", body, offset + 4)
                if is_lldp(frame):
                    self.emulator.deliver_lldp(self.dpid, out, frame)
                else:   # to a host: an ARP answer ends its asking
                    self.emulator.to_host(self.dpid, out, frame)
            offset += max(size, 8)

    def packet_in(self, port: int, frame: bytes) -> None:
        head = struct.pack(ofp.OFP_PACKET_IN_PACK_STR, ofp.OFP_NO_BUFFER, len(frame), port, ofp.OFPR_NO_MATCH)
        self._send(message(ofp.OFPT_PACKET_IN, 0, head + frame))

    def port_status(self, port: int, up: bool) -> None:
        (self.down.discard if up else self.down.add)(port)
        body = struct.pack("!B7x", ofp.OFPPR_MODIFY) + phy_port(self.dpid, port, f"{self.name}-eth{port}", up)
        self._send(message(ofp.OFPT_PORT_STATUS, 0, body))

    def _stats(self, xid: int, body: bytes) -> list[bytes]:
        stats_type, _flags = struct.unpack_from(ofp.OFP_STATS_MSG_PACK_STR, body)
        if stats_type == ofp.OFPST_FLOW:
            records = flow_stats(self.table.entries.values(), time.monotonic())
        elif stats_type == ofp.OFPST_DESC:
            records = [struct.pack(ofp.OFP_DESC_STATS_PACK_STR, b"MetaFlow", b"ofemu", b"1.0",
                                   self.name.encode(), b"emulated OpenFlow 1.0 switch")]
        elif stats_type == ofp.OFPST_PORT:
            records = [struct.pack(ofp.OFP_PORT_STATS_PACK_STR, p, *([0] * 12))
                       for p in self.emulator.wiring.ports[self.dpid]]
        else:
            records = []
        return stats_replies(stats_type, xid, records)

    def _vendor(self, channel: Channel, xid: int, body: bytes) -> None:
        vendor, subtype = struct.unpack_from(nx.NICIRA_HEADER_PACK_STR, body)
        if vendor == ofproto_common.NX_EXPERIMENTER_ID and subtype == nx.NXT_ROLE_REQUEST:
            (role,) = struct.unpack_from(nx.NX_ROLE_PACK_STR, body, 8)
            if role == nx.NX_ROLE_MASTER:   # one master at a time: the one before becomes a slave
                for other in self.channels:
                    if other is not channel and other.role == nx.NX_ROLE_MASTER:
                        other.role = nx.NX_ROLE_SLAVE
            channel.role = role
            reply = struct.pack(nx.NICIRA_HEADER_PACK_STR, vendor, nx.NXT_ROLE_REPLY) + \
                struct.pack(nx.NX_ROLE_PACK_STR, role)
            channel.sink.write(message(ofp.OFPT_VENDOR, xid, reply))


class Emulator:
    """Every switch of a topology, connected to each of its controllers;
    with `real`, every switch but those, which are real switches elsewhere
    (Open vSwitch bridges: `benchmarks.sample`) wired to the emulated ones
    through `attach` and `from_real`."""

    def __init__(self, graph: Topology, real: Iterable[int] = ()) -> None:
        self.graph = graph
        self.wiring = Wiring.of(graph)
        self.counters = Counters()
        self.real = frozenset(real)
        self.switches = {dpid: EmulatedSwitch(self, dpid)
                         for dpid in self.wiring.names if dpid not in self.real}
        self.doors: dict[Port, Callable[[bytes], None]] = {}
        """A real switch's port -> what puts a frame into it (`attach`)."""
        self.real_tables: Callable[[], dict[int, Table]] = dict
        """The real switches' tables, by dpid (`tables`)."""
        self.host_at = {at: host for host, at in self.wiring.hosts.items()}
        self.asking: dict[str, tuple[float, float]] = {}
        """Servers whose ARP is unanswered: when to ask again, and the wait after that."""
        self.gateway_ip = DEFAULT_GATEWAY
        self.held: dict[int, list[tuple[int, bytes]]] = {}
        """LLDP frames for a switch not connected yet, by dpid (`deliver_lldp`)."""
        self._tasks: list[asyncio.Task[None]] = []

    async def start(self, controllers: Sequence[tuple[str, int]] = (("127.0.0.1", OPENFLOW_PORT),)) -> None:
        """Connect every switch to every controller (host, port) (`CONNECT_BATCH`
        switches at a time); they run in the background."""
        self._tasks += [asyncio.create_task(self._ask_again(), name="arp retries"),
                        asyncio.create_task(self._watch_lag(), name="loop lag")]
        switches = list(self.switches.values())
        for i in range(0, len(switches), CONNECT_BATCH):
            for switch in switches[i:i + CONNECT_BATCH]:
                self._tasks += [asyncio.create_task(switch.run(host, port), name=f"s{switch.dpid} to {port}")
                                for host, port in controllers]
            await asyncio.sleep(0.01)

    async def close(self) -> None:
        for switch in self.switches.values():
            switch.close()
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        self._tasks.clear()

    def deliver_lldp(self, dpid: int, port: int, frame: bytes) -> None:
        """Into the switch at the other end, or held there until it is connected,
        as a real peer's port would see it once up: the controller sends a
        port's frame again only once a round (`controller.discovery`: 102 s
        for the 40,960 ports of k=32), so a first frame lost to a peer still
        connecting would hide that link for a round."""
        peer = self.wiring.peer(dpid, port)
        if peer is None or port in self.switches[dpid].down:
            return
        if peer[0] in self.real:
            door = self.doors.get(peer)
            if door is not None:
                self.counters.lldp += 1
                door(frame)
            return
        self._enter(peer, frame)

    def _enter(self, port: Port, frame: bytes) -> bool:
        """An LLDP frame into emulated switch port `port` (held until the
        switch is connected); False if that port is down."""
        dpid, number = port
        if number in self.switches[dpid].down:
            return False
        self.counters.lldp += 1
        target = self.switches[dpid]
        if not target.connected:
            self.held.setdefault(dpid, []).append((number, frame))
        else:
            target.packet_in(number, frame)
        return True

    def attach(self, port: Port, send: Callable[[bytes], None]) -> None:
        """`send` puts a frame into real switch port `port`: the LLDP frames
        an emulated peer's controller sends out of the other end."""
        if port[0] not in self.real or self.wiring.peer(*port) is None:
            raise ValueError(f"{port} is not a real switch's port wired to an emulated switch")
        self.doors[port] = send

    def from_real(self, port: Port, frame: bytes) -> bool:
        """A frame that left real switch port `port`: an LLDP frame enters
        the emulated switch at the other end (as `deliver_lldp`); anything
        else is dropped, the emulated fabric carrying no data. True if it went on."""
        if not is_lldp(frame):
            self.counters.dropped += 1
            return False
        peer = self.wiring.peer(*port)
        return peer is not None and peer[0] not in self.real and self._enter(peer, frame)

    def announce(self, hosts: Iterable[str]) -> None:
        """Each host's ARP for the gateway, as a PACKET_IN from its edge port,
        asked again (`ARP_RETRY_S`) until the controller answers it."""
        first, _ = ARP_RETRY_S
        now = time.monotonic()
        for host in hosts:
            self._arp(host)
            self.asking[host] = (now + first, 2 * first)

    def _arp(self, host: str) -> None:
        dpid, port = self.wiring.hosts[host]
        self.counters.packet_ins += 1
        self.switches[dpid].packet_in(port, arp_announcement(self.wiring.macs[host], self.wiring.ips[host],
                                                             self.gateway_ip))

    def to_host(self, dpid: int, port: int, frame: bytes) -> None:
        """A frame the controller sent out of a host's port: an ARP reply to it
        ends its asking; an ARP request for its address (hybrid mode's probe)
        gets its reply, as from any host, back up through its edge switch."""
        host = self.host_at.get((dpid, port))
        message = arp.parse(frame) if host is not None else None
        if host is None or message is None or message.target_ip != self.wiring.ips[host]:
            return
        if message.is_request:
            self.counters.packet_ins += 1
            self.switches[dpid].packet_in(port, arp.reply(message, self.wiring.macs[host]))
        else:
            self.asking.pop(host, None)

    async def _watch_lag(self, every: float = 0.1) -> None:
        """`Counters.loop_lag_max`: how late a 0.1 s sleep wakes."""
        while True:
            began = time.monotonic()
            await asyncio.sleep(every)
            self.counters.loop_lag_max = max(self.counters.loop_lag_max, time.monotonic() - began - every)

    async def _ask_again(self) -> None:
        _, longest = ARP_RETRY_S
        while True:
            await asyncio.sleep(0.25)
            now = time.monotonic()
            for host, (due, wait) in list(self.asking.items()):
                if now >= due:
                    self._arp(host)
                    self.asking[host] = (now + wait, min(2 * wait, longest))

    def set_port(self, dpid: int, port: int, up: bool) -> None:
        self.switches[dpid].port_status(port, up)

    def tables(self) -> dict[int, Table]:
        """Every switch's MetaFlow entries as it holds them, by dpid (the real
        ones' as `real_tables` reads them)."""
        return {dpid: switch.table.metaflow() for dpid, switch in self.switches.items()} | self.real_tables()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--k", type=int, default=4, help="fat-tree arity")
    p.add_argument("--servers", type=int, default=None, help="storage servers (default all hosts)")
    p.add_argument("--of-host", default="127.0.0.1")
    p.add_argument("--of-port", type=int, action="append",
                   help=f"a controller's OpenFlow port (repeat for several; default {OPENFLOW_PORT})")
    args = p.parse_args(argv)

    async def run() -> None:
        emulator = Emulator(builders.fat_tree(args.k, servers=args.servers))
        await emulator.start([(args.of_host, port) for port in args.of_port or [OPENFLOW_PORT]])
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        await stop.wait()
        await emulator.close()

    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(run())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
