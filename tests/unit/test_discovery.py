"""LLDP pacing for the fabric's size (`controller.discovery`)."""

from __future__ import annotations

import itertools
import sys
import threading
import time
from collections.abc import Callable

import pytest

from controller.discovery import LLDP_RATE, MIN_ROUND_S, LldpTiming, LockedPorts, lldp_timing, lldp_turn
from topology import builders


def switch_ports(k: int) -> int:
    graph = builders.fat_tree(k)
    return sum(graph.degree(n) for n in builders.switches(graph))


def test_a_small_fabric_sends_a_round_every_ten_seconds():
    timing = lldp_timing(switch_ports(4))
    assert timing.period_s == MIN_ROUND_S
    assert timing.guard_s == 1 / LLDP_RATE < 0.05


def test_a_k32_fabric_sends_a_round_at_the_rate():
    ports = switch_ports(32)
    assert ports == 32 * 1280
    timing = lldp_timing(ports)
    assert timing.period_s == pytest.approx(ports / LLDP_RATE)


@pytest.mark.parametrize("ports", [0, 1, 399, 4_000, 40_960, 200_000])
def test_a_round_sends_every_port_within_its_period(ports):
    timing = lldp_timing(ports)
    assert timing.period_s >= MIN_ROUND_S
    assert ports * timing.guard_s <= timing.period_s + 1e-9


def test_a_rate_that_is_not_positive_is_refused():
    with pytest.raises(ValueError, match="positive"):
        lldp_timing(100, rate=0)


def test_the_controller_loads_link_discovery_as_its_only_topology_service():
    from os_ken.base import app_manager
    from os_ken.topology.switches import Switches

    from controller.discovery import LinkDiscovery
    from controller.launcher import APPS, load_apps

    manager = app_manager.AppManager()
    load_apps(manager)
    assert set(APPS) <= set(manager.applications_cls)
    services = [name for name, cls in manager.applications_cls.items() if issubclass(cls, Switches)]
    assert services == ["controller.discovery"]
    assert manager.applications_cls["controller.discovery"] is LinkDiscovery
    # no host table is kept: the packet-in handler that fills it is not a handler here
    assert not hasattr(LinkDiscovery.host_discovery_packet_in_handler, "callers")


class _Port:
    """What the port table needs of os-ken's `Port`: a hash and whether it is down."""

    def __init__(self, no: int) -> None:
        self.no = no

    def is_down(self) -> bool:
        return False

    def __hash__(self) -> int:
        return self.no

    def __eq__(self, other: object) -> bool:
        return isinstance(other, _Port) and other.no == self.no


def test_the_port_table_survives_the_lldp_loop_and_the_event_thread_at_once() -> None:
    """The LLDP loop sends in table order and moves each port sent to the end
    while packet-ins move ports to the front: with threads switching every
    microsecond, os-ken's own table raised KeyError here within a second
    (which ended the LLDP thread silently under the native hub)."""
    ports = [_Port(i) for i in range(50)]
    table = LockedPorts()
    for port in ports:
        table.add_port(port, b"")
    errors: list[BaseException] = []
    stop = time.monotonic() + 0.5

    def guarded(work: Callable[[], None]) -> Callable[[], None]:
        def run() -> None:
            try:
                while time.monotonic() < stop:
                    work()
            except Exception as exc:   # noqa: BLE001 (what the test reports)
                errors.append(exc)
        return run

    def send_round() -> None:
        for port, _ in table.items():
            table.lldp_sent(port)

    moved = itertools.cycle(ports[::7])
    before = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    try:
        threads = [threading.Thread(target=guarded(send_round)),
                   threading.Thread(target=guarded(lambda: table.move_front(next(moved))))]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    finally:
        sys.setswitchinterval(before)
    assert errors == []
    assert sorted(p.no for p in table) == list(range(50))   # the order still holds every port once


def _table(n: int, sent_at: float | None) -> tuple[LockedPorts, list[_Port]]:
    """`n` ports in send order, each last sent at `sent_at` (None: never)."""
    ports = [_Port(i) for i in range(n)]
    table = LockedPorts()
    for port in reversed(ports):   # add_port puts a new port first
        table.add_port(port, b"")
    for port in ports:
        table[port].timestamp = sent_at
    return table, ports


def test_a_turn_sends_the_new_ports_at_once_and_the_expired_ones_one_per_guard() -> None:
    table, ports = _table(6, sent_at=100.0)
    table[ports[0]].timestamp = None   # a port moved to the front (its link seen one way)
    table[ports[4]].timestamp = 105.0  # the first not due at 111: the walk stops there
    sent: list[int] = []
    slept: list[float] = []
    wait = lldp_turn(table, now=111.0, timing=LldpTiming(guard_s=0.5, period_s=10.0),
                     send=lambda p: sent.append(p.no), sleep=slept.append)
    assert sent == [0, 1, 2, 3] and slept == [0.5, 0.5, 0.5]   # port 5 lies past the first not due
    assert wait == 0.0   # it sent: it comes round again at once


def test_a_turn_with_nothing_due_sleeps_until_the_next_port_expires() -> None:
    table, ports = _table(3, sent_at=100.0)
    table[ports[0]].timestamp = 98.0
    wait = lldp_turn(table, now=105.0, timing=LldpTiming(guard_s=0.5, period_s=10.0),
                     send=lambda p: pytest.fail(f"sent {p.no}"), sleep=lambda s: None)
    assert wait == pytest.approx(3.0)


def test_a_turn_that_sent_every_port_comes_round_again_instead_of_waiting_for_an_event() -> None:
    """os-ken's loop slept with no timeout when every port had been due (all
    of them new at start): no second round came until some event."""
    table, _ = _table(4, sent_at=None)
    sent: list[int] = []
    wait = lldp_turn(table, now=time.time(), timing=lldp_timing(4), send=lambda p: sent.append(p.no),
                     sleep=lambda s: None)
    assert sent == [0, 1, 2, 3] and wait == 0.0
    for port in list(table):   # what os-ken's send_lldp_packet does with each
        table.lldp_sent(port)
    wait = lldp_turn(table, now=time.time(), timing=lldp_timing(4), send=lambda p: pytest.fail("again"),
                     sleep=lambda s: None)
    assert wait is not None and 0 < wait <= MIN_ROUND_S   # the next round, on time


def test_an_empty_table_waits_for_an_event() -> None:
    assert lldp_turn(LockedPorts(), 0.0, lldp_timing(0), send=lambda p: None, sleep=lambda s: None) is None
