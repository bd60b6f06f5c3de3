"""Moving load: which hot range of a busy leaf goes to which cooler leaf, and
how many keys a rebalance may move.

Why a range and not a half: a hot spot is a few prefixes of one server, so
the cheapest relief ships just them, with few keys, and leaves the rest
where it is (Slicer's "move hot slices, keep churn bounded"). The search
walks each of the source's blocks down its hotter half, level by level,
and takes every prefix it passes as a candidate: one prefix is one carved
entry in each table that changes, however deep it sits.

What a candidate must meet:

* its load lies within `LOAD_WINDOW` of the amount the receiver should
  take (the source's excess over the mean, the receiver's deficit under it,
  and the per-epoch `limit`, as `btree.balance.transfers` pairs them), so
  that neither side crosses the mean far and nothing oscillates;
* its keys are within the churn budget (`ChurnLimit`);
* the table budget (`fits`) does not object.

Receivers are the busy leaves below the mean, nearest first (`rings`): a
range moved next door changes only the tables below the common ancestor.
An idle leaf is the receiver only when no busy one can take the load, and
only if the caller allows it (the controller does when the hot server is
over its capacity: a split by load, the hot range gets a server of its
own), so that the idle pool stays for key-count splits and fail-over and is
not spent on a hot spot that moves on. Of what is left, the
closest load match wins (to a tenth of the amount), then the fewest flow
entries, then the nearest receiver, then the fewest keys.

One plan is one move to one receiver, which takes no more than its deficit:
a hot leaf sheds its excess over a few moves (`controller.rebalance`
re-plans after each with the loads it has shifted).

Loads come in two units, and only their ratios are used: `loads` (a
server's packets a second, from the switches' counters) says who is hot and
how much of its load should go; `load_in` (the agent's per-range request
counts) says which of its ranges carry it.

A single ID hotter than any receiver can take cannot be moved usefully:
the plan says so (`RelievePlan.reason`), as the issue asks.
"""

from __future__ import annotations

import statistics
import time
from collections import deque
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass, field

from client_lib.cidr import Block

from .merge import MergePlan
from .split import CostFn, FitsFn
from .tree import LogicalBTree, Move, State

RangeCount = Callable[[int, int], float]
"""A quantity (requests, keys) on the source leaf within [first, last]."""

COLD_SHARE = 0.1
"""A busy leaf with less than this share of the median load is cold: its
blocks go to a neighbour and it becomes idle again (`plan_retire`). The
median, not the mean, which one hot leaf would lift."""

LOAD_WINDOW = (0.5, 1.25)
"""A candidate's load, as a multiple of the amount its receiver should take."""

RECEIVERS = 4
"""Receivers weighed for one move, nearest first: bounds the trials of the
flow planner on a 2,000-server tree."""

CANDIDATES = 8
"""Prefixes weighed per receiver, those nearest the amount first."""


@dataclass(frozen=True, slots=True)
class RelievePlan:
    source: str
    target: str | None
    move: tuple[Block, ...]
    load_share: float
    """Of the source's load, the share that moves (0..1)."""
    keys: int
    reason: str
    to_idle: bool = False
    """The receiver was idle: a split by load."""

    @property
    def ok(self) -> bool:
        return self.target is not None and bool(self.move)


