"""Group commit: many writes, one sync each time the disk is asked.

Why: with ``--fsync batch`` a write is acknowledged only once it is on disk,
and a sync costs about the same for one write as for a hundred. The first
write that needs a sync starts one at once, in a worker thread so that the
event loop keeps serving; the writes that arrive while it runs wait for the
next one, which then covers them all. A lone write thus waits for one sync,
as with ``always``, and under load the number of syncs follows the disk's
speed instead of the number of writes.

Each write takes a ticket (a count) once it has reached the kernel. A sync
covers every ticket issued before it began; the sync function must make
that true (it syncs every file those writes went to).

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
import time
from collections.abc import Callable, Iterable

from client_lib.api.metrics import REQUEST_BUCKETS
from nat_agent.latency import Latency

__all__ = ["GroupCommit", "SyncFailed"]

log = logging.getLogger("metaflow.agent.store")


class SyncFailed(OSError):
    """A sync failed: the writes it covered, and every write since, are not
    known to be on disk."""


class GroupCommit:
    """Runs `sync` (blocking; in the loop's default executor) for groups of writes.

    ``what`` names the synced thing in errors. `syncs` counts the syncs done,
    `seconds` how long each took (for the metrics).
    """

    def __init__(self, sync: Callable[[], None], what: str) -> None:
        self._sync = sync
        self._what = what
        self._issued = 0
        self._synced = 0
        """Every ticket up to this one is on disk."""
        self._dirty: dict[bytes, int] = {}
        """Keys written since the running sync began, with their latest ticket."""
        self._covering: dict[bytes, int] = {}
        """Keys the running sync covers."""
        self._round: asyncio.Task[None] | None = None
        self._failure: OSError | None = None
        self.syncs = 0
        self.seconds = Latency(REQUEST_BUCKETS)

    def wrote(self, keys: Iterable[bytes]) -> int:
        """Record a write that has reached the kernel; returns its ticket."""
        self._issued += 1
        ticket = self._issued
        for key in keys:
            self._dirty[key] = ticket
        return ticket

    async def durable(self, ticket: int) -> None:
        """Return once a sync covers ``ticket``; raises `SyncFailed` if one failed."""
        while self._synced < ticket:
            if self._failure is not None:
                raise SyncFailed(f"a sync of {self._what} failed ({self._failure}); "
                                 "writes since are not known to be on disk") from self._failure
            if self._round is None:
                # A task, not a coroutine awaited here: the sync must finish
                # even if the write that started it is cancelled.
                self._round = asyncio.get_running_loop().create_task(self._run())
            await asyncio.shield(self._round)

    def unsynced(self, key: bytes) -> bool:
        """Whether a read of ``key`` must wait for a sync (`settled` would wait)."""
        return key in self._dirty or key in self._covering

    async def settled(self, key: bytes) -> None:
        """Return once the last write of ``key`` (if any) is on disk."""
        ticket = self._dirty.get(key) or self._covering.get(key)
        if ticket is not None:
            await self.durable(ticket)

    async def flush(self) -> None:
        """Return once every write so far is on disk (before closing the files)."""
        await self.durable(self._issued)

    async def _run(self) -> None:
        target = self._issued
        self._covering, self._dirty = self._dirty, {}
        started = time.perf_counter()
        try:
            await asyncio.get_running_loop().run_in_executor(None, self._sync)
        except BaseException as exc:
            self._dirty = self._covering | self._dirty  # not covered after all
            self._covering = {}
            if isinstance(exc, OSError):
                self._failure = exc
                log.critical("sync of %s failed: %s; every write from now on fails", self._what, exc)
                raise SyncFailed(f"sync of {self._what} failed: {exc}") from exc
            raise
        finally:
            self._round = None
        self._synced = target
        self._covering = {}
        self.syncs += 1
        self.seconds.observe(time.perf_counter() - started)
