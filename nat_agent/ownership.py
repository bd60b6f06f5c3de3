"""Which MetaDataIDs this server answers for, and which are moving.

The switches route an ID to a server, but during a split or a take-over the
flow tables and the data move at different moments, so the server re-checks
every request against its own view: serve it, refuse a write to a block that
is being copied (TRYAGAIN: the client retries and lands after the cut-over),
or say the ID is not ours (MOVED: the flows have not caught up yet, or the
client's route is stale). This module is that view, with no I/O.
"""

from __future__ import annotations

import bisect
from collections import OrderedDict
from collections.abc import Iterable
from dataclasses import dataclass
from enum import Enum

from client_lib.cidr import Block, subtract
from client_lib.errors import Conflict

# How many recent hand-offs to remember for MOVED hints.
_MOVED_HINTS = 1024


class OwnershipError(Conflict):
    """An own/disown/freeze request that contradicts the current ownership
    (the admin API answers 409)."""

    def __init__(self, message: str) -> None:
        super().__init__(message, 409)


class Verdict(Enum):
    SERVE = "serve"
    TRYAGAIN = "tryagain"
    MOVED = "moved"


@dataclass(frozen=True)
class Decision:
    verdict: Verdict
    block: Block | None = None   # the owned, frozen or handed-off block involved
    hint: str | None = None      # where a handed-off block went, if known


class Ownership:
    """Disjoint owned blocks, the frozen subset, and hints for blocks given away."""

    def __init__(self, width: int = 32, owned: Iterable[Block] = ()) -> None:
        self.width = width
        self._owned: list[Block] = []
        self._firsts: list[int] = []  # _owned's first IDs, for bisect on every request
        self._frozen: list[Block] = []
        self._moved: OrderedDict[Block, str] = OrderedDict()
        self.own(owned)

    @property
    def owned(self) -> list[Block]:
        return list(self._owned)

    @property
    def frozen(self) -> list[Block]:
        return list(self._frozen)

    def _owner_block(self, mdid: int) -> Block | None:
        i = bisect.bisect_right(self._firsts, mdid) - 1
        if i >= 0 and self._owned[i].contains(mdid):
            return self._owned[i]
        return None

    def decide(self, mdid: int, write: bool) -> Decision:
        """What to do with a request for `mdid`. Reads of frozen blocks are served:
        the data is still here and unchanged until the cut-over."""
        block = self._owner_block(mdid)
        if block is None:
            for moved, hint in reversed(self._moved.items()):
                if moved.contains(mdid):
                    return Decision(Verdict.MOVED, moved, hint)
            return Decision(Verdict.MOVED)
        if write:
            for frozen in self._frozen:
                if frozen.contains(mdid):
                    return Decision(Verdict.TRYAGAIN, frozen)
        return Decision(Verdict.SERVE, block)

    def owns_all(self, blocks: Iterable[Block]) -> bool:
        return all(self._covering(b) is not None for b in blocks)

    def unowned(self, block: Block) -> list[Block]:
        """The parts of `block` not owned here, as disjoint blocks."""
        if self._covering(block) is not None:
            return []
        parts = [block]
        for owned in self._owned:
            if block.covers(owned):  # blocks nest or are disjoint: each lies in one part
                parts = [q for p in parts for q in (subtract(p, owned) if p.covers(owned) else [p])]
        return parts

    def _covering(self, block: Block) -> Block | None:
        owner = self._owner_block(block.first)
        return owner if owner is not None and owner.covers(block) else None

    def _check(self, block: Block) -> None:
        if block.width != self.width:
            raise OwnershipError(f"{block} is not a {self.width}-bit block")

    def own(self, blocks: Iterable[Block]) -> list[Block]:
        """Start answering for `blocks`. A block may swallow smaller owned ones
        (a merge back). CIDR blocks either nest or are disjoint, so there is
        no partial overlap to refuse here. Every block is checked before any
        is taken, so a bad one changes nothing."""
        blocks = self._checked(blocks)
        added = []
        for block in blocks:
            if self._covering(block) is not None:
                continue  # already ours: owning is idempotent
            self._replace([b for b in self._owned if block.covers(b)], [block])
            self._moved.pop(block, None)
            added.append(block)
        return added

    def disown(self, blocks: Iterable[Block], moved_to: str | None = None) -> list[Block]:
        """Stop answering for every ID of `blocks`, however much of each is owned.

        A block inside an owned one is cut out of it (a split hands away
        half of one); owned blocks inside a given one are released whole;
        a block owned nowhere is left alone. So the call means "none of
        these IDs is served here afterwards", and a repeated or retried
        disown, or one over a block that was already partly handed away,
        converges instead of failing half-way. Every block is checked before
        any is released. Returns what was released: disjoint blocks, each
        inside one of `blocks`."""
        blocks = self._checked(blocks)
        released = []
        for block in blocks:
            owner = self._covering(block)
            if owner is not None:
                self._replace([owner], subtract(owner, block))
                gone = [block]
            else:
                gone = [b for b in self._owned if block.covers(b)]
                if not gone:
                    continue  # none of it is ours: disowning is idempotent
                self._replace(gone, [])
            self._frozen = [f for f in self._frozen if not block.covers(f)]
            if moved_to is not None:
                self._moved[block] = moved_to
                while len(self._moved) > _MOVED_HINTS:
                    self._moved.popitem(last=False)
            released.extend(gone)
        return released

    def _checked(self, blocks: Iterable[Block]) -> list[Block]:
        blocks = list(blocks)
        for block in blocks:
            self._check(block)
        return blocks

    def _replace(self, old: list[Block], new: list[Block]) -> None:
        """Swap owned blocks, keeping them sorted and the bisect index in step."""
        self._owned = sorted([b for b in self._owned if b not in old] + new)
        self._firsts = [b.first for b in self._owned]

    def freeze(self, blocks: Iterable[Block]) -> None:
        blocks = self._checked(blocks)
        for block in blocks:
            if self._covering(block) is None:
                raise OwnershipError(f"cannot freeze {block}: not owned here")
        for block in blocks:
            if block not in self._frozen:
                self._frozen.append(block)

    def unfreeze(self, blocks: Iterable[Block]) -> None:
        for block in blocks:
            if block in self._frozen:
                self._frozen.remove(block)
