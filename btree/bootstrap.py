"""How an empty tree gets its first owners: the one parser and applier of the
bootstrap policy, for the controller's flag and the planner's alike.

- ``organic``: the paper's growth; one leaf owns the whole space and splits
  do the rest.
- ``preallocate[:N]``: N leaves spread evenly across the tree own the space
  from the start (default: half the leaves, so every subtree keeps idle
  leaves for its splits and failures).
"""

from __future__ import annotations

from dataclasses import dataclass

from .tree import LogicalBTree, Move, State


@dataclass(frozen=True)
class Bootstrap:
    kind: str
    count: int | None = None   # preallocate only; None: half the leaves

    @classmethod
    def parse(cls, text: str) -> Bootstrap:
        kind, sep, count = text.partition(":")
        if kind == "organic" and not sep:
            return cls("organic")
        if kind == "preallocate":
            if not sep:
                return cls("preallocate")
            if count.isdigit() and int(count) >= 1:
                return cls("preallocate", int(count))
        raise ValueError(f"bootstrap must be organic, preallocate or preallocate:N (N >= 1), not {text!r}")

    def apply(self, tree: LogicalBTree, first_leaf: str | None = None) -> list[Move]:
        """Give an empty tree its owners; `first_leaf` is the organic owner
        (default: the first idle leaf). Pre-allocation spreads the space over
        as many of the wanted leaves as are usable: a server that failed (or had
        not registered) by the first build leaves the space to the others
        rather than no build at all (`wanted` says how many were asked for)."""
        if self.kind == "organic":
            return tree.bootstrap_organic(first_leaf)
        usable = len(tree.leaves_in(State.IDLE))
        return tree.bootstrap_preallocate(max(1, min(self.wanted(tree), usable)))

    def wanted(self, tree: LogicalBTree) -> int:
        """How many leaves the policy asks to own the space from the start."""
        if self.kind == "organic":
            return 1
        return self.count or max(1, len(tree.leaves()) // 2)

    def __str__(self) -> str:
        return self.kind if self.count is None else f"{self.kind}:{self.count}"
