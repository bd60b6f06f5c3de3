"""benchmarks.ofemu, the pure parts: the topology's wires, the table the flow
mods build, and the bytes an emulated switch answers, read back by os-ken's
own OpenFlow 1.0 parser (what the real controller reads them with)."""

from __future__ import annotations

import struct
from typing import Any

import pytest
from os_ken.ofproto import nicira_ext as nx
from os_ken.ofproto import ofproto_parser
from os_ken.ofproto import ofproto_v1_0 as ofp
from os_ken.ofproto import ofproto_v1_0_parser as parser

from benchmarks.ofemu import (
    HEADER,
    MAX_MESSAGE,
    Channel,
    Emulator,
    FlowTable,
    Wiring,
    _Datapath,
    covers,
    flow_stats,
    is_lldp,
    stats_replies,
)
from btree.flows import FlowEntry, SwitchDiff
from client_lib.cidr import Block
from controller import arp, ofmsgs
from topology import builders

GRAPH = builders.fat_tree(4, servers=8)
ENTRIES = [FlowEntry(2010, Block.parse("100.64.0.0/10"), 3, "00:00:00:00:00:01"),
           FlowEntry(2012, Block.parse("100.64.0.0/12"), 4, None),
           FlowEntry(1999, Block.parse("100.64.0.0/11"), 1, None)]


class Collected:
    """A switch's connection, as the bytes written to it."""

    def __init__(self) -> None:
        self.data = bytearray()

    def write(self, data: bytes) -> None:
        self.data += data

    def messages(self) -> list[Any]:
        """Every message written, parsed as the controller parses it."""
        out, buf = [], bytes(self.data)
        while buf:
            version, msg_type, length, xid = HEADER.unpack_from(buf)
            out.append(ofproto_parser.msg(_Datapath, version, msg_type, length, xid, buf[:length]))
            buf = buf[length:]
        return out


def _wire(msg: Any) -> bytes:
    msg.datapath = _Datapath
    if msg.xid is None:
        msg.set_xid(7)
    msg.serialize()
    return bytes(msg.buf)


def _packet_out(port: int, frame: bytes) -> Any:
    return parser.OFPPacketOut(None, ofp.OFP_NO_BUFFER, ofp.OFPP_NONE, [parser.OFPActionOutput(port)], frame)


def _attach(emulator: Emulator, dpid: int) -> Channel:
    """A controller's connection to the switch, collecting what it is sent."""
    channel = Channel(Collected())
    emulator.switches[dpid].channels.append(channel)
    return channel


def _sent(channel: Channel) -> Collected:
    assert isinstance(channel.sink, Collected)
    return channel.sink


def _feed(emulator: Emulator, dpid: int, msgs: list[Any], channel: Channel | None = None) -> None:
    """`msgs` from the controller on `channel` (default: the switch's first connection)."""
    switch = emulator.switches[dpid]
    channel = channel or (switch.channels[0] if switch.channels else _attach(emulator, dpid))
    for msg in msgs:
        data = _wire(msg)
        _, msg_type, _, xid = HEADER.unpack_from(data)
        switch.handle(channel, msg_type, xid, data)


def test_every_link_of_the_topology_leads_back_and_hosts_are_where_the_builder_put_them() -> None:
    wiring = Wiring.of(GRAPH)
    for (dpid, port), (peer, peer_port) in wiring.links.items():
        assert wiring.peer(peer, peer_port) == (dpid, port)
    a, b = "p0e0", "p0a1"
    assert wiring.peer(GRAPH.nodes[a]["dpid"], builders.port(GRAPH, a, b)) == \
        (GRAPH.nodes[b]["dpid"], builders.port(GRAPH, b, a))
    host = builders.storage_hosts(GRAPH)[0]
    (edge,) = GRAPH.neighbors(host)
    at = (GRAPH.nodes[edge]["dpid"], builders.port(GRAPH, edge, host))
    assert wiring.hosts[host] == at and wiring.peer(*at) is None   # a frame to a host leaves the emulation
    assert len(wiring.links) == 2 * 32 and sum(len(p) for p in wiring.ports.values()) == 20 * 4


