"""Hybrid mode (`--mode hybrid`), pure: what the switches get in each mode,
what a re-sync changes (and leaves alone), how servers are located without
intercepting their traffic, and a switch that refuses NORMAL."""

from __future__ import annotations

import ipaddress
import logging
from types import SimpleNamespace

import pytest
from os_ken.lib.packet import arp, ethernet, packet
from os_ken.ofproto import ofproto_v1_0 as ofp
from os_ken.ofproto import ofproto_v1_0_parser as parser

from btree.flows import FlowEntry, SwitchDiff
from client_lib.api.auth import write_secret
from client_lib.cidr import Block
from client_lib.constants import (
    ARP_PRIORITY,
    COOKIE_BASE,
    COOKIE_NORMAL,
    COOKIE_ROUTE,
    LLDP_PRIORITY,
    UPRULE_PRIORITY,
)
from controller import arp as arp_frames
from controller import core as core_module
from controller.arp import GATEWAY_MAC, ArpMessage
from controller.core import PROBE_INTERVAL_S
from controller.inventory import Inventory
from controller.ofmsgs import (
    base_entries,
    base_messages,
    diff_messages,
    installed,
    refuses_normal,
    resync_messages,
    route_messages,
)
from controller.settings import from_args
from controller.settings import parser as settings_parser
from controller.steps import ArpIn, LinkUp, PacketOut, PortDown, SwitchError, SwitchUp, Tick
from tests.unit.controller_world import FakeSwitch, World, sample_ids
from topology.builders import fat_tree, port, storage_hosts, two_tier

GATEWAY = "10.255.255.254"
DP = SimpleNamespace(ofproto=ofp, ofproto_parser=parser, id=7)


def _wire(msg) -> bytes:
    msg.datapath = DP
    msg.set_xid(9)
    msg.serialize()
    return bytes(msg.buf)


def _shape(mod) -> tuple:
    """(command, priority, cookie, dl_type or None, nw_dst or None, output ports)."""
    w = mod.match.wildcards
    exact_dst = (w & ofp.OFPFW_NW_DST_MASK) >> ofp.OFPFW_NW_DST_SHIFT == 0
    return (mod.command, mod.priority, mod.cookie, None if w & ofp.OFPFW_DL_TYPE else mod.match.dl_type,
            str(ipaddress.IPv4Address(mod.match.nw_dst)) if exact_dst else None,
            [a.port for a in mod.actions])


# -- the base entries of each mode ---------------------------------------------------


def test_full_mode_keeps_its_layout_lldp_every_arp_and_drop_all():
    assert [_shape(m) for m in base_messages("full", GATEWAY)] == [
        (ofp.OFPFC_ADD, LLDP_PRIORITY, COOKIE_BASE, 0x88CC, None, [ofp.OFPP_CONTROLLER]),
        (ofp.OFPFC_ADD, ARP_PRIORITY, COOKIE_BASE, 0x0806, None, [ofp.OFPP_CONTROLLER]),
        (ofp.OFPFC_ADD, 0, COOKIE_BASE, None, None, [])]


def test_hybrid_mode_sends_only_the_gateways_arp_up_and_everything_else_to_normal():
    mods = base_messages("hybrid", GATEWAY)
    assert [_shape(m) for m in mods] == [
        (ofp.OFPFC_ADD, LLDP_PRIORITY, COOKIE_BASE, 0x88CC, None, [ofp.OFPP_CONTROLLER]),
        (ofp.OFPFC_ADD, ARP_PRIORITY, COOKIE_BASE, 0x0806, GATEWAY, [ofp.OFPP_CONTROLLER]),
        (ofp.OFPFC_ADD, 0, COOKIE_NORMAL, None, None, [ofp.OFPP_NORMAL])]
    for mod in mods:   # never flooded, never a wipe
        assert ofp.OFPP_FLOOD not in [a.port for a in mod.actions]
        _wire(mod)   # a valid OF1.0 message
    gateway_arp = mods[1].match
    assert not gateway_arp.wildcards & ofp.OFPFW_DL_TYPE
    assert (gateway_arp.wildcards & ofp.OFPFW_NW_DST_MASK) >> ofp.OFPFW_NW_DST_SHIFT == 0


def test_the_mode_is_a_flag_with_full_as_default_and_others_refused(tmp_path, capsys):
    secret = write_secret(tmp_path / "secret")
    assert from_args(settings_parser().parse_args(["--secret-file", str(secret)])).mode == "full"
    hybrid = settings_parser().parse_args(["--secret-file", str(secret), "--mode", "hybrid"])
    assert from_args(hybrid).mode == "hybrid"
    with pytest.raises(SystemExit):
        settings_parser().parse_args(["--secret-file", str(secret), "--mode", "halfway"])
    assert "invalid choice: 'halfway'" in capsys.readouterr().err


