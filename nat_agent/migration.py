"""Moving blocks to a new replica set without losing an acknowledged write,
and without ever leaving a block frozen.

The sending agent (the blocks' primary) drives it, in steps so that the
controller can assign the new set and swap the flow entries in between:

1. `migrate` (``POST /migrations``): check that every target (the new set's
   members, primary first) is an agent of this cluster, freeze writes to
   the blocks (clients get TRYAGAIN and retry), let the writes under way
   finish (replicated or not), and stream every record of the blocks to
   each target's admin API, where they sit unserved. The migration is then
   ``copied`` and holds a lease.
2. The controller assigns the targets their roles (``/assign`` with the
   migration id, which keeps the imported records) and moves the flows.
3. `commit` (``POST /migrations/{id}/commit``): this agent stops serving
   (MOVED, naming the first target, for stragglers) and deletes its copy.

Anything that fails before the commit ends in an abort: this agent
unfreezes and keeps serving, every target drops its copy. Nothing is
deleted here before the commit, so no failure loses data.

Who may be a target. The source talks to the targets only through
`AsyncApiClient` with the cluster's secret, which checks that every
response is signed with it. Before freezing anything the source asks each
target's ``/health``: a URL that does not hold the secret (an attacker's
listener, a stale address) fails there, so it never receives a record, nor
even a request that changes something; and a target that turns out to be
this agent itself, or to use another MetaDataID space, is refused.

The lease. A copied migration that nobody commits or aborts within its
``lease_s`` (`MigrateRequest`, default 60 s) aborts by itself: a controller
that died mid-split leaves no block refusing writes for longer than that.
Every call to a target has a timeout (``--peer-timeout``), so the copy
cannot hang on a silent target. The copy runs in a task of its own, not in
the HTTP request that asked for it, so a caller that goes away does not
stop it half-way; an abort during the copy cancels it. Finished migrations
are kept (the most recent `KEEP_FINISHED`) so that a restarted controller
can list them and learn how each ended.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
import uuid
from collections.abc import AsyncIterator, Coroutine
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

from client_lib.api.admin import (
    ADMIN,
    Health,
    ImportBegin,
    ImportRecords,
    MigrateRequest,
    MigrationReport,
    encode_records,
)
from client_lib.api.clients import DEFAULT_TIMEOUT, AsyncApiClient
from client_lib.cidr import Block
from client_lib.errors import ApiError, Conflict, InvalidArgument, NotFound
from nat_agent.agent import Agent
from nat_agent.replication import Replicator
from nat_agent.store import Record

log = logging.getLogger("metaflow.agent.migration")

BATCH = 500
"""Records per store scan, and at most per ``/records`` call."""
BATCH_BYTES = 4 << 20
"""Encoded bytes per ``/records`` call: far under the admin API's body limit
even when every value is as large as the service allows."""
KEEP_FINISHED = 256

COPYING, COPIED, COMMITTED, ABORTED = "copying", "copied", "committed", "aborted"


class MigrationError(ApiError):
    """A migration that could not proceed because a target failed or could
    not be trusted (the admin API answers 502); the source still owns and
    serves its blocks."""

    def __init__(self, message: str) -> None:
        super().__init__(message, 502)


@dataclass(eq=False)
class Migration:
    id: str
    blocks: list[Block]
    targets: list[str]               # the new set's admin URLs, primary first
    lease_s: float
    moved_to: str | None = None      # the first target's data address: the MOVED hint after the commit
    state: str = COPYING
    keys: int = 0
    error: str | None = None
    started: float = field(default_factory=time.monotonic)
    finished: float | None = None
    lease_until: float | None = None  # monotonic; set while copied
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    task: asyncio.Task[None] | None = None  # the copy, then the lease timer

    def lease_left(self) -> float | None:
        return None if self.lease_until is None else max(0.0, self.lease_until - time.monotonic())

    def report(self) -> MigrationReport:
        left = self.lease_left()
        return MigrationReport(self.id, list(self.blocks), list(self.targets), self.state, self.keys,
                               self.error, round((self.finished or time.monotonic()) - self.started, 4),
                               None if left is None else round(left, 3))


def _by_size(records: list[Record]) -> list[list[Record]]:
    """`records` cut into runs whose encoded size stays under `BATCH_BYTES`."""
    runs: list[list[Record]] = [[]]
    size = 0
    for record in records:
        cost = len(record[1]) + len(record[2]) * 4 // 3 + 32
        if runs[-1] and size + cost > BATCH_BYTES:
            runs.append([])
            size = 0
        runs[-1].append(record)
        size += cost
    return runs


def _endpoint(url: str) -> tuple[str, int]:
    """(host, port) of an admin URL; InvalidArgument unless it is http://HOST[:PORT]."""
    wrong = InvalidArgument(f"target must be an agent's admin URL, http://HOST:PORT, not {url!r}")
    try:
        parts = urlsplit(url)
        port = parts.port or 80
    except ValueError:
        raise wrong from None
    if parts.scheme != "http" or not parts.hostname:
        raise wrong
    return parts.hostname.lower(), port


