"""One storage server's agent state and the operations the admin API exposes.

`Agent` ties the store, the ownership view and the service together and
keeps the owned blocks persisted in the store, so a restarted agent (and a
restarted controller asking it) finds the same partition. The admin API
(`admin.py`) only authenticates and decodes; everything that changes state
is here, where tests can call it directly, and answers in the typed bodies
of `client_lib.api.admin`.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass, field

from client_lib.api.admin import BlockKeys, BlocksReport, Health
from client_lib.cidr import Block
from client_lib.errors import Conflict, InvalidArgument, NotFound
from nat_agent.ownership import Ownership
from nat_agent.store import Record, Store

log = logging.getLogger("metaflow.agent")


@dataclass(frozen=True)
class Identity:
    """What the controller needs to know to route to and manage this server."""

    name: str
    data_ip: str | None
    data_mac: str | None
    data_port: int
    admin_url: str
    capacity: int


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
        self.ownership = Ownership(space.width)
        self.inflight = InFlight()
        self.imports: dict[str, Import] = {}
        self.started = time.monotonic()

    # -- ownership, persisted ------------------------------------------------

    async def load(self, own: list[Block] | None) -> None:
        """Ownership at start: `own` if given (and persisted), else what the
        store remembers from the previous run, else idle."""
        if own is None:
            state = await self.store.load_state() or {}
            own = [Block.parse(b) for b in state.get("owned", [])]
            if own:
                log.info("restored %d owned blocks from the store", len(own))
        for block in own:
            self.check_block(block)
        self.ownership.own(own)
        await self._persist()

    async def _persist(self) -> None:
        await self.store.save_state({"owned": [str(b) for b in self.ownership.owned]})

    def check_block(self, block: Block) -> None:
        """A block of another space can never be served here: bad input (400)."""
        if block.width != self.space.width or not self.space.covers(block):
            raise InvalidArgument(f"{block} is not inside the MetaDataID space {self.space}")

    async def own(self, blocks: list[Block], migration: str | None = None) -> list[Block]:
        """Start serving `blocks`. Records of the parts already owned here are
        kept (owning a block may swallow smaller owned ones: a merge back), and
        so are those that arrived through `migration`; anything else there is
        stale (an interrupted import) and must not resurface, so it is wiped."""
        for block in blocks:
            self.check_block(block)
        arrived = self.imports.pop(migration, None) if migration else None
        if migration and arrived is None:
            raise NotFound(f"no import {migration!r} in progress", 404)
        kept = set(arrived.blocks) if arrived else set()
        for block in blocks:
            if block not in kept:
                for part in self.ownership.unowned(block):
                    await self.store.delete_range(part.first, part.last)
        added = self.ownership.own(blocks)
        await self._persist()
        log.info("now owning %s%s", ", ".join(map(str, added)) or "nothing new",
                 f" (migration {migration})" if migration else "")
        return added

    async def disown(self, blocks: list[Block], delete: bool = True,
                     moved_to: str | None = None) -> list[Block]:
        """Stop serving `blocks` first, then drop their keys, so no request can
        see a half-deleted block."""
        for block in blocks:
            self.check_block(block)
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

    # -- counts --------------------------------------------------------------

    async def count(self, first: int, last: int) -> int:
        if first > last or not (self.space.contains(first) and self.space.contains(last)):
            raise InvalidArgument(f"range {first}..{last} is empty or outside {self.space}")
        return await self.store.count(first, last)

    async def blocks_report(self) -> BlocksReport:
        frozen = self.ownership.frozen
        blocks = [BlockKeys(b, await self.store.count(b.first, b.last),
                            any(b.covers(f) or f.covers(b) for f in frozen))
                  for b in self.ownership.owned]
        return BlocksReport(blocks, sum(b.keys for b in blocks))

    async def health(self) -> Health:
        ident = self.identity
        return Health("ok", ident.name, self.store.kind, self.space, ident.data_ip, ident.data_mac,
                      ident.data_port, ident.admin_url, ident.capacity, await self.store.total(),
                      self.ownership.owned, self.ownership.frozen, sorted(self.imports),
                      round(time.monotonic() - self.started, 1))

    # -- receiving side of a migration ----------------------------------------

    async def import_begin(self, migration: str, blocks: list[Block]) -> None:
        """Prepare to receive `blocks`: they must not be ours, and leftovers of
        an earlier interrupted import are cleared so the copy is exact. An
        earlier import of the same IDs whose discard never arrived is
        superseded, so that a late discard of it cannot delete this copy."""
        for block in blocks:
            self.check_block(block)
            if any(_overlap(block, b) for b in self.ownership.owned):
                raise Conflict(f"cannot import {block}: it overlaps blocks owned here", 409)
        for other, arriving in list(self.imports.items()):
            if any(_overlap(a, b) for a in arriving.blocks for b in blocks):
                del self.imports[other]
                log.info("import %s superseded by import %s", other, migration)
        for block in blocks:
            await self.store.delete_range(block.first, block.last)
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
        arriving = self.imports.pop(migration, None)
        if arriving is None:
            return
        for block in arriving.blocks:
            if not self.ownership.owns_all([block]):
                await self.store.delete_range(block.first, block.last)
        log.info("discarded import %s (%d records)", migration, arriving.records)