# -- re-sync: only differences, only ours ---------------------------------------------


def _operator(switch: FakeSwitch, priority: int, actions: list, **match) -> None:
    """An entry the operator installed (cookie 0)."""
    switch.apply(parser.OFPFlowMod(datapath=None, match=parser.OFPMatch(**match), cookie=0,
                                   command=ofp.OFPFC_ADD, priority=priority, idle_timeout=0,
                                   hard_timeout=0, actions=actions))


ENTRIES = [FlowEntry(2012, Block.parse("100.96.0.0/12"), 2, "00:00:00:00:00:02"),
           FlowEntry(UPRULE_PRIORITY, Block.parse("100.64.0.0/10"), 3)]


def test_a_hybrid_restart_over_an_operators_normal_replaces_it_and_touches_nothing_else():
    switch = FakeSwitch(1)
    _operator(switch, 0, [parser.OFPActionOutput(ofp.OFPP_NORMAL)])
    _operator(switch, 5, [parser.OFPActionOutput(2)], dl_type=0x0800, nw_dst=0x0A000005)
    held = installed(switch.stats())
    assert held.base == set() and held.table == {} and held.routes == {}   # none of it is ours
    for mod in resync_messages(held, ENTRIES, {}, base_entries("hybrid", GATEWAY)):
        switch.apply(mod)
    flows = {(f.priority, f.cookie): [getattr(a, "port", None) for a in f.actions]
             for f in switch.flows.values()}
    assert flows[(0, COOKIE_NORMAL)] == [ofp.OFPP_NORMAL]   # ours, identical, in its place
    assert flows[(5, 0)] == [2]                             # the operator's own entry survives
    assert (ARP_PRIORITY, COOKIE_BASE) in flows and (LLDP_PRIORITY, COOKIE_BASE) in flows
    assert not [f for f in switch.flows.values() if f.cookie == COOKIE_ROUTE]
    # A second restart finds everything right: the base adds (idempotent), nothing else.
    again = resync_messages(installed(switch.stats()), ENTRIES, {}, base_entries("hybrid", GATEWAY))
    assert [m.command for m in again] == [ofp.OFPFC_ADD] * 3


def test_full_to_hybrid_deletes_our_routes_and_catch_all_arp_and_back_again():
    switch = FakeSwitch(1)
    _operator(switch, 5, [parser.OFPActionOutput(2)], dl_type=0x0800, nw_dst=0x0A000005)
    for mod in (base_messages("full", GATEWAY) + diff_messages(SwitchDiff(add=ENTRIES))
                + route_messages({"10.0.0.1": 1, "10.0.0.2": 4})):
        switch.apply(mod)
    mods = resync_messages(installed(switch.stats()), ENTRIES, {}, base_entries("hybrid", GATEWAY))
    deletes = [_shape(m) for m in mods if m.command == ofp.OFPFC_DELETE_STRICT]
    assert sorted(deletes) == sorted([
        (ofp.OFPFC_DELETE_STRICT, 1000, COOKIE_ROUTE, 0x0800, "10.0.0.1", []),
        (ofp.OFPFC_DELETE_STRICT, 1000, COOKIE_ROUTE, 0x0800, "10.0.0.2", []),
        (ofp.OFPFC_DELETE_STRICT, ARP_PRIORITY, COOKIE_BASE, 0x0806, None, [])])
    for mod in mods:
        switch.apply(mod)
    held = installed(switch.stats())
    assert held.base == {e.key for e in base_entries("hybrid", GATEWAY)} and held.routes == {}
    assert held.table == {e.match: e for e in ENTRIES}
    for mod in resync_messages(held, ENTRIES, {"10.0.0.1": 1}, base_entries("full", GATEWAY)):
        switch.apply(mod)
    held = installed(switch.stats())
    assert held.base == {e.key for e in base_entries("full", GATEWAY)} and held.routes == {"10.0.0.1": 1}
    assert len(switch.flows) == 1 + 3 + 2 * len(ENTRIES) + 1   # the operator's, base, MetaFlow pairs, route


# -- a switch that refuses NORMAL ------------------------------------------------------


