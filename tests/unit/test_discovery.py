"""LLDP pacing for the fabric's size (`controller.discovery`)."""

from __future__ import annotations

import itertools
import sys
import threading
import time
from collections.abc import Callable

import pytest

from controller.discovery import LLDP_RATE, MIN_ROUND_S, LockedPorts, lldp_timing
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