def plan_relief(tree: LogicalBTree, source: str, loads: Mapping[str, float], load_in: RangeCount,
                keys_in: RangeCount, *, max_keys: int, limit: float,
                avoid: Collection[str] = (), fits: FitsFn | None = None,
                cost: CostFn | None = None, finest: int | None = None,
                with_idle: bool = True) -> RelievePlan:
    """Decide one move of load off `source`; nothing changes until `LogicalBTree.transfer`.
    `loads` are the busy leaves' loads (the mean is theirs); leaves in
    `avoid` do not receive; `finest`: the longest prefix `load_in` counts
    exactly (the agents' resolution; default: single IDs). Below it a count
    would be a share of its bucket, and a move chosen on it could carry
    none of the load. `with_idle`: whether an idle leaf may receive (a split
    by load) when no busy one can."""
    if tree.state(source) is not State.BUSY or source not in loads:
        return _refusal(source, f"{source!r} is not a busy leaf with a measured load")
    mean = sum(loads.values()) / len(loads)
    excess = min(loads[source] - mean, limit)
    if excess <= 0 or loads[source] <= 0:
        return _refusal(source, f"{source!r} carries {loads[source]:.0f}, not above the mean {mean:.0f}")
    total = sum(load_in(b.first, b.last) for b in tree.blocks(source))
    if total <= 0:
        return _refusal(source, f"the agent of {source!r} counted no requests in its window")
    receivers = _receivers(tree, source, loads, mean, limit, {*avoid, source}, with_idle)
    if not receivers:
        return _refusal(source, "no busy leaf below the mean and no idle leaf to take load")
    smallest = min([excess, *(room for group in receivers for _, room, _ in group)])
    finest = tree.space.width if finest is None else finest
    prefixes = _hot_prefixes(tree.blocks(source), load_in, smallest / loads[source] * total, finest)
    objections: list[str] = []
    keys_of: dict[Block, int] = {}
    for group in receivers:
        options = []
        for target, room, distance in group:
            amount = min(excess, room) / loads[source] * total
            near = sorted(((abs(load - amount), p, load) for p, load in prefixes
                           if LOAD_WINDOW[0] * amount <= load <= LOAD_WINDOW[1] * amount),
                          key=lambda c: (c[0], c[1]))[:CANDIDATES]
            for miss, prefix, load in near:
                if prefix not in keys_of:
                    keys_of[prefix] = int(keys_in(prefix.first, prefix.last))
                if keys_of[prefix] > max_keys:
                    continue
                moves = [Move(prefix, source, target)]
                objection = fits(moves) if fits else None
                if objection:
                    objections.append(objection)
                    continue
                entries = cost(moves) if cost else 0
                options.append((round(miss / amount, 1), entries, distance, keys_of[prefix],
                                prefix, target, load))
        if options:
            *_, keys, prefix, target, load = min(options)
            return RelievePlan(source, target, (prefix,), load / total, keys, "",
                               to_idle=tree.state(target) is State.IDLE)
    return _refusal(source, _why_none(prefixes, total, excess / loads[source], max_keys, keys_of, objections,
                                      finest))


def plan_retire(tree: LogicalBTree, loads: Mapping[str, float], keys_of: Callable[[str], int], *,
                max_keys: int, avoid: Collection[str] = (), fits: FitsFn | None = None) -> MergePlan:
    """A cold busy leaf to make idle again: the coldest under `COLD_SHARE` of
    the median load (with at most `max_keys` keys) gives all its blocks to the
    least loaded busy leaf nearest it that `fits` takes. Why: rebalancing
    leaves a once-hot leaf with only its hot spot's prefix, cold once the spot
    moves on; as a busy leaf it only drags the mean down, as an idle one it
    is there for the next split or fail-over."""
    median = statistics.median(loads.values()) if loads else 0.0
    cold = sorted((load, leaf) for leaf, load in loads.items()
                  if load < COLD_SHARE * median and leaf not in avoid and tree.state(leaf) is State.BUSY
                  and keys_of(leaf) <= max_keys)
    for _, source in cold:
        for ring in tree.rings(source, avoid):
            near = sorted((loads[leaf], leaf) for leaf in ring
                          if leaf in loads and tree.state(leaf) is State.BUSY)
            for _, target in near:
                if fits is None or fits([Move(b, source, target) for b in tree.blocks(source)]) is None:
                    return MergePlan(source, target, keys_of(source), "")
    return MergePlan(None, None, 0,
                     f"no busy leaf under {COLD_SHARE:.0%} of the median load that a neighbour takes")


def _refusal(source: str, reason: str) -> RelievePlan:
    return RelievePlan(source, None, (), 0.0, 0, reason)


