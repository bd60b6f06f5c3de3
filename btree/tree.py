"""The logical B-tree: switch groups as inner nodes, storage servers as leaves.

The shape is fixed by the physical topology (the classifier in `topology/`
produces it); what changes at run time is which leaf owns which CIDR blocks.
Leaves are idle (own nothing), busy (own blocks) or failed. The blocks of all
leaves partition the MetaDataID space exactly; every mutation here keeps that
invariant and reports what moved as `Move`s, from which the flow planner
derives exactly which switch groups need new entries.

Inner nodes keep an index of the blocks below them, so a group's forwarding
function (ID -> child or UP) is read without scanning the whole partition.
"""

from __future__ import annotations

import enum
from collections import deque
from collections.abc import Collection, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass

from sortedcontainers import SortedDict

from client_lib.cidr import Block, cover, most_aligned, subtract


class State(enum.Enum):
    """FAILED covers any leaf out of service: crashed, unreachable, or departed."""

    IDLE = "idle"
    BUSY = "busy"
    FAILED = "failed"


@dataclass(frozen=True, slots=True)
class Move:
    """`block` changed owner from `source` to `target` (None: newly assigned)."""

    block: Block
    source: str | None
    target: str


@dataclass(frozen=True, slots=True)
class Takeover:
    """What a failure or departure did: who inherited the blocks and why."""

    failed: str
    successor: str | None
    moves: tuple[Move, ...]
    same_parent: bool
    reason: str


class TreeError(ValueError):
    """An operation that the tree's current state does not allow."""


