"""Link discovery: os-ken's topology service, paced to the fabric and without its host table.

`LinkDiscovery` is the os-ken app that finds the switch-to-switch links by
LLDP (its events, `EventLinkAdd` and the rest, are os-ken's own). It differs
from os-ken's `Switches` in three ways, all for large fabrics.

**Pacing, and a timeout that works.** os-ken's `lldp_loop` sends a new
port's first LLDP frame at once and is meant to send each port's again
every `LLDP_SEND_PERIOD_PER_PORT` (0.9 s), one frame per `LLDP_SEND_GUARD`
(50 ms). It sleeps on `hub.Event.wait(timeout)`, and under os-ken's native
hub (ours: no eventlet) that timeout never fires: the loop wakes only when
something sets the event (a port added, a link found one way only). So no
frame was ever sent again; a link whose first frame was lost (its peer
switch still connecting) stayed unfound until some other port's event
came along (the emulator's LLDP count stood still after the first burst).
At k=32 that made link discovery take 333 s in one run and never finish
in 300 s in the next. Here the
loop sleeps on a `threading.Event`, whose timeout works, and sends at
`LLDP_RATE` frames a second: a round of all ports takes ports / rate
(never under `MIN_ROUND_S`). Each turn (`lldp_turn`) walks the send order
only as far as the ports that are due (`LockedPorts.due`), where os-ken's
copied the whole table (26 ms at k=32, at every turn, and during link
discovery the loop turns at every link found one way), and a turn that
sent anything comes round again where os-ken's could sleep until an event.

os-ken's `link_loop`, which deletes a link not seen within `LINK_TIMEOUT`,
sleeps the same way and is left so: under the native hub it makes one pass
at start and never wakes again, as it always was here. A link or switch
that fails is seen from PORT_STATUS and the OpenFlow connection
(`controller.core`); a link that dies silently, with its ports up, is not
detected by LLDP.

**A port table that two threads can share.** os-ken's `PortDataState`
(the ports in LLDP send order, a linked list) was written for green
threads; under the native hub the LLDP loop's thread and the app's event
thread change it at once (the loop moves each port it sent to the end, a
packet-in moves a port to the front). One such race raised KeyError in
the loop, and under the native hub `hub.TaskExit` is `Exception`, so the
loop's thread ended without a word: no frame was sent again. A k=8
fabric with two controllers then stood at 203 of 256 links for 120 s (1
run in 5 of the registration-storm test; `py-spy dump` showed no LLDP
thread left). `LockedPorts` takes a lock around every use, and
`lldp_loop` says and survives anything it raises.

**No host table.** os-ken learns hosts from every packet-in that is not
LLDP, and checks each against every link (`_is_edge_port` is a scan of the
link table); each new link then re-checks every host the same way. At k=32
that is 32,768 links times 2,000 hosts on every link found: profiling the
controller showed its event thread in that scan. MetaFlow locates hosts
itself (`controller.inventory`, from ARP and registrations), so the host
table is left empty and neither scan runs.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from os_ken.lib import hub
from os_ken.topology.switches import PortDataState, Switches

from controller.nativehub import HandlerFailuresLogged

log = logging.getLogger("metaflow.controller.discovery")

LLDP_RATE = 400.0
"""LLDP frames a second after a port's first, at most (about 10 % of one core)."""
MIN_ROUND_S = 10.0
"""A small fabric's round: a first frame lost to a peer still connecting is
sent again within this, at under 10 frames a second on a k=4 fat-tree."""


@dataclass(frozen=True)
class LldpTiming:
    """The LLDP loop's pacing (`lldp_turn`), in os-ken's terms."""

    guard_s: float     # os-ken's LLDP_SEND_GUARD: between two expired ports' frames
    period_s: float    # os-ken's LLDP_SEND_PERIOD_PER_PORT: a port's frame again after this


def lldp_timing(ports: int, rate: float = LLDP_RATE) -> LldpTiming:
    """The timing for a fabric of `ports` switch ports (host ports included)."""
    if rate <= 0:
        raise ValueError(f"LLDP rate must be positive, not {rate}")
    guard = 1.0 / rate
    return LldpTiming(guard, max(MIN_ROUND_S, max(ports, 0) * guard))


STARTUP_POLL_S = 0.01
"""How often the LLDP loop looks, at start, for the port table it needs (`LinkDiscovery.lldp_loop`)."""
LOOP_RESTART_S = 1.0
"""How long the LLDP loop waits before it runs again after it raised."""


