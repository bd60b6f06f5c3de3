"""Request load from the switches' own counters: no server CPU spent on it.

Every MetaFlow request crosses the edge switch above the server that owns
its ID exactly once, and that switch counts it on the entry that sent it out
of the server's port (Mayflower's idea: poll flow counters from the
controller instead of asking the servers). So the controller polls each
switch's flow statistics, and two polls of one entry give its packets per
second. This module turns those samples into rates; it does no I/O.

OpenFlow 1.0's counters are not a clean series, and the rate must not jump
when they misbehave:

* ``packet_count`` is a 64-bit counter and wraps: a smaller count from an
  entry whose age (``duration``) kept growing is the same entry, wrapped.
* An entry that was deleted and added again (a flow change, a resync), or a
  switch that restarted or reconnected, starts again from zero with a young
  age. A count that went down with an age that went down is such a restart:
  the packets since are the count itself, over the entry's age.
* A switch that disconnects loses what the meter knew of it (`forget`), so
  its first poll after the reconnect only sets a baseline.

Rates are packets, not requests: a request on a kept-open connection is a
few packets each way, and the switch sees only the client-to-server half.
That is the same factor for every server, so it orders and compares load
rightly; `metaflowctl status` says packets.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from client_lib.cidr import Block

COUNTER_MODULUS = 1 << 64
"""OpenFlow 1.0's ``packet_count`` is an unsigned 64-bit counter."""


@dataclass(frozen=True)
class EntryCount:
    """One flow entry's counters in one poll of one switch."""

    block: Block
    """The entry's destination prefix."""
    protocol: int
    """Its ``nw_proto``: a MetaFlow prefix has one entry per protocol."""
    port: int
    """The switch port it sends to."""
    packets: int
    age_s: float
    """``duration_sec + duration_nsec``: how long the entry has been installed."""


@dataclass(frozen=True)
class EntryRate:
    block: Block
    port: int
    packets_per_s: float


_Key = tuple[Block, int]


@dataclass
class _Seen:
    at: float
    packets: int
    age_s: float


class LoadMeter:
    """Packets per second per flow entry, from successive polls.

    `observe` takes one switch's poll at a controller clock time; `rates` is
    the latest rate of every entry seen in two polls. Entries that vanish
    from a poll (deleted) vanish from the rates.
    """

    def __init__(self) -> None:
        self._seen: dict[int, dict[_Key, _Seen]] = {}
        self._rates: dict[int, dict[_Key, EntryRate]] = {}

    def observe(self, dpid: int, at: float, counts: Iterable[EntryCount]) -> None:
        before = self._seen.get(dpid, {})
        old_rates = self._rates.get(dpid, {})
        seen: dict[_Key, _Seen] = {}
        rates: dict[_Key, EntryRate] = {}
        for count in counts:
            key = (count.block, count.protocol)
            seen[key] = _Seen(at, count.packets, count.age_s)
            last = before.get(key)
            if last is None:
                continue   # a baseline
            if at <= last.at:
                if key in old_rates:
                    rates[key] = old_rates[key]   # no time between the polls: keep what was known
                continue
            rate = _rate(last, count, at)
            if rate is not None:
                rates[key] = EntryRate(count.block, count.port, rate)
        self._seen[dpid] = seen
        self._rates[dpid] = rates

    def forget(self, dpid: int) -> None:
        """A switch disconnected: its counters start over when it is back."""
        self._seen.pop(dpid, None)
        self._rates.pop(dpid, None)

    def rates(self, dpid: int) -> list[EntryRate]:
        """Each prefix's rate on this switch (its protocols' entries summed)."""
        summed: dict[tuple[Block, int], float] = {}
        for rate in self._rates.get(dpid, {}).values():
            key = (rate.block, rate.port)
            summed[key] = summed.get(key, 0.0) + rate.packets_per_s
        return [EntryRate(block, port, value) for (block, port), value in sorted(summed.items())]

    def switches(self) -> list[int]:
        return sorted(self._rates)


def _rate(last: _Seen, now: EntryCount, at: float) -> float | None:
    """Packets per second between two polls of one entry; None if the
    samples cannot tell (a restarted entry with no age yet).

    The entry is the same one if its age grew with the time between the
    polls (half of it, for the jitter of two replies' delays); then a
    smaller count is a wrap. Otherwise it was installed again since."""
    elapsed = at - last.at
    if now.age_s - last.age_s >= 0.5 * elapsed:
        return ((now.packets - last.packets) % COUNTER_MODULUS) / elapsed
    if now.age_s <= 0:
        return None
    return now.packets / now.age_s
