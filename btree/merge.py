"""Merging cold neighbours: giving a busy leaf's blocks to another so that it
becomes idle again, for a split that has no idle leaf to go to.

Why: pre-allocation and skewed IDs leave servers that own a share of the
space and hold almost no keys, while hot servers fill up and find the idle
pool empty (`metaflowctl plan --keys-dist skewed` refused 826 splits with
the coldest servers at 0 keys). A merge is the inverse of a split, and goes
through the same `LogicalBTree.transfer` and flow planner, so every ID keeps
exactly one owner throughout.

Which merge: the search starts at the full leaf's own parent and widens one
ancestor at a time, as `LogicalBTree.nearest_leaves` does, so that the freed
leaf (and the split that follows) stays near the hot one and the tables
above them stay small. At the nearest level that has one, it takes the
coldest leaf that fits into a busy neighbour of its own (same parent first)
with that neighbour at most `fill` of capacity afterwards, so a merged leaf
has room to grow before it splits in turn; of the neighbours that fit, the
coldest takes the blocks.
"""

from __future__ import annotations

from collections.abc import Callable, Collection
from dataclasses import dataclass

from .split import FitsFn
from .tree import LogicalBTree, Move, State

KeysOf = Callable[[str], int]
"""Keys a leaf holds now."""

DEFAULT_FILL = 0.8
"""A merge leaves its receiver at most this much of capacity."""

CANDIDATES_PER_LEVEL = 16
"""Coldest leaves tried as sources, and as receivers, at each level of the
search: this bounds its cost on a 2,000-server tree."""


@dataclass(frozen=True, slots=True)
class MergePlan:
    source: str | None
    """The leaf that gives every block away and becomes idle."""
    target: str | None
    """The busy leaf that takes them."""
    keys: int
    """Keys that move."""
    reason: str

    @property
    def ok(self) -> bool:
        return self.source is not None and self.target is not None


def plan_merge(tree: LogicalBTree, near: str, keys_of: KeysOf, capacity: int,
               fill: float = DEFAULT_FILL, avoid: Collection[str] = (),
               fits: FitsFn | None = None) -> MergePlan:
    """Choose a merge that frees a leaf as near `near` as possible; nothing
    changes until `apply_merge`. Leaves in `avoid` (and `near` itself) are
    neither freed nor filled; a merge that `fits` objects to (the table
    budget) is not made."""
    if not 0 < fill <= 1:
        raise ValueError(f"fill must be in (0, 1], not {fill}")
    room = int(fill * capacity)
    skip = {*avoid, near}
    objections: list[str] = []
    for ring in tree.rings(near, avoid):
        busy = [leaf for leaf in ring if tree.state(leaf) is State.BUSY]
        for source in sorted(busy, key=lambda leaf: (keys_of(leaf), leaf))[:CANDIDATES_PER_LEVEL]:
            held = keys_of(source)
            if held > room:
                break   # sorted: no colder leaf is left in this ring
            target = _receiver(tree, source, held, room, keys_of, skip, fits, objections)
            if target is not None:
                return MergePlan(source, target, held, "")
    if objections:
        return MergePlan(None, None, 0, f"every merge that fits is refused: {objections[0]}")
    return MergePlan(None, None, 0, f"no busy leaf fits into a busy neighbour within {fill:.0%} of "
                                    f"capacity ({room} keys)")


def _receiver(tree: LogicalBTree, source: str, held: int, room: int, keys_of: KeysOf,
              skip: Collection[str], fits: FitsFn | None, objections: list[str]) -> str | None:
    """The coldest busy leaf nearest `source` that takes `held` more keys,
    stays within `room`, and that `fits` does not object to (objections are
    added to `objections`)."""
    for ring in tree.rings(source, skip):
        room_for = [leaf for leaf in ring if tree.state(leaf) is State.BUSY and keys_of(leaf) + held <= room]
        for target in sorted(room_for, key=lambda leaf: (keys_of(leaf), leaf))[:CANDIDATES_PER_LEVEL]:
            objection = fits([Move(b, source, target) for b in tree.blocks(source)]) if fits else None
            if objection is None:
                return target
            objections.append(objection)
    return None


def apply_merge(tree: LogicalBTree, plan: MergePlan) -> list[Move]:
    """Hand the source's blocks to the target (after the data has moved, in a live system)."""
    if plan.source is None or plan.target is None:
        raise ValueError(f"cannot apply a merge with no source or target: {plan.reason}")
    return tree.transfer(tree.blocks(plan.source), plan.target)