class LockedPorts(PortDataState):
    """os-ken's port table with one lock around every read and change (module
    doc): its linked list is changed by the LLDP loop and the event thread."""

    def __init__(self) -> None:
        super().__init__()
        self._lock = threading.RLock()

    def add_port(self, port: Any, lldp_data: bytes) -> None:
        with self._lock:
            super().add_port(port, lldp_data)

    def lldp_sent(self, port: Any) -> Any:
        with self._lock:
            return super().lldp_sent(port)

    def lldp_received(self, port: Any) -> None:
        with self._lock:
            super().lldp_received(port)

    def move_front(self, port: Any) -> None:
        with self._lock:
            super().move_front(port)

    def set_down(self, port: Any) -> bool:
        with self._lock:
            return bool(super().set_down(port))

    def get_port(self, port: Any) -> Any:
        with self._lock:
            return super().get_port(port)

    def del_port(self, port: Any) -> None:
        with self._lock:
            super().del_port(port)

    def clear(self) -> None:
        with self._lock:
            super().clear()

    def items(self) -> list[tuple[Any, Any]]:
        with self._lock:
            return list(super().items())

    def __iter__(self) -> Iterator[Any]:
        """A copy of the order (a generator would walk the list outside the lock)."""
        with self._lock:
            return iter(list(super().__iter__()))

    def due(self, now: float, period_s: float) -> Due:
        """The ports to send now, walking the send order only up to the first
        port not due: os-ken's loop copied the whole table at every turn
        (`items`: 26 ms for k=32's 40,960 ports, and during link discovery the
        loop turns at every link found one way)."""
        fresh: list[Any] = []
        expired: list[Any] = []
        with self._lock:
            for port in PortDataState.__iter__(self):
                sent = self[port].timestamp
                if sent is None:
                    fresh.append(port)
                elif sent + period_s <= now:
                    expired.append(port)
                else:
                    return Due(fresh, expired, sent + period_s - now)
        return Due(fresh, expired, None)


@dataclass(frozen=True)
class Due:
    """One turn of the LLDP loop: what to send, and how long to sleep if nothing."""

    fresh: list[Any]
    """Never sent, or moved to the front (a port up again, a link seen one way): sent at once."""
    expired: list[Any]
    """Sent a round ago or more: sent one per guard."""
    next_s: float | None
    """Until the first port not due expires; None if every port is due (or there is none)."""


def lldp_turn(ports: LockedPorts, now: float, timing: LldpTiming, send: Callable[[Any], None],
              sleep: Callable[[float], None]) -> float | None:
    """One turn of os-ken's `lldp_loop`: send what is due (`LockedPorts.due`),
    the expired ports one per guard; how long the loop may then sleep (None:
    until an event). A turn that sent anything comes round again at once, to
    find the next expiry: os-ken's loop slept until an event when every port
    had been due, so a fabric whose ports were all sent in one turn (all of
    them new, at start) had no next round until some port or link event
    came."""
    due = ports.due(now, timing.period_s)
    for port in due.fresh:
        send(port)
    for port in due.expired:
        send(port)
        sleep(timing.guard_s)
    return 0.0 if due.fresh or due.expired else due.next_s


class LinkDiscovery(HandlerFailuresLogged, Switches):
    """os-ken's `Switches` with `lldp_timing`, an LLDP loop that wakes on
    time, and no host discovery (module doc)."""

    lldp_event: Any   # os-ken's hub.Event, or here a threading.Event

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        if self.link_discovery and hub.HUB_TYPE == "native":
            self.lldp_event = threading.Event()   # before the loop's first turn: it waits for the next line
        self.ports = LockedPorts()   # before any switch connects: nothing to carry over

    def lldp_loop(self) -> None:
        """os-ken's loop, turn by turn (`lldp_turn`), said and run again if it raises (module doc)."""
        while self.is_active and not isinstance(self.ports, LockedPorts):
            # `Switches.__init__` starts this thread before `__init__` here put its Event and LockedPorts in
            time.sleep(STARTUP_POLL_S)
        while self.is_active:
            try:
                self.lldp_event.clear()
                wait = lldp_turn(self.ports, time.time(), lldp_timing(len(self.ports)),
                                 self.send_lldp_packet, hub.sleep)
                self.lldp_event.wait(timeout=wait)
            except Exception:
                log.exception("the LLDP loop failed; it runs again in %.0f s", LOOP_RESTART_S)
                time.sleep(LOOP_RESTART_S)

    def host_discovery_packet_in_handler(self, ev: Any) -> None:
        """Not an event handler here (no `set_ev_cls`): hosts are MetaFlow's to locate."""
