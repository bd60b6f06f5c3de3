"""The agent's stores (LevelDB and Redis) against a brute-force model, on real backends."""

from __future__ import annotations

import asyncio
import itertools
import math
import os
import signal
import socket
import time
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pytest
import redis
import redis.asyncio as aioredis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from nat_agent import extension
from nat_agent.leveldb_store import LevelDBStore
from nat_agent.redis_server import RedisServer, RedisServerError
from nat_agent.redis_store import RESTART_WINDOW, RESTARTS_ALLOWED, RedisStore, ServerKeeper
from nat_agent.store import (
    DEFAULT_FSYNC,
    FsyncMode,
    IfEqual,
    InDirectory,
    Record,
    Store,
    encode_mdid,
    encode_path,
)
from nat_agent.store_spec import open_store

pytestmark = pytest.mark.timeout(120)


@dataclass
class Backend:
    """Opens stores of one kind and width; each name is a separate, empty store."""

    kind: str
    width: int
    root: str  # a LevelDB parent directory, or a redis:// URL
    prefix: str = ""  # Redis only: the test's own key prefix
    fsync: FsyncMode = DEFAULT_FSYNC
    _names: itertools.count = field(default_factory=itertools.count)

    @property
    def top(self) -> int:
        return (1 << self.width) - 1

    def spec(self, name: str | None = None) -> str:
        name = name or f"s{next(self._names)}"
        if self.kind == "leveldb":
            return f"leveldb:{self.root}/{name}"
        return f"{self.root}?prefix={quote(f'{self.prefix}{name}:')}"

    def open(self, name: str | None = None) -> Store:
        """A store; call inside the event loop that uses it (Redis binds to it)."""
        return open_store(self.spec(name), self.width, self.fsync)


@pytest.fixture(
    # Every kind and width in the default mode; the other LevelDB modes write
    # differently (synced, or without group commit). A foreign Redis is
    # written the same way in every mode. "plyvel": LevelDB opened by plyvel,
    # as without the extension (`leveldb_store._open`).
    params=[("leveldb", 32, DEFAULT_FSYNC), ("leveldb", 128, DEFAULT_FSYNC), ("redis", 32, DEFAULT_FSYNC),
            ("redis", 128, DEFAULT_FSYNC), ("leveldb", 32, "always"), ("leveldb", 32, "off"),
            ("plyvel", 32, DEFAULT_FSYNC)],
    ids=lambda p: f"{p[0]}-{p[1]}-{p[2]}",
)
def backend(request: pytest.FixtureRequest, leveldb_path: Path) -> Backend:
    kind, width, fsync = request.param
    if kind == "plyvel":
        request.getfixturevalue("monkeypatch").setattr(extension, "LEVELDB", None)
        kind = "leveldb"
    if kind == "leveldb":
        return Backend(kind, width, str(leveldb_path), fsync=fsync)
    # Looked up lazily so that LevelDB-only runs never start a redis-server.
    url = request.getfixturevalue("redis_server")
    return Backend(kind, width, url, request.getfixturevalue("redis_prefix"), fsync=fsync)


def run(body: Callable[[], Coroutine[Any, Any, None]]) -> None:
    asyncio.run(body())


async def scan_batches(store: Store, first: int, last: int, batch: int = 1000) -> list[list[Record]]:
    return [chunk async for chunk in store.scan(first, last, batch)]


async def scan_all(store: Store, first: int, last: int, batch: int = 1000) -> list[Record]:
    return [record for chunk in await scan_batches(store, first, last, batch) for record in chunk]


def ordered(records: list[Record]) -> list[Record]:
    """The order every scan must produce: by mdid, then by the path's bytes."""
    return sorted(records, key=lambda r: (r[0], encode_path(r[1])))


# ---------------------------------------------------------------- single records


def test_get_put_delete_exists(backend: Backend) -> None:
    async def body() -> None:
        async with backend.open() as store:
            mdid = backend.top // 3
            assert await store.get(mdid, "/a") is None
            assert not await store.exists(mdid, "/a")
            assert await store.delete(mdid, "/a") is False

            await store.put(mdid, "/a", b"v1")
            assert await store.get(mdid, "/a") == b"v1"
            assert await store.exists(mdid, "/a")
            await store.put(mdid, "/a", b"v2")  # overwrite: still one record
            assert await store.get(mdid, "/a") == b"v2"
            assert (await store.total(), await store.count(0, backend.top)) == (1, 1)

            await store.put(mdid + 1, "/empty", b"")
            assert await store.get(mdid + 1, "/empty") == b""  # empty, not missing
            assert await store.exists(mdid + 1, "/empty")
            await store.put(mdid + 2, "/nul", b"\x00a\x00\xff")
            assert await store.get(mdid + 2, "/nul") == b"\x00a\x00\xff"

            assert await store.delete(mdid, "/a") is True
            assert await store.delete(mdid, "/a") is False
            assert await store.get(mdid, "/a") is None
            assert not await store.exists(mdid, "/a")
            assert await store.total() == 2
            assert await store.count(mdid, mdid) == 0
            assert await scan_all(store, 0, backend.top) == [
                (mdid + 1, "/empty", b""),
                (mdid + 2, "/nul", b"\x00a\x00\xff"),
            ]

    run(body)