def _hot_prefixes(blocks: list[Block], load_in: RangeCount, amount: float,
                  finest: int) -> list[tuple[Block, float]]:
    """Each block, and both halves at every level of a walk down its hotter
    half until the half carries no more than `amount` or is `finest` long:
    the prefixes a move could take."""
    found: list[tuple[Block, float]] = []
    for block in blocks:
        load = load_in(block.first, block.last)
        found.append((block, load))
        while load > amount and block.plen < finest:
            low, high = block.halves()
            low_load = load_in(low.first, low.last)
            halves = ((low, low_load), (high, max(load - low_load, 0.0)))
            found.extend(halves)
            block, load = max(halves, key=lambda h: h[1])
    return found


def _receivers(tree: LogicalBTree, source: str, loads: Mapping[str, float], mean: float,
               limit: float, skip: Collection[str], with_idle: bool) -> list[list[tuple[str, float, int]]]:
    """The leaves that may take load, in two tiers: busy ones below the mean
    (nearest first, `RECEIVERS` of them), then (`with_idle`) the nearest idle
    one; each with the load it may take and its distance (ring) from `source`."""
    busy: list[tuple[str, float, int]] = []
    idle: list[tuple[str, float, int]] = []
    for distance, ring in enumerate(tree.rings(source, skip)):
        for leaf in ring:
            if tree.state(leaf) is State.BUSY and loads.get(leaf, mean) < mean and len(busy) < RECEIVERS:
                busy.append((leaf, min(mean - loads[leaf], limit), distance))
            elif with_idle and tree.state(leaf) is State.IDLE and not idle:
                idle.append((leaf, min(mean, limit), distance))
        if len(busy) >= RECEIVERS and (idle or not with_idle):
            break
    return [tier for tier in (busy, idle) if tier]


def _why_none(prefixes: list[tuple[Block, float]], total: float, share: float, max_keys: int,
              keys_of: Mapping[Block, int], objections: list[str], finest: int) -> str:
    """Why no move was planned; `share`: of the source's load, what should go."""
    if objections:
        return f"every move that fits the load is refused: {objections[0]}"
    if keys_of:
        return f"every range that carries the load holds more than {max_keys} keys (the churn limit)"
    hottest = [(load, p) for p, load in prefixes if p.plen >= finest and load / total > share]
    if hottest:
        load, hot = max(hottest)
        what = f"ID {hot.address()}" if hot.plen == hot.width else f"{hot}, as finely as load is counted,"
        return (f"{what} alone carries {load / total:.0%} of the load, more than may move "
                f"({share:.0%}): a single ID cannot be split")
    return f"no range carries near {share:.0%} of the load"


@dataclass
class ChurnLimit:
    """Keys rebalancing may move, as shares of the keys stored: at most
    `per_rebalance` in one rebalance (all its moves) and `per_minute` over
    any 60 s (Slicer bounds churn the same way), so that balancing never
    turns into a copy storm."""

    per_rebalance: float
    per_minute: float
    clock: Callable[[], float] = time.monotonic
    _moved: deque[tuple[float, int]] = field(default_factory=deque)

    def __post_init__(self) -> None:
        if not 0 <= self.per_rebalance <= 1 or not 0 <= self.per_minute <= 1:
            raise ValueError(f"churn limits are shares of the keys, in [0, 1]: "
                             f"{self.per_rebalance}, {self.per_minute}")

    def allowance(self, stored: int, this_rebalance: int = 0) -> int:
        """Keys the next move may take now, with `stored` keys in the system
        and `this_rebalance` moved by the rebalance's earlier moves."""
        now = self.clock()
        while self._moved and now - self._moved[0][0] >= 60:
            self._moved.popleft()
        spent = sum(k for _, k in self._moved)
        return max(0, min(int(self.per_rebalance * stored) - this_rebalance,
                          int(self.per_minute * stored) - spent))

    def spend(self, keys: int) -> None:
        self._moved.append((self.clock(), keys))
