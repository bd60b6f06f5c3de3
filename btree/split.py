"""Choosing how a full leaf splits: which IDs move, and to which idle leaf.

Two methods, both driven by a key-count oracle so that the same code runs on a
simulation and on live agents:

- `traversal`: the paper's algorithm. Walk the leaf's ordered blocks adding to a
  left set until it holds more than `low` of the keys; if it then holds more
  than `high`, put the last block back, halve it and go on. The right set moves
  to the first idle leaf nearest in the tree (same parent first).
- `aligned` (ours): find every cut point whose left side holds between `low` and
  `high` of the keys, try the cheapest few of them (block boundaries, the most
  aligned point), either side moving, and each distinct nearest idle target,
  and keep the one whose flow tables come out smallest (a cost callback asks
  the flow planner). Within the bounds it trades nothing for fewer entries.

A split that cannot land inside the bounds (one ID holding too many keys) still
returns the best cut, with `within_bounds=False` and a reason; a split with no
idle leaf returns a plan with no target and a reason, never an exception.
"""

from __future__ import annotations

import math
from bisect import bisect_right
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass

from client_lib.cidr import Block, cover, most_aligned, subtract

from .tree import LogicalBTree, Move, State

Oracle = Callable[[str, int, int], int]
"""Keys on `leaf` with IDs in [first, last]."""

CostFn = Callable[[Sequence[Move]], int]
"""Total flow entries the network would hold after these moves."""

FitsFn = Callable[[Sequence[Move]], "str | None"]
"""Why these moves would break a limit (a switch's table budget), or None."""


@dataclass(frozen=True, slots=True)
class SplitBounds:
    low: float = 0.4
    high: float = 0.6

    def __post_init__(self) -> None:
        if not 0 < self.low <= self.high < 1:
            raise ValueError(f"split bounds need 0 < low <= high < 1, got {self.low}, {self.high}")

    @classmethod
    def parse(cls, text: str) -> SplitBounds:
        """'0.4,0.6' or '40,60' (percent)."""
        try:
            low, high = (float(part) for part in text.split(","))
        except ValueError:
            raise ValueError(f"split bounds must look like 0.4,0.6, not {text!r}") from None
        if high > 1:
            low, high = low / 100, high / 100
        return cls(low, high)

    def kept_range(self, total: int) -> tuple[int, int]:
        """Whole key counts the staying side may hold; empty (low > high) when no whole
        number of keys lies in the window, e.g. 40-60 % of 3 keys."""
        return math.ceil(self.low * total - 1e-9), math.floor(self.high * total + 1e-9)


@dataclass(frozen=True, slots=True)
class SplitPlan:
    leaf: str
    target: str | None
    move: tuple[Block, ...]
    keys_total: int
    keys_moved: int
    within_bounds: bool
    iterations: int
    reason: str
    wants_room: bool = False
    """Refused for want of room: no idle leaf, or the table budget. A merge
    that frees a leaf nearby (`btree.merge`) may let it through."""

    @property
    def ok(self) -> bool:
        return self.target is not None and bool(self.move)

    @property
    def moved_fraction(self) -> float:
        return self.keys_moved / self.keys_total if self.keys_total else 0.0


class _Counter:
    """Per-leaf key counts with one oracle call per distinct question."""

    def __init__(self, oracle: Oracle, leaf: str):
        self.oracle, self.leaf, self.calls = oracle, leaf, 0

    def __call__(self, first: int, last: int) -> int:
        if first > last:
            return 0
        self.calls += 1
        return self.oracle(self.leaf, first, last)


