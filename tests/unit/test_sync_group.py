"""The group commit's ledgers from threads, as the compiled workers use them:
the compiled `SyncGroup` against its oracle, the Python `Ledger`.

* The same random stream of begins, ends, syncs, failures and questions,
  fed to both, gets the same answers from both.
* A sync waits for a write that took its ticket before the sync began.
* Threads writing and reading a model store at once: once a reader's sync
  returns, what it read is on disk, and so is every write whose sync returned.

The model store is a dict (what has reached the kernel) and a copy of it
(what a sync made durable), as in tests/unit/test_group_commit.py.
"""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Callable

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from client_lib.api.metrics import REQUEST_BUCKETS
from nat_agent._fastpath import Histogram, SyncGroup
from nat_agent.group_commit import Ledger, SyncLedger
from nat_agent.latency import Latency

pytestmark = pytest.mark.timeout(60)

KINDS = ["python", "compiled"]


def make(kind: str, sync: Callable[[], None]) -> SyncLedger:
    if kind == "python":
        return Ledger(sync, Latency(REQUEST_BUCKETS))
    return SyncGroup(seconds=Histogram(REQUEST_BUCKETS), sync=sync)


class Failing:
    """A sync that fails on the call numbered `fail_at` (1-based)."""

    def __init__(self, fail_at: int | None) -> None:
        self.calls = 0
        self.fail_at = fail_at

    def __call__(self) -> None:
        self.calls += 1
        if self.calls == self.fail_at:
            raise OSError(5, "Input/output error")


def answer(call: Callable[[int], object], ticket: int) -> object:
    """A call's result, or its error's type and arguments."""
    try:
        return call(ticket)
    except OSError as exc:
        return ("OSError", exc.errno, exc.strerror)


ops = st.lists(st.one_of(
    st.tuples(st.just("begin"), st.lists(st.integers(0, 4), max_size=3)),
    st.tuples(st.just("end"), st.integers(0, 20)),
    st.tuples(st.just("sync"), st.integers(0, 20)),
    st.tuples(st.just("ask"), st.integers(0, 4)),
), max_size=40)


@settings(max_examples=150)
@given(ops, st.one_of(st.none(), st.integers(1, 4)))
def test_both_ledgers_answer_a_stream_alike(stream: list[tuple[str, object]], fail_at: int | None) -> None:
    """One thread, so a sync is asked only when no write under way would make it wait."""
    syncs = {kind: Failing(fail_at) for kind in KINDS}
    ledgers = {kind: make(kind, syncs[kind]) for kind in KINDS}
    open_tickets: list[int] = []
    seen: dict[str, list[object]] = {kind: [] for kind in KINDS}
    for op, arg in stream:
        for kind, ledger in ledgers.items():
            out = seen[kind]
            if op == "begin":
                assert isinstance(arg, list)
                out.append(ledger.begin([b"k%d" % k for k in arg]))
            elif op == "end" and open_tickets:
                assert isinstance(arg, int)
                ledger.end(open_tickets[arg % len(open_tickets)])
            elif op == "sync" and not open_tickets:
                assert isinstance(arg, int)
                ticket = arg % (ledger.issued + 1)
                out.append(answer(ledger.sync_through, ticket))
                out.append(answer(ledger.covered, ticket))
            elif op == "ask":
                assert isinstance(arg, int)
                key = b"k%d" % arg
                out += [ledger.ticket_of(key), ledger.issued, ledger.syncs]
        if op == "begin":
            began = seen["python"][-1]
            assert isinstance(began, int)
            open_tickets.append(began)
        elif op == "end" and open_tickets:
            assert isinstance(arg, int)
            open_tickets.pop(arg % len(open_tickets))
        assert seen["python"] == seen["compiled"]
    assert syncs["python"].calls == syncs["compiled"].calls


@pytest.mark.parametrize("kind", KINDS)
def test_a_sync_waits_for_a_write_that_began_before_it(kind: str) -> None:
    synced = threading.Event()
    ledger = make(kind, synced.set)
    ticket = ledger.begin([b"k"])
    syncing = threading.Thread(target=ledger.sync_through, args=(ticket,))
    syncing.start()
    time.sleep(0.05)
    assert not synced.is_set() and syncing.is_alive()  # the write has not reached the kernel yet
    ledger.end(ticket)
    syncing.join(5)
    assert synced.is_set() and not syncing.is_alive() and ledger.covered(ticket)


class Store:
    """What writes have handed to the kernel, and what syncs made durable."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.kernel: dict[bytes, int] = {}
        self.disk: dict[bytes, int] = {}
        self.calls = 0

    def sync(self) -> None:
        with self.lock:
            self.calls += 1
            self.disk = dict(self.kernel)
        time.sleep(0.0005)   # a disk takes its time: more writes pile up meanwhile


@pytest.mark.parametrize("kind", KINDS)
def test_threads_writing_and_reading_see_only_what_is_on_disk(kind: str) -> None:
    store = Store()
    ledger = make(kind, store.sync)
    failures: list[str] = []
    counter = iter(range(1, 1 << 30))

    def writer(seed: int) -> None:
        rng = random.Random(seed)
        for _ in range(300):
            key = b"k%d" % rng.randrange(8)
            ticket = ledger.begin([key])
            with store.lock:
                value = store.kernel[key] = next(counter)
            ledger.end(ticket)
            ledger.sync_through(ticket)
            with store.lock:
                if store.disk.get(key, 0) < value:
                    failures.append(f"write {value} of {key!r} acknowledged before it was on disk")

    def reader(seed: int) -> None:
        rng = random.Random(seed)
        for _ in range(600):
            key = b"k%d" % rng.randrange(8)
            with store.lock:
                value = store.kernel.get(key)
            ticket = ledger.ticket_of(key)   # after the read, as the lane asks
            if ticket is not None:
                ledger.sync_through(ticket)
            with store.lock:
                if value is not None and store.disk.get(key, 0) < value:
                    failures.append(f"read {value} of {key!r} answered before it was on disk")

    threads = [threading.Thread(target=writer, args=(i,)) for i in range(4)]
    threads += [threading.Thread(target=reader, args=(100 + i,)) for i in range(3)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(50)
    assert not any(thread.is_alive() for thread in threads)
    assert failures == []
    assert 0 < store.calls < 4 * 300   # shared: fewer syncs than writes
