"""A histogram of request seconds cheap enough for the request path.

The Python path observes every command it runs (`MetadataService.execute`);
a lock-free list of bucket counts on the event loop's thread costs a clock
read, a bisection and two additions, where a prometheus_client Histogram
would take a lock per observation. The exporter (`nat_agent.metrics`)
reads the counts at scrape time, with the compiled lane's (its `Histogram`,
same bounds, same placement) added in (`plus`). Pure: no I/O.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Sequence


class Latency:
    """Observations of one command: counts per upper bound (the last, +Inf), and their sum."""

    __slots__ = ("bounds", "counts", "total")

    def __init__(self, bounds: Sequence[float]) -> None:
        self.bounds = tuple(bounds)
        self.counts = [0] * (len(self.bounds) + 1)
        self.total = 0.0

    def observe(self, seconds: float) -> None:
        self.counts[bisect_left(self.bounds, seconds)] += 1
        self.total += seconds

    def plus(self, counts: Sequence[int], total: float) -> Latency:
        """A copy with another path's observations added: `counts` per bucket
        of the same bounds (+Inf last), `total` their sum (the compiled
        lane's `Histogram.snapshot`)."""
        both = Latency(self.bounds)
        both.counts = [mine + theirs for mine, theirs in zip(self.counts, counts, strict=True)]
        both.total = self.total + total
        return both

    def cumulative(self) -> list[tuple[str, int]]:
        """The buckets as Prometheus writes them: (upper bound, observations at or under it)."""
        out, running = [], 0
        for bound, count in zip((*map(str, self.bounds), "+Inf"), self.counts, strict=True):
            running += count
            out.append((bound, running))
        return out
