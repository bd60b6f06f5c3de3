"""FlowTable: which mdid each client endpoint asked for, and when to forget it."""

from __future__ import annotations

from nat_agent.flowtable import FlowTable
from nat_agent.packet import (
    IPPROTO_TCP,
    IPPROTO_UDP,
    TCP_ACK,
    TCP_FIN,
    TCP_RST,
    TCP_SYN,
)

CLIENT = (IPPROTO_TCP, 0x0A000001, 40000)
OTHER = (IPPROTO_TCP, 0x0A000001, 40001)
MDID = 0x64400001


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def table(clock: Clock) -> FlowTable:
    return FlowTable(idle_timeout=60.0, closing_timeout=5.0, clock=clock)


def test_reply_gets_the_mdid_the_request_went_to() -> None:
    flows = table(Clock())
    assert flows.outbound(CLIENT) is None
    flows.inbound(CLIENT, MDID, TCP_SYN)
    assert flows.outbound(CLIENT, TCP_SYN | TCP_ACK) == MDID
    assert flows.outbound(OTHER) is None
    assert flows.outbound((IPPROTO_UDP, *CLIENT[1:])) is None


def test_idle_entries_expire_and_activity_keeps_them() -> None:
    clock = Clock()
    flows = table(clock)
    flows.inbound(CLIENT, MDID, TCP_SYN)
    clock.now += 50
    assert flows.outbound(CLIENT, TCP_ACK) == MDID  # refreshes
    clock.now += 50
    assert flows.outbound(CLIENT, TCP_ACK) == MDID
    clock.now += 60
    assert flows.outbound(CLIENT, TCP_ACK) is None
    assert len(flows) == 0


def test_inbound_traffic_drops_expired_entries_of_others() -> None:
    clock = Clock()
    flows = table(clock)
    for port in range(100):
        flows.inbound((IPPROTO_UDP, 1, port), MDID)
    clock.now += 30
    flows.inbound((IPPROTO_UDP, 1, 0), MDID)  # keeps port 0 alive
    clock.now += 31
    flows.inbound((IPPROTO_UDP, 2, 0), MDID)
    assert len(flows) == 2
    assert flows.outbound((IPPROTO_UDP, 1, 0)) == MDID
    clock.now += 61
    assert flows.expire() == 2


def test_rst_removes_the_flow_after_translating_it() -> None:
    flows = table(Clock())
    flows.inbound(CLIENT, MDID, TCP_SYN)
    assert flows.outbound(CLIENT, TCP_RST | TCP_ACK) == MDID  # the RST itself is rewritten
    assert flows.outbound(CLIENT, TCP_ACK) is None
    flows.inbound(CLIENT, MDID, TCP_SYN)
    flows.inbound(CLIENT, MDID, TCP_RST)
    assert flows.outbound(CLIENT, TCP_ACK) is None


def test_fin_both_ways_closes_after_a_short_linger() -> None:
    clock = Clock()
    flows = table(clock)
    flows.inbound(CLIENT, MDID, TCP_SYN)
    flows.inbound(CLIENT, MDID, TCP_FIN | TCP_ACK)
    clock.now += 30
    assert flows.outbound(CLIENT, TCP_ACK) == MDID  # half closed: still idle timeout
    assert flows.outbound(CLIENT, TCP_FIN | TCP_ACK) == MDID
    clock.now += 4
    assert flows.outbound(CLIENT, TCP_ACK) == MDID  # retransmitted FIN/last ACK still rewritten
    flows.inbound(CLIENT, MDID, TCP_ACK)  # does not extend the linger
    clock.now += 1
    assert flows.outbound(CLIENT, TCP_ACK) is None


def test_syn_starts_a_fresh_flow_on_a_reused_port() -> None:
    clock = Clock()
    flows = table(clock)
    flows.inbound(CLIENT, MDID, TCP_SYN)
    flows.inbound(CLIENT, MDID, TCP_FIN)
    flows.outbound(CLIENT, TCP_FIN)
    flows.inbound(CLIENT, MDID + 7, TCP_SYN)  # same client port, new connection, other mdid
    clock.now += 10
    assert flows.outbound(CLIENT, TCP_SYN | TCP_ACK) == MDID + 7


def test_udp_follows_the_latest_mdid() -> None:
    flows = table(Clock())
    key = (IPPROTO_UDP, 0x0A000001, 5353)
    flows.inbound(key, MDID)
    flows.inbound(key, MDID + 1)
    assert flows.outbound(key) == MDID + 1