def test_many_paths_share_one_mdid_in_byte_order(backend: Backend) -> None:
    paths = [f"/d/{i}" for i in range(40)] + ["/Z", "/a", "/é", "/日本語/ファイル.txt", "/cafe\u0301"]
    paths += ["/café", "/raw/\udcff\udcfe"]  # NFC vs NFD differ; undecodable bytes round-trip

    async def body() -> None:
        async with backend.open() as store:
            mid = backend.top // 2
            for path in paths:
                await store.put(mid, path, path.encode("utf-8", "surrogateescape"))
            await store.put(mid - 1, "/zz-before", b"")
            await store.put(mid + 1, "/00-after", b"")

            assert await store.count(mid, mid) == len(paths)
            assert await store.count(mid - 1, mid + 1) == len(paths) + 2
            records = await scan_all(store, mid, mid, batch=7)
            expected = sorted(paths, key=encode_path)
            assert [path for _, path, _ in records] == expected
            assert all(value == encode_path(path) for _, path, value in records)
            assert expected.index("/Z") < expected.index("/a") < expected.index("/é")

    run(body)


def test_edges_of_the_space(backend: Backend) -> None:
    top = backend.top

    async def body() -> None:
        async with backend.open() as store:
            for mdid in (0, 1, top - 1, top):
                await store.put(mdid, f"/{mdid}", b"x")
            await store.put(2, "", b"")  # the smallest key just past [1, 1]: be(2) alone
            assert await store.count(1, 1) == 1
            assert await store.delete_range(2, 2) == 1
            assert await store.count(0, top) == 4
            assert await store.count(top, top) == 1
            assert await store.count(0, 0) == 1
            assert await scan_all(store, top, top) == [(top, f"/{top}", b"x")]
            assert await scan_all(store, 0, 0) == [(0, "/0", b"x")]
            assert await store.delete_range(top, top) == 1
            assert await store.count(top - 1, top) == 1
            assert await store.delete_range(0, 0) == 1
            assert [r[0] for r in await scan_all(store, 0, top)] == [1, top - 1]

    run(body)


def test_empty_and_invalid_ranges(backend: Backend) -> None:
    top = backend.top

    async def body() -> None:
        async with backend.open() as store:
            await store.put(5, "/five", b"5")
            assert await store.count(6, 5) == 0
            assert await scan_batches(store, 6, 5) == []
            assert await store.delete_range(6, 4) == 0
            assert await store.get(5, "/five") == b"5"

            for first, last in ((-1, 0), (0, top + 1)):
                with pytest.raises(ValueError, match="outside"):
                    await store.count(first, last)
                with pytest.raises(ValueError, match="outside"):
                    await scan_batches(store, first, last)
                with pytest.raises(ValueError, match="outside"):
                    await store.delete_range(first, last)
            for bad in (-1, top + 1):
                with pytest.raises(ValueError, match="outside"):
                    await store.put(bad, "/x", b"")
                with pytest.raises(ValueError, match="outside"):
                    await store.get(bad, "/x")
            with pytest.raises(ValueError, match="batch"):
                await scan_batches(store, 0, top, batch=0)
            assert await store.total() == 1

    run(body)


@given(ops=st.lists(st.tuples(st.sampled_from(["/a", "/b", "/c"]),
                               st.one_of(st.sampled_from([None, "absent", "present", "delete"]),
                                         st.builds(IfEqual, st.sampled_from([b"", b"x", b"y"]))),
                               st.sampled_from([b"", b"x", b"y", b"zz"])), min_size=1, max_size=12))
@settings(max_examples=25, suppress_health_check=[HealthCheck.function_scoped_fixture])
def test_put_if_has_set_nx_xx_ifeq_get_semantics(backend: Backend, ops: list[tuple[str, Any, bytes]]) -> None:
    """Against a dict: written when the condition holds (IFEQ: the value is
    exactly the one given; an absent record equals nothing), the previous
    value returned either way, and the index (count, scan) kept in step.
    "delete" is DELIFEQ: removed only when the record holds that value."""
    ids = {"/a": 3, "/b": 3, "/c": backend.top}

    async def body() -> None:
        model: dict[str, bytes] = {}
        async with backend.open() as store:
            for path, when, value in ops:
                old = model.get(path)
                if when == "delete":
                    assert await store.delete(ids[path], path, value) == (old == value)
                    if old == value:
                        del model[path]
                    continue
                if isinstance(when, IfEqual):
                    holds = old == when.value
                else:
                    holds = when is None or (old is not None) == (when == "present")
                assert await store.put_if(ids[path], path, value, when) == (holds, old)
                if holds:
                    model[path] = value
            assert await store.total() == await store.count(0, backend.top) == len(model)
            assert await scan_all(store, 0, backend.top) == ordered(
                [(ids[p], p, v) for p, v in model.items()])

    run(body)


