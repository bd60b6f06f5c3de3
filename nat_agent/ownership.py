"""Which MetaDataIDs this server answers for, in which role, and which are moving.

The switches route an ID to a server, but during a split, a take-over or a
fail-over the flow tables and the data move at different moments, so the
server re-checks every request against its own view: serve it, refuse it
for now (TRYAGAIN: the client retries and lands after the change), or say
the ID is not ours (MOVED: the flows have not caught up yet, or the
client's route is stale). This module is that view, with no I/O.

Every held block has a `Role` (`client_lib.api.admin`): this agent is the
block's primary or one of its backups, in the block's replica set at an
epoch. Only a primary answers clients, and only while nothing stands in its
way; what may stand there, each a TRYAGAIN:

* ``serving`` is False: the controller has fenced the old primary and not
  yet moved the flows to this one;
* *fenced*: a backup answered that it holds the block at a newer epoch, so
  this agent was deposed and must not acknowledge anything more;
* *degraded*: a synced member failed to acknowledge a write, so the value
  here may be one that the set does not hold (reported in heartbeats; a
  newer epoch, in which the controller re-syncs the members, clears it);
* *suspended*: the agent restarted and the controller has not yet said what
  it may hold (a server declared failed meanwhile must never serve what it
  saved);
* a migration froze the block (writes only: its data is still here).

A backup answers MOVED, as for a block it does not hold: the switches send
clients to the primary. Epochs never go back: an assignment older than what
is held is refused (409) and changes nothing, so a stale decision cannot
undo a newer one; within an epoch a member only goes from unsynced to
synced (its sync finished), never back.
"""

from __future__ import annotations

import bisect
import dataclasses
import functools
from collections import OrderedDict
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from enum import Enum

from client_lib.api.admin import Member, Role
from client_lib.cidr import Block, subtract
from client_lib.errors import Conflict, InvalidArgument

# How many recent hand-offs to remember for MOVED hints.
_MOVED_HINTS = 1024


class OwnershipError(Conflict):
    """An assign/disown/freeze request that contradicts the current ownership
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
    block: Block | None = None   # the held, frozen or handed-off block involved
    hint: str | None = None      # where a handed-off block went, if known
    held: Held | None = None     # what is held there (for SERVE: the role to replicate by)
    reason: str = ""             # why not served (TRYAGAIN)


@dataclass(eq=False)
class Peer:
    """Another member of a block's set, as its primary (this agent) streams to it."""

    name: str
    address: str
    synced: bool
    required: bool
    """A write is acknowledged only once this member applied it: it is synced,
    or the end of its sync is on its way."""
    streamed: bool = True
    """False once dropped (its sync failed), until the block's next epoch."""


@dataclass(eq=False)
class Held:
    """One held block (a part of one role's block, if the controller split it)."""

    role: Role
    peers: tuple[Peer, ...] = ()
    """For a primary, the other members; empty for a backup and for a set of one."""
    fenced: bool = False
    degraded: bool = False
    decision: Decision = field(default=Decision(Verdict.MOVED))

    @property
    def block(self) -> Block:
        return self.role.block

    @functools.cached_property
    def label(self) -> str:
        """The block as text, as the replication stream names it on every write."""
        return str(self.role.block)

    @property
    def epoch(self) -> int:
        return self.role.epoch

    @property
    def primary(self) -> str:
        """The name of the block's primary (members are listed primary first)."""
        return self.role.members[0].name


@dataclass(frozen=True)
class Assignment:
    added: list[Block]     # parts held now that were not held before (any stale records must go)
    dropped: list[Block]   # parts no longer held (an exclusive assignment): their records must go


def solo_role(block: Block, name: str, replication: str, epoch: int = 0) -> Role:
    """The role of a standalone agent: the primary of a set of one."""
    return Role(block, epoch, True, [Member(name, replication, True)])


