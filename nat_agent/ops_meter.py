"""Requests served per part of the ID space over the last few seconds: the load behind ``POST /ops``.

Why: a block's key count says how much it holds, not how busy it is, and the
controller splits and moves hot ID ranges by load; a switch entry's packet
counter is too coarse (one per block). So each agent counts what it serves,
per *bucket*: 1/65,536th of the ID space, by the top `BUCKET_BITS` bits of an
ID's offset in it (`Buckets`). Counting is one add on the hot path, in two
places: the Python path's array here (`OpsMeter.count`) and the compiled
lane's atomics (`FastLane.ops_counts`); each request is counted by the path
that answered it, never both. Both are cumulative; a sampler snapshots them
every `SAMPLE_S`, and a read answers the counts now minus the oldest snapshot
still within `OPS_WINDOW_S` (so a window is a little under that long), and
says how long the window was.

A range that cuts a bucket gets the bucket's count pro rata to the IDs it
covers, as the difference of a rounded cumulative count at its two ends:
so the ranges of any partition of the space sum to the total exactly, and a
part of a bucket never gets more than the bucket.
"""

from __future__ import annotations

import time
from array import array
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from functools import reduce
from itertools import accumulate
from operator import add, sub

from client_lib.api.admin import OPS_BUCKET_BITS as BUCKET_BITS
from client_lib.cidr import Block

OPS_WINDOW_S = 2.0
"""Seconds of load a read reports (at most: the oldest snapshot within them).
Short, because the controller asks right after its flow counters showed a
shift (two 1 s polls): a longer window would still point at the old hot spot."""

SAMPLE_S = 0.5
"""Seconds between snapshots: a window's length is known to within this."""


Counts = Callable[[], bytes]
"""Cumulative counts per bucket, as native unsigned 64-bit integers (``array('Q')``)."""


@dataclass(frozen=True)
class Buckets:
    """How IDs map to buckets: ``(id - first) >> shift``, `number` of them.
    Also what the compiled lane is built with, so both paths agree."""

    first: int
    shift: int
    number: int

    @classmethod
    def of(cls, space: Block) -> Buckets:
        host_bits = space.width - space.plen
        shift = max(host_bits - BUCKET_BITS, 0)
        return cls(space.first, shift, 1 << (host_bits - shift))

    def index(self, ident: int) -> int:
        return (ident - self.first) >> self.shift


@dataclass(frozen=True)
class Snapshot:
    time: float
    parts: tuple[bytes, ...]
    """Each path's cumulative counts (`Counts`), the Python path's first."""


@dataclass(frozen=True)
class Window:
    """The requests of one window, ready to be asked about any number of ranges."""

    buckets: Buckets
    below: list[int]
    """`below[b]`: requests for buckets before bucket `b` (one more entry than buckets)."""
    seconds: float

    def ops(self, first: int, last: int) -> int:
        """Requests for IDs in the inclusive range, which must lie inside the space."""
        return self._before(last + 1) - self._before(first)

    def _before(self, ident: int) -> int:
        """Requests for IDs below `ident`, the bucket it cuts pro rata, rounded half up."""
        size = 1 << self.buckets.shift
        bucket, into = divmod(ident - self.buckets.first, size)
        below = self.below[bucket]
        if into == 0:
            return below
        return below + (2 * (self.below[bucket + 1] - below) * into + size) // (2 * size)


class OpsMeter:
    """Per-bucket request counts of one agent and their sliding window.

    Pure: `sample` is driven from outside (the service's sampler), `clock`
    is injectable, and everything runs on the event loop but the lane's own
    counting, which `lane` only reads."""

    def __init__(self, space: Block, lane: Counts | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        """`lane`: the compiled path's counts, if it has one."""
        self.buckets = Buckets.of(space)
        self.clock = clock
        self._counts = array("Q", [0]) * self.buckets.number
        self._lane = lane
        if lane is not None and len(lane()) != self._counts.itemsize * self.buckets.number:
            raise ValueError(f"the lane's counts are not of {self.buckets.number} buckets")
        self._snapshots = deque([Snapshot(clock(), self._parts())])

    def count(self, ident: int) -> None:
        """One request the Python path served for `ident`."""
        self._counts[self.buckets.index(ident)] += 1

    def sample(self) -> None:
        """Snapshot the counts now, dropping the snapshots no window starts at
        any more (the newest one always stays: a window longer than asked, if
        the sampler stalled, is still a window)."""
        now = self.clock()
        snapshots = self._snapshots
        while len(snapshots) > 1 and snapshots[0].time < now - OPS_WINDOW_S:
            snapshots.popleft()
        snapshots.append(Snapshot(now, self._parts()))

    def window(self) -> Window:
        """The requests since the oldest snapshot within `OPS_WINDOW_S` (else the newest)."""
        now = self.clock()
        base = next((s for s in self._snapshots if s.time >= now - OPS_WINDOW_S), self._snapshots[-1])
        served = map(sub, _total(self._parts()), _total(base.parts))
        return Window(self.buckets, list(accumulate(served, initial=0)), now - base.time)

    def _parts(self) -> tuple[bytes, ...]:
        mine = self._counts.tobytes()
        return (mine,) if self._lane is None else (mine, self._lane())


def _total(parts: tuple[bytes, ...]) -> Iterator[int]:
    """Per bucket, the sum over the paths."""
    return reduce(lambda a, b: map(add, a, b), (iter(array("Q", part)) for part in parts))