def test_flow_mods_from_the_controllers_own_messages_build_the_table_it_meant() -> None:
    emulator = Emulator(GRAPH)
    _feed(emulator, 1, ofmsgs.diff_messages(SwitchDiff(add=ENTRIES)))
    assert emulator.switches[1].table.metaflow() == {e.match: e for e in ENTRIES}
    moved = FlowEntry(2010, ENTRIES[0].prefix, 2, "00:00:00:00:00:02")
    _feed(emulator, 1, ofmsgs.diff_messages(SwitchDiff(modify=[moved], delete=[ENTRIES[1]])))
    assert emulator.switches[1].table.metaflow() == {moved.match: moved, ENTRIES[2].match: ENTRIES[2]}
    assert emulator.counters.flow_mods == 2 * 3 + 2 * 2   # a tcp and a udp entry each
    assert emulator.switches[2].table.entries == {}


def test_a_non_strict_delete_removes_what_its_match_covers() -> None:
    table = FlowTable()
    for msg in ofmsgs.diff_messages(SwitchDiff(add=ENTRIES)) + ofmsgs.base_messages("full", "100.64.0.1"):
        table.apply(msg)
    wide = parser.OFPMatch(dl_type=0x0800, nw_proto=6)   # every tcp entry, whatever nw_dst
    delete = parser.OFPFlowMod(None, wide, 0, ofp.OFPFC_DELETE, 0, 0, 0, ofp.OFP_NO_BUFFER, ofp.OFPP_NONE)
    table.apply(delete)
    assert table.metaflow() == {}   # the tcp halves are gone
    assert any(e.match.nw_proto == 17 for e in table.entries.values())   # the udp halves are not
    table.apply(parser.OFPFlowMod(None, parser.OFPMatch(), 0, ofp.OFPFC_DELETE, 0, 0, 0, ofp.OFP_NO_BUFFER,
                                  ofp.OFPP_NONE))
    assert table.entries == {}


def test_covers_is_openflow_10_non_strict_matching() -> None:
    def tcp(prefix: str) -> Any:
        return ofmsgs.metaflow_matches(FlowEntry(2000, Block.parse(prefix), 1))[0]

    ten, twelve, other = tcp("100.64.0.0/10"), tcp("100.64.0.0/12"), tcp("100.128.0.0/10")
    assert covers(ten, twelve) and not covers(twelve, ten) and not covers(ten, other)
    assert covers(parser.OFPMatch(), ten) and not covers(ten, parser.OFPMatch())


def test_flow_stats_are_read_back_by_os_ken_as_the_table_held() -> None:
    table = FlowTable()
    for msg in ofmsgs.diff_messages(SwitchDiff(add=ENTRIES)):
        table.apply(msg)
    (reply,) = stats_replies(ofp.OFPST_FLOW, 9, flow_stats(table.entries.values(), 0.0))
    msg = ofproto_parser.msg(_Datapath, *HEADER.unpack_from(reply), reply)
    assert msg.xid == 9 and not msg.flags & ofp.OFPSF_REPLY_MORE
    assert ofmsgs.installed(msg.body).table == {e.match: e for e in ENTRIES}


def test_a_long_stats_reply_is_cut_into_parts_flagged_more() -> None:
    records = [bytes(1000)] * 200
    parts = stats_replies(ofp.OFPST_FLOW, 1, records)
    assert len(parts) == 4 and all(len(p) <= MAX_MESSAGE for p in parts)
    flags = [struct.unpack_from("!H", p, HEADER.size + 2)[0] for p in parts]
    assert flags == [ofp.OFPSF_REPLY_MORE] * 3 + [0]
    assert sum(len(p) - HEADER.size - 4 for p in parts) == 200 * 1000


def test_lldp_sent_out_of_a_link_port_comes_in_at_the_other_end() -> None:
    emulator = Emulator(GRAPH)
    channels = {dpid: _attach(emulator, dpid) for dpid in emulator.switches}
    sinks = {dpid: _sent(channel) for dpid, channel in channels.items()}
    (here, there), = [(a, b) for a, b in emulator.wiring.links.items() if a[0] == 1][:1]
    lldp = bytes.fromhex("0180c200000e" "020000000001" "88cc") + bytes(20)
    assert is_lldp(lldp) and not is_lldp(arp.probe("10.0.0.1", "100.64.0.1"))
    out = _packet_out(here[1], lldp)
    _feed(emulator, here[0], [out])
    (packet_in,) = sinks[there[0]].messages()
    assert isinstance(packet_in, parser.OFPPacketIn)
    assert (packet_in.in_port, bytes(packet_in.data)) == (there[1], lldp)
    assert all(not sinks[d].data for d in sinks if d != there[0])
    emulator.switches[there[0]].channels.clear()   # not connected yet: the frame waits for it
    _feed(emulator, here[0], [out])
    emulator.switches[there[0]].channels.append(channels[there[0]])
    sinks[there[0]].data.clear()
    _feed(emulator, there[0], [parser.OFPFeaturesRequest(None)])
    features, held = sinks[there[0]].messages()
    assert isinstance(held, parser.OFPPacketIn) and held.in_port == there[1]
    emulator.set_port(*there, up=False)   # a link that is down carries nothing
    sinks[there[0]].data.clear()
    _feed(emulator, here[0], [out])
    assert sinks[there[0]].messages() == []