def test_a_refused_normal_is_read_from_the_errors_data():
    normal, arp_entry = (next(m for m in base_messages("hybrid", GATEWAY) if m.cookie == cookie_)
                         for cookie_ in (COOKIE_NORMAL, COOKIE_BASE))
    wire = _wire(normal)
    for data in (wire, wire[:64]):   # OVS returns it whole; OF1.0 promises 64 bytes
        assert refuses_normal(ofp.OFPET_BAD_ACTION, ofp.OFPBAC_BAD_OUT_PORT, data)
    assert not refuses_normal(ofp.OFPET_BAD_ACTION, ofp.OFPBAC_BAD_OUT_PORT, wire[:63])
    assert not refuses_normal(ofp.OFPET_BAD_ACTION, ofp.OFPBAC_BAD_OUT_PORT, _wire(arp_entry))
    # A switch that holds this controller as a slave refuses every flow mod: the role, not NORMAL.
    assert not refuses_normal(ofp.OFPET_BAD_REQUEST, ofp.OFPBRC_EPERM, wire)
    barrier = parser.OFPBarrierRequest(None)
    assert not refuses_normal(ofp.OFPET_BAD_REQUEST, 0, _wire(barrier) + bytes(64))


def test_a_switch_refusing_normal_is_reported_by_name_at_connect(caplog):
    world = World(two_tier(core=1, edges=2, servers_per_edge=2, clients_per_edge=1), mode="hybrid")
    world.post(SwitchUp(3, (1, 2, 3), "br-edge3"))
    world.run()
    normal = next(m for m in base_messages("hybrid", GATEWAY) if m.cookie == COOKIE_NORMAL)
    with caplog.at_level(logging.ERROR, logger="metaflow.controller"):
        world.post(SwitchError(3, ofp.OFPET_BAD_ACTION, ofp.OFPBAC_BAD_OUT_PORT, _wire(normal)))
        world.run()
    (event,) = [e for e in world.core.events if e["event"] == "normal-refused"]
    assert event["switch"] == "br-edge3 (dpid 3)" and event["error"] == "type 2 code 4"
    assert "normal-refused switch=br-edge3 (dpid 3)" in caplog.text
    other = next(m for m in base_messages("hybrid", GATEWAY) if m.priority == ARP_PRIORITY)
    world.post(SwitchError(3, ofp.OFPET_FLOW_MOD_FAILED, ofp.OFPFMFC_ALL_TABLES_FULL, _wire(other)))
    world.run()
    assert len([e for e in world.core.events if e["event"] == "normal-refused"]) == 1


# -- locating servers without intercepting their traffic --------------------------------


def _connect(world: World) -> dict[tuple[int, int], str]:
    """Every switch connects with its ports (features) and its links come up;
    (dpid, port) -> the host there."""
    g = world.graph
    hosts = {}
    for sw, data in g.nodes(data=True):
        if data["kind"] != "switch":
            continue
        world.post(SwitchUp(data["dpid"], tuple(sorted(port(g, sw, n) for n in g.neighbors(sw))), sw))
        for n in g.neighbors(sw):
            if g.nodes[n]["kind"] == "host":
                hosts[(data["dpid"], port(g, sw, n))] = n
    for a, b in g.edges():
        if g.nodes[a]["kind"] == g.nodes[b]["kind"] == "switch":
            world.post(LinkUp(g.nodes[a]["dpid"], port(g, a, b), g.nodes[b]["dpid"], port(g, b, a)))
    world.run()
    return hosts


def _probes(world: World) -> list[PacketOut]:
    start = len(world.executed)
    world.post(Tick())
    world.run()
    return [s for s in world.executed[start:] if isinstance(s, PacketOut)]


def test_hybrid_mode_asks_for_unlocated_servers_out_of_edge_ports_until_they_answer():
    g = two_tier(core=1, edges=2, servers_per_edge=2, clients_per_edge=1)
    world = World(g, mode="hybrid")
    at = _connect(world)
    world.register_all()
    assert _probes(world) == []   # not before the topology has been quiet for --settle
    world.advance(world.settings.settle_s)
    probes = _probes(world)
    servers = storage_hosts(g)
    assert {(p.dpid, p.port) for p in probes} == set(at)   # every host port, no inter-switch link
    asked = {}
    for p in probes:
        frame = packet.Packet(p.data)
        eth, request = frame.get_protocol(ethernet.ethernet), frame.get_protocol(arp.arp)
        assert eth.src == GATEWAY_MAC and eth.dst == "ff:ff:ff:ff:ff:ff"
        assert request.opcode == arp.ARP_REQUEST and request.src_ip == GATEWAY
        asked.setdefault(request.dst_ip, set()).add((p.dpid, p.port))
    assert set(asked) == {g.nodes[s]["ip"] for s in servers}
    assert _probes(world) == []   # not again before PROBE_INTERVAL_S
    # The first server answers (to the gateway: its edge switch's gateway entry sends it up).
    first = servers[0]
    (where,) = [k for k, h in at.items() if h == first]
    world.post(ArpIn(*where, ArpMessage(g.nodes[first]["ip"], g.nodes[first]["mac"], GATEWAY, False)))
    world.run()
    assert world.core.inventory.hosts[g.nodes[first]["ip"]].dpid == where[0]
    down = next(k for k, h in at.items() if h == servers[1])
    world.post(PortDown(*down))   # a port that is down is not asked through
    world.run()
    world.advance(2.0)
    again = _probes(world)
    assert {packet.Packet(p.data).get_protocol(arp.arp).dst_ip for p in again} == {
        g.nodes[s]["ip"] for s in servers[1:]}
    assert {(p.dpid, p.port) for p in again} == set(at) - {down}
    world.advance(world.settings.heartbeat_timeout_s + 0.1)   # the rest fell silent: dead, not asked for
    assert _probes(world) == []


