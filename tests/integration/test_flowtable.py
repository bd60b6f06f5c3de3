"""FlowTable: which mdid each client endpoint asked for, and when to forget it."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from nat_agent.flowtable import REMAP_PORTS, FlowTable, NoFreePort
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
    assert flows.outbound(CLIENT, TCP_SYN | TCP_ACK) == (MDID, 40000)
    assert flows.outbound(OTHER) is None
    assert flows.outbound((IPPROTO_UDP, *CLIENT[1:])) is None


def test_idle_entries_expire_and_activity_keeps_them() -> None:
    clock = Clock()
    flows = table(clock)
    flows.inbound(CLIENT, MDID, TCP_SYN)
    clock.now += 50
    assert flows.outbound(CLIENT, TCP_ACK) == (MDID, 40000)  # refreshes
    clock.now += 50
    assert flows.outbound(CLIENT, TCP_ACK) == (MDID, 40000)
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
    assert flows.outbound((IPPROTO_UDP, 1, 0)) == (MDID, 0)
    clock.now += 61
    assert flows.expire() == 2


def test_rst_removes_the_flow_after_translating_it() -> None:
    flows = table(Clock())
    flows.inbound(CLIENT, MDID, TCP_SYN)
    assert flows.outbound(CLIENT, TCP_RST | TCP_ACK) == (MDID, 40000)  # the RST itself is rewritten
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
    assert flows.outbound(CLIENT, TCP_ACK) == (MDID, 40000)  # half closed: still idle timeout
    assert flows.outbound(CLIENT, TCP_FIN | TCP_ACK) == (MDID, 40000)
    clock.now += 4
    assert flows.outbound(CLIENT, TCP_ACK) == (MDID, 40000)  # retransmitted FIN/last ACK still rewritten
    flows.inbound(CLIENT, MDID, TCP_ACK)  # does not extend the linger
    clock.now += 1
    assert flows.outbound(CLIENT, TCP_ACK) is None


def test_syn_starts_a_fresh_flow_on_a_reused_port() -> None:
    clock = Clock()
    flows = table(clock)
    flows.inbound(CLIENT, MDID, TCP_SYN)
    flows.inbound(CLIENT, MDID, TCP_FIN)
    flows.outbound(CLIENT, TCP_FIN)
    assert flows.inbound(CLIENT, MDID, TCP_SYN) == CLIENT[2]  # same port, same mdid, new connection
    clock.now += 10  # past the old connection's linger: the new one is not closing
    assert flows.outbound(CLIENT, TCP_SYN | TCP_ACK) == (MDID, 40000)


def test_a_second_connection_from_one_port_to_another_mdid_gets_its_own_server_port() -> None:
    clock = Clock()
    flows = table(clock)
    assert flows.inbound(CLIENT, MDID, TCP_SYN) == 40000
    moved = flows.inbound(CLIENT, MDID + 7, TCP_SYN)  # Linux reuses the port for another destination
    assert moved in REMAP_PORTS and flows.remapped == 1
    # each connection's packets find their own server-side port, both ways
    assert flows.inbound(CLIENT, MDID + 7, TCP_ACK) == moved
    assert flows.inbound(CLIENT, MDID, TCP_ACK) == 40000
    assert flows.outbound((IPPROTO_TCP, CLIENT[1], moved), TCP_ACK) == (MDID + 7, 40000)
    assert flows.outbound(CLIENT, TCP_ACK) == (MDID, 40000)
    # a third mdid from the same port takes yet another port
    third = flows.inbound(CLIENT, MDID + 9, TCP_SYN)
    assert third not in (40000, moved) and flows.remapped == 2
    # a RST of the remapped connection ends it and frees its port
    assert flows.inbound(CLIENT, MDID + 7, TCP_RST) == moved
    assert flows.outbound((IPPROTO_TCP, CLIENT[1], moved), TCP_ACK) is None
    assert len(flows) == 2


def test_a_packet_of_an_unknown_connection_never_takes_over_a_live_flow() -> None:
    flows = table(Clock())
    flows.inbound(CLIENT, MDID, TCP_SYN)
    assert flows.inbound(CLIENT, MDID + 7, TCP_ACK) == 40000  # passed on, not recorded
    assert flows.inbound(CLIENT, MDID + 7, TCP_RST) == 40000
    assert flows.outbound(CLIENT, TCP_ACK) == (MDID, 40000)
    assert flows.remapped == 0 and len(flows) == 1


def test_a_remapped_flow_expires_with_its_alias_and_the_port_is_used_again() -> None:
    clock = Clock()
    flows = table(clock)
    flows.inbound(CLIENT, MDID, TCP_SYN)
    moved = flows.inbound(CLIENT, MDID + 7, TCP_SYN)
    clock.now += 30
    flows.inbound(CLIENT, MDID, TCP_ACK)  # only the first stays active
    clock.now += 31
    assert flows.expire() == 1 and flows.outbound((IPPROTO_TCP, CLIENT[1], moved)) is None
    # the alias went with the flow: a new SYN to MDID + 7 from that port is remapped afresh
    again = flows.inbound(CLIENT, MDID + 7, TCP_SYN)
    assert again != 40000 and flows.remapped == 2
    assert flows.outbound((IPPROTO_TCP, CLIENT[1], again), TCP_ACK) == (MDID + 7, 40000)


def test_a_client_port_that_meets_a_remapped_one_is_remapped_in_turn() -> None:
    flows = table(Clock())
    flows.inbound(CLIENT, MDID, TCP_SYN)
    moved = flows.inbound(CLIENT, MDID + 7, TCP_SYN)
    own = (IPPROTO_TCP, CLIENT[1], moved)  # the client now opens a connection from that very port
    other = flows.inbound(own, MDID, TCP_SYN)
    assert other not in (moved, 40000)
    assert flows.outbound((IPPROTO_TCP, CLIENT[1], other), TCP_ACK) == (MDID, moved)
    assert flows.outbound(own, TCP_ACK) == (MDID + 7, 40000)


def test_the_remap_ports_run_out_with_a_clear_error() -> None:
    flows = table(Clock())
    flows.inbound(CLIENT, MDID, TCP_SYN)
    for n in range(len(REMAP_PORTS)):
        flows.inbound(CLIENT, MDID + 1 + n, TCP_SYN)
    with pytest.raises(NoFreePort, match="remap ports"):
        flows.inbound(CLIENT, MDID + len(REMAP_PORTS) + 1, TCP_SYN)
    assert flows.inbound(OTHER, MDID, TCP_SYN) == OTHER[2]  # another port is unaffected


def test_udp_to_another_mdid_from_one_port_is_its_own_flow() -> None:
    flows = table(Clock())
    key = (IPPROTO_UDP, 0x0A000001, 5353)
    assert flows.inbound(key, MDID) == 5353
    moved = flows.inbound(key, MDID + 1)
    assert flows.outbound(key) == (MDID, 5353)
    assert flows.outbound((IPPROTO_UDP, key[1], moved)) == (MDID + 1, 5353)


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 3), st.integers(0, 2),
                          st.sampled_from([TCP_SYN, TCP_ACK, TCP_FIN | TCP_ACK, TCP_RST]),
                          st.booleans()), max_size=60))
def test_every_open_connection_keeps_a_server_side_port_of_its_own(steps) -> None:
    """Random packets of connections from 4 client ports to 3 mdids, both
    ways (no time passes, so only a RST ends one): every connection a SYN
    opened keeps one server-side port that no other holds, and a reply there
    names that connection's mdid and port."""
    flows = table(Clock())
    server_port: dict[tuple[int, int], int] = {}  # open (client port, mdid) -> server-side port
    for port_index, mdid_index, flags, reply, in steps:
        conn = (40000 + port_index, MDID + mdid_index)
        if reply:
            if conn in server_port:
                flows.outbound((IPPROTO_TCP, CLIENT[1], server_port[conn]), flags)
                if flags & TCP_RST:
                    del server_port[conn]
            continue
        got = flows.inbound((IPPROTO_TCP, CLIENT[1], conn[0]), conn[1], flags)
        if conn in server_port:
            assert got == server_port[conn]
            if flags & TCP_RST:
                del server_port[conn]
        elif flags == TCP_SYN:
            server_port[conn] = got
        assert len(set(server_port.values())) == len(server_port), server_port
        for (cport, mdid), sport in server_port.items():
            assert flows.outbound((IPPROTO_TCP, CLIENT[1], sport), TCP_ACK) == (mdid, cport)