def plan_split(tree: LogicalBTree, leaf: str, oracle: Oracle, bounds: SplitBounds = SplitBounds(),
               method: str = "traversal", cost: CostFn | None = None,
               avoid: Collection[str] = (), fits: FitsFn | None = None) -> SplitPlan:
    """Decide a split of `leaf`; nothing in the tree changes until `apply_split`.
    Idle leaves in `avoid` (promised to other operations) are not targets; a
    split that `fits` objects to (the table budget) is not made, and if every
    candidate is objected to, the refusal carries the objection."""
    if method not in ("traversal", "aligned"):
        raise ValueError(f"unknown split method {method!r} (traversal or aligned)")
    if tree.state(leaf) is not State.BUSY:
        return _refusal(leaf, f"{leaf!r} is {tree.state(leaf).value}, only busy leaves split")
    blocks = tree.blocks(leaf)
    count = _Counter(oracle, leaf)
    per_block = [count(b.first, b.last) for b in blocks]
    total = sum(per_block)
    if total < 2:
        return _refusal(leaf, f"{leaf!r} holds {total} keys; nothing to split", total)
    targets = tree.nearest_leaves(leaf, State.IDLE, avoid)
    if not targets:
        return _refusal(leaf, "no idle leaf anywhere in the tree; add servers", total, wants_room=True)
    target: str | None
    if method == "traversal":
        move, moved, within, steps, why = _traversal(blocks, per_block, total, count, bounds)
        target = targets[0]
        objection = fits([Move(b, leaf, target) for b in move]) if fits and move else None
        if objection:
            return _refusal(leaf, objection, total, wants_room=True)
    else:
        try:
            move, moved, within, steps, why, target = _aligned(
                tree, leaf, blocks, per_block, total, count, bounds, targets, cost, fits)
        except _Objected as objected:
            return _refusal(leaf, str(objected), total, wants_room=True)
    return SplitPlan(leaf, target, tuple(move), total, moved, within, steps, why)


def _refusal(leaf: str, reason: str, total: int = 0, wants_room: bool = False) -> SplitPlan:
    return SplitPlan(leaf, None, (), total, 0, False, 0, reason, wants_room)


def apply_split(tree: LogicalBTree, plan: SplitPlan) -> list[Move]:
    """Hand the plan's blocks to its target (after the data has moved, in a live system)."""
    if plan.target is None or not plan.move:
        raise ValueError(f"cannot apply a split that has no target or nothing to move: {plan.reason}")
    return tree.transfer(plan.move, plan.target)


# -- the paper's traversal -----------------------------------------------------

_Found = tuple[list[Block], int, bool, int, str]
"""What a search found: blocks to move, keys they hold, within bounds, steps, why not."""


def _traversal(blocks: list[Block], per_block: list[int], total: int, count: _Counter,
               bounds: SplitBounds) -> _Found:
    low_keys, high_keys = bounds.low * total, bounds.high * total
    lo_keys, hi_keys = bounds.kept_range(total)
    queue = list(zip(blocks, per_block, strict=True))[::-1]   # a stack, next block last
    left_keys, steps, reason = 0, 0, ""
    while queue:
        block, keys = queue.pop()
        steps += 1
        if left_keys + keys <= low_keys:
            left_keys += keys
            continue
        if left_keys + keys <= high_keys:
            left_keys += keys
            break
        if block.plen == block.width:
            # A single ID cannot be halved: it stays on whichever side is nearer half.
            if abs(left_keys + keys - total / 2) < abs(left_keys - total / 2) or left_keys == 0:
                left_keys += keys
            else:
                queue.append((block, keys))
            if not lo_keys <= left_keys <= hi_keys:
                reason = _no_cut_reason(bounds, total, lo_keys, hi_keys, block.address(), keys)
            break
        low_half, high_half = block.halves()
        low_count = count(low_half.first, low_half.last)
        queue.append((high_half, keys - low_count))
        queue.append((low_half, low_count))
    move = [block for block, _ in reversed(queue)]
    moved = total - left_keys
    if moved == 0 or not move:
        return [], 0, False, steps, "every key sits left of the last cut; nothing would move"
    return move, moved, lo_keys <= left_keys <= hi_keys, steps, reason


# -- ours: the cheapest cut inside the window ------------------------------------