class Migrator:
    """The sending side of migrations, for one agent. `secret` is the
    cluster's: a target must answer with it. `timeout` bounds every call
    to a target."""

    def __init__(self, agent: Agent, replicator: Replicator, secret: bytes,
                 timeout: float = DEFAULT_TIMEOUT) -> None:
        self.agent = agent
        self.replicator = replicator
        self.migrations: dict[str, Migration] = {}
        self._secret = secret
        self._timeout = timeout

    def _peer(self, url: str) -> AsyncApiClient:
        return AsyncApiClient(url, self._secret, timeout=self._timeout)

    def get(self, ident: str) -> Migration:
        try:
            return self.migrations[ident]
        except KeyError:
            raise NotFound(f"no migration {ident!r}", 404) from None

    def reports(self) -> list[MigrationReport]:
        return [m.report() for m in self.migrations.values()]

    # -- steps ---------------------------------------------------------------

    async def migrate(self, request: MigrateRequest) -> Migration:
        """Check, freeze, copy. Returns the copied migration; raises
        MigrationError if it aborted."""
        targets = [t.rstrip("/") for t in request.targets]
        self._check(request, targets)
        first = None
        for target in targets:
            health = await self._vet_target(target)
            first = first or health
        assert first is not None  # _check: at least one target
        migration = Migration(uuid.uuid4().hex[:12], list(request.blocks), targets, request.lease_s,
                              f"{first.data_ip}:{first.data_port}" if first.data_ip else None)
        self._check(request, targets)  # again: another migration may have frozen them meanwhile
        self._remember(migration)
        self.agent.ownership.freeze(migration.blocks)
        log.info("migration %s: %s -> %s, writes frozen", migration.id,
                 ", ".join(map(str, migration.blocks)), ", ".join(targets))
        migration.task = self._spawn(self._copy(migration), migration)
        await asyncio.shield(migration.task)
        if migration.state == ABORTED:
            raise MigrationError(f"migration {migration.id} aborted: {migration.error}")
        return migration

    def _check(self, request: MigrateRequest, targets: list[str]) -> None:
        blocks, ownership = request.blocks, self.agent.ownership
        if not blocks:
            raise InvalidArgument("nothing to migrate: no blocks given")
        if not targets:
            raise InvalidArgument("nowhere to migrate to: no targets given")
        if not (math.isfinite(request.lease_s) and request.lease_s > 0):
            raise InvalidArgument(f"lease_s must be a positive number of seconds, not {request.lease_s}")
        endpoints = [_endpoint(t) for t in targets]
        if len(set(endpoints)) != len(endpoints):
            raise InvalidArgument(f"targets must be different agents: {', '.join(targets)}")
        for target, endpoint in zip(targets, endpoints, strict=True):
            if endpoint == _endpoint(self.agent.identity.admin_url):
                raise InvalidArgument(f"target {target} is this agent's own admin API")
        for block in blocks:
            self.agent.check_block(block)
        if not ownership.owns_all(blocks):
            raise Conflict(f"cannot migrate {', '.join(map(str, blocks))}: this agent is not the "
                           "primary of all of them", 409)
        busy = [f for f in ownership.frozen for b in blocks if f.covers(b) or b.covers(f)]
        if busy:
            raise Conflict(f"{busy[0]} is already being migrated", 409)

    async def _vet_target(self, target: str) -> Health:
        """The target must prove it holds the cluster's secret (a signed
        answer), and be another agent of the same space."""
        try:
            health = await self._peer(target).call(ADMIN.health)
        except ApiError as exc:
            raise MigrationError(f"target {target} refused before anything was frozen: {exc}") from None
        if health.name == self.agent.identity.name:
            raise InvalidArgument(f"target {target} is this agent ({health.name}) itself")
        if health.space != self.agent.space:
            raise MigrationError(f"target {target} serves the space {health.space}, "
                                 f"not {self.agent.space}")
        return health

    async def _copy(self, migration: Migration) -> None:
        peers = [self._peer(t) for t in migration.targets]
        try:
            await self.agent.inflight.drain()
            await self.replicator.quiesce(migration.blocks)
            await asyncio.gather(*(peer.call(ADMIN.import_begin, ImportBegin(migration.blocks),
                                             id=migration.id) for peer in peers))
            async for batch in self._batches(migration.blocks):
                body = ImportRecords(encode_records(batch))
                await asyncio.gather(*(peer.call(ADMIN.import_records, body, id=migration.id)
                                       for peer in peers))
                migration.keys += len(batch)
        except asyncio.CancelledError:
            await self._abort(migration, migration.error or "copy cancelled")
            return
        except Exception as exc:  # whatever it was, the blocks must not stay frozen
            if not isinstance(exc, ApiError):
                log.error("migration %s: copy failed", migration.id, exc_info=exc)
            await self._abort(migration, f"copy failed: {exc}")
            return
        migration.state = COPIED
        migration.lease_until = time.monotonic() + migration.lease_s
        migration.task = self._spawn(self._expire(migration), migration)
        log.info("migration %s: %d keys copied to %d targets; lease %.1f s", migration.id, migration.keys,
                 len(peers), migration.lease_s)

    async def _batches(self, blocks: list[Block]) -> AsyncIterator[list[Record]]:
        for block in blocks:
            async for scanned in self.agent.store.scan(block.first, block.last, BATCH):
                for run in _by_size(scanned):
                    yield run

    async def _expire(self, migration: Migration) -> None:
        await asyncio.sleep(migration.lease_left() or 0.0)
        async with migration.lock:
            if migration.state == COPIED:
                await self._abort(migration, f"lease of {migration.lease_s:g} s expired "
                                             "without a commit or an abort")

    async def commit(self, ident: str) -> Migration:
        """The targets hold the blocks now (the controller assigned them): stop
        serving here and delete. Committing a committed migration again
        answers its report (a controller's retry)."""
        migration = self.get(ident)
        async with migration.lock:
            if migration.state == COMMITTED:
                return migration
            if migration.state == COPIED and migration.lease_left() == 0.0:
                await self._abort(migration, f"lease of {migration.lease_s:g} s expired before the commit")
            if migration.state != COPIED:
                why = f" ({migration.error})" if migration.error else ""
                raise Conflict(f"migration {ident} is {migration.state}, not copied{why}", 409)
            self._stop_task(migration)
            migration.lease_until = None
            try:
                await self.agent.disown(migration.blocks, delete=True, moved_to=migration.moved_to)
            finally:  # the targets serve now, whether or not our deletion went through
                migration.state = COMMITTED
                migration.finished = time.monotonic()
        log.info("migration %s committed in %.3f s", ident, migration.finished - migration.started)
        return migration

    async def abort(self, ident: str) -> Migration:
        """Unfreeze here, discard at every target. Aborting an aborted migration
        again answers its report; a committed one cannot be aborted."""
        migration = self.get(ident)
        if migration.state == COPYING and migration.task is not None:
            migration.error = "aborted by request during the copy"
            migration.task.cancel()
            await asyncio.gather(migration.task, return_exceptions=True)
        async with migration.lock:
            if migration.state == COMMITTED:
                raise Conflict(f"migration {ident} is already committed", 409)
            if migration.state != ABORTED:
                await self._abort(migration, "aborted by request")
        return migration

    async def close(self) -> None:
        """On shutdown: stop copies and lease timers, and abort what is not
        finished, so that no target keeps an orphaned copy."""
        tasks = [m.task for m in self.migrations.values() if m.task is not None]
        for migration in self.migrations.values():
            if migration.state == COPYING:
                migration.error = "the agent is shutting down"
            self._stop_task(migration)
        await asyncio.gather(*tasks, return_exceptions=True)
        await asyncio.gather(*(self._abort(m, "the agent is shutting down")
                               for m in self.migrations.values() if m.state == COPIED))

    # -- compensations ---------------------------------------------------------

    async def _abort(self, migration: Migration, reason: str) -> None:
        """Serve the blocks again here first, then ask every target to drop its copy."""
        self._stop_task(migration)
        self.agent.ownership.unfreeze(migration.blocks)
        migration.state = ABORTED
        migration.error = reason
        migration.lease_until = None
        migration.finished = time.monotonic()
        log.warning("migration %s aborted (%s); this agent keeps serving %s", migration.id,
                    reason, ", ".join(map(str, migration.blocks)))
        answers = await asyncio.gather(*(self._peer(t).call(ADMIN.import_discard, id=migration.id)
                                         for t in migration.targets), return_exceptions=True)
        for target, answer in zip(migration.targets, answers, strict=True):
            if isinstance(answer, ApiError):
                log.info("migration %s: target %s did not confirm the discard: %s", migration.id,
                         target, answer)

    # -- bookkeeping -----------------------------------------------------------

    def _spawn(self, work: Coroutine[Any, Any, None], migration: Migration) -> asyncio.Task[None]:
        return asyncio.get_running_loop().create_task(work, name=f"migration-{migration.id}")

    @staticmethod
    def _stop_task(migration: Migration) -> None:
        task, migration.task = migration.task, None
        if task is not None and task is not asyncio.current_task():
            task.cancel()

    def _remember(self, migration: Migration) -> None:
        self.migrations[migration.id] = migration
        finished = [m for m in self.migrations.values() if m.state in (COMMITTED, ABORTED)]
        for old in finished[:max(0, len(finished) - KEEP_FINISHED)]:
            del self.migrations[old.id]