def test_a_real_switchs_port_takes_the_lldp_of_its_emulated_peer_and_sends_its_own_back() -> None:
    edge = next(s for s in builders.switches(GRAPH) if GRAPH.nodes[s]["layer"] == "edge")
    real = GRAPH.nodes[edge]["dpid"]
    emulator = Emulator(GRAPH, real=[real])
    assert real not in emulator.switches and len(emulator.switches) == len(emulator.wiring.names) - 1
    (mine, theirs), = [(a, b) for a, b in emulator.wiring.links.items() if a[0] == real][:1]
    sink = _sent(_attach(emulator, theirs[0]))
    into: list[bytes] = []
    emulator.attach(mine, into.append)
    lldp = bytes.fromhex("0180c200000e" "020000000001" "88cc") + bytes(20)
    _feed(emulator, theirs[0], [_packet_out(theirs[1], lldp)])   # the emulated side's frame
    assert into == [lldp] and sink.messages() == []
    assert emulator.from_real(mine, lldp)   # the real side's frame
    (packet_in,) = sink.messages()
    assert (packet_in.in_port, bytes(packet_in.data)) == (theirs[1], lldp)
    data = arp.probe("10.0.0.1", "100.64.0.1")   # anything else: the emulated fabric carries no data
    assert not emulator.from_real(mine, data) and emulator.counters.dropped == 1
    emulator.set_port(*theirs, up=False)
    assert not emulator.from_real(mine, lldp)
    host_port = emulator.wiring.hosts[next(h for h in GRAPH.adj[edge] if GRAPH.nodes[h]["kind"] == "host")]
    with pytest.raises(ValueError, match="not a real switch's port"):
        emulator.attach(host_port, into.append)
    with pytest.raises(ValueError, match="not a real switch's port"):
        emulator.attach(theirs, into.append)


def test_the_tables_of_real_switches_come_from_whoever_reads_them() -> None:
    real = GRAPH.nodes["p0e0"]["dpid"]
    emulator = Emulator(GRAPH, real=[real])
    assert real not in emulator.tables()
    held = {(2016, Block.parse("100.64.0.0/16")): FlowEntry(2016, Block.parse("100.64.0.0/16"), 1, None)}
    emulator.real_tables = lambda: {real: held}
    tables = emulator.tables()
    assert tables[real] == held and set(tables) == set(emulator.wiring.names)


def _a_server_and_its_edge(emulator: Emulator) -> tuple[str, int, int, Collected]:
    """A storage server, its edge switch and port, and that switch's connection."""
    host = builders.storage_hosts(GRAPH)[3]
    dpid, port = emulator.wiring.hosts[host]
    return host, dpid, port, _sent(_attach(emulator, dpid))


def test_a_servers_announcement_is_an_arp_packet_in_from_its_edge_port() -> None:
    emulator = Emulator(GRAPH)
    host, dpid, port, sink = _a_server_and_its_edge(emulator)
    emulator.gateway_ip = "100.64.0.1"
    emulator.announce([host])
    (packet_in,) = sink.messages()
    message = arp.parse(bytes(packet_in.data))
    assert packet_in.in_port == port and message is not None
    assert (message.sender_ip, message.sender_mac, message.target_ip) == \
        (GRAPH.nodes[host]["ip"], GRAPH.nodes[host]["mac"], "100.64.0.1")
    assert host in emulator.asking   # asked again until answered
    reply = arp.reply(message, arp.GATEWAY_MAC)
    _feed(emulator, dpid, [_packet_out(port % 4 + 1, reply)])
    assert host in emulator.asking   # an answer out of another port is not this server's
    _feed(emulator, dpid, [_packet_out(port, reply)])
    assert host not in emulator.asking


