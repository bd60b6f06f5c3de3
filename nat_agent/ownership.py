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
from dataclasses import dataclass
from enum import Enum
from typing import Iterable

from client_lib.cidr import Block, subtract

# How many recent hand-offs to remember for MOVED hints.
_MOVED_HINTS = 1024


class OwnershipError(ValueError):
    """An own/disown/freeze request that contradicts the current ownership."""


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

    def _covering(self, block: Block) -> Block | None:
        owner = self._owner_block(block.first)
        return owner if owner is not None and owner.covers(block) else None

    def _check(self, block: Block) -> None:
        if block.width != self.width:
            raise OwnershipError(f"{block} is not a {self.width}-bit block")

    def own(self, blocks: Iterable[Block]) -> list[Block]:
        """Start answering for `blocks`. A block may swallow smaller owned ones
        (a merge back). CIDR blocks either nest or are disjoint, so there is
        no partial overlap to refuse here."""
        added = []
        for block in blocks:
            self._check(block)
            if self._covering(block) is not None:
                continue  # already ours: owning is idempotent
            self._owned = sorted([b for b in self._owned if not block.covers(b)] + [block])
            self._firsts = [b.first for b in self._owned]
            self._moved.pop(block, None)
            added.append(block)
        return added

    def disown(self, blocks: Iterable[Block], moved_to: str | None = None) -> list[Block]:
        """Stop answering for `blocks` (each inside one owned block; a split
        may hand away half of one). Returns the blocks actually released."""
        released = []
        for block in blocks:
            self._check(block)
            owner = self._covering(block)
            if owner is None:
                if any(b.first <= block.last and block.first <= b.last for b in self._owned):
                    raise OwnershipError(f"{block} is only partly owned")
                continue  # not ours already: disowning is idempotent
            self._owned = sorted([b for b in self._owned if b != owner] + subtract(owner, block))
            self._firsts = [b.first for b in self._owned]
            self._frozen = [f for f in self._frozen if not block.covers(f)]
            if moved_to is not None:
                self._moved[block] = moved_to
                while len(self._moved) > _MOVED_HINTS:
                    self._moved.popitem(last=False)
            released.append(block)
        return released

    def freeze(self, blocks: Iterable[Block]) -> None:
        blocks = list(blocks)
        for block in blocks:
            self._check(block)
            if self._covering(block) is None:
                raise OwnershipError(f"cannot freeze {block}: not owned here")
        for block in blocks:
            if block not in self._frozen:
                self._frozen.append(block)

    def unfreeze(self, blocks: Iterable[Block]) -> None:
        for block in blocks:
            if block in self._frozen:
                self._frozen.remove(block)
