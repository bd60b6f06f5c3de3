"""Link discovery: os-ken's topology service, paced to the fabric and without its host table.

`LinkDiscovery` is the os-ken app that finds the switch-to-switch links by
LLDP (its events, `EventLinkAdd` and the rest, are os-ken's own). It differs
from os-ken's `Switches` in two ways, both for large fabrics.

**Pacing.** os-ken's `Switches` app sends one LLDP frame out of every port of every
switch: all of a new port's at once, then each port again after
`LLDP_SEND_PERIOD_PER_PORT` (0.9 s) but one port at a time with
`LLDP_SEND_GUARD` (0.05 s) between frames, i.e. at most 20 frames a second;
and it deletes a link not seen again within `LINK_TIMEOUT` (10 s). On a
k=4 fat-tree (80 ports) that is a round every 4 s. On k=32 (40,960 ports)
a round takes 34 minutes, so every link found by the first burst expired
10 s later and was found again only when its ports came round: links
flapped without end, every flap postponed the build (`core.last_change`),
and the whole fabric was never seen at once within 300 s.

So the timing follows the number of ports: frames go out at `LLDP_RATE`
(a budget of controller CPU: sending one and taking its packet-in back
costs it a few hundred microseconds), a round of all ports takes
ports / rate (never less than os-ken's 0.9 s), and a link lives for
`LINK_TIMEOUT_ROUNDS` rounds (never less than os-ken's 10 s). Small
fabrics keep os-ken's timing exactly; a port or switch going down is
seen at once from PORT_STATUS whatever the size: LLDP only finds links,
and finds a silently dead one within the link timeout. `lldp_timing` is
the arithmetic; the app reads it for the ports it knows at each use.

**No host table.** os-ken learns hosts from every packet-in that is not
LLDP, and checks each against every link (`_is_edge_port` is a scan of the
link table); each new link then re-checks every host the same way. At k=32
that is 32,768 links times 2,000 hosts on every link found: profiling the
controller showed its event thread in that scan. MetaFlow locates hosts
itself (`controller.inventory`, from ARP and registrations), so the host
table is left empty and neither scan runs.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from os_ken.topology.switches import Switches

LLDP_RATE = 400.0
"""LLDP frames a second after a port's first, at most (about 10 % of one core)."""
OS_KEN_PERIOD_S = 0.9
OS_KEN_LINK_TIMEOUT_S = 10.0
LINK_TIMEOUT_ROUNDS = 3
"""Rounds a link may go unseen before it is deleted: one lost frame is no failure."""


@dataclass(frozen=True)
class LldpTiming:
    """Values for os-ken's `Switches` attributes of the same meaning."""

    guard_s: float     # LLDP_SEND_GUARD
    period_s: float    # LLDP_SEND_PERIOD_PER_PORT
    link_timeout_s: float   # LINK_TIMEOUT


def lldp_timing(ports: int, rate: float = LLDP_RATE) -> LldpTiming:
    """The timing for a fabric of `ports` switch ports (host ports included)."""
    if rate <= 0:
        raise ValueError(f"LLDP rate must be positive, not {rate}")
    guard = 1.0 / rate
    period = max(OS_KEN_PERIOD_S, max(ports, 0) * guard)
    return LldpTiming(guard, period, max(OS_KEN_LINK_TIMEOUT_S, LINK_TIMEOUT_ROUNDS * period))


class LinkDiscovery(Switches):
    """os-ken's `Switches` with `lldp_timing` and no host discovery (module doc)."""

    @property
    def LLDP_SEND_GUARD(self) -> float:  # noqa: N802   # os-ken's attribute names
        return lldp_timing(len(self.ports)).guard_s

    @property
    def LLDP_SEND_PERIOD_PER_PORT(self) -> float:  # noqa: N802
        return lldp_timing(len(self.ports)).period_s

    @property
    def LINK_TIMEOUT(self) -> float:  # noqa: N802
        return lldp_timing(len(self.ports)).link_timeout_s

    def host_discovery_packet_in_handler(self, ev: Any) -> None:
        """Not an event handler here (no `set_ev_cls`): hosts are MetaFlow's to locate."""