def test_servers_that_beat_by_datagram_only_are_still_asked_for():
    """Agents beat by liveness datagram (`controller.liveness` writes
    `registry.heard`), not by HTTP: they are heard lately, and asked for,
    for as long as their datagrams come (a real run located none of them
    when the probes read only the HTTP heartbeat's time)."""
    g = two_tier(core=1, edges=2, servers_per_edge=2, clients_per_edge=1)
    world = World(g, mode="hybrid")
    _connect(world)
    world.register_all()
    world.advance(world.settings.settle_s + world.settings.heartbeat_timeout_s + 1.0)
    names = {world.core.registry.by_ip(g.nodes[s]["ip"]).name: g.nodes[s]["ip"] for s in storage_hosts(g)}
    for name in names:
        world.core.registry.heard[name] = (world.now, 0)
    asked = {packet.Packet(p.data).get_protocol(arp.arp).dst_ip for p in _probes(world)}
    assert asked == set(names.values())
    world.advance(world.settings.heartbeat_timeout_s + PROBE_INTERVAL_S + 0.1)   # the datagrams stopped
    assert _probes(world) == []


def test_full_mode_never_probes():
    world = World(two_tier(core=1, edges=2, servers_per_edge=2, clients_per_edge=1))
    _connect(world)
    world.register_all()
    world.advance(world.settings.settle_s)
    assert _probes(world) == []


def test_a_server_located_at_a_port_lldp_later_finds_a_link_is_forgotten_and_asked_for_again():
    g = two_tier(core=1, edges=2, servers_per_edge=2, clients_per_edge=1)
    world = World(g, mode="hybrid")
    _connect(world)
    world.register_all()
    server = storage_hosts(g)[0]
    core_switch = next(s for s in g if g.nodes[s].get("layer") == "core")
    edge = next(n for n in g.neighbors(core_switch))
    wrong = (g.nodes[core_switch]["dpid"], port(g, core_switch, edge))
    world.post(ArpIn(*wrong, ArpMessage(g.nodes[server]["ip"], g.nodes[server]["mac"], GATEWAY, False)))
    world.run()   # refused: the link is known, and a link's port is no host's
    assert g.nodes[server]["ip"] not in world.core.inventory.hosts
    inv = world.core.inventory
    inv.link_down(*wrong, g.nodes[edge]["dpid"], port(g, edge, core_switch))   # as if not found yet
    world.post(ArpIn(*wrong, ArpMessage(g.nodes[server]["ip"], g.nodes[server]["mac"], GATEWAY, False)))
    world.run()
    assert inv.hosts[g.nodes[server]["ip"]].dpid == wrong[0]   # mislocated
    world.post(LinkUp(*wrong, g.nodes[edge]["dpid"], port(g, edge, core_switch)))
    world.run()
    assert g.nodes[server]["ip"] not in inv.hosts
    (event,) = [e for e in world.core.events if e["event"] == "host-forgotten"]
    assert event["at"] == f"{wrong[0]}:{wrong[1]}"
    world.advance(world.settings.settle_s)
    asked = {packet.Packet(p.data).get_protocol(arp.arp).dst_ip for p in _probes(world)}
    assert g.nodes[server]["ip"] in asked


@pytest.fixture
def hybrid() -> World:
    world = World(fat_tree(4, servers=8), mode="hybrid")
    world.boot()
    assert world.core.tree is not None
    return world


def test_a_built_hybrid_network_has_metaflow_entries_and_no_routes_drop_or_catch_all_arp(hybrid):
    world = hybrid
    for switch in world.switches.values():
        cookies = {f.cookie for f in switch.flows.values()}
        assert COOKIE_ROUTE not in cookies
        held = installed(switch.stats())
        assert held.base == {e.key for e in base_entries("hybrid", GATEWAY)}
    for mdid in sample_ids(world):
        assert world.deliver(mdid).host in world.agents   # requests still take their zero-hop path
    assert world.core.world.routes == {}