class Ownership:
    """Disjoint held blocks with their roles, the frozen subset, and hints for
    blocks given away. `name` is this agent's (how it finds itself in a set)."""

    def __init__(self, width: int = 32, name: str = "") -> None:
        self.width = width
        self.name = name
        self._held: list[Held] = []
        self._firsts: list[int] = []  # _held's first IDs, for bisect on every request
        self._frozen: list[Block] = []
        self._moved: OrderedDict[Block, str] = OrderedDict()
        self._suspended = False
        self.version = 0
        """Moves on every change of what `decide` could answer, once the
        change is made: the compiled request path recomputes its
        `fast_ranges` when it sees a new one."""
        self.on_version: Callable[[int], None] | None = None
        """Told each new `version` (the compiled path's `LaneView`, whose
        worker threads thus see a change without asking)."""

    # -- views -------------------------------------------------------------

    @property
    def owned(self) -> list[Block]:
        """Blocks this agent is the primary of (what the switches route to it)."""
        return [h.block for h in self._held if h.role.primary]

    @property
    def held(self) -> list[Block]:
        """Every held block, primary or backup (its records are in the store)."""
        return [h.block for h in self._held]

    @property
    def roles(self) -> list[Role]:
        return [h.role for h in self._held]

    @property
    def frozen(self) -> list[Block]:
        return list(self._frozen)

    @property
    def degraded(self) -> list[Block]:
        """Primary blocks held back until a newer epoch (fenced or degraded)."""
        return [h.block for h in self._held if h.fenced or h.degraded]

    @property
    def suspended(self) -> bool:
        return self._suspended

    @suspended.setter
    def suspended(self, value: bool) -> None:
        self._suspended = value
        for held in self._held:
            self._refresh(held)

    def parts(self) -> list[Held]:
        return list(self._held)

    def held_at(self, mdid: int) -> Held | None:
        i = bisect.bisect_right(self._firsts, mdid) - 1
        if i >= 0 and self._held[i].block.contains(mdid):
            return self._held[i]
        return None

    def holds_at(self, roles: Iterable[Role]) -> bool:
        """Every role's block is held here, exactly, at that role's epoch: a
        repeated assignment (its first answer was lost) changes nothing."""
        return all(any(h.block == r.block and h.epoch == r.epoch for h in self.overlapping(r.block))
                   for r in roles)

    def overlapping(self, block: Block) -> list[Held]:
        """Held parts sharing an ID with `block` (CIDR blocks nest or are disjoint)."""
        return [h for h in self._held if block.covers(h.block) or h.block.covers(block)]

    # -- the request path ----------------------------------------------------

    def decide(self, mdid: int, write: bool) -> Decision:
        """What to do with a request for `mdid`. Reads of frozen blocks are served:
        the data is still here and unchanged until the cut-over."""
        held = self.held_at(mdid)
        if held is None:
            for moved, hint in reversed(self._moved.items()):
                if moved.contains(mdid):
                    return Decision(Verdict.MOVED, moved, hint)
            return Decision(Verdict.MOVED)
        decision = held.decision
        if write and self._frozen and decision.verdict is Verdict.SERVE:
            for frozen in self._frozen:
                if frozen.contains(mdid):
                    return Decision(Verdict.TRYAGAIN, frozen, held=held, reason="is migrating")
        return decision

    def fast_ranges(self) -> tuple[list[tuple[int, int]], list[tuple[int, int]], list[tuple[int, int]]]:
        """Where the compiled request path may answer on its own, as sorted
        disjoint (first, last) ID ranges: reads where `decide` says SERVE
        (a key with a replicated write under way it leaves to the Python
        path, by `Replicator.writing`); writes where that holds, the block
        has no other member and no migration froze the ID; and replicated
        writes (its workers' turns, `Replicator.begin_turn`) where it holds
        and the block has other members."""
        served = [h for h in self._held if h.decision.verdict is Verdict.SERVE]
        return ([(h.block.first, h.block.last) for h in served],
                self._unfrozen([h.block for h in served if not h.peers]),
                self._unfrozen([h.block for h in served if h.peers]))

    def _unfrozen(self, blocks: list[Block]) -> list[tuple[int, int]]:
        """The parts of `blocks` no migration froze, as sorted (first, last) ranges."""
        for frozen in self._frozen:
            blocks = [part for block in blocks
                      for part in (subtract(block, frozen) if block.covers(frozen)
                                   else [] if frozen.covers(block) else [block])]
        return sorted((b.first, b.last) for b in blocks)

    def _changed(self) -> None:
        """What `decide` could answer has changed: a new `version`. Called
        after the change, so that whoever reads `fast_ranges` at the new
        version (the worker threads may, between any two statements here)
        sees it."""
        self.version += 1
        if self.on_version is not None:
            self.on_version(self.version)

    def _refresh(self, held: Held) -> None:
        """Work out the (cached) decision for requests in `held`."""
        held.decision = self._decision(held)
        self._changed()

    def _decision(self, held: Held) -> Decision:
        block = held.block
        reason = ""
        if not held.role.primary:
            return Decision(Verdict.MOVED, block, held=held)
        if self._suspended:
            reason = "is held by a restarted agent that waits for the controller"
        elif held.fenced:
            reason = "has a newer primary (this one is fenced)"
        elif held.degraded:
            reason = "is degraded (a replica did not acknowledge a write), waiting for the controller"
        elif not held.role.serving:
            reason = "is not served here yet"
        verdict = Verdict.TRYAGAIN if reason else Verdict.SERVE
        return Decision(verdict, block, held=held, reason=reason)

    # -- roles ---------------------------------------------------------------

    def assign(self, roles: Iterable[Role], exclusive: bool = False) -> Assignment:
        """Take `roles`. A role for a part of a held block replaces the role of
        that part only (the rest keeps its own); one covering several held
        blocks replaces them all. Every role is checked before any is taken,
        so a bad one (400) or an older epoch than one held (409) changes
        nothing. `exclusive`: drop every held block no role covers, and end
        a suspension."""
        roles = list(roles)
        self.check_assign(roles)
        added: list[Block] = []
        for role in roles:
            added += self.unheld(role.block)
            olds = self.overlapping(role.block)
            rest = [self._part(old, part) for old in olds if not role.block.covers(old.block)
                    for part in subtract(old.block, role.block)]
            self._replace(olds, [*rest, self._taken(role, olds)])
            for moved in [m for m in self._moved if role.block.covers(m)]:
                del self._moved[moved]
        dropped: list[Block] = []
        if exclusive:
            listed = [r.block for r in roles]
            gone = [h for h in self._held if not any(b.covers(h.block) for b in listed)]
            self._replace(gone, [])
            dropped = [h.block for h in gone]
            self._frozen = [f for f in self._frozen if any(b.covers(f) for b in listed)]
            self.suspended = False
        return Assignment(added, dropped)

    def check_assign(self, roles: list[Role]) -> None:
        """Raise what `assign` would raise for `roles`, changing nothing."""
        for i, role in enumerate(roles):
            self._check(role.block)
            names = [m.name for m in role.members]
            if role.epoch < 0:
                raise InvalidArgument(f"role for {role.block}: epoch {role.epoch} is negative")
            if self.name not in names or len(set(names)) != len(names):
                raise InvalidArgument(f"role for {role.block}: this agent ({self.name}) must be "
                                      f"one of its members, each listed once: {names}")
            if role.primary != (names[0] == self.name):
                raise InvalidArgument(f"role for {role.block}: members are listed primary first, "
                                      f"so primary must be {names[0] == self.name}")
            for other in roles[:i]:
                if other.block.covers(role.block) or role.block.covers(other.block):
                    raise InvalidArgument(f"roles for {other.block} and {role.block} overlap")
        for role in roles:
            for old in self.overlapping(role.block):
                if old.epoch > role.epoch:
                    raise OwnershipError(f"cannot assign {role.block} at epoch {role.epoch}: "
                                         f"{old.block} is held at the newer epoch {old.epoch}")

    def _taken(self, role: Role, olds: list[Held]) -> Held:
        """The held block for a new role. Within the same epoch the state this
        primary learned stays: fenced or degraded, and which members it knows
        to be synced or dropped; a newer epoch starts afresh."""
        same = [o for o in olds if o.epoch == role.epoch]
        known = {p.name: p for o in same for p in o.peers}
        members = [dataclasses.replace(m, synced=True)
                   if not m.synced and m.name in known and known[m.name].synced else m
                   for m in role.members]
        role = dataclasses.replace(role, members=members)
        peers: tuple[Peer, ...] = ()
        if role.primary:
            peers = tuple(self._peer(m, known.get(m.name)) for m in members[1:])
        return self._refreshed(Held(role, peers, fenced=any(o.fenced for o in same),
                                    degraded=any(o.degraded for o in same)))

    @staticmethod
    def _peer(member: Member, known: Peer | None) -> Peer:
        if known is None or member.synced:  # the controller's word that it is synced stands
            return Peer(member.name, member.replication, member.synced, member.synced)
        return Peer(member.name, member.replication, known.synced, known.required, known.streamed)

    def _part(self, old: Held, part: Block) -> Held:
        return self._refreshed(Held(dataclasses.replace(old.role, block=part),
                                    tuple(dataclasses.replace(p) for p in old.peers),
                                    old.fenced, old.degraded))

    def _refreshed(self, held: Held) -> Held:
        self._refresh(held)
        return held

    def fence(self, block: Block, newer: int) -> list[Block]:
        """A member holds `block` at epoch `newer`: every primary part of it
        held at an older epoch stops serving. Returns the parts fenced now."""
        fenced = []
        for held in self.overlapping(block):
            if held.role.primary and held.epoch < newer and not held.fenced:
                held.fenced = True
                self._refresh(held)
                fenced.append(held.block)
        return fenced

    def degrade(self, block: Block, epoch: int) -> list[Block]:
        """A synced member did not acknowledge a write to `block` at `epoch`:
        hold the primary parts of that epoch back. Returns the parts degraded now."""
        degraded = []
        for held in self.overlapping(block):
            if held.role.primary and held.epoch == epoch and not held.degraded:
                held.degraded = True
                self._refresh(held)
                degraded.append(held.block)
        return degraded

    def update_peer(self, block: Block, epoch: int, name: str, *, required: bool | None = None,
                    streamed: bool | None = None, synced: bool = False) -> None:
        """Change how this primary streams `block` (at `epoch`) to member `name`;
        `synced` also records it in the role, as the controller will."""
        for held in self.overlapping(block):
            if held.epoch != epoch or not held.role.primary:
                continue
            for peer in held.peers:
                if peer.name == name:
                    if required is not None:
                        peer.required = required
                    if streamed is not None:
                        peer.streamed = streamed
                    peer.synced = peer.synced or synced
            if synced:
                members = [dataclasses.replace(m, synced=True) if m.name == name else m
                           for m in held.role.members]
                held.role = dataclasses.replace(held.role, members=members)
        self._changed()

    # -- giving blocks away --------------------------------------------------

    def owns_all(self, blocks: Iterable[Block]) -> bool:
        """Whether this agent is the primary of every ID of `blocks`."""
        for block in blocks:
            held = self._covering(block)
            if held is None or not held.role.primary:
                return False
        return True

    def unheld(self, block: Block) -> list[Block]:
        """The parts of `block` not held here (in any role), as disjoint blocks."""
        if self._covering(block) is not None:
            return []
        parts = [block]
        for held in self._held:
            if block.covers(held.block):  # blocks nest or are disjoint: each lies in one part
                parts = [q for p in parts for q in (subtract(p, held.block) if p.covers(held.block) else [p])]
        return parts

    def _covering(self, block: Block) -> Held | None:
        held = self.held_at(block.first)
        return held if held is not None and held.block.covers(block) else None

    def _check(self, block: Block) -> None:
        if block.width != self.width:
            raise OwnershipError(f"{block} is not a {self.width}-bit block")

    def disown(self, blocks: Iterable[Block], moved_to: str | None = None) -> list[Block]:
        """Stop answering for every ID of `blocks`, in whatever role each is held.

        A block inside a held one is cut out of it (a split hands away half
        of one); held blocks inside a given one are released whole; a block
        held nowhere is left alone. So the call means "none of these IDs is
        held here afterwards", and a repeated or retried disown, or one over
        a block that was already partly handed away, converges instead of
        failing half-way. Every block is checked before any is released.
        Returns what was released: disjoint blocks, each inside one of `blocks`."""
        blocks = self._checked(blocks)
        released = []
        for block in blocks:
            owner = self._covering(block)
            if owner is not None:
                self._replace([owner], [self._part(owner, part) for part in subtract(owner.block, block)])
                gone = [block]
            else:
                parts = [h for h in self._held if block.covers(h.block)]
                if not parts:
                    continue  # none of it is ours: disowning is idempotent
                self._replace(parts, [])
                gone = [h.block for h in parts]
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

    def _replace(self, old: list[Held], new: list[Held]) -> None:
        """Swap held parts, keeping them sorted and the bisect index in step."""
        gone = {id(h) for h in old}
        self._held = sorted([h for h in self._held if id(h) not in gone] + new, key=lambda h: h.block)
        self._firsts = [h.block.first for h in self._held]
        self._changed()

    def freeze(self, blocks: Iterable[Block]) -> None:
        blocks = self._checked(blocks)
        for block in blocks:
            if not self.owns_all([block]):
                raise OwnershipError(f"cannot freeze {block}: this agent is not its primary")
        for block in blocks:
            if block not in self._frozen:
                self._frozen.append(block)
        self._changed()

    def unfreeze(self, blocks: Iterable[Block]) -> None:
        for block in blocks:
            if block in self._frozen:
                self._frozen.remove(block)
        self._changed()
