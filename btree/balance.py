"""When to rebalance by load, and how much to ship between which servers.

The model is Lunule's (SC'21, section 3.2), taken as it is because it
answers the two questions a fixed max/mean threshold gets wrong:

* **Noise.** One poll's maximum swings with every burst; the coefficient of
  variation over all servers does not, and divided by sqrt(n) it lies in
  [0, 1] whatever the cluster size (1: one server takes everything).
* **Benign imbalance.** Uneven load on servers that all have headroom costs
  nothing, and moving data to fix it costs a copy. The urgency U, a
  logistic function of the busiest server's load against a server's
  capacity, is near 0 until that server nears its capacity.

    IF = CoV / sqrt(n) * U,   U = 1 / (1 + exp((1 - 2 l_max / C) / S))

Rebalancing starts once IF has stayed above a threshold for `hold`
consecutive polls (TiKV waits 10 s above 3,000 reads/s before a split; the
issue's recovery target of 5 s after a shift allows two 1 s polls). What
moves is Lunule's Algorithm 1 in its greedy form: servers above the mean
export their excess, servers below it import up to their deficit, each
bounded per epoch, hottest to coolest. Loads are the switches' packets a
second (`controller.load`); capacities are in the same unit.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

DEFAULT_SMOOTHNESS = 0.2
"""Lunule's S: how sharply urgency rises around half of capacity."""


def coefficient_of_variation(loads: Sequence[float]) -> float:
    """Corrected sample standard deviation over the mean; 0 when undefined
    (fewer than two servers, or no load at all)."""
    n = len(loads)
    mean = sum(loads) / n if n else 0.0
    if n < 2 or mean <= 0:
        return 0.0
    return math.sqrt(sum((x - mean) ** 2 for x in loads) / (n - 1)) / mean


def urgency(max_load: float, capacity: float, smoothness: float = DEFAULT_SMOOTHNESS) -> float:
    """How harmful an imbalance is, from 0 to 1: 0.5 when the busiest server
    is at half its capacity."""
    if capacity <= 0 or not 0 < smoothness < 1:
        raise ValueError(f"capacity must be positive and smoothness in (0, 1), not {capacity}, {smoothness}")
    exponent = (1 - 2 * max_load / capacity) / smoothness
    return 0.0 if exponent > 700 else 1 / (1 + math.exp(exponent))


def spread(loads: Sequence[float]) -> float:
    """CoV / sqrt(n), in [0, 1]: the imbalance factor without its urgency."""
    return coefficient_of_variation(loads) / math.sqrt(len(loads)) if len(loads) >= 2 else 0.0


def imbalance_factor(loads: Sequence[float], capacity: float,
                     smoothness: float = DEFAULT_SMOOTHNESS) -> float:
    """Lunule's IF, in [0, 1]."""
    if len(loads) < 2:
        return 0.0
    return spread(loads) * urgency(max(loads), capacity, smoothness)


@dataclass(frozen=True)
class ImbalanceModel:
    capacity: float
    """The load one server can take (packets a second)."""
    threshold: float = 0.1
    """IF above which the imbalance is harmful."""
    hold: int = 2
    """Polls in a row above the threshold before acting."""
    smoothness: float = DEFAULT_SMOOTHNESS

    def factor(self, loads: Mapping[str, float]) -> float:
        return imbalance_factor(list(loads.values()), self.capacity, self.smoothness)

    def should_rebalance(self, history: Iterable[Mapping[str, float]]) -> bool:
        """Whether the last `hold` polls (oldest first) were all imbalanced."""
        recent = list(history)[-self.hold:]
        return len(recent) == self.hold and all(self.factor(loads) > self.threshold for loads in recent)


@dataclass(frozen=True)
class Transfer:
    source: str
    target: str
    load: float
    """Load to ship from source to target."""


def transfers(loads: Mapping[str, float], limit: float) -> list[Transfer]:
    """Who ships how much load to whom (Lunule's Algorithm 1, greedy): the
    hottest exporter to the coolest importer first, each amount bounded by
    the exporter's excess over the mean, the importer's deficit under it,
    and `limit` per server per epoch, so no server crosses the mean and none
    moves more than `limit` in or out."""
    if limit < 0:
        raise ValueError(f"limit must not be negative, not {limit}")
    if not loads:
        return []
    mean = sum(loads.values()) / len(loads)
    exporters = sorted(((min(x - mean, limit), name) for name, x in loads.items() if x > mean), reverse=True)
    importers = sorted(((mean - x, name) for name, x in loads.items() if x < mean), reverse=True)
    room = {name: min(deficit, limit) for deficit, name in importers}
    out: list[Transfer] = []
    for excess, source in exporters:
        for _, target in importers:
            if excess <= 0:
                break
            amount = min(excess, room[target])
            if amount > 0:
                out.append(Transfer(source, target, amount))
                room[target] -= amount
                excess -= amount
    return out