def test_put_if_is_atomic_under_concurrent_writers(backend: Backend) -> None:
    """Fifty writers race SET NX on one path: exactly one wins, and every
    loser sees the winner's value (a read-then-write would let several win)."""

    async def body() -> None:
        async with backend.open() as store:
            results = await asyncio.gather(
                *(store.put_if(42, "/race", b"%d" % i, "absent") for i in range(50)))
            winners = [i for i, (written, _) in enumerate(results) if written]
            assert len(winners) == 1
            assert {old for written, old in results if not written} == {b"%d" % winners[0]}
            assert await store.get(42, "/race") == b"%d" % winners[0]
            assert await store.count(42, 42) == 1

    run(body)


def test_compare_and_set_lets_one_of_many_racing_updates_win(backend: Backend) -> None:
    """Fifty writers read version 1 and race to replace it: exactly one wins."""

    async def body() -> None:
        async with backend.open() as store:
            await store.put(7, "/v", b"v1")
            results = await asyncio.gather(
                *(store.put_if(7, "/v", b"v2-%d" % i, IfEqual(b"v1")) for i in range(50)))
            winners = [i for i, (written, _) in enumerate(results) if written]
            assert len(winners) == 1
            assert await store.get(7, "/v") == b"v2-%d" % winners[0]

    run(body)


def test_entries_of_a_directory_page_in_name_order(backend: Backend) -> None:
    """A directory's entries (``dir NUL name`` at the directory's mdid) come
    back in bytewise name order, a page at a time after a name, and never
    include the directory itself, a deeper path, a neighbour directory whose
    name extends this one's, or another mdid's records."""
    names = ["b", "a", "a b", "\u00e9t\u00e9", "z" * 255, "A", "-", "a\udcff"]

    async def body() -> None:
        async with backend.open() as store:
            for i, name in enumerate(names):
                await store.put(9, "/d\0" + name, b"%d" % i)
            await store.put(9, "/d", b"the directory itself")
            await store.put(9, "/d/x", b"a path below it")
            await store.put(9, "/dd\0a", b"a neighbour's entry")
            await store.put(10, "/d\0zzz", b"another mdid")
            await store.put(8, "/d\0zzz", b"another mdid")
            want = sorted(((n, b"%d" % i) for i, n in enumerate(names)),
                          key=lambda e: encode_path(e[0]))
            assert await store.entries(9, "/d", "", 100) == want
            pages: list[tuple[str, bytes]] = []
            after = ""
            while page := await store.entries(9, "/d", after, 3):
                assert len(page) <= 3
                pages += page
                after = page[-1][0]
            assert pages == want
            assert await store.entries(9, "/d", "a", 2) == want[want.index(("a", b"1")) + 1:][:2]
            assert await store.entries(9, "/nothing", "", 10) == []
            assert await store.delete(9, "/d\0a")
            assert ("a", b"1") not in await store.entries(9, "/d", "", 100)

    run(body)


def test_a_directory_takes_entries_only_while_its_header_exists(backend: Backend) -> None:
    """InDirectory creates only a free name of an existing directory;
    remove_directory deletes the header only while no entry exists, and
    after it no create can land: the pair is how rmdir and create exclude
    each other on one server."""

    async def body() -> None:
        async with backend.open() as store:
            into = InDirectory("/d")
            assert await store.put_if(5, "/d\0a", b"1", into) == (False, None)   # no directory yet
            assert await store.remove_directory(5, "/d") == "absent"
            await store.put(5, "/d", b"header")
            assert await store.put_if(5, "/d\0a", b"1", into) == (True, None)
            assert await store.put_if(5, "/d\0a", b"2", into) == (False, b"1")   # the name is taken
            assert await store.remove_directory(5, "/d") == "not-empty"
            assert await store.get(5, "/d") == b"header"
            await store.put(5, "/dd", b"a neighbour")        # neither of these two
            await store.put(5, "/d/deeper", b"a path")       # is an entry of /d
            assert await store.delete(5, "/d\0a")
            assert await store.remove_directory(5, "/d") == "removed"
            assert await store.get(5, "/d") is None and await store.count(5, 5) == 2
            assert await store.put_if(5, "/d\0b", b"1", into) == (False, None)

    run(body)


def test_rmdir_and_creates_racing_on_one_directory_never_both_win(backend: Backend) -> None:
    """Creates and a remove_directory race on an empty directory: either the
    header is gone and no create landed, or it stays with what landed."""

    async def body() -> None:
        async with backend.open() as store:
            for round_ in range(20):
                directory = f"/race{round_}"
                await store.put(6, directory, b"header")
                into = InDirectory(directory)
                racers: list[Coroutine[Any, Any, Any]] = [
                    store.put_if(6, f"{directory}\0n{i}", b"x", into) for i in range(5)]
                at = round_ % (len(racers) + 1)   # the removal sent first, last, or in between
                racers.insert(at, store.remove_directory(6, directory))
                results = await asyncio.gather(*racers)
                removal = results.pop(at)
                landed = sum(1 for written, _ in results if written)
                listed = await store.entries(6, directory, "", 100)
                assert len(listed) == landed
                if removal == "removed":
                    assert landed == 0 and await store.get(6, directory) is None
                else:
                    assert removal == "not-empty" and landed > 0

    run(body)


