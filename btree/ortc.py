"""Minimal longest-prefix-match tables: ORTC (Draves et al., 1999), kept incremental.

A switch group's MetaFlow table is a function from MetaDataID to next hop (a
child of the group, or UP). ORTC finds the fewest prefix entries that realise
such a function. It rests on one fact: the optimal cost of a trie node, given
the value it inherits from above, is `cost` if that value is in the node's
candidate set and `cost + 1` otherwise. Pass 2 computes (cost, set) bottom-up;
pass 3 places entries top-down.

The trie is stored as two dicts keyed by (first, plen) so that a change to one
range (a split moving a block) touches only the nodes on its path: `assign`
re-runs pass 2 along that path, which is what makes per-split updates and
"what would this move cost" questions cheap.
"""

from __future__ import annotations

from bisect import bisect_left
from typing import Hashable, Iterator, Sequence

from .cidr import Block

Value = Hashable
Key = tuple[int, int]


class LpmTrie:
    """A total function on a space, as a binary trie, with ORTC's (cost, set) per node."""

    def __init__(self, space: Block, background: Value):
        self.space = space
        self.width = space.width
        self._leaf: dict[Key, Value] = {(space.first, space.plen): background}
        self._inner: dict[Key, tuple[int, frozenset]] = {}

    @classmethod
    def from_partition(cls, space: Block, items: Sequence[tuple[Block, Value]],
                       background: Value) -> LpmTrie:
        """Build in one pass from sorted, non-overlapping blocks; gaps take `background`."""
        trie = cls(space, background)
        trie._leaf.clear()
        firsts = [block.first for block, _ in items]
        trie._build(space.first, space.plen, items, firsts, 0, len(items), background)
        return trie

    def _build(self, first: int, plen: int, items: Sequence[tuple[Block, Value]],
               firsts: list[int], lo: int, hi: int, background: Value) -> None:
        key = (first, plen)
        if lo == hi:
            self._leaf[key] = background
            return
        block, value = items[lo]
        if hi - lo == 1 and block.first == first and block.plen == plen:
            self._leaf[key] = value
            return
        if block.plen <= plen:
            raise ValueError(f"block {block} overlaps another block of the partition")
        half = 1 << (self.width - plen - 1)
        mid = bisect_left(firsts, first + half, lo, hi)
        self._build(first, plen + 1, items, firsts, lo, mid, background)
        self._build(first + half, plen + 1, items, firsts, mid, hi, background)
        self._combine(key)

    # -- pass 2 -----------------------------------------------------------------

    def _children(self, key: Key) -> tuple[Key, Key]:
        first, plen = key
        return (first, plen + 1), (first + (1 << (self.width - plen - 1)), plen + 1)

    def _summary(self, key: Key) -> tuple[int, frozenset]:
        if key in self._leaf:
            return 0, frozenset((self._leaf[key],))
        return self._inner[key]

    def _combine(self, key: Key) -> None:
        """Recompute a node from its children; collapse two equal leaves into one."""
        left, right = self._children(key)
        if left in self._leaf and right in self._leaf and self._leaf[left] == self._leaf[right]:
            self._leaf[key] = self._leaf.pop(left)
            del self._leaf[right]
            self._inner.pop(key, None)
            return
        cost_l, set_l = self._summary(left)
        cost_r, set_r = self._summary(right)
        both = set_l & set_r
        if both:
            self._inner[key] = (cost_l + cost_r, both)
        else:
            self._inner[key] = (cost_l + cost_r + 1, set_l | set_r)

    def _drop_subtree(self, key: Key) -> None:
        stack = [key]
        while stack:
            node = stack.pop()
            if self._leaf.pop(node, _MISSING) is _MISSING and self._inner.pop(node, None) is not None:
                stack.extend(self._children(node))

    def assign(self, block: Block, value: Value) -> None:
        """Make the function equal `value` on all of `block`."""
        if not self.space.covers(block):
            raise ValueError(f"{block} is outside the space {self.space}")
        path: list[Key] = []
        key = (self.space.first, self.space.plen)
        target = (block.first, block.plen)
        while key != target:
            if key in self._leaf:  # a coarser leaf: push its value one level down
                inherited = self._leaf.pop(key)
                for child in self._children(key):
                    self._leaf[child] = inherited
                self._inner[key] = (0, frozenset((inherited,)))  # recomputed on the way up
            path.append(key)
            left, right = self._children(key)
            key = left if block.first < right[0] else right
        self._drop_subtree(key)
        self._leaf[key] = value
        for ancestor in reversed(path):
            self._combine(ancestor)

    def value(self, addr: int) -> Value:
        key = (self.space.first, self.space.plen)
        while key not in self._leaf:
            left, right = self._children(key)
            key = left if addr < right[0] else right
        return self._leaf[key]

    # -- results ----------------------------------------------------------------

    def cost(self, default: Value | None) -> int:
        """Entries needed when unmatched IDs fall through to `default` (None: no default)."""
        cost, candidates = self._summary((self.space.first, self.space.plen))
        return cost if default in candidates else cost + 1

    def entries(self, default: Value | None, order=repr) -> list[tuple[Block, Value]]:
        """Pass 3: the minimal table, as (prefix, value) in address order.

        `order` breaks ties among equally good values so output is deterministic.
        """
        out: list[tuple[Block, Value]] = []
        self._place((self.space.first, self.space.plen), default, order, out)
        return out

    def _place(self, key: Key, inherited: Value | None, order, out: list) -> None:
        if key in self._leaf:
            if self._leaf[key] != inherited:
                out.append((Block(key[0], key[1], self.width), self._leaf[key]))
            return
        _, candidates = self._inner[key]
        if inherited not in candidates:
            inherited = min(candidates, key=order)
            out.append((Block(key[0], key[1], self.width), inherited))
        for child in self._children(key):
            self._place(child, inherited, order, out)

    def leaves(self) -> Iterator[tuple[Block, Value]]:
        """The function as maximal aligned blocks, in address order."""
        for (first, plen), value in sorted(self._leaf.items()):
            yield Block(first, plen, self.width), value


_MISSING = object()
