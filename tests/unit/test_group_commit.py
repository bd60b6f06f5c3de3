"""Group commit (`nat_agent.group_commit`) against a model disk, over both
ledgers: the Python `Ledger` and the compiled `SyncGroup` the worker threads
share (every test runs on each, so each answers as its oracle does).

The "disk" is two sets: what writes have handed to the kernel (``applied``)
and what a sync has made durable (``on_disk``). A sync, run in the worker
thread as the real one is, copies the first into the second, exactly what an
fdatasync does with the page cache. The promise checked: when `durable`
returns, the write is on disk; when `settled` returns, the last write of
that key is.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Coroutine
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from client_lib.api.metrics import REQUEST_BUCKETS
from nat_agent._fastpath import Histogram, SyncGroup
from nat_agent.group_commit import GroupCommit, Ledger, SyncFailed, SyncLedger
from nat_agent.latency import Latency

pytestmark = [pytest.mark.timeout(60), pytest.mark.parametrize("kind", ["python", "compiled"])]


def ledger(kind: str, sync: Callable[[], None]) -> SyncLedger:
    """The Python ledger or the compiled one, over the same sync."""
    if kind == "python":
        return Ledger(sync, Latency(REQUEST_BUCKETS))
    return SyncGroup(seconds=Histogram(REQUEST_BUCKETS), sync=sync)


class Disk:
    """The model disk; ``gate``, when set, holds every sync until it is released."""

    def __init__(self, kind: str, gate: threading.Event | None = None, fail_at: int | None = None) -> None:
        self.applied: set[int] = set()
        self.on_disk: set[int] = set()
        self.calls = 0
        self.gate = gate
        self.fail_at = fail_at
        self.group = GroupCommit(ledger(kind, self.sync), "the model disk", lambda: Latency(REQUEST_BUCKETS))

    def sync(self) -> None:
        self.calls += 1
        if self.gate is not None:
            assert self.gate.wait(30)
        if self.calls == self.fail_at:
            raise OSError(5, "Input/output error")
        self.on_disk |= set(self.applied)

    def write(self, key: bytes) -> int:
        """Apply a write (it is in the kernel now) and take its ticket."""
        ticket = self.group.ledger.begin([key])
        self.applied.add(ticket)
        self.group.ledger.end(ticket)
        return ticket


def run(body: Callable[[], Coroutine[Any, Any, None]]) -> None:
    asyncio.run(body())


async def until(check: Callable[[], bool]) -> None:
    while not check():
        await asyncio.sleep(0.001)


def test_a_lone_write_waits_for_one_sync(kind: str) -> None:
    async def body() -> None:
        disk = Disk(kind)
        ticket = disk.write(b"k")
        await disk.group.durable(ticket)
        assert ticket in disk.on_disk and disk.calls == disk.group.syncs == 1
        await disk.group.durable(ticket)  # already covered: no second sync
        assert disk.calls == 1

    run(body)


def test_writes_made_during_a_sync_share_the_next_one(kind: str) -> None:
    async def body() -> None:
        gate = threading.Event()
        disk = Disk(kind, gate)
        first = asyncio.ensure_future(disk.group.durable(disk.write(b"a")))
        await until(lambda: disk.calls == 1)  # the first sync is running, held at the gate
        rest = [asyncio.ensure_future(disk.group.durable(disk.write(b"k%d" % i))) for i in range(10)]
        await asyncio.sleep(0.01)
        assert not first.done() and not any(task.done() for task in rest)
        gate.set()
        await asyncio.gather(first, *rest)
        assert disk.calls == 2  # one for the first write, one for the ten that waited
        assert disk.on_disk == disk.applied

    run(body)


def test_a_read_waits_only_for_a_key_with_an_unsynced_write(kind: str) -> None:
    async def body() -> None:
        gate = threading.Event()
        disk = Disk(kind, gate)
        writing = asyncio.ensure_future(disk.group.durable(disk.write(b"dirty")))
        await until(lambda: disk.calls == 1)
        await disk.group.settled(b"clean")  # returns at once, sync or no sync
        reading = asyncio.ensure_future(disk.group.settled(b"dirty"))
        await asyncio.sleep(0.01)
        assert not reading.done()
        gate.set()
        await asyncio.gather(writing, reading)
        assert disk.calls == 1

    run(body)


def test_a_cancelled_writer_does_not_cancel_the_sync(kind: str) -> None:
    async def body() -> None:
        gate = threading.Event()
        disk = Disk(kind, gate)
        ticket = disk.write(b"k")
        impatient = asyncio.ensure_future(disk.group.durable(ticket))
        await until(lambda: disk.calls == 1)
        patient = asyncio.ensure_future(disk.group.durable(ticket))
        await asyncio.sleep(0)
        impatient.cancel()
        gate.set()
        await patient
        assert impatient.cancelled() and ticket in disk.on_disk and disk.calls == 1

    run(body)


def test_a_failed_sync_fails_its_writes_and_every_later_one(kind: str) -> None:
    async def body() -> None:
        disk = Disk(kind, fail_at=2)
        await disk.group.durable(disk.write(b"a"))
        with pytest.raises(SyncFailed, match="Input/output error"):
            await disk.group.durable(disk.write(b"b"))
        with pytest.raises(SyncFailed, match="not known to be on disk"):
            await disk.group.durable(disk.write(b"c"))
        with pytest.raises(SyncFailed):
            await disk.group.settled(b"b")
        assert disk.calls == 2  # never retried: a second fsync can lie about the first

    run(body)


def test_flush_covers_every_write(kind: str) -> None:
    async def body() -> None:
        disk = Disk(kind)
        for i in range(5):
            disk.write(b"k%d" % i)
        await disk.group.flush()
        assert disk.on_disk == disk.applied and disk.calls == 1

    run(body)


# A schedule: steps, each some writes to keys drawn from a small set and some
# reads, all started at once; a step's coroutines may still be waiting when
# the next step starts (`pause` loop turns later).
schedules = st.lists(
    st.tuples(st.lists(st.integers(0, 5), max_size=6),   # keys written
              st.lists(st.integers(0, 5), max_size=4),   # keys read
              st.integers(0, 3)),                         # loop turns before the next step
    min_size=1, max_size=12)


@settings(max_examples=60)
@given(schedules)
def test_every_acknowledged_write_and_read_is_on_disk(
        kind: str, schedule: list[tuple[list[int], list[int], int]]) -> None:
    async def body() -> None:
        disk = Disk(kind)
        last: dict[bytes, int] = {}  # key -> ticket of its latest write
        waiting: list[asyncio.Future[None]] = []

        async def write(key: bytes) -> None:
            ticket = last[key] = disk.write(key)
            await disk.group.durable(ticket)
            assert ticket in disk.on_disk

        async def read(key: bytes) -> None:
            seen = last.get(key)  # what a read at this moment returns
            await disk.group.settled(key)
            assert seen is None or seen in disk.on_disk

        for written, read_keys, pause in schedule:
            waiting += [asyncio.ensure_future(write(b"%d" % k)) for k in written]
            waiting += [asyncio.ensure_future(read(b"%d" % k)) for k in read_keys]
            for _ in range(pause):
                await asyncio.sleep(0)
        await asyncio.gather(*waiting)
        writes = sum(len(step[0]) for step in schedule)
        assert disk.calls <= writes  # never more syncs than writes

    run(body)
