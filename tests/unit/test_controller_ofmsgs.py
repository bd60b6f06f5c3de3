"""Abstract entries -> OF1.0 messages, routes and ARP answers: no switch needed."""

from __future__ import annotations

import ipaddress
from types import SimpleNamespace

import pytest
from os_ken.lib.packet import arp, ethernet, packet
from os_ken.ofproto import ofproto_v1_0 as ofp
from os_ken.ofproto import ofproto_v1_0_parser as parser

from btree.flows import FlowEntry, SwitchDiff
from client_lib.cidr import Block
from client_lib.constants import UPRULE_PRIORITY
from controller import arp as arp_answers
from controller.ofmsgs import (
    base_entries,
    base_messages,
    diff_messages,
    installed,
    resync_messages,
    route_messages,
)
from controller.routing import host_routes
from topology.builders import client_hosts, fat_tree, storage_hosts

DP = SimpleNamespace(ofproto=ofp, ofproto_parser=parser, id=7)


def _wire(msg) -> bytes:
    msg.datapath = DP   # built without one, as the core builds them; the shim attaches it
    msg.set_xid(1)
    msg.serialize()
    return bytes(msg.buf)


def test_an_entry_becomes_one_flow_mod_per_protocol_with_its_prefix_and_priority():
    entry = FlowEntry(2014, Block.parse("100.92.0.0/14"), 3, "00:00:00:00:00:09")
    mods = diff_messages(SwitchDiff(add=[entry]))
    assert [m.match.nw_proto for m in mods] == [6, 17]
    for mod in mods:
        assert mod.command == ofp.OFPFC_ADD and mod.priority == 2014
        assert mod.match.tp_dst == 9000 and mod.match.dl_type == 0x0800
        assert mod.match.nw_dst == int(ipaddress.IPv4Address("100.92.0.0"))
        wildcards = mod.match.wildcards
        assert (wildcards & ofp.OFPFW_NW_DST_MASK) >> ofp.OFPFW_NW_DST_SHIFT == 32 - 14
        assert not wildcards & (ofp.OFPFW_TP_DST | ofp.OFPFW_NW_PROTO | ofp.OFPFW_DL_TYPE)
        set_dst, output = mod.actions
        assert set_dst.dl_addr == bytes.fromhex("000000000009") and output.port == 3
        assert len(_wire(mod)) == 72 + 8 + 16  # header+match+body, output, set-dl-dst


def test_uprules_match_their_slice_and_diffs_are_ordered_add_modify_delete():
    up = FlowEntry(UPRULE_PRIORITY, Block.parse("100.96.0.0/11"), 5)
    a = FlowEntry(2011, Block.parse("100.64.0.0/11"), 1)
    b = FlowEntry(2012, Block.parse("100.96.0.0/12"), 2)
    mods = diff_messages(SwitchDiff(add=[up], modify=[a], delete=[b]))
    expected = [ofp.OFPFC_ADD] * 2 + [ofp.OFPFC_MODIFY_STRICT] * 2 + [ofp.OFPFC_DELETE_STRICT] * 2
    assert [m.command for m in mods] == expected
    assert (mods[0].match.wildcards & ofp.OFPFW_NW_DST_MASK) >> ofp.OFPFW_NW_DST_SHIFT == 32 - 11
    assert mods[0].match.nw_dst == int(ipaddress.IPv4Address("100.96.0.0"))
    assert mods[-1].actions == [] and mods[-1].priority == 2012


def test_base_flows_never_flood_and_never_wipe():
    lldp, arp_rule, miss = base_messages("full", "10.255.255.254")
    assert all(m.command == ofp.OFPFC_ADD for m in (lldp, arp_rule, miss))
    assert arp_rule.match.dl_type == 0x0806 and arp_rule.actions[0].port == ofp.OFPP_CONTROLLER
    assert lldp.match.dl_type == 0x88CC
    assert miss.priority == 0 and miss.actions == []
    for mod in (lldp, arp_rule, miss):
        assert all(getattr(a, "port", None) != ofp.OFPP_FLOOD for a in mod.actions)


