"""A switch group's prefix table, kept in step with its forwarding function.

A group's MetaFlow table realises one function: MetaDataID -> next hop (a child
of the group, or UP). The function lives in a binary trie whose leaves are the
maximal aligned blocks on which it is constant. Two ways to write it as
prefix entries:

- minimal (ORTC, Draves et al. 1999): the fewest longest-prefix-match
  entries. It rests on one fact: the optimal cost of a trie node, given the
  value it inherits from above, is `cost` if that value is in the node's
  candidate set and `cost + 1` otherwise. Pass 2 computes (cost, set)
  bottom-up; pass 3 places entries top-down. Entries may nest.
- plain (the paper's form): one entry per non-default leaf, i.e. every run of
  equal next hops covered by its minimal CIDR list. Entries never nest.

The trie is stored as dicts keyed by (first, plen), and both passes are kept
incremental: `assign` re-runs pass 2 along the changed path and marks it
dirty; `refresh` re-runs pass 3 only where a node is dirty or now inherits a
different value, and reports exactly which entries changed. A split therefore
costs work in proportion to what it changes, not to the size of the table.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Callable, Hashable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Generic, TypeVar

from sortedcontainers import SortedDict

from client_lib.cidr import Block

Value = TypeVar("Value", bound=Hashable)
"""What the function maps IDs to (a next hop: a child id, UP, or None)."""
Key = tuple[int, int]
_UNSEEN = object()


class LpmTrie(Generic[Value]):
    """A total function on a space, with its current prefix table.

    `default` is what unmatched IDs get without any entry (UP through the
    default up-rules, or None at the root, which has no default). `order`
    breaks ties between equally cheap values, so tables are deterministic.
    """

    def __init__(self, space: Block, background: Value, default: Value | None,
                 minimal: bool = True, order: Callable[[Value], str] = repr,
                 items: Sequence[tuple[Block, Value]] = ()) -> None:
        """`items`: sorted, non-overlapping blocks with values; the rest takes `background`."""
        self.space, self.width = space, space.width
        self.default, self.minimal, self.order = default, minimal, order
        self._leaf: dict[Key, Value] = {}
        self._inner: dict[Key, tuple[int, frozenset[Value]]] = {}
        self._entries: SortedDict[Key, Value] = SortedDict()   # key -> value placed there
        self._inherited: dict[Key, Value | None] = {}         # key -> value it inherited last placement
        self._dirty: set[Key] = set()
        self._gone: set[Key] = set()                    # nodes removed since the last refresh
        firsts = [block.first for block, _ in items]
        self._build(space.first, space.plen, items, firsts, 0, len(items), background)
        self.refresh()

    @classmethod
    def from_partition(cls, space: Block, items: Sequence[tuple[Block, Value]], background: Value,
                       default: Value | None, minimal: bool = True,
                       order: Callable[[Value], str] = repr) -> LpmTrie[Value]:
        """Build in one pass from sorted, non-overlapping blocks; gaps take `background`."""
        return cls(space, background, default, minimal, order, items)

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

    def _summary(self, key: Key) -> tuple[int, frozenset[Value]]:
        if key in self._leaf:
            return 0, frozenset((self._leaf[key],))
        return self._inner[key]

    def _combine(self, key: Key) -> None:
        """Recompute a node from its children; collapse two equal leaves into one."""
        left, right = self._children(key)
        if left in self._leaf and right in self._leaf and self._leaf[left] == self._leaf[right]:
            self._leaf[key] = self._leaf[left]
            self._forget(left)
            self._forget(right)
            self._inner.pop(key, None)
            return
        cost_l, set_l = self._summary(left)
        cost_r, set_r = self._summary(right)
        both = set_l & set_r
        if both:
            self._inner[key] = (cost_l + cost_r, both)
        else:
            self._inner[key] = (cost_l + cost_r + 1, set_l | set_r)

    def _forget(self, key: Key) -> None:
        """Remove one node; an entry it held is withdrawn at the next refresh."""
        self._leaf.pop(key, None)
        self._inner.pop(key, None)
        self._inherited.pop(key, None)
        self._gone.add(key)

    def _drop_subtree(self, key: Key) -> None:
        stack = [key]
        while stack:
            node = stack.pop()
            if node in self._inner:
                stack.extend(self._children(node))
            self._forget(node)

    def assign(self, block: Block, value: Value) -> None:
        """Make the function equal `value` on all of `block` (pass 2 only; see refresh)."""
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
        self._dirty.update(path)
        self._dirty.add(key)
        for ancestor in reversed(path):
            self._combine(ancestor)

    def value(self, addr: int) -> Value:
        key = (self.space.first, self.space.plen)
        while key not in self._leaf:
            left, right = self._children(key)
            key = left if addr < right[0] else right
        return self._leaf[key]

    # -- pass 3 -----------------------------------------------------------------

    def cost(self) -> int:
        """Entries the table needs now (minimal mode: from pass 2 alone, no refresh needed)."""
        if not self.minimal:
            return sum(1 for v in self._leaf.values() if v != self.default)
        cost, candidates = self._summary((self.space.first, self.space.plen))
        return cost if self.default in candidates else cost + 1

    def refresh(self) -> TableChange[Value]:
        """Re-place entries where something changed, and say which entries did."""
        old: dict[Key, Value] = {}
        new: dict[Key, Value] = {}
        root = (self.space.first, self.space.plen)
        self._place(root, self.default, old, new)
        # Entries of nodes that no longer exist (dropped or collapsed) go too.
        for key in self._gone:
            if key in self._entries and key not in self._leaf and key not in self._inner:
                old.setdefault(key, self._entries.pop(key))
        self._dirty.clear()
        self._gone.clear()
        change: TableChange[Value] = TableChange()
        for key in sorted(old.keys() | new.keys()):
            if key not in new:
                change.removed.append((self._block(key), old[key]))
            elif key not in old:
                change.added.append((self._block(key), new[key]))
            elif old[key] != new[key]:
                change.modified.append((self._block(key), new[key]))
        return change

    def _block(self, key: Key) -> Block:
        return Block(key[0], key[1], self.width)

    def _place(self, key: Key, inherited: Value | None, old: dict[Key, Value],
               new: dict[Key, Value]) -> None:
        stack: list[tuple[Key, Value | None]] = [(key, inherited)]
        while stack:
            key, inherited = stack.pop()
            if key not in self._dirty and self._inherited.get(key, _UNSEEN) == inherited:
                continue  # same subtree, same inheritance: same entries as before
            self._inherited[key] = inherited
            if key in self._entries:
                old[key] = self._entries.pop(key)
            if key in self._leaf:
                if self._leaf[key] != inherited:
                    self._entries[key] = new[key] = self._leaf[key]
                continue
            if self.minimal:
                _, candidates = self._inner[key]
                if inherited not in candidates:
                    inherited = min(candidates, key=self.order)
                    self._entries[key] = new[key] = inherited
            left, right = self._children(key)
            stack.append((right, inherited))
            stack.append((left, inherited))

    def entries(self) -> list[tuple[Block, Value]]:
        """The current table as (prefix, value), in address order (refresh first)."""
        return [(self._block(k), v) for k, v in self._entries.items()]

    def __len__(self) -> int:
        return len(self._entries)

    def leaves(self) -> Iterator[tuple[Block, Value]]:
        """The function as maximal aligned blocks, in address order."""
        for key, value in sorted(self._leaf.items()):
            yield self._block(key), value


@dataclass
class TableChange(Generic[Value]):
    """What one refresh did to a group's table, in address order. `removed` carries
    the value the entry had, so a caller can still name the port it pointed to."""

    removed: list[tuple[Block, Value]] = field(default_factory=list)
    added: list[tuple[Block, Value]] = field(default_factory=list)
    modified: list[tuple[Block, Value]] = field(default_factory=list)

    def __bool__(self) -> bool:
        return bool(self.removed or self.added or self.modified)
