"""Group commit: many writes, one sync each time the disk is asked.

Why: with ``--fsync batch`` a write is acknowledged only once it is on disk,
and a sync costs about the same for one write as for a hundred. The first
write that needs a sync starts one at once, in a worker thread so that the
event loop keeps serving; the writes that arrive while it runs wait for the
next one, which then covers them all. A lone write thus waits for one sync,
as with ``always``, and under load the number of syncs follows the disk's
speed instead of the number of writes.

Each write takes a ticket (a count) just before it reaches the kernel
(`Ledger.begin`) and says when it has (`Ledger.end`). A sync covers every
ticket issued before it began, once those writes have reached the kernel;
the sync function must make that true (it syncs every file those writes
went to). The ticket comes first because the compiled workers read the
store from other threads: a reader that sees a write's value must also see
that it is not yet on disk.

The ledger (tickets, unsynced keys, the one sync at a time, the failure) is
shared by whoever writes: `Ledger` here, or the compiled
``nat_agent._fastpath.SyncGroup`` when the extension is there, which the
worker threads wait on directly (issue 27); `Ledger` is its oracle, held
to the same answers by tests/unit/test_sync_group.py. `GroupCommit` is the
event loop's side: it runs a sync in a worker thread and awaits it.

The keys a write touched are remembered until a sync covers it, so that a
read of such a key waits for that sync too: no reply shows a value that a
power loss could still take back. (Redis with ``appendfsync always`` gives
the same: it sends the replies of an event-loop round only after the fsync
of the commands in it.)

A failed sync is final. What it should have covered may or may not be on
disk, and a second fsync can report success for pages the kernel already
dropped after the first failed (PostgreSQL's "fsyncgate"), so every waiter
of that sync, and every later one, gets the error.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Callable
from typing import Protocol

from client_lib.api.metrics import REQUEST_BUCKETS
from nat_agent.extension import HISTOGRAM, SYNC_GROUP
from nat_agent.latency import Latency

__all__ = ["GroupCommit", "Ledger", "SyncFailed", "SyncLedger", "group_commit"]

log = logging.getLogger("metaflow.agent.store")


class SyncFailed(OSError):
    """A sync failed: the writes it covered, and every write since, are not
    known to be on disk."""


class SyncLedger(Protocol):
    """What `GroupCommit` needs of a ledger: `Ledger`, or the compiled
    ``SyncGroup`` (same methods, same answers)."""

    @property
    def issued(self) -> int: ...
    @property
    def syncs(self) -> int: ...
    def begin(self, keys: list[bytes]) -> int: ...
    def end(self, ticket: int) -> None: ...
    def covered(self, ticket: int) -> bool: ...
    def ticket_of(self, key: bytes) -> int | None: ...
    def sync_through(self, ticket: int) -> None: ...


class Ledger:
    """The tickets, the unsynced keys and the one sync at a time, in Python
    (see the module docstring); thread-safe. `sync` is blocking; `seconds`
    gets how long each took."""

    def __init__(self, sync: Callable[[], object], seconds: Latency) -> None:
        self._sync = sync
        self._seconds = seconds
        self._changed = threading.Condition()
        self.issued = 0
        self._synced = 0
        self._writing: set[int] = set()
        self._dirty: dict[bytes, int] = {}
        """Keys written and not yet covered by a sync, with their latest ticket."""
        self._syncing = False
        self._failure: OSError | None = None
        self.syncs = 0

    def begin(self, keys: list[bytes]) -> int:
        """A write of `keys` is about to reach the kernel: its ticket."""
        with self._changed:
            self.issued += 1
            self._writing.add(self.issued)
            for key in keys:
                self._dirty[key] = self.issued
            return self.issued

    def end(self, ticket: int) -> None:
        """The write of `ticket` has reached the kernel (or failed to)."""
        with self._changed:
            self._writing.discard(ticket)
            if self._syncing:
                self._changed.notify_all()

    def covered(self, ticket: int) -> bool:
        """Whether a sync covers `ticket`; raises OSError if a sync failed."""
        with self._changed:
            self._raise_failure()
            return self._synced >= ticket

    def ticket_of(self, key: bytes) -> int | None:
        """The ticket of the last write of `key` that no sync covers yet, if any."""
        with self._changed:
            return self._dirty.get(key)

    def sync_through(self, ticket: int) -> None:
        """Return once a sync covers `ticket`, leading one if none runs (blocking)."""
        with self._changed:
            while True:
                self._raise_failure()
                if self._synced >= ticket:
                    return
                if not self._syncing:
                    break
                self._changed.wait()
            self._syncing = True
            target = self.issued
            self._changed.wait_for(lambda: not any(w <= target for w in self._writing))
        started = time.perf_counter()
        try:
            self._sync()
        except Exception as exc:
            with self._changed:
                self._failure = exc if isinstance(exc, OSError) else OSError(0, str(exc))
                self._syncing = False
                self._changed.notify_all()
                self._raise_failure()
        with self._changed:
            self._synced = max(self._synced, target)
            self._dirty = {key: t for key, t in self._dirty.items() if t > target}
            self.syncs += 1
            self._seconds.observe(time.perf_counter() - started)
            self._syncing = False
            self._changed.notify_all()

    def _raise_failure(self) -> None:
        if self._failure is not None:
            raise OSError(self._failure.errno, self._failure.strerror or str(self._failure))


class GroupCommit:
    """The event loop's side of a ledger: `durable` awaits a sync (run in
    the loop's default executor) that covers a ticket.

    ``what`` names the synced thing in errors. `syncs` counts the syncs done,
    `seconds` how long each took (for the metrics).
    """

    def __init__(self, ledger: SyncLedger, what: str, seconds: Callable[[], Latency]) -> None:
        self.ledger = ledger
        self._what = what
        self._seconds = seconds
        self._round: asyncio.Task[None] | None = None

    @property
    def syncs(self) -> int:
        return self.ledger.syncs

    @property
    def seconds(self) -> Latency:
        return self._seconds()

    async def durable(self, ticket: int) -> None:
        """Return once a sync covers ``ticket``; raises `SyncFailed` if one failed."""
        while not self._covered(ticket):
            if self._round is None:
                # A task, not a coroutine awaited here: the sync must finish
                # even if the write that started it is cancelled.
                self._round = asyncio.get_running_loop().create_task(self._run())
            await asyncio.shield(self._round)

    def _covered(self, ticket: int) -> bool:
        try:
            return self.ledger.covered(ticket)
        except OSError as exc:
            raise self.failure(exc.strerror or str(exc)) from exc

    def failure(self, reason: str) -> SyncFailed:
        """What a write or read waiting for a sync that failed for `reason` gets."""
        return SyncFailed(f"a sync of {self._what} failed ({reason}); "
                          "writes since are not known to be on disk")

    async def settled(self, key: bytes) -> None:
        """Return once the last write of ``key`` (if any) is on disk."""
        ticket = self.ledger.ticket_of(key)
        if ticket is not None:
            await self.durable(ticket)

    async def flush(self) -> None:
        """Return once every write so far is on disk (before closing the files)."""
        await self.durable(self.ledger.issued)

    async def _run(self) -> None:
        """One sync through every ticket issued so far; its failure is
        raised by `durable` (through `covered`), logged here once."""
        try:
            loop = asyncio.get_running_loop()
            await loop.run_in_executor(None, self.ledger.sync_through, self.ledger.issued)
        except OSError as exc:
            log.critical("sync of %s failed: %s; every write from now on fails", self._what, exc)
        finally:
            self._round = None


def group_commit(what: str, sync: Callable[[], None], logs: tuple[str, str] | None = None) -> GroupCommit:
    """A group commit over `sync`, or, given `logs` (a directory and its logs'
    file name ending) and the extension, over the compiled ``SyncGroup``,
    which syncs those logs itself without the GIL and which the worker
    threads share (`sync` then is not used: it does the same in Python)."""
    if logs is not None and SYNC_GROUP is not None and HISTOGRAM is not None:
        histogram = HISTOGRAM(REQUEST_BUCKETS)
        directory, suffix = logs
        return GroupCommit(SYNC_GROUP(seconds=histogram, directory=directory, suffix=suffix), what,
                           lambda: Latency(REQUEST_BUCKETS).plus(*histogram.snapshot()))
    seconds = Latency(REQUEST_BUCKETS)
    return GroupCommit(Ledger(sync, seconds), what, lambda: seconds)