def test_host_routes_are_loop_free_shortest_paths_spread_over_equal_cost_uplinks():
    g = fat_tree(4, servers=8)
    routes = host_routes(g)
    by_dpid = {d["dpid"]: n for n, d in g.nodes(data=True) if d["kind"] == "switch"}
    hosts = storage_hosts(g) + client_hosts(g)
    uplinks_used = set()
    for host in hosts:
        ip = g.nodes[host]["ip"]
        for start in by_dpid:
            node, hops = by_dpid[start], 0
            while g.nodes[node]["kind"] == "switch":
                out = routes[g.nodes[node]["dpid"]][ip]
                nxt = next(n for n in g.neighbors(node) if g.edges[node, n]["ports"][node] == out)
                if g.nodes[node].get("layer") == "edge" and g.nodes[nxt]["kind"] == "switch":
                    uplinks_used.add((node, nxt))
                node, hops = nxt, hops + 1
                assert hops <= 5, "routing loop"
            assert node == host
    assert len(uplinks_used) == 2 * 8  # every edge switch uses both its uplinks for some host
    mods = route_messages({"10.0.0.5": 4}, delete=["10.0.0.6"])
    assert mods[0].priority == 1000 and mods[0].actions[0].port == 4
    assert mods[1].command == ofp.OFPFC_DELETE_STRICT


def _arp_request(sender_ip, sender_mac, target_ip) -> bytes:
    pkt = packet.Packet()
    pkt.add_protocol(ethernet.ethernet(dst="ff:ff:ff:ff:ff:ff", src=sender_mac, ethertype=0x0806))
    pkt.add_protocol(arp.arp(opcode=arp.ARP_REQUEST, src_mac=sender_mac, src_ip=sender_ip,
                             dst_mac="00:00:00:00:00:00", dst_ip=target_ip))
    pkt.serialize()
    return bytes(pkt.data)


@pytest.mark.parametrize("target, mac", [("10.255.255.254", arp_answers.GATEWAY_MAC),
                                         ("10.0.0.3", "00:00:00:00:00:03"), ("10.0.0.99", None)])
def test_arp_answers_the_gateway_and_known_hosts_only(target, mac):
    frame = _arp_request("10.0.0.9", "00:00:00:00:00:09", target)
    request = arp_answers.parse(frame)
    assert request.sender_ip == "10.0.0.9" and request.is_request
    reply = arp_answers.answer(request, {"10.0.0.3": "00:00:00:00:00:03"}.get, "10.255.255.254")
    if mac is None:
        assert reply is None
        return
    answered = arp_answers.parse(reply)  # a reply is learned from, never answered
    assert not answered.is_request and arp_answers.answer(answered, {}.get, target) is None
    answer = packet.Packet(reply).get_protocol(arp.arp)
    assert answer.opcode == arp.ARP_REPLY and answer.src_mac == mac and answer.src_ip == target
    assert answer.dst_ip == "10.0.0.9" and answer.dst_mac == "00:00:00:00:00:09"


def _as_stats(mods) -> list:
    """What a switch reports back for the flow mods it was sent."""
    return [SimpleNamespace(match=m.match, priority=m.priority, cookie=m.cookie, actions=m.actions)
            for m in mods if m.command == ofp.OFPFC_ADD]


def test_reading_back_a_switch_and_resyncing_touches_only_differences():
    entries = [FlowEntry(2012, Block.parse("100.96.0.0/12"), 2, "00:00:00:00:00:02"),
               FlowEntry(2011, Block.parse("100.64.0.0/11"), 1),
               FlowEntry(UPRULE_PRIORITY, Block.parse("100.64.0.0/10"), 3)]
    routes = {"10.0.0.1": 1, "10.0.0.2": 4}
    base = base_entries("full", "10.255.255.254")
    sent = (base_messages("full", "10.255.255.254") + diff_messages(SwitchDiff(add=entries))
            + route_messages(routes))
    held = installed(_as_stats(sent))
    assert held.table == {e.match: e for e in entries} and held.routes == routes
    assert held.base == {e.key for e in base}
    assert len(resync_messages(held, entries, routes, base)) == 3  # just the base flows
    moved = [FlowEntry(2012, Block.parse("100.96.0.0/12"), 5, "00:00:00:00:00:05"), entries[2]]
    mods = resync_messages(held, moved, {"10.0.0.1": 1}, base)[3:]
    assert [(m.command, m.priority) for m in mods] == [
        (ofp.OFPFC_MODIFY_STRICT, 2012)] * 2 + [(ofp.OFPFC_DELETE_STRICT, 2011)] * 2 + [
        (ofp.OFPFC_DELETE_STRICT, 1000)]