# ---------------------------------------------------------------- batches


def test_scan_batch_boundaries(backend: Backend) -> None:
    async def body() -> None:
        async with backend.open() as store:
            step = backend.top // 10
            records = [(i * step, f"/r{i}", bytes([i])) for i in range(10)]
            await store.put_many(records)
            for batch in (1, 3, 9, 10, 11, 1000):
                batches = await scan_batches(store, 0, backend.top, batch)
                assert all(1 <= len(chunk) <= batch for chunk in batches), batch
                assert len(batches) == math.ceil(len(records) / batch), batch
                assert [r for chunk in batches for r in chunk] == records
            # A range that cuts the records in the middle, with a batch boundary inside.
            assert await scan_all(store, step, 4 * step, batch=2) == records[1:5]

    run(body)


def test_scan_resumes_strictly_after_a_record_even_within_one_mdid(backend: Backend) -> None:
    """`after` pages a range across calls, as ``POST /dump`` does: within a
    directory (one mdid, many paths), from a record deleted meanwhile, and
    from a key outside the range (before it: the whole range; past it: nothing)."""
    async def body() -> None:
        async with backend.open() as store:
            mid = backend.top // 2
            records = ordered([(mid, f"/d\0f{i}", bytes([i])) for i in range(7)]
                              + [(mid - 1, "/a", b"a"), (mid + 1, "/z", b"z")])
            await store.put_many(records)
            paged: list[Record] = []
            after: tuple[int, str] | None = None
            while True:
                page = [r async for chunk in store.scan(mid - 1, mid + 1, 3, after) for r in chunk][:3]
                paged += page
                if len(page) < 3:
                    break
                after = page[-1][:2]
            assert paged == records
            cut = records[4]
            await store.delete(cut[0], cut[1])
            resumed = [r async for chunk in store.scan(mid - 1, mid + 1, 100, cut[:2]) for r in chunk]
            assert resumed == records[5:]
            assert await scan_all(store, mid, mid + 1) == [r for r in records if r[0] >= mid and r != cut]
            before = [r async for chunk in store.scan(mid, mid + 1, 100, (mid - 1, "/a")) for r in chunk]
            assert before == [r for r in records if r[0] >= mid and r != cut]
            assert [r async for chunk in store.scan(mid - 1, mid, 100, (mid + 1, "/")) for r in chunk] == []

    run(body)


def test_put_many_is_one_batch(backend: Backend) -> None:
    async def body() -> None:
        async with backend.open() as store:
            await store.put(7, "/old", b"old")
            await store.put_many([(7, "/old", b"new"), (9, "/dup", b"1"), (9, "/dup", b"2")])
            assert await store.get(7, "/old") == b"new"
            assert await store.get(9, "/dup") == b"2"  # the later duplicate wins
            assert await store.total() == 2
            assert await store.count(0, 9) == 2

            await store.put_many([])
            with pytest.raises(ValueError):
                await store.put_many([(11, "/good", b""), (backend.top + 1, "/bad", b"")])
            assert not await store.exists(11, "/good")  # nothing of the bad batch landed
            assert await store.total() == 2

    run(body)


def test_delete_range_leaves_the_rest(backend: Backend) -> None:
    async def body() -> None:
        async with backend.open() as store:
            records = [(m, f"/p{m}/{i}", b"v") for m in (10, 20, 30, 40) for i in range(3)]
            await store.put_many(records)
            await store.save_state({"blocks": ["10.0.0.0/8"]})
            assert await store.delete_range(20, 30) == 6
            assert await store.delete_range(20, 30) == 0
            assert await store.total() == 6
            assert await store.count(0, backend.top) == 6
            assert [r for r in await scan_all(store, 0, backend.top)] == [
                r for r in records if r[0] in (10, 40)
            ]
            assert not await store.exists(20, "/p20/0")
            assert await store.load_state() == {"blocks": ["10.0.0.0/8"]}

    run(body)


# ---------------------------------------------------------------- the model


