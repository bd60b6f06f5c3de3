"""Replica sets: which servers hold each block, in which order, at which epoch.

The tree says who is each block's *primary* (the one server the switches
send its IDs to); this module says who else holds a copy. A set is an
ordered tuple of leaves, primary first, at an epoch; every change of a set
(a promotion, a member dropped or added, a block moved) takes a new epoch
from one counter, so a newer decision always carries a higher number and
agents can refuse an older one.

Placement spreads a set over failure domains: a backup goes to a different
edge switch (rack) from every other member whenever a live leaf exists
there, and only otherwise to the same rack (`Placement.shared_domain` then
says so, for the caller to warn). Among the candidates the least loaded
leaf wins (loads are the caller's: keys, or the number of sets a leaf is
in), then tree order, so placement is deterministic.

Pure: no I/O. The controller keeps the sets aligned with the tree after
every move (`realign`); tests run it against every topology builder.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass, field, replace

from client_lib.cidr import Block

from .tree import LogicalBTree, State


@dataclass(frozen=True)
class ReplicaSet:
    """`members[0]` is the primary. Members in `unsynced` are still being
    copied to: they get every write but cannot be promoted yet."""

    epoch: int
    members: tuple[str, ...]
    unsynced: frozenset[str] = frozenset()

    @property
    def primary(self) -> str:
        return self.members[0]

    @property
    def backups(self) -> tuple[str, ...]:
        return self.members[1:]

    @property
    def synced(self) -> tuple[str, ...]:
        """Members holding every acknowledged write, primary first."""
        return tuple(m for m in self.members if m not in self.unsynced)


@dataclass(frozen=True)
class Placement:
    backups: tuple[str, ...]
    shared_domain: bool
    """Some backup shares a rack with another member: no other rack had a live leaf."""
    short: int
    """How many backups could not be placed at all (too few live leaves)."""


@dataclass
class Replicas:
    """The replica set of every block of the tree's partition."""

    tree: LogicalBTree
    r: int
    epoch: int = 0
    """The last epoch handed out."""
    sets: dict[Block, ReplicaSet] = field(default_factory=dict)
    floor: int = 0
    """No epoch handed out is at or below it: a leader with term T sets
    `T << 32` (`controller.leadership.epoch_floor`), so its epochs are above
    every epoch of an older leader; 0 for the one controller without etcd."""

    def __post_init__(self) -> None:
        if self.r < 1:
            raise ValueError(f"a block needs at least one copy, not {self.r}")
        if self.floor < 0:
            raise ValueError(f"an epoch floor cannot be negative, not {self.floor}")
        self.epoch = max(self.epoch, self.floor)

    def next_epoch(self) -> int:
        self.epoch = max(self.epoch, self.floor) + 1
        return self.epoch

    def continue_from(self, claimed: int) -> None:
        """A rebuild from the agents' claims: go on above the highest epoch
        claimed, and never below the floor."""
        self.epoch = max(claimed, self.floor)

    def domain(self, leaf: str) -> str | None:
        """A leaf's failure domain: its parent in the tree (its edge switch)."""
        return self.tree.parent(leaf)

    # -- placement ---------------------------------------------------------------

    def place(self, members: Collection[str], count: int, avoid: Collection[str] = (),
              load: Mapping[str, int] | None = None) -> Placement:
        """`count` more members for a set that has `members` (primary first):
        live leaves not in `avoid`, other racks first, least loaded first."""
        taken = set(members)
        domains = {self.domain(m) for m in members}
        loads = dict(load) if load is not None else self.memberships()
        chosen: list[str] = []
        shared = False
        order = {leaf: i for i, leaf in enumerate(self.tree.leaves())}
        for _ in range(count):
            candidates = [leaf for leaf in self.tree.leaves()
                          if leaf not in taken and leaf not in avoid
                          and self.tree.state(leaf) is not State.FAILED]
            if not candidates:
                break
            best = min(candidates, key=lambda leaf: (self.domain(leaf) in domains, loads.get(leaf, 0),
                                                     order[leaf]))
            shared = shared or self.domain(best) in domains
            chosen.append(best)
            taken.add(best)
            domains.add(self.domain(best))
            loads[best] = loads.get(best, 0) + 1
        return Placement(tuple(chosen), shared, count - len(chosen))

    def memberships(self) -> dict[str, int]:
        """How many sets each leaf is in (the default load)."""
        out: dict[str, int] = {}
        for s in self.sets.values():
            for m in s.members:
                out[m] = out.get(m, 0) + 1
        return out

    # -- keeping the sets aligned with the tree ---------------------------------

    def assign(self, block: Block, members: Iterable[str], unsynced: Collection[str] = ()) -> ReplicaSet:
        """A new set for `block` (a block of the partition), at a new epoch."""
        members = tuple(members)
        owner = self.tree.owner(block.first)
        if not members or members[0] != owner:
            raise ValueError(f"{block}: the set {members} must start with its primary {owner!r}")
        if len(set(members)) != len(members):
            raise ValueError(f"{block}: a server appears twice in {members}")
        new = ReplicaSet(self.next_epoch(), members, frozenset(unsynced) & set(members[1:]))
        self.sets[block] = new
        return new

    def mark_synced(self, block: Block, member: str) -> ReplicaSet:
        """`member` has caught up (same epoch: nobody's role changes)."""
        current = self.sets[block]
        new = replace(current, unsynced=current.unsynced - {member})
        self.sets[block] = new
        return new

    def realign(self) -> None:
        """After the tree moved blocks: a block of the partition with no set of
        its own takes the set of the block it was cut from (same epoch: the
        members hold it already); sets of blocks no longer in the partition
        go. A block whose primary changed without a new set here is a bug of
        the caller's."""
        aligned: dict[Block, ReplicaSet] = {}
        for block, owner in self.tree.partition():
            parent = self.sets.get(block) or next((s for b, s in self.sets.items() if b.covers(block)), None)
            if parent is None:
                continue
            if parent.primary != owner:
                raise ValueError(f"{block}: owned by {owner!r} but its set starts with {parent.primary!r}")
            aligned[block] = parent
        self.sets = aligned

    def of(self, leaf: str) -> dict[Block, ReplicaSet]:
        """The sets `leaf` is in, by block."""
        return {b: s for b, s in self.sets.items() if leaf in s.members}

    def under_replicated(self) -> list[Block]:
        """Blocks with fewer than r synced members, or with members left to sync."""
        return [b for b, s in self.sets.items() if len(s.synced) < self.r or s.unsynced]

    def check(self) -> None:
        """Every block of the partition has a set led by its owner, with no
        failed member and no member twice."""
        for block, owner in self.tree.partition():
            s = self.sets.get(block)
            if s is None:
                raise ValueError(f"{block} has no replica set")
            if s.primary != owner:
                raise ValueError(f"{block}: set {s.members} does not start with its owner {owner!r}")
            if len(set(s.members)) != len(s.members):
                raise ValueError(f"{block}: a member appears twice in {s.members}")
            failed = [m for m in s.members if self.tree.state(m) is State.FAILED]
            if failed:
                raise ValueError(f"{block}: failed members {failed} in {s.members}")