@pytest.mark.parametrize("role", [1, 2])
def test_features_barrier_echo_and_role_are_answered_as_os_ken_expects(role: int) -> None:
    emulator = Emulator(GRAPH)
    channel = _attach(emulator, 5)
    sink = _sent(channel)
    switch = emulator.switches[5]
    _feed(emulator, 5, [parser.OFPFeaturesRequest(None), parser.OFPBarrierRequest(None),
                        parser.OFPEchoRequest(None, b"hi"), ofmsgs.role_request(role == 1)])
    features, barrier, echo, role_reply = sink.messages()
    assert features.datapath_id == 5 and set(features.ports) == {*emulator.wiring.ports[5], ofp.OFPP_LOCAL}
    assert features.ports[ofp.OFPP_LOCAL].name.rstrip(b"\0").decode() == switch.name
    assert isinstance(barrier, parser.OFPBarrierReply) and bytes(echo.data) == b"hi"
    assert channel.role == role and role_reply.xid == 7
    assert 5 in emulator.counters.connected


def test_a_server_answers_a_probe_for_its_address_out_of_its_own_port_only() -> None:
    emulator = Emulator(GRAPH)
    host, dpid, port, sink = _a_server_and_its_edge(emulator)
    ip, mac = GRAPH.nodes[host]["ip"], GRAPH.nodes[host]["mac"]
    probe = arp.probe(ip, "100.64.0.1")
    _feed(emulator, dpid, [_packet_out(port % 4 + 1, probe)])   # another port: nobody there answers
    assert sink.messages() == []
    _feed(emulator, dpid, [_packet_out(port, arp.probe("10.9.9.9", "100.64.0.1"))])   # not its address
    assert sink.messages() == []
    _feed(emulator, dpid, [_packet_out(port, probe)])
    (packet_in,) = sink.messages()
    answer = arp.parse(bytes(packet_in.data))
    assert packet_in.in_port == port and answer is not None and not answer.is_request
    assert (answer.sender_ip, answer.sender_mac, answer.target_ip) == (ip, mac, "100.64.0.1")


def test_with_two_controllers_replies_go_to_the_asker_events_to_both_and_a_slave_changes_nothing() -> None:
    emulator = Emulator(GRAPH)
    host, dpid, port, _ = _a_server_and_its_edge(emulator)
    leader, standby = emulator.switches[dpid].channels[0], _attach(emulator, dpid)
    _feed(emulator, dpid, [ofmsgs.role_request(True)], leader)
    _feed(emulator, dpid, [ofmsgs.role_request(False), parser.OFPBarrierRequest(None)], standby)
    assert (leader.role, standby.role) == (nx.NX_ROLE_MASTER, nx.NX_ROLE_SLAVE)
    assert len(_sent(leader).messages()) == 1 and len(_sent(standby).messages()) == 2   # each its own replies
    for channel in (leader, standby):
        _sent(channel).data.clear()
    emulator.announce([host])   # a packet-in: both hear it (ofmsgs.async_config asks for that)
    assert all(isinstance(m, parser.OFPPacketIn) for c in (leader, standby) for m in _sent(c).messages())
    assert [len(_sent(c).messages()) for c in (leader, standby)] == [1, 1]
    _sent(standby).data.clear()
    changes = ofmsgs.diff_messages(SwitchDiff(add=ENTRIES)) + [_packet_out(port, b"x" * 60)]
    _feed(emulator, dpid, changes, standby)
    assert emulator.switches[dpid].table.entries == {}   # a slave's changes are refused, as by OVS
    errors = _sent(standby).messages()
    assert errors and all(isinstance(e, parser.OFPErrorMsg) and ofmsgs.refused_as_slave(e.type, e.code)
                          for e in errors)
    # the standby takes over: the old master becomes a slave, the new one's flow mods apply
    _feed(emulator, dpid, [ofmsgs.role_request(True)], standby)
    assert (leader.role, standby.role) == (nx.NX_ROLE_SLAVE, nx.NX_ROLE_MASTER)
    _feed(emulator, dpid, ofmsgs.diff_messages(SwitchDiff(add=ENTRIES)), standby)
    assert emulator.switches[dpid].table.metaflow() == {e.match: e for e in ENTRIES}