@st.composite
def scenarios(draw: st.DrawFn, width: int) -> tuple[dict[str, int], list[tuple], list[tuple[int, int, int]]]:
    """Paths with their mdids, a sequence of writes, and ranges to check.

    mdids cluster around a few centres and the ends of the space, so ranges
    often start or stop exactly on, just before or just after a key.
    """
    top = (1 << width) - 1
    centres = draw(st.lists(st.integers(0, top), min_size=1, max_size=3)) + [0, top]
    near = st.builds(
        lambda c, d: min(top, max(0, c + d)), st.sampled_from(centres), st.integers(-3, 3)
    )
    mdid_of = st.one_of(st.sampled_from(centres), near, st.integers(0, top))
    names = st.text(st.characters(codec="utf-8"), max_size=8)
    paths = draw(st.lists(names.map(lambda s: "/" + s), min_size=1, max_size=25, unique=True))
    ids = {path: draw(mdid_of) for path in paths}

    path = st.sampled_from(paths)
    value = st.binary(max_size=12)
    op = st.one_of(
        st.tuples(st.just("put"), path, value),
        st.tuples(st.just("put_many"), st.lists(st.tuples(path, value), max_size=8)),
        st.tuples(st.just("delete"), path),
        st.tuples(st.just("delete_range"), mdid_of, mdid_of),
    )
    ops = draw(st.lists(op, min_size=1, max_size=15))

    edges = sorted({min(top, max(0, m + d)) for m in [*ids.values(), 0, top] for d in (-1, 0, 1)})
    end = st.one_of(st.sampled_from(edges), st.integers(0, top))
    ranges = draw(st.lists(st.tuples(end, end, st.integers(1, 6)), min_size=1, max_size=6))
    return ids, ops, ranges


@settings(
    max_examples=40,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],  # stores are per example
)
@given(data=st.data())
def test_matches_a_brute_force_model(backend: Backend, data: st.DataObject) -> None:
    ids, ops, ranges = data.draw(scenarios(backend.width))
    model: dict[str, bytes] = {}

    def in_range(first: int, last: int) -> list[Record]:
        return ordered([(ids[p], p, v) for p, v in model.items() if first <= ids[p] <= last])

    async def body() -> None:
        async with backend.open() as store:
            for op in ops:
                if op[0] == "put":
                    _, path, value = op
                    await store.put(ids[path], path, value)
                    model[path] = value
                elif op[0] == "put_many":
                    await store.put_many([(ids[p], p, v) for p, v in op[1]])
                    model.update(op[1])
                elif op[0] == "delete":
                    path = op[1]
                    assert await store.delete(ids[path], path) is (model.pop(path, None) is not None)
                else:
                    first, last = sorted(op[1:])
                    doomed = in_range(first, last)
                    assert await store.delete_range(first, last) == len(doomed)
                    for _, path, _ in doomed:
                        del model[path]

            assert await store.total() == len(model)
            for path, mdid in ids.items():
                assert await store.get(mdid, path) == model.get(path)
                assert await store.exists(mdid, path) is (path in model)
            for first, last, batch in ranges:
                expected = in_range(first, last)
                assert await store.count(first, last) == len(expected)
                batches = await scan_batches(store, first, last, batch)
                assert all(1 <= len(chunk) <= batch for chunk in batches)
                assert [r for chunk in batches for r in chunk] == expected

    run(body)


# ---------------------------------------------------------------- state and reopening


def test_state_is_beside_the_records_not_among_them(backend: Backend) -> None:
    async def body() -> None:
        async with backend.open("a") as store:
            assert await store.load_state() is None
            await store.save_state({"blocks": ["100.64.0.0/11"], "epoch": 3})
            assert await store.load_state() == {"blocks": ["100.64.0.0/11"], "epoch": 3}
            assert await store.total() == 0
            assert await store.count(0, backend.top) == 0
            assert await scan_batches(store, 0, backend.top) == []
            assert await store.delete_range(0, backend.top) == 0
            await store.save_state({"blocks": []})
        async with backend.open("a") as store:
            assert await store.load_state() == {"blocks": []}

    run(body)


def test_reopened_store_counts_what_is_on_disk(backend: Backend) -> None:
    records = [(m, f"/f{m}/{i}", b"v") for m in (3, 4, 1000) for i in range(4)]

    async def body() -> None:
        async with backend.open("a") as store:
            await store.put_many(records)
            await store.delete(4, "/f4/0")
        async with backend.open("a") as store:
            assert await store.total() == 11
            assert await store.count(3, 4) == 7
            await store.put(3, "/f3/0", b"again")  # existing: not counted twice
            assert await store.count(3, 3) == 4
            assert await store.delete_range(4, 1000) == 7
            assert await store.total() == 4
        async with backend.open("b") as other:
            assert await other.total() == 0  # another name is another store

    run(body)


def test_leveldb_refuses_another_width(leveldb_path: Path) -> None:
    async def body() -> None:
        async with LevelDBStore(leveldb_path, 32) as store:
            await store.put(1, "/x", b"")
        with pytest.raises(ValueError, match="32-bit"):
            LevelDBStore(leveldb_path, 128)
        async with LevelDBStore(leveldb_path, 32) as store:  # the failed open released the lock
            assert await store.total() == 1

    run(body)