@dataclass(frozen=True, slots=True)
class _Cut:
    point: int        # IDs below it stay on the left
    left_keys: int


class _Objected(Exception):
    """Every candidate split broke a limit; the message is the first objection."""


def _aligned(tree: LogicalBTree, leaf: str, blocks: list[Block], per_block: list[int], total: int,
             count: _Counter, bounds: SplitBounds, targets: list[str],
             cost: CostFn | None, fits: FitsFn | None) -> tuple[list[Block], int, bool, int, str, str | None]:
    prefix = [0]
    for keys in per_block:
        prefix.append(prefix[-1] + keys)
    lo, hi = bounds.kept_range(total)
    firsts = [b.first for b in blocks]

    def keys_below(point: int) -> int:
        i = bisect_right(firsts, point - 1) - 1
        if i < 0:
            return 0
        block = blocks[i]
        if point > block.last:
            return prefix[i + 1]
        return prefix[i] + count(block.first, point - 1)

    def first_point_with(at_least: int) -> int:
        """Smallest cut point p with keys_below(p) >= at_least."""
        i = next(j for j, s in enumerate(prefix[1:]) if s >= at_least)
        block = blocks[i]
        a, b = block.first + 1, block.last + 1
        while a < b:
            mid = (a + b) // 2
            if prefix[i] + count(block.first, mid - 1) >= at_least:
                b = mid
            else:
                a = mid + 1
        return a

    start, end = blocks[0].first + 1, blocks[-1].last
    p_low = first_point_with(max(lo, 1))
    p_high = first_point_with(hi + 1) - 1 if hi < total else end
    within = lo <= hi and p_low <= p_high
    if within:
        candidates = set(aligned_points(p_low, p_high, tree.space.width))
        candidates.update(b.first for b in blocks if p_low <= b.first <= p_high)
        candidates.update(b.last + 1 for b in blocks if p_low <= b.last + 1 <= p_high)
        reason = ""
    else:
        # The window is empty: one ID is too heavy. Cut on whichever side of it is nearer half.
        heavy = p_low - 1
        candidates = {p for p in (heavy, heavy + 1) if start <= p <= end}
        reason = _no_cut_reason(bounds, total, lo, hi, tree.space.address(heavy),
                                keys_below(heavy + 1) - keys_below(heavy))
    cuts = [_Cut(p, keys_below(p)) for p in sorted(candidates) if start <= p <= end]
    cuts = [c for c in cuts if 0 < c.left_keys < total]
    if within:  # cheapest first: fewest new blocks, then nearest to an even split
        cuts.sort(key=lambda c: (_extra_blocks(blocks, c.point), abs(c.left_keys - total / 2)))
    else:
        cuts = sorted(cuts, key=lambda c: abs(c.left_keys - total / 2))[:1]
    sets: list[tuple[list[Block], int]] = []   # (blocks that would move, keys they hold)
    for cut in cuts[:6]:
        sets.append((_side(blocks, cut.point, below=False), total - cut.left_keys))
        sets.append((_side(blocks, cut.point, below=True), cut.left_keys))
    if within:
        for dense, keys in _heavy_prefixes(blocks, per_block, count, total - hi, total - lo):
            sets.append(([dense], keys))
            sets.append((_without(blocks, dense), total - keys))
    representatives = _distinct_targets(tree, leaf, targets)
    options = [(move, moved, target) for move, moved in sets if move and 0 < moved < total
               for target in representatives]
    if not options:
        return [], 0, False, count.calls, reason or "every key sits on one ID; no cut separates them", None
    if fits is not None:
        objections = [fits([Move(b, leaf, target) for b in move]) for move, _, target in options]
        allowed = [o for o, objection in zip(options, objections, strict=True) if objection is None]
        if not allowed:
            raise _Objected(objections[0])
        options = allowed

    def score(option: tuple[list[Block], int, str]) -> tuple[int, float, int]:
        move, moved, target = option
        entries = cost([Move(b, leaf, target) for b in move]) if cost else 0
        return entries, abs(moved - total / 2), len(move)

    best = min(options, key=score)
    move, moved, target = best
    return list(move), moved, within, count.calls, reason, target


