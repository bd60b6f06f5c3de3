"""One storage server's agent state and the operations the admin API exposes.

`Agent` ties the store, the ownership view and the service together and
keeps the held roles persisted in the store (the state document, saved
synchronously), so a restarted agent, and a restarted controller asking
it, finds the same partition with its epochs. The admin API (`admin.py`)
only authenticates and decodes; everything that changes state is here,
where tests can call it directly, and answers in the typed bodies of
`client_lib.api.admin`.

A restarted agent that has a controller comes back *suspended*
(`Ownership.suspended`): it remembers its roles and reports them, but
serves nothing and applies no replication until the controller says what
it may hold (an exclusive assignment), because the controller may have
declared it failed and given its blocks to others meanwhile.

The state document also keeps the highest leadership term the agent has
seen (`nat_agent.fence`), so a restarted agent still refuses calls from a
leader controller older than one it obeyed.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import time
from collections.abc import AsyncGenerator, Callable
from dataclasses import dataclass, field
from typing import cast

from client_lib.api import codec
from client_lib.api.admin import (
    AssignRequest,
    BlockKeys,
    BlocksReport,
    DumpPage,
    Health,
    Member,
    Role,
    encode_records,
)
from client_lib.cidr import Block
from client_lib.errors import Conflict, InvalidArgument, NotFound
from nat_agent.fence import TermFence
from nat_agent.ownership import Ownership, solo_role
from nat_agent.store import Record, Store

log = logging.getLogger("metaflow.agent")

MAX_DUMP = 10_000
"""Records per ``POST /dump`` page at most: the answer, values included,
stays far below what a client holds in memory at once."""


@dataclass(frozen=True)
class Identity:
    """What the controller needs to know to route to and manage this server."""

    name: str
    data_ip: str | None
    data_mac: str | None
    data_port: int
    admin_url: str
    capacity: int
    replication: str = ""
    """host:port of the replication listener (where primaries stream to it)."""

    @property
    def data_address(self) -> str | None:
        """Where clients reach the metadata service (a MOVED hint), if known."""
        return f"{self.data_ip}:{self.data_port}" if self.data_ip else None


@dataclass
class Import:
    """Blocks arriving from another agent, held unserved until the cut-over."""

    blocks: list[Block]
    records: int = 0
    started: float = field(default_factory=time.monotonic)


class InFlight:
    """The requests that passed the ownership check but have not finished.

    A request is checked against the ownership view and then awaits the
    store. A migration that freezes a block in between must not start copying
    until such a write has landed (the copy would miss an acknowledged write),
    and a disown must not delete keys under a read that was already admitted.
    `drain` waits for exactly the requests in flight when it is called.
    Entering and leaving are plain calls (no future per request): they sit on
    every request's path, and only a drain, which is rare, allocates.
    """

    def __init__(self) -> None:
        self._next = 0
        self._pending: set[int] = set()
        self._waiters: list[tuple[set[int], asyncio.Future[None]]] = []
        self.barrier: Callable[[], None] | None = None
        """The compiled path's requests on other threads (`ServiceLoop.barrier`):
        waits, briefly and blocking, for those admitted before the call."""

    def begin(self) -> int:
        self._next += 1
        self._pending.add(self._next)
        return self._next

    def end(self, token: int) -> None:
        self._pending.discard(token)
        if self._waiters:
            for awaited, done in self._waiters:
                awaited.discard(token)
                if not awaited and not done.done():
                    done.set_result(None)
            self._waiters = [w for w in self._waiters if not w[1].done()]

    async def drain(self) -> None:
        if self.barrier is not None:
            self.barrier()
        if self._pending:
            done = asyncio.get_running_loop().create_future()
            self._waiters.append((set(self._pending), done))
            await done


def _overlap(a: Block, b: Block) -> bool:
    return a.first <= b.last and b.first <= a.last


class Agent:
    def __init__(self, identity: Identity, store: Store, space: Block) -> None:
        self.identity = identity
        self.store = store
        self.space = space
        self.ownership = Ownership(space.width, identity.name)
        self.inflight = InFlight()
        self.imports: dict[str, Import] = {}
        self.started = time.monotonic()
        self.fence = TermFence()
        self._changing = asyncio.Lock()  # one change of roles at a time: each awaits the store

    # -- roles, persisted ----------------------------------------------------

    async def load(self, own: list[Block] | None, suspended: bool = False) -> None:
        """Roles at start: the primary of a set of one for each block of `own`
        if given (and persisted), else what the store remembers from the
        previous run, else none. `suspended`: serve nothing until the
        controller says what to hold. The kept term is always restored."""
        state = await self.store.load_state() or {}
        term = state.get("term", 0)
        self.fence = TermFence(term if isinstance(term, int) and term > 0 else 0)
        if own is None:
            roles = self._restored(state)
            if roles:
                log.info("restored %d roles from the store%s", len(roles),
                         "; suspended until the controller confirms them" if suspended else "")
        else:
            for block in own:
                self.check_block(block)
            roles = [solo_role(b, self.identity.name, self.identity.replication) for b in own]
        for role in roles:
            self.check_block(role.block)
        self.ownership.assign(roles)
        self.ownership.suspended = suspended
        await self._persist()

    def _restored(self, state: dict[str, object]) -> list[Role]:
        """The roles of a state document (or of one written before roles
        existed: its owned blocks, as the primary of a set of one), as this
        agent is now: its replication address may have changed, and so may
        its name (a set of one is still its own; a set that knows it by
        another name is not, and the block is left unheld)."""
        me = self.identity
        saved = state.get("roles")
        if not isinstance(saved, list):
            owned = state.get("owned")
            return [solo_role(Block.parse(b), me.name, me.replication)
                    for b in (owned if isinstance(owned, list) else [])]
        roles = []
        for role in (codec.from_json(Role, r, where="saved role") for r in saved):
            names = [m.name for m in role.members]
            if me.name in names:
                members = [Member(me.name, me.replication, m.synced) if m.name == me.name else m
                           for m in role.members]
                roles.append(dataclasses.replace(role, members=members))
            elif len(names) == 1:
                roles.append(solo_role(role.block, me.name, me.replication, role.epoch))
            else:
                log.warning("not restoring %s (epoch %d): its set %s does not name this agent (%s)",
                            role.block, role.epoch, names, me.name)
        return roles

    async def _persist(self) -> None:
        await self.store.save_state({"roles": codec.to_json(self.ownership.roles), "term": self.fence.term})

    async def admit_term(self, term: int | None, what: str) -> None:
        """The term fence (`nat_agent.fence`): StaleTerm (409) for `what`
        from an older leader; a newer term is saved before `what` acts."""
        if self.fence.admit(term, what):
            async with self._changing:
                await self._persist()
            log.info("leadership term %d: refusing anything from an older leader", self.fence.term)

    def check_block(self, block: Block) -> None:
        """A block of another space can never be served here: bad input (400)."""
        if block.width != self.space.width or not self.space.covers(block):
            raise InvalidArgument(f"{block} is not inside the MetaDataID space {self.space}")

    async def assign(self, request: AssignRequest) -> list[Role]:
        """Take the roles (`AssignRequest` says what that means). The records
        of newly held parts are wiped first, unless `migration` brought them,
        so a stale copy (an interrupted import, a life before a failure) never
        resurfaces; an exclusive assignment drops and deletes the rest."""
        roles = request.roles
        for role in roles:
            self.check_block(role.block)
        async with self._changing:
            self.ownership.check_assign(roles)
            arriving = self.imports.get(request.migration) if request.migration else None
            if request.migration and arriving is None:
                if not self.ownership.holds_at(roles):
                    raise NotFound(f"no import {request.migration!r} in progress", 404)
                # The adoption happened and its answer was lost: the records are the import's.
                kept = [r.block for r in roles]
            else:
                kept = arriving.blocks if arriving else []
            for role in roles:
                for part in self.ownership.unheld(role.block):
                    if not any(k.covers(part) for k in kept):
                        await self.store.delete_range(part.first, part.last)
            assignment = self.ownership.assign(roles, request.exclusive)
            if request.migration:
                self.imports.pop(request.migration, None)
            if assignment.dropped:
                await self.inflight.drain()
            await self._persist()
            deleted = 0
            for block in assignment.dropped:
                deleted += await self.store.delete_range(block.first, block.last)
        log.info("assigned %s%s%s", ", ".join(f"{r.block}@{r.epoch}{'' if r.primary else ' (backup)'}"
                                              for r in roles) or "nothing",
                 f" (migration {request.migration})" if request.migration else "",
                 f"; dropped {', '.join(map(str, assignment.dropped))} ({deleted} keys)"
                 if assignment.dropped else "")
        return self.ownership.roles

    async def disown(self, blocks: list[Block], delete: bool = True,
                     moved_to: str | None = None) -> list[Block]:
        """Stop holding `blocks` (any role) first, then drop their keys, so no
        request can see a half-deleted block."""
        for block in blocks:
            self.check_block(block)
        async with self._changing:
            released = self.ownership.disown(blocks, moved_to)
            await self.inflight.drain()
            await self._persist()
            deleted = 0
            if delete:
                for block in released:
                    deleted += await self.store.delete_range(block.first, block.last)
        log.info("released %s (moved to %s, %d keys deleted)",
                 ", ".join(map(str, released)) or "nothing", moved_to or "unknown", deleted)
        return released

    async def persist(self) -> None:
        """Save the roles after the replication changed one (a member synced)."""
        async with self._changing:
            await self._persist()

    # -- counts --------------------------------------------------------------

    def check_range(self, first: int, last: int) -> None:
        """An inclusive ID range asked about must be a range of this space: bad input (400)."""
        if first > last or not (self.space.contains(first) and self.space.contains(last)):
            raise InvalidArgument(f"range {first}..{last} is empty or outside {self.space}")

    async def count(self, first: int, last: int) -> int:
        self.check_range(first, last)
        return await self.store.count(first, last)

    async def blocks_report(self) -> BlocksReport:
        """Every held block (primary or backup: both keep records here)."""
        frozen = self.ownership.frozen
        blocks = [BlockKeys(b, await self.store.count(b.first, b.last),
                            any(b.covers(f) or f.covers(b) for f in frozen))
                  for b in self.ownership.held]
        return BlocksReport(blocks, sum(b.keys for b in blocks))

    async def health(self) -> Health:
        ident, ownership = self.identity, self.ownership
        return Health("ok", ident.name, self.store.kind, self.space, ident.data_ip, ident.data_mac,
                      ident.data_port, ident.admin_url, ident.capacity, await self.store.total(),
                      ownership.owned, ownership.frozen, sorted(self.imports),
                      round(time.monotonic() - self.started, 1), ownership.roles, ownership.suspended)

    # -- snapshots -------------------------------------------------------------

    def primary_epoch(self, block: Block, epoch: int | None = None) -> int:
        """The epoch at which this agent is `block`'s primary (one held part
        covers it; not fenced, not suspended), which must be `epoch` when
        given: else 409, saying what it holds, so a snapshot or a restore that
        reached the wrong server, or a block that moved on, asks again."""
        self.check_block(block)
        ownership = self.ownership
        parts = ownership.overlapping(block)
        held = parts[0] if len(parts) == 1 and parts[0].block.covers(block) else None
        if ownership.suspended or held is None or not held.role.primary or held.fenced \
                or (epoch is not None and held.epoch != epoch):
            holds = ", ".join(f"{h.block}@{h.epoch}{'' if h.role.primary else ' (backup)'}"
                              f"{' fenced' if h.fenced else ''}" for h in parts) or "nothing of it"
            at = "" if epoch is None else f" at epoch {epoch}"
            raise Conflict(f"{block} is not held here as its primary{at}: this agent holds {holds}"
                           f"{' (suspended)' if ownership.suspended else ''}", 409)
        return held.epoch

    async def dump(self, block: Block, epoch: int | None, after: tuple[int, str] | None,
                   limit: int) -> DumpPage:
        """Up to `limit` of `block`'s records after `after`, as its primary at
        `epoch` (the one held if None), checked before and after the read:
        a page that straddles a change of epoch is refused."""
        if not 0 < limit <= MAX_DUMP:
            raise InvalidArgument(f"limit must be 1 to {MAX_DUMP} records, not {limit}")
        if after is not None and not self.space.contains(after[0]):
            raise InvalidArgument(f"after: ID {after[0]:#x} is outside {self.space}")
        held = self.primary_epoch(block, epoch)
        records: list[Record] = []
        scan = self.store.scan(block.first, block.last, limit + 1, after)
        # both stores' scans are async generators: close this one at once, not when collected
        async with contextlib.aclosing(cast(AsyncGenerator[list[Record], None], scan)) as pages:
            async for chunk in pages:
                records += chunk
                if len(records) > limit:
                    break
        self.primary_epoch(block, held)
        return DumpPage(block, held, encode_records(records[:limit]), len(records) > limit)

    # -- receiving side of a migration ----------------------------------------

    async def import_begin(self, migration: str, blocks: list[Block]) -> None:
        """Prepare to receive `blocks`: this agent must not be their primary,
        and leftovers of an earlier interrupted import are cleared so the copy
        is exact. Parts held here as a backup keep their records (the copy
        brings the same ones): wiping them would take a replica away while
        the block is still served elsewhere. An earlier import of the same
        IDs whose discard never arrived is superseded, so that a late discard
        of it cannot delete this copy."""
        for block in blocks:
            self.check_block(block)
            for held in self.ownership.overlapping(block):
                if held.role.primary:
                    raise Conflict(f"cannot import {block}: this agent is the primary of {held.block}",
                                   409)
        for other, arriving in list(self.imports.items()):
            if any(_overlap(a, b) for a in arriving.blocks for b in blocks):
                del self.imports[other]
                log.info("import %s superseded by import %s", other, migration)
        for block in blocks:
            for part in self.ownership.unheld(block):
                await self.store.delete_range(part.first, part.last)
        self.imports[migration] = Import(blocks)

    async def import_records(self, migration: str, records: list[Record]) -> int:
        arriving = self.imports.get(migration)
        if arriving is None:
            raise NotFound(f"no import {migration!r} in progress", 404)
        for ident, _, _ in records:
            if not any(b.contains(ident) for b in arriving.blocks):
                shown = self.space.address(ident) if self.space.contains(ident) else f"{ident:#x}"
                raise InvalidArgument(f"record with ID {shown} is outside the blocks of import {migration}")
        await self.store.put_many(records)
        arriving.records += len(records)
        return arriving.records

    async def import_discard(self, migration: str) -> None:
        """Drop an unfinished import: its records, except in parts held here."""
        arriving = self.imports.pop(migration, None)
        if arriving is None:
            return
        for block in arriving.blocks:
            for part in self.ownership.unheld(block):
                await self.store.delete_range(part.first, part.last)
        log.info("discarded import %s (%d records)", migration, arriving.records)