def test_leveldb_tables_hold_records_uncompressed_behind_a_bloom_filter(leveldb_path: Path) -> None:
    """What the open options promise, read from the table files themselves:
    a point lookup never decompresses, and a path that is not there is
    answered by a filter."""
    value = bytes(range(256)) * 2   # no run that snappy would shorten by much, none it would keep

    async def body() -> None:
        leveldb = LevelDBStore(leveldb_path, 32)
        async with leveldb as store:
            await store.put_many([(i, f"/d/{i}", value) for i in range(500)])
            leveldb._db.compact_range()   # out of the memtable, into tables
        tables = [f.read_bytes() for f in leveldb_path.glob("*.ldb")]
        assert tables, "no table written"
        assert sum(t.count(value) for t in tables) == 500
        assert all(b"filter.leveldb.BuiltinBloomFilter2" in t for t in tables)
        async with LevelDBStore(leveldb_path, 32) as store:   # and it reads them back
            assert await store.get(7, "/d/7") == value and await store.get(7, "/d/8") is None

    run(body)


# ---------------------------------------------------------------- Redis layout


def test_redis_layout_and_prefix_isolation(redis_server: str, redis_prefix: str) -> None:
    mdid = 0x64400001

    async def body() -> None:
        async with (
            aioredis.Redis.from_url(redis_server) as raw,
            open_store(f"{redis_server}/0?prefix={redis_prefix}a:", 32) as a,
            open_store(f"{redis_server}/0?prefix={redis_prefix}b:", 32) as b,
        ):
            await a.put(mdid, "/x", b"value")
            await a.save_state({"k": 1})
            assert await b.total() == 0
            assert await b.get(mdid, "/x") is None
            assert await b.load_state() is None

            # A value that vanishes between reading the index and the values
            # (here: removed behind the store's back) is skipped, and a page
            # left empty is not yielded.
            await b.put_many([(1, "/1", b"1"), (2, "/2", b"2"), (3, "/3", b"3")])
            await raw.delete(f"{redis_prefix}b:k:/2")
            assert await scan_batches(b, 0, 2**32 - 1, batch=1) == [[(1, "/1", b"1")], [(3, "/3", b"3")]]

    run(body)
    with redis.Redis.from_url(redis_server) as raw:
        p = redis_prefix.encode()
        assert raw.get(p + b"a:k:/x") == b"value"
        assert raw.zrange(p + b"a:idx", 0, -1, withscores=True) == [
            (encode_mdid(mdid, 32) + b"/x", 0.0)
        ]
        assert raw.get(p + b"a:state") == b'{"k": 1}'
        assert sorted(raw.scan_iter(match=redis_prefix + "a:*")) == [
            p + b"a:idx", p + b"a:k:/x", p + b"a:state"
        ]


# ---------------------------------------------------------------- open_store


def test_open_store_tcp_spec_with_database_and_prefix(redis_server: str, redis_prefix: str) -> None:
    port = int(redis_server.rsplit(":", 1)[1])

    async def body() -> None:
        store = open_store(f"redis://127.0.0.1:{port}/3?prefix={redis_prefix}", 128)
        assert isinstance(store, RedisStore)
        assert (store.kind, store.width, store.prefix) == ("redis", 128, redis_prefix.encode())
        async with store:
            await store.put(2**128 - 1, "/top", b"t")

    run(body)
    with redis.Redis(port=port, db=3) as raw:
        assert raw.get(f"{redis_prefix}k:/top") == b"t"
        raw.delete(f"{redis_prefix}k:/top", f"{redis_prefix}idx")


def test_open_store_unix_spec(tmp_path: Path) -> None:
    with RedisServer(tmp_path, unix_socket=tmp_path / "r.sock") as server:

        async def body() -> None:
            async with open_store(f"unix://{server.unix_socket}?db=2&prefix=u%26v:", 32) as store:
                assert isinstance(store, RedisStore) and store.prefix == b"u&v:"
                await store.put(9, "/nine", b"9")

        run(body)
        with redis.Redis(unix_socket_path=str(server.unix_socket), db=2) as raw:
            assert raw.get("u&v:k:/nine") == b"9"


def test_open_store_leveldb_creates_its_directory(leveldb_path: Path) -> None:
    async def body() -> None:
        async with open_store(f"leveldb:{leveldb_path}/x", 128) as store:
            assert isinstance(store, LevelDBStore)
            assert (store.kind, store.width) == ("leveldb", 128)
        assert (leveldb_path / "x").is_dir()

    run(body)


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("", "no scheme"),
        ("/var/lib/metaflow", "no scheme"),
        ("leveldb:", "no directory"),
        ("redis-server:", "no directory"),
        ("memcached://127.0.0.1", "unknown store kind"),
        ("redis://", "no host"),
        ("redis://127.0.0.1:port", "bad port"),
        ("redis://127.0.0.1:6379/zero", "database must be a number"),
        ("redis://127.0.0.1:6379/0?bogus=1", "options"),
        ("redis://127.0.0.1:6379/0?db=1", "options"),
        ("redis://127.0.0.1/0?prefix=a&prefix=b", "options"),
        ("redis://127.0.0.1/0?prefix", "malformed query"),
        ("redis://user:secret@127.0.0.1:6379", "credentials"),
        ("unix://", "unix:///"),
        ("unix://host/tmp/r.sock", "unix:///"),
        ("unix:///tmp/r.sock?db=two", "database must be a number"),
    ],
)
def test_open_store_rejects_bad_specs(spec: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        open_store(spec, 32)


def test_open_store_rejects_bad_width(leveldb_path: Path) -> None:
    with pytest.raises(ValueError, match="width"):
        open_store(f"leveldb:{leveldb_path}", 64)
    assert not leveldb_path.exists()


# ---------------------------------------------------------------- our own redis-server


def test_redis_server_spec_owns_its_server(tmp_path: Path) -> None:
    directory = tmp_path / "rs"
    sock = directory / "redis.sock"

    async def first_life() -> int:
        store = open_store(f"redis-server:{directory}", 32)
        assert isinstance(store, RedisStore) and store.server is not None
        pid = store.server.pid
        assert pid is not None
        os.kill(pid, 0)  # running
        assert sock.is_socket()
        await store.put(42, "/kept", b"across restarts")
        await store.close()
        await store.close()  # idempotent
        return pid

    pid = asyncio.run(first_life())
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)
    assert not sock.exists()
    assert list((directory / "appendonlydir").iterdir())  # append-only files in DIR

    async def second_life() -> None:
        async with open_store(f"redis-server:{directory}", 32) as store:
            assert await store.get(42, "/kept") == b"across restarts"
            assert await store.count(0, 2**32 - 1) == 1

    asyncio.run(second_life())


