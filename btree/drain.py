"""Where a drained server's blocks go: a target for each block it owns.

Why: an operator takes a server out of service for maintenance (`metaflowctl
drain`); every block it owns as primary moves to another live server
through the migration, so that it can be stopped with nothing lost and no
fail-over. A split moves half a server to one idle leaf and a merge a whole
cold one to one neighbour; a drain must empty a server whatever it holds, so
its blocks may go to several servers, each within its room.

Which target: the blocks are placed largest first; each goes to the nearest
ring of leaves in the tree (same parent first, as `LogicalBTree.rings`) that
has a live leaf with room for it (its keys plus what this plan already gives
it stay within `fill` of capacity) and whose table growth the flow budget
accepts (`fits`, on every move planned so far); within the ring, the leaf
with the fewest keys (an idle one first). A block that has nowhere to go
refuses the whole plan: a drain either has a target for every block, or
moves nothing.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass

from client_lib.cidr import Block

from .merge import CANDIDATES_PER_LEVEL, DEFAULT_FILL, KeysOf
from .split import FitsFn
from .tree import LogicalBTree, Move, State


@dataclass(frozen=True, slots=True)
class DrainPlan:
    moves: tuple[Move, ...]
    """Each block of the source with its target (empty when refused)."""
    reason: str
    """Why the plan is refused ("" when every block has a target)."""

    @property
    def ok(self) -> bool:
        return not self.reason

    def by_target(self) -> dict[str, list[Block]]:
        """The moves grouped by target, in the order the targets were chosen:
        one migration per target."""
        out: dict[str, list[Block]] = {}
        for move in self.moves:
            out.setdefault(move.target, []).append(move.block)
        return out


def plan_drain(tree: LogicalBTree, source: str, block_keys: Mapping[Block, int], keys_of: KeysOf,
               capacity: int, fill: float = DEFAULT_FILL, avoid: Collection[str] = (),
               fits: FitsFn | None = None) -> DrainPlan:
    """A target for every block `source` owns (`block_keys`: the keys of each);
    leaves in `avoid` (failed, drained, held by other operations) are never
    targets. Nothing changes in the tree."""
    if not 0 < fill <= 1:
        raise ValueError(f"fill must be in (0, 1], not {fill}")
    room = int(fill * capacity)
    given: dict[str, int] = {}
    moves: list[Move] = []
    for block in sorted(tree.blocks(source), key=lambda b: (-block_keys[b], b.first)):
        keys = block_keys[block]
        target, objection = _target(tree, source, block, keys, room, keys_of, given, avoid, fits, moves)
        if target is None:
            why = objection or f"no live server has room for its {keys} keys within {fill:.0%} of capacity"
            return DrainPlan((), f"{block}: {why} (room {room} keys)")
        moves.append(Move(block, source, target))
        given[target] = given.get(target, 0) + keys
    return DrainPlan(tuple(moves), "")


def _target(tree: LogicalBTree, source: str, block: Block, keys: int, room: int, keys_of: KeysOf,
            given: Mapping[str, int], avoid: Collection[str], fits: FitsFn | None,
            planned: list[Move]) -> tuple[str | None, str]:
    """The leaf that takes `block`, or None with the last objection of `fits` ("" if none)."""
    objection = ""

    def held(leaf: str) -> int:
        return keys_of(leaf) + given.get(leaf, 0)

    for ring in tree.rings(source, avoid):
        room_for = [leaf for leaf in ring
                    if tree.state(leaf) is not State.FAILED and held(leaf) + keys <= room]
        for leaf in sorted(room_for, key=lambda x: (held(x), x))[:CANDIDATES_PER_LEVEL]:
            refused = fits([*planned, Move(block, source, leaf)]) if fits is not None else None
            if refused is None:
                return leaf, ""
            objection = refused
    return None, objection