class LogicalBTree:
    """Shape plus block ownership. Node ids are opaque strings chosen by the mapper."""

    def __init__(self, space: Block, root: str, children: Mapping[str, Sequence[str]]):
        self.space = space
        self.root = root
        self._children: dict[str, list[str]] = {}
        self._parent: dict[str, str | None] = {root: None}
        self._path: dict[str, tuple[str, ...]] = {}
        self._state: dict[str, State] = {}
        self._blocks: dict[str, SortedDict[int, Block]] = {}             # leaf -> first -> Block
        self._index: dict[str, SortedDict[int, tuple[Block, str]]] = {}  # inner -> first -> (Block, leaf)
        self._add_inner(root, None)
        queue = deque([root])   # breadth first: leaves come out in tree order
        while queue:
            node = queue.popleft()
            for child in children.get(node, ()):
                if child in self._parent:
                    raise TreeError(f"node {child!r} appears twice in the tree shape")
                if child in children:
                    self._add_inner(child, node)
                    queue.append(child)
                else:
                    self._add_leaf(child, node)
        unknown = set(children) - set(self._children)
        if unknown:
            raise TreeError(f"nodes {sorted(unknown)} are not reachable from root {root!r}")

    # -- shape ------------------------------------------------------------------

    def _add_inner(self, node: str, parent: str | None, position: int | None = None) -> None:
        self._parent[node] = parent
        self._children[node] = []
        self._index[node] = SortedDict()
        if parent is not None:
            kids = self._children[parent]
            kids.insert(len(kids) if position is None else position, node)
        self._path[node] = (self._path[parent] if parent else ()) + (node,)

    def _add_leaf(self, leaf: str, parent: str) -> None:
        self._parent[leaf] = parent
        self._children[parent].append(leaf)
        self._path[leaf] = self._path[parent] + (leaf,)
        self._state[leaf] = State.IDLE
        self._blocks[leaf] = SortedDict()

    def is_leaf(self, node: str) -> bool:
        return node in self._state

    def parent(self, node: str) -> str | None:
        return self._parent[node]

    def children(self, node: str) -> list[str]:
        return list(self._children.get(node, ()))

    def path(self, node: str) -> tuple[str, ...]:
        """Root-to-node ids; `path(leaf)[depth(g) + 1]` is the child of g toward leaf."""
        return self._path[node]

    def depth(self, node: str) -> int:
        return len(self._path[node]) - 1

    def inner_nodes(self) -> list[str]:
        return list(self._children)

    def leaves(self) -> list[str]:
        return list(self._state)

    def child_toward(self, group: str, leaf: str) -> str | None:
        """The child of `group` on the way down to `leaf`, or None if leaf is not below group."""
        path = self._path[leaf]
        d = len(self._path[group]) - 1
        return path[d + 1] if len(path) > d + 1 and path[d] == group else None

    def lca(self, a: str, b: str) -> str:
        pa, pb = self._path[a], self._path[b]
        common = self.root
        for x, y in zip(pa, pb, strict=False):   # the common prefix of two paths
            if x != y:
                break
            common = x
        return common

    # -- ownership --------------------------------------------------------------

    def state(self, leaf: str) -> State:
        return self._state[leaf]

    def leaves_in(self, state: State) -> list[str]:
        return [leaf for leaf, s in self._state.items() if s is state]

    def blocks(self, leaf: str) -> list[Block]:
        return list(self._blocks[leaf].values())

    def owner(self, addr: int) -> str:
        """The leaf whose block holds `addr`."""
        index = self._index[self.root]
        i = index.bisect_right(addr) - 1
        if i >= 0:
            block, leaf = index.peekitem(i)[1]
            if block.contains(addr):
                return leaf
        raise TreeError(f"address {self.space.address(addr)} has no owner")

    def partition(self) -> list[tuple[Block, str]]:
        """Every owned block with its leaf, in address order."""
        return list(self._index[self.root].values())

    def group_blocks(self, group: str) -> Iterator[tuple[Block, str]]:
        """Blocks owned by leaves below `group`, in address order."""
        return iter(self._index[group].values())

    def _attach(self, block: Block, leaf: str) -> None:
        self._blocks[leaf][block.first] = block
        for node in self._path[leaf][:-1]:
            self._index[node][block.first] = (block, leaf)

    def _detach(self, block: Block, leaf: str) -> None:
        del self._blocks[leaf][block.first]
        for node in self._path[leaf][:-1]:
            del self._index[node][block.first]

    def _refresh_state(self, leaf: str) -> None:
        if self._state[leaf] is not State.FAILED:
            self._state[leaf] = State.BUSY if self._blocks[leaf] else State.IDLE

    def transfer(self, blocks: Iterable[Block], target: str) -> list[Move]:
        """Give `blocks` to `target`. Each must be a block (or a sub-block) of one current owner;
        an owner's block that is only partly transferred is re-covered around the part."""
        if self._state.get(target) is State.FAILED:
            raise TreeError(f"cannot give blocks to failed leaf {target!r}")
        if target not in self._state:
            raise TreeError(f"{target!r} is not a leaf")
        moves: list[Move] = []
        touched = {target}
        for block in blocks:
            source = self.owner(block.first)
            held = self._held_block(source, block.first)
            if not held.covers(block):
                raise TreeError(f"{block} spans more than one block of {source!r}")
            if source == target:
                continue
            self._detach(held, source)
            for rest in subtract(held, block):
                self._attach(rest, source)
            self._attach(block, target)
            moves.append(Move(block, source, target))
            touched.add(source)
        for leaf in touched:
            self._refresh_state(leaf)
        return moves

    def carve(self, block: Block) -> None:
        """Make `block` one of its owner's blocks on its own, the block it sits
        in re-covered around it; the owner stays. (A rebuild restores blocks
        that replicate apart, under different sets, even where one leaf owns
        them side by side.)"""
        owner = self.owner(block.first)
        held = self._held_block(owner, block.first)
        if not held.covers(block):
            raise TreeError(f"{block} spans more than one block of {owner!r}")
        if held == block:
            return
        self._detach(held, owner)
        for piece in [block, *subtract(held, block)]:
            self._attach(piece, owner)

    def _held_block(self, leaf: str, addr: int) -> Block:
        held = self._blocks[leaf]
        return held.peekitem(held.bisect_right(addr) - 1)[1]

    # -- bootstrap --------------------------------------------------------------

    def _require_unassigned(self) -> None:
        if self._index[self.root]:
            raise TreeError("the tree already owns blocks; bootstrap only an empty tree")

    def bootstrap_organic(self, leaf: str | None = None) -> list[Move]:
        """The paper's growth: one busy leaf owns the whole space, splits do the rest."""
        self._require_unassigned()
        leaf = leaf or self.leaves_in(State.IDLE)[0]
        self._attach(self.space, leaf)
        self._refresh_state(leaf)
        return [Move(self.space, None, leaf)]

    def bootstrap_preallocate(self, count: int, tolerance: float = 0.1) -> list[Move]:
        """Spread the space over `count` leaves chosen evenly across the tree.

        Each subtree gets a contiguous range in proportion to how many chosen
        leaves it holds, and every boundary between two sibling subtrees is moved
        (by at most `tolerance` of the smaller one's share) to the most aligned
        point nearby, so that ranges are covered by few prefixes and ancestors'
        tables stay short. The cost is a load deviation of about `tolerance` per
        level, which only changes when each leaf first reaches capacity.
        """
        self._require_unassigned()
        usable = [leaf for leaf in self.leaves() if self._state[leaf] is State.IDLE]
        if not 1 <= count <= min(len(usable), self.space.size):
            raise TreeError(f"cannot pre-allocate {count} leaves: {len(usable)} are usable "
                            f"and the space holds {self.space.size} IDs")
        chosen = set(self._spread_choice(self.root, count))
        moves: list[Move] = []
        self._allocate(self.root, self.space.first, self.space.last, chosen, tolerance, moves)
        return moves

    def _usable_below(self, node: str) -> list[str]:
        return [leaf for leaf in self.leaves_below(node) if self._state[leaf] is State.IDLE]

    def _spread_choice(self, node: str, count: int) -> list[str]:
        """Pick `count` usable leaves below node, each child's share in proportion to
        its usable leaves (largest remainder), so every subtree keeps the same
        fraction idle for its own splits and failures."""
        if self.is_leaf(node):
            return [node] if count else []
        usable = [(c, len(self._usable_below(c))) for c in self._children[node]]
        total = sum(n for _, n in usable)
        if not total:
            return []
        share = {c: count * n // total for c, n in usable}
        by_remainder = sorted(usable, key=lambda cn: -(count * cn[1] % total))
        for c, _ in by_remainder[:count - sum(share.values())]:
            share[c] += 1
        return [leaf for c, _ in usable for leaf in self._spread_choice(c, share[c])]

    def _allocate(self, node: str, lo: int, hi: int, chosen: set[str], tolerance: float,
                  moves: list[Move]) -> None:
        if self.is_leaf(node):
            for block in cover(lo, hi, self.space.width):
                self._attach(block, node)
                moves.append(Move(block, None, node))
            self._refresh_state(node)
            return
        weights = [(c, sum(1 for leaf in self.leaves_below(c) if leaf in chosen))
                   for c in self._children[node]]
        weights = [(c, w) for c, w in weights if w]
        total = sum(w for _, w in weights)
        span = hi - lo + 1
        start, acc = lo, 0
        for i, (child, w) in enumerate(weights):
            acc += w
            if i == len(weights) - 1:
                end = hi
            else:
                slack = int(span * min(w, weights[i + 1][1]) // total * tolerance)
                ideal = lo + span * acc // total
                room = hi - (len(weights) - i - 2)  # leave one ID for each later child
                low = max(start + 1, min(ideal - slack, room))
                end = most_aligned(low, max(low, min(room, ideal + slack)), self.space.width) - 1
            self._allocate(child, start, end, chosen, tolerance, moves)
            start = end + 1

    def leaves_below(self, node: str) -> list[str]:
        """Every leaf under `node` (itself, if it is one), in tree order."""
        if self.is_leaf(node):
            return [node]
        return [leaf for child in self._children[node] for leaf in self.leaves_below(child)]

    # -- join, leave, failure ---------------------------------------------------

    def join(self, leaf: str, parent: str) -> None:
        """A new server under `parent` becomes an idle leaf; no table changes."""
        if leaf in self._parent:
            if self._state.get(leaf) is State.FAILED and self._parent[leaf] == parent:
                self._state[leaf] = State.IDLE if not self._blocks[leaf] else State.BUSY
                return
            raise TreeError(f"{leaf!r} is already in the tree")
        if parent not in self._children:
            raise TreeError(f"parent {parent!r} is not an inner node")
        if any(not self.is_leaf(c) for c in self._children[parent]):
            raise TreeError(f"{parent!r} has switch groups below it; servers join at the bottom")
        self._add_leaf(leaf, parent)

    def join_group(self, group: str, parent: str, position: int | None = None) -> None:
        """A new switch group (e.g. an edge switch) becomes an inner node with no
        leaves, at `position` among its parent's children (None: last). A new
        rack (`topology.grow`) passes the place the classifier gives it, so the
        tree a restarted controller maps from the whole fabric is this one."""
        if group in self._parent:
            raise TreeError(f"{group!r} is already in the tree")
        if parent not in self._children:
            raise TreeError(f"parent {parent!r} is not an inner node")
        if any(self.is_leaf(c) for c in self._children[parent]):
            raise TreeError(f"{parent!r} has servers below it; switch groups join above the servers")
        if position is not None and not 0 <= position <= len(self._children[parent]):
            raise TreeError(f"{parent!r} has {len(self._children[parent])} children, no place {position}")
        self._add_inner(group, parent, position)

    def nearest_leaves(self, leaf: str, state: State = State.IDLE,
                       avoid: Collection[str] = ()) -> list[str]:
        """Leaves in `state` closest to `leaf` in the tree: same parent first, then the
        next ancestor up, and so on. Within one distance, tree order. Leaves in
        `avoid` (promised to an operation under way) are passed over."""
        for ring in self.rings(leaf, avoid):
            found = [x for x in ring if self._state[x] is state]
            if found:
                return found
        return []

    def rings(self, leaf: str, avoid: Collection[str] = ()) -> Iterator[list[str]]:
        """The other leaves by distance from `leaf`: those under its parent, then
        those under the next ancestor up that are not under the parent, and so
        on to the root (tree order within a ring; leaves in `avoid` left out)."""
        seen: set[str] = {leaf, *avoid}
        for ancestor in reversed(self._path[leaf][:-1]):
            below = self.leaves_below(ancestor)
            yield [x for x in below if x not in seen]
            seen.update(below)

    def fail(self, leaf: str, avoid: Collection[str] = ()) -> Takeover:
        """A leaf is gone: an idle leaf (same parent first, else the nearest) takes over
        its blocks. With no idle leaf anywhere, the nearest busy leaf adopts them so
        that every ID keeps an owner, and the result says so. Leaves in `avoid`
        are not chosen."""
        if self._state[leaf] is State.FAILED:
            raise TreeError(f"{leaf!r} has already failed")
        was_busy = self._state[leaf] is State.BUSY
        self._state[leaf] = State.FAILED
        if not was_busy:
            return Takeover(leaf, None, (), False, "idle leaf failed; no blocks to take over")
        idle = self.nearest_leaves(leaf, State.IDLE, avoid)
        candidates = idle or self.nearest_leaves(leaf, State.BUSY, avoid)
        if not candidates:
            self._state[leaf] = State.BUSY
            raise TreeError(f"{leaf!r} is the last live leaf; nothing can take over its blocks")
        successor = candidates[0]
        moves = self.transfer(self.blocks(leaf), successor)
        same_parent = self._parent[successor] == self._parent[leaf]
        reason = ("idle leaf took over" if idle else
                  "no idle leaf anywhere: nearest busy leaf adopted the blocks (add servers)")
        return Takeover(leaf, successor, tuple(moves), same_parent, reason)

    def leave(self, leaf: str) -> Takeover:
        """A graceful departure: the same hand-over as a failure, except that the data
        can be migrated first. The leaf stays out of service until `remove` deletes it
        (after the flows are updated, which still needs its place in the tree)."""
        result = self.fail(leaf)
        return Takeover(result.failed, result.successor, result.moves, result.same_parent,
                        result.reason.replace("failed", "left"))

    def remove(self, leaf: str) -> None:
        """Delete an out-of-service leaf that owns nothing (a decommissioned server)."""
        if self._state.get(leaf) is not State.FAILED or self._blocks[leaf]:
            raise TreeError(f"only a failed or departed leaf that owns nothing can be removed, "
                            f"not {leaf!r}")
        del self._state[leaf], self._blocks[leaf], self._path[leaf]
        parent = self._parent.pop(leaf)
        assert parent is not None, "only the root has no parent, and it is not a leaf"
        self._children[parent].remove(leaf)

    # -- checks -----------------------------------------------------------------

    def check(self) -> None:
        """Raise if blocks do not partition the space or indexes disagree."""
        expected = self.space.first
        for block, leaf in self.partition():
            if block.first != expected:
                raise TreeError(f"gap or overlap at {self.space.address(expected)} (next block {block})")
            if self._blocks[leaf].get(block.first) != block:
                raise TreeError(f"{block} indexed for {leaf!r} but not held by it")
            expected = block.last + 1
        if expected != self.space.last + 1:
            raise TreeError(f"space not covered from {self.space.address(expected)}")
        for leaf, held in self._blocks.items():
            if held and self._state[leaf] is State.IDLE:
                raise TreeError(f"idle leaf {leaf!r} holds blocks")