def test_redis_server_start_failure_shows_the_log(tmp_path: Path) -> None:
    with socket.socket() as squatter:
        squatter.bind(("127.0.0.1", 0))
        squatter.listen()
        server = RedisServer(tmp_path, port=squatter.getsockname()[1])
        with pytest.raises(RedisServerError, match="(?s)exited.*log tail.*Address already in use"):
            server.start()
        assert server.pid is None


def test_redis_server_will_not_share_a_socket(tmp_path: Path) -> None:
    with RedisServer(tmp_path / "one", unix_socket=tmp_path / "r.sock") as first:
        second = RedisServer(tmp_path / "two", unix_socket=tmp_path / "r.sock")
        with pytest.raises(RedisServerError, match="already listens"):
            second.start()
        assert first.pid is not None
        os.kill(first.pid, 0)  # the first one is untouched


def test_redis_server_needs_an_address(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="socket"):
        RedisServer(tmp_path)
    with pytest.raises(ValueError, match="longer than"):
        RedisServer(tmp_path, unix_socket=tmp_path / ("s" * 120))


def _kill(pid: int | None) -> None:
    assert pid is not None
    os.kill(pid, signal.SIGKILL)


async def _until(check: Callable[[], bool], timeout: float = 15.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, "timed out"
        await asyncio.sleep(0.05)


async def _put_until_it_works(store: Store, mdid: int, path: str, value: bytes) -> None:
    """Writes fail while the server restarts; the store reconnects by itself."""
    deadline = time.monotonic() + 15
    while True:
        try:
            await store.put(mdid, path, value)
            return
        except ConnectionError:
            assert time.monotonic() < deadline
            await asyncio.sleep(0.05)


def test_own_redis_server_is_restarted_when_it_dies(tmp_path: Path) -> None:
    """Found: the agent's own redis-server died and nothing restarted it.
    Killed with SIGKILL, it comes back with what it had acknowledged."""

    async def body() -> None:
        store = RedisStore.with_own_server(tmp_path / "rs", 32, give_up=pytest.fail)
        async with store:
            assert store.server is not None and store.keeper is not None
            await store.put(7, "/before", b"kept")
            first = store.server.pid
            _kill(first)
            await _until(lambda: store.keeper is not None and store.keeper.restarts == 1)
            assert store.server.pid not in (None, first)
            await _put_until_it_works(store, 8, "/after", b"new")
            assert await store.get(7, "/before") == b"kept"  # from the append-only file
            assert await store.total() == 2

    run(body)


def test_own_redis_server_that_keeps_dying_is_given_up(tmp_path: Path) -> None:
    """Restarted RESTARTS_ALLOWED times within RESTART_WINDOW; one death more and
    the keeper gives up (the agent's `give_up` makes it exit)."""
    reasons: list[str] = []

    async def body() -> None:
        store = RedisStore.with_own_server(tmp_path / "rs", 32, give_up=reasons.append)
        keeper, server = store.keeper, store.server
        assert keeper is not None and server is not None
        for restarts in range(1, RESTARTS_ALLOWED + 1):
            _kill(server.pid)
            await _until(lambda: keeper.restarts == restarts)  # noqa: B023 (awaited at once)
        _kill(server.pid)
        await _until(lambda: bool(reasons))
        assert server.pid is None  # not restarted again
        await store.close()

    run(body)
    assert len(reasons) == 1
    assert f"died {RESTARTS_ALLOWED + 1} times within {RESTART_WINDOW:g} s" in reasons[0]


class _KilledWhileStarting(RedisServer):
    """A real redis-server that is SIGKILLed once just as the keeper waits
    for it to answer (`kills` times), as a test or an operator may do."""

    kills = 0

    def wait_ready(self) -> RedisServer:
        if self.kills:
            self.kills -= 1
            _kill(self.pid)
        return super().wait_ready()


def test_own_redis_server_killed_while_restarting_is_one_more_death(tmp_path: Path) -> None:
    """Found in CI: a restarted server answered the store, was killed, and the
    keeper, still waiting for its PING, took it for a server that cannot
    start and gave up after two deaths, not RESTARTS_ALLOWED + 1."""
    reasons: list[str] = []

    async def body() -> None:
        server = _KilledWhileStarting(tmp_path / "rs", unix_socket=tmp_path / "rs.sock")
        server.start()
        keeper = ServerKeeper(server, give_up=reasons.append)
        try:
            server.kills = 1
            _kill(server.pid)
            await _until(lambda: keeper.restarts == 1)
            assert reasons == [] and server.kills == 0
            assert server.unix_socket is not None
            assert redis.Redis(unix_socket_path=str(server.unix_socket)).ping()
        finally:
            await keeper.close()
            server.stop()

    run(body)


# ---------------------------------------------------------------- durability (--fsync)


def test_batch_leveldb_answers_only_from_synced_writes(leveldb_path: Path) -> None:
    """With group commit a write reaches LevelDB before its sync; a read of
    that key (GET, EXISTS, a SET NX that does not write, a DEL of nothing)
    waits for the sync, so no reply shows what a power loss could undo."""

    async def body() -> None:
        store = LevelDBStore(leveldb_path, 32, "batch")
        async with store:
            group = store._group
            assert group is not None
            await store.put(1, "/clean", b"c")
            synced = group.syncs
            assert await store.get(1, "/clean") == b"c"  # nothing pending: no sync asked
            assert group.syncs == synced

            for read in (lambda: store.get(2, "/new"), lambda: store.exists(2, "/new"),
                         lambda: store.put_if(2, "/new", b"x", "absent")):
                writing = asyncio.ensure_future(store.put(2, "/new", b"n"))
                await asyncio.sleep(0)  # the write is made and waits for its sync
                before = group.syncs
                assert await read() in (b"n", True, (False, b"n"))
                assert group.syncs > before  # the read returned after a sync covering the write
                await writing
            deleting = asyncio.ensure_future(store.delete(2, "/new"))
            await asyncio.sleep(0)
            before = group.syncs
            assert await store.delete(2, "/new") is False
            assert group.syncs > before and await deleting is True

    run(body)


def test_own_redis_server_appendfsync_follows_the_mode(tmp_path: Path) -> None:
    async def appendfsync(mode: FsyncMode) -> bytes:
        async with open_store(f"redis-server:{tmp_path / mode}", 32, mode) as store:
            assert isinstance(store, RedisStore) and store.server is not None
            with redis.Redis(unix_socket_path=str(store.server.unix_socket)) as raw:
                return bytes(raw.config_get("appendfsync")["appendfsync"].encode())

    assert [asyncio.run(appendfsync(mode)) for mode in ("always", "batch", "off")] == [
        b"always", b"always", b"everysec"]


def test_a_foreign_redis_is_checked_not_reconfigured(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    """A redis:// server belongs to its operator: the store warns when its
    persistence falls short of --fsync, and sees it fixed, but never changes it."""
    monkeypatch.setattr("nat_agent.redis_store.DURABILITY_CHECK_INTERVAL", 0.05)
    with RedisServer(tmp_path / "foreign", port=0) as server, redis.Redis.from_url(server.url) as raw:

        async def body() -> None:
            async with open_store(f"{server.url}/0", 32, "batch") as store:
                assert isinstance(store, RedisStore)
                await _until(lambda: store.durability_problem is not None)
                assert "appendfsync is everysec" in str(store.durability_problem)
                assert raw.config_get("appendfsync") == {"appendfsync": "everysec"}  # untouched
                raw.config_set("appendonly", "no")
                await _until(lambda: "appendonly is not yes" in str(store.durability_problem))
                raw.config_set("appendonly", "yes")
                raw.config_set("appendfsync", "always")  # as its operator would
                await _until(lambda: store.durability_problem is None)
            async with open_store(f"{server.url}/0", 32, "off") as relaxed:
                assert isinstance(relaxed, RedisStore)
                raw.config_set("appendfsync", "no")
                await relaxed.put(1, "/x", b"")  # off asks nothing of the server
                await asyncio.sleep(0.2)
                assert relaxed.durability_problem is None

        with caplog.at_level("INFO", logger="metaflow.agent.store"):
            run(body)
    messages = [r.getMessage() for r in caplog.records]
    assert sum("so a power loss can take acknowledged writes" in m for m in messages) == 1
    assert sum("so a restart of it loses every record" in m for m in messages) == 1
    assert any("now persists as --fsync batch needs" in m for m in messages)


def test_bad_fsync_mode_is_refused(leveldb_path: Path) -> None:
    with pytest.raises(ValueError, match="fsync mode must be one of always, batch, off"):
        open_store(f"leveldb:{leveldb_path}", 32, "sometimes")  # type: ignore[arg-type]
    assert not leveldb_path.exists()