def test_hybrid_mode_answers_arp_for_the_gateway_only(hybrid):
    world = hybrid
    g = world.graph
    server = storage_hosts(g)[0]
    client = next(n for n, d in g.nodes(data=True) if d.get("role") == "client")
    (edge,) = list(g.neighbors(client))
    where = (g.nodes[edge]["dpid"], port(g, edge, client))
    replies = []
    for target in (g.nodes[server]["ip"], GATEWAY):
        start = len(world.executed)
        world.post(ArpIn(*where, ArpMessage(g.nodes[client]["ip"], g.nodes[client]["mac"], target, True)))
        world.run()
        replies += [s for s in world.executed[start:] if isinstance(s, PacketOut)]
    (reply,) = replies
    answer = arp_frames.parse(reply.data)
    assert answer is not None and answer.sender_ip == GATEWAY and answer.sender_mac == GATEWAY_MAC


def test_hybrid_mode_leaves_clients_out_of_the_classified_fabric(hybrid):
    """A client is located in hybrid mode only when it ARPs for the gateway: if it
    shaped the graph, two controllers (or a restart) that saw different clients
    would build different trees, and a takeover would rewrite the tables."""
    world = hybrid
    g = world.graph
    client = next(n for n, d in g.nodes(data=True) if d.get("role") == "client")
    (edge,) = list(g.neighbors(client))
    before = world.core.graph_now()
    world.post(ArpIn(g.nodes[edge]["dpid"], port(g, edge, client),
                     ArpMessage(g.nodes[client]["ip"], g.nodes[client]["mac"], GATEWAY, True)))
    world.run()
    assert g.nodes[client]["ip"] in world.core.inventory.hosts   # located...
    after = world.core.graph_now()
    assert sorted(after.nodes) == sorted(before.nodes)           # ...and still not in the fabric
    assert not [n for n, d in after.nodes(data=True) if d.get("role") == "client"]
    assert {d.get("role") for n, d in after.nodes(data=True) if d.get("kind") == "host"} == {"storage"}


def test_a_link_is_held_the_same_whichever_end_lldp_saw_first():
    """A leader and its standby may learn a link from opposite ends (each from
    the first LLDP it hears); their views must still be equal."""
    one, other = (Inventory(Block.parse("100.64.0.0/10"), GATEWAY) for _ in range(2))
    assert one.link_up(7, 2, 3, 10) and other.link_up(3, 10, 7, 2)
    assert not one.link_up(3, 10, 7, 2)   # the same link, not news
    assert one.links == other.links == {(3, 10, 7, 2)}
    assert other.link_down(7, 2, 3, 10) and not other.links


def test_probes_stay_within_the_budget_and_ask_for_every_server_in_turn(monkeypatch):
    """A storage row powering up at k=32 would ask for 2,000 servers out of
    8,192 edge ports at once: a round sends at most PROBE_BUDGET probes, and
    the next round goes on with the (server, port) pair after the last one
    asked through, so every server is asked for at every port in turn."""
    g = two_tier(core=1, edges=2, servers_per_edge=2, clients_per_edge=1)
    world = World(g, mode="hybrid")
    at = _connect(world)
    world.register_all()
    world.advance(world.settings.settle_s)
    monkeypatch.setattr(core_module, "PROBE_BUDGET", 2 * len(at))   # two servers' probes a round
    servers = sorted(g.nodes[s]["ip"] for s in storage_hosts(g))
    rounds = []
    for _ in range(3):
        probes = _probes(world)
        assert len(probes) <= 2 * len(at)
        rounds.append(sorted({packet.Packet(p.data).get_protocol(arp.arp).dst_ip for p in probes}))
        world.beat_for(PROBE_INTERVAL_S)   # heard lately: still asked for
    assert rounds == [servers[:2], servers[2:], servers[:2]]
    # Fewer than one server's ports a round: every (server, port) pair once, in turn.
    monkeypatch.setattr(core_module, "PROBE_BUDGET", 5)
    asked: list[tuple[str, int, int]] = []
    for _ in range(len(servers) * len(at) // 5):
        probes = _probes(world)
        assert len(probes) == 5
        asked += [(packet.Packet(p.data).get_protocol(arp.arp).dst_ip, p.dpid, p.port) for p in probes]
        world.beat_for(PROBE_INTERVAL_S)
    assert len(asked) == len(set(asked)) == len(servers) * len(at) - len(servers) * len(at) % 5