def aligned_points(lo: int, hi: int, width: int, limit: int = 8) -> list[int]:
    """Up to `limit` points of [lo, hi], most trailing zero bits first: the cut points
    that cost the fewest prefixes, and their nearest rivals."""
    best = most_aligned(lo, hi, width)
    level = (best & -best).bit_length() - 1 if best else width
    out = [best]
    while level > 0 and len(out) < limit:
        level -= 1
        step = 1 << level
        first = -(-lo // step) * step
        out.extend(p for p in range(first, hi + 1, step)
                   if p % (step << 1) and len(out) < limit)  # new at this level only
    return out[:limit]


def _heavy_prefixes(blocks: list[Block], per_block: list[int], count: _Counter,
                    low: int, high: int) -> list[tuple[Block, int]]:
    """Single prefixes holding between `low` and `high` keys, found by walking down
    the heavier half of each block. Moving one prefix costs one carved-out entry,
    however deep and unaligned the keys are: the cheap split for clustered IDs."""
    found: list[tuple[Block, int]] = []
    for block, keys in zip(blocks, per_block, strict=True):
        while keys > high and block.plen < block.width:
            low_half, high_half = block.halves()
            low_keys = count(low_half.first, low_half.last)
            halves = ((low_half, low_keys), (high_half, keys - low_keys))
            found.extend((half, k) for half, k in halves if low <= k <= high)
            block, keys = max(halves, key=lambda h: h[1])
        if low <= keys <= high:
            found.append((block, keys))
    return list(dict.fromkeys(found))[:4]


def _without(blocks: list[Block], prefix: Block) -> list[Block]:
    """The leaf's blocks with `prefix` (inside one of them) taken out."""
    out = []
    for block in blocks:
        out.extend(subtract(block, prefix) if block.covers(prefix) else [block])
    return out


def _no_cut_reason(bounds: SplitBounds, total: int, lo: int, hi: int, heavy: str,
                   heavy_keys: int) -> str:
    window = f"{bounds.low:.0%}-{bounds.high:.0%}"
    if lo > hi:
        return f"no whole number of the {total} keys lies within {window}"
    return f"ID {heavy} alone holds {heavy_keys} of {total} keys; no cut lands within {window}"


def _side(blocks: list[Block], point: int, below: bool) -> list[Block]:
    out: list[Block] = []
    for block in blocks:
        if below:
            out.extend(cover(block.first, min(block.last, point - 1), block.width))
        else:
            out.extend(cover(max(block.first, point), block.last, block.width))
    return out


def _extra_blocks(blocks: list[Block], point: int) -> int:
    for block in blocks:
        if block.first < point <= block.last:
            return (len(cover(block.first, point - 1, block.width))
                    + len(cover(point, block.last, block.width)) - 1)
    return 0


def _distinct_targets(tree: LogicalBTree, leaf: str, targets: list[str], limit: int = 6) -> list[str]:
    """Idle leaves worth comparing: one per distinct parent (leaves under one parent
    cost the same in every table but the parent's, where only ports differ), taken
    round-robin over the subtrees below the common ancestor, so that a move across
    pods weighs several pods and not just the first one in tree order."""
    if not targets:
        return []
    below = tree.depth(tree.lca(leaf, targets[0])) + 1   # depth of the LCA's children
    by_subtree: dict[str, list[str]] = {}
    seen: set[str | None] = set()
    for target in targets:
        parent = tree.parent(target)
        if parent in seen:
            continue
        seen.add(parent)
        by_subtree.setdefault(tree.path(target)[below], []).append(target)
    out: list[str] = []
    while len(out) < limit and any(by_subtree.values()):
        for group in by_subtree.values():
            if group and len(out) < limit:
                out.append(group.pop(0))
    return out
