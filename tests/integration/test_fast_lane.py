"""The compiled request path (`FastLane`) against the Python path, its oracle (issue 13).

Two metadata services, one with the compiled path and one without, each
over its own real LevelDB store, get the same random ownership view (held
blocks as primary or backup, serving or not, frozen parts, a suspension) and
the same random stream of commands: the ones the lane takes on, with keys
that normalize, do not, or are not UTF-8, and everything it must leave to
Python (options, other commands, wrong arities, RESP3, oversized values,
inline commands), cut into random chunks and sent through a real socket
pair to the service's real `Connection`. The reply bytes, the stores'
records and counts, and the service counters must be identical, whatever
``--fsync`` is (``batch`` makes the lane decline writes and unsynced reads).
"""

from __future__ import annotations

import asyncio
import dataclasses
import itertools
import socket
import threading
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from client_lib.api.admin import Member, Role
from client_lib.api.metrics import REQUEST_BUCKETS
from client_lib.cidr import Block
from client_lib.constants import MAX_KEY
from client_lib.mdid import NAME_MAX, PATH_MAX, mdid_of_key, normalize_key
from client_lib.resp import OK, ErrorReply, RespParser, SimpleString, encode_command
from nat_agent._fastpath import Histogram, SyncGroup
from nat_agent.agent import Agent, Identity
from nat_agent.connection import Connection
from nat_agent.leveldb_store import LevelDBStore
from nat_agent.replication import Replicator
from nat_agent.resp_commands import encode_reply, internal_error
from nat_agent.service import MetadataService, ServiceLimits, keyspace
from nat_agent.store import FsyncMode, Record, RecordAccess, record_key

SPACE = Block.parse("10.9.0.0/28")   # 16 IDs: random blocks cover a fair share of the keys
NAME = "lane"
MAX_VALUE = 64
MARK = b"end-of-stream"
EPOCHS = itertools.count(1)   # every view newer than the last, as the controller sends them

KEYS = [b"/a", b"/a/b", b"/a//b", b"/a/./b/", b"/a/b/..", b"/dir", b"/dir\0e1", b"/dir/\0e2", b"/",
        b"/x/../..", b"rel", b"", b"/a\0", b"/a\0x/y", b"/a\0..", b"/\xff\xfe", b"/\xed\xa0\x80",
        b"/" + b"x" * 5000, "/é/ü".encode(), b"/a\0n\0m", b"/a b", b"/A"]

EDGES = [b"/d\0" + b"n" * NAME_MAX, b"/d\0" + b"n" * (NAME_MAX + 1),
         b"/" + b"k" * (PATH_MAX - 1), b"/" + b"k" * PATH_MAX, b"/k/" + b"k" * (PATH_MAX - 3) + b"/.",
         b"/" + b"d" * (PATH_MAX - 5) + b"\0" + b"nnn", b"/" + b"d" * (PATH_MAX - 5) + b"\0" + b"nnnn"]
"""Keys at the limits and one over: a file name of `NAME_MAX` bytes, a
normalized key (a path, an entry) of `PATH_MAX`."""


@dataclass
class Side:
    service: MetadataService
    store: LevelDBStore


@pytest.fixture(params=["off", "always", "batch"])
def sides(request, tmp_path: Path) -> Iterator[tuple[Side, Side]]:
    made = []
    for compiled in (True, False):
        store = LevelDBStore(tmp_path / f"compiled-{compiled}", SPACE.width, fsync=request.param)
        agent = Agent(Identity(NAME, None, None, 9000, "http://127.0.0.1:1", 1000), store, SPACE)
        replicator = Replicator(agent.ownership, NAME, b"s" * 32)
        made.append(Side(MetadataService(agent, replicator, ServiceLimits(max_value=MAX_VALUE),
                                         compiled=compiled), store))
    assert made[0].service.lane() is not None and made[1].service.lane() is None
    yield made[0], made[1]
    for side in made:
        asyncio.run(side.store.close())


# -- random ownership ---------------------------------------------------------------

@st.composite
def views(draw: st.DrawFn) -> tuple[list[Role], list[Block], bool]:
    """Disjoint held blocks with random roles, frozen parts of primary ones, a suspension."""
    roles: list[Role] = []
    free = [SPACE]
    for _ in range(draw(st.integers(1, 4))):
        if not free:
            break
        block = free.pop(draw(st.integers(0, len(free) - 1)))
        while block.plen < SPACE.width and draw(st.integers(0, 2)) == 0:
            low, high = block.halves()
            block, other = (low, high) if draw(st.booleans()) else (high, low)
            free.append(other)
        primary = draw(st.integers(0, 3)) < 3   # (Hypothesis favours 0: let 0 be the common case)
        members = [Member(NAME, "127.0.0.1:1")]
        if not primary or draw(st.integers(0, 3)) == 3:   # mostly sets of one: primaries without peers
            members.insert(0 if not primary else 1, Member("other", "127.0.0.1:1"))
        roles.append(Role(block, 0, primary, members, serving=draw(st.integers(0, 4)) < 4))
    frozen = []
    for role in roles:
        if role.primary and draw(st.integers(0, 3)) == 3:
            part = role.block
            while part.plen < SPACE.width and draw(st.booleans()):
                part = part.halves()[draw(st.integers(0, 1))]
            frozen.append(part)
    return roles, frozen, draw(st.integers(0, 9)) == 9


def _apply(service: MetadataService, view: tuple[list[Role], list[Block], bool], epoch: int) -> None:
    roles, frozen, suspended = view
    ownership = service.ownership
    ownership.assign([Role(r.block, epoch, r.primary, r.members, r.serving) for r in roles], exclusive=True)
    ownership.unfreeze(ownership.frozen)
    ownership.freeze(frozen)
    ownership.suspended = suspended


# -- random commands ------------------------------------------------------------------

VALUES = st.binary(max_size=MAX_VALUE + 16)   # some over --max-value: refused on both paths
GOOD = [b"/a", b"/a/b", b"/dir", b"/dir\0e1", *(b"/k%d" % i for i in range(12))]
KEY = st.one_of(st.sampled_from(GOOD), st.sampled_from(GOOD), st.sampled_from(KEYS))   # mostly routable


@st.composite
def commands(draw: st.DrawFn) -> list[bytes]:
    kind = draw(st.integers(0, 14))
    name = draw(st.sampled_from([b"GET", b"get", b"Get"])) if kind < 4 else None
    if name is not None:
        return [name, draw(KEY)]
    if kind < 7:
        return [draw(st.sampled_from([b"SET", b"set"])), draw(KEY), draw(VALUES)]
    if kind == 7:
        return [b"EXISTS", *draw(st.lists(KEY, min_size=1, max_size=2))]
    if kind == 8:
        return [b"PING", *draw(st.lists(st.binary(max_size=8), max_size=1))]
    if kind == 9:
        return [b"SET", draw(KEY), draw(VALUES), draw(st.sampled_from([b"NX", b"XX", b"GET", b"EX"]))]
    if kind == 10:
        return [b"HELLO", draw(st.sampled_from([b"2", b"3"]))]
    if kind == 11:
        return draw(st.sampled_from([[b"GET"], [b"GET", b"/a", b"/b"], [b"SET", b"/a"], [b"FOO", b"/a"]]))
    if kind == 12:
        return [b"DEL", *draw(st.lists(KEY, min_size=1, max_size=2))]
    if kind == 13:
        return [b"ECREATE", b"/dir", draw(st.sampled_from([b"e1", b"e2", b"."])), draw(VALUES)]
    return [b"STAT", draw(KEY)]


def _frame(command: list[bytes], inline: bool) -> bytes:
    if inline and all(arg and not any(c in arg for c in b" \t\r\n\x0b\x0c") for arg in command):
        return b" ".join(command) + b"\r\n"
    return encode_command(*command)


@st.composite
def streams(draw: st.DrawFn) -> list[bytes]:
    """Complete frames (so the end-of-stream ECHO is read as a command), in random chunks."""
    frames = draw(st.lists(commands(), min_size=3, max_size=25))
    data = b"".join(_frame(c, draw(st.integers(0, 7)) == 0) for c in frames)
    data += encode_command(b"ECHO", MARK)
    cuts = sorted(draw(st.lists(st.integers(0, len(data)), max_size=6)))
    return [data[a:b] for a, b in zip([0, *cuts], [*cuts, len(data)]) if b > a]


async def _exchange(service: MetadataService, chunks: list[bytes]) -> bytes:
    """What a client that sends `chunks` reads back, up to the end-of-stream echo."""
    ours, theirs = socket.socketpair()
    loop = asyncio.get_running_loop()
    transport, _ = await loop.connect_accepted_socket(lambda: Connection(service), ours)
    theirs.setblocking(False)
    try:
        for chunk in chunks:
            await loop.sock_sendall(theirs, chunk)
            await asyncio.sleep(0)
        received = b""
        end = encode_reply(MARK)
        while not received.endswith(end):
            got = await asyncio.wait_for(loop.sock_recv(theirs, 1 << 16), 10)
            if not got:
                break
            received += got
        return received
    finally:
        transport.abort()
        theirs.close()


async def _records(store: LevelDBStore) -> tuple[list[Record], int, list[int]]:
    rows = [row async for chunk in store.scan(SPACE.first, SPACE.last) for row in chunk]
    counts = [await store.count(i, i) for i in range(SPACE.first, SPACE.last + 1)]
    return rows, await store.total(), counts


def _ops(service: MetadataService) -> list[int]:
    """The requests the service served per ID (a bucket each, in this small space)."""
    window = service.ops.window()
    return [window.ops(i, i) for i in range(SPACE.first, SPACE.last + 1)]


def _answers_as_the_python_path(pair: tuple[Side, Side], view, stream: list[bytes],
                                exchange: Callable[[MetadataService, list[bytes]], Awaitable[bytes]]) -> None:
    """The first side, fed `stream` through `exchange`, gives the same bytes,
    leaves the same records and counts the same as the Python path (the
    second side) does, but for the requests it answered itself; and its
    lane and Python path together count every served request by ID once,
    as the Python path alone does."""
    compiled, python = pair
    epoch = next(EPOCHS)
    for side in pair:
        _apply(side.service, view, epoch)

    async def both() -> tuple[bytes, bytes]:
        return await exchange(compiled.service, stream), await _exchange(python.service, stream)

    got, want = asyncio.run(both())
    assert got == want
    assert asyncio.run(_records(compiled.store)) == asyncio.run(_records(python.store))
    taken = Counter(compiled.service.stats)
    del taken["compiled_requests"]
    assert taken == python.service.stats
    assert _ops(compiled.service) == _ops(python.service)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(view=views(), stream=streams())
def test_the_compiled_path_answers_exactly_as_the_python_path(sides, view, stream):
    _answers_as_the_python_path(sides, view, stream, _exchange)


def test_the_lane_answers_what_it_takes_on_and_declines_the_rest(sides):
    """The comparison above would pass with a lane that answers nothing: here
    it must answer a served GET, SET and PING itself, and leave alone a key
    outside the view, a SET with an option, and (``batch``) any write."""
    compiled, python = sides
    for side in sides:
        _apply(side.service, ([Role(SPACE, 1, True, [Member(NAME, "127.0.0.1:1")])], [], False), 1)
    batch = compiled.store.fsync == "batch"
    taken = encode_command(b"GET", b"/a") + encode_command(b"PING") + encode_command(b"EXISTS", b"/a")
    writes = encode_command(b"SET", b"/a", b"v")
    declined = encode_command(b"SET", b"/a", b"w", b"XX") + encode_command(b"GET", b"rel")

    async def run() -> tuple[bytes, bytes]:
        return (await _exchange(compiled.service, [taken, writes, declined, encode_command(b"ECHO", MARK)]),
                await _exchange(python.service, [taken, writes, declined, encode_command(b"ECHO", MARK)]))

    got, want = asyncio.run(run())
    assert got == want == (b"$-1\r\n+PONG\r\n:0\r\n+OK\r\n+OK\r\n-ERR invalid path: path must be absolute: "
                           b"b'rel'\r\n" + encode_reply(MARK))
    assert compiled.service.stats["compiled_requests"] == 3 + (0 if batch else 1)
    assert python.service.stats["compiled_requests"] == 0
    counted = [0] * SPACE.size   # GET, EXISTS, SET and SET XX of /a, on whichever path
    counted[mdid_of_key(b"/a", SPACE) - SPACE.first] = 4
    assert _ops(compiled.service) == _ops(python.service) == counted


def test_the_key_step_is_the_python_one():
    """`Keyspace.route` (normalize, UTF-8, hash) against `normalize_key` and `mdid_of_key`,
    in a 32-bit and a 128-bit space, for every odd key above and random ones."""
    spaces = [SPACE, Block.parse("100.64.0.0/10"), Block.parse("0.0.0.0/0"), Block.parse("fd00::/8"),
              Block.parse("::/0")]

    def python(raw: bytes, space: Block) -> tuple[bytes, int] | None:
        try:
            key = normalize_key(raw)
            key.decode("utf-8")
        except ValueError:
            return None
        return key, mdid_of_key(key, space)

    @settings(max_examples=400, deadline=None)
    @given(raw=st.one_of(st.sampled_from(KEYS), st.binary(max_size=40).map(lambda b: b"/" + b),
                         st.lists(st.sampled_from([b"/", b".", b"..", b"a", b"\0", b"\xc3\xa9", b"\xff"]),
                                  max_size=12).map(b"".join)),
           space=st.sampled_from(spaces))
    def check(raw: bytes, space: Block) -> None:
        assert keyspace(space).route(raw) == python(raw, space)

    check()
    for space in spaces:
        for raw in EDGES:
            assert keyspace(space).route(raw) == python(raw, space)
    assert [keyspace(SPACE).route(raw) is not None for raw in EDGES] == [True, False, True, False, True,
                                                                        True, False]


def test_the_lane_steps_aside_for_a_key_with_a_replicated_write_under_way(sides):
    """A read waits for a write its replica set may not hold yet
    (`MetadataService._settled`), which only the Python path can do: the
    lane declines the key of a replicated write under way (and only that
    key; here in a block with another member), and takes it again once the
    write has ended."""
    compiled, _ = sides
    service = compiled.service
    _apply(service, ([Role(SPACE, 1, True, [Member(NAME, "127.0.0.1:1")])], [], False), 1)

    def get(key: bytes) -> list[bytes]:
        return [encode_command(b"GET", key) + encode_command(b"ECHO", MARK)]

    async def run() -> list[int]:
        taken = [service.stats["compiled_requests"]]
        write = service.replicator.begin(SPACE.first, "/a")
        assert write is not None
        assert await _exchange(service, get(b"/b")) == b"$-1\r\n" + encode_reply(MARK)
        taken.append(service.stats["compiled_requests"])
        reading = asyncio.create_task(_exchange(service, get(b"/a")))
        await asyncio.sleep(0.05)
        assert not reading.done()   # it waits for the write
        service.replicator.finish(write, None)
        assert await reading == b"$-1\r\n" + encode_reply(MARK)
        taken.append(service.stats["compiled_requests"])
        assert await _exchange(service, get(b"/a")) == b"$-1\r\n" + encode_reply(MARK)
        taken.append(service.stats["compiled_requests"])
        return taken

    assert asyncio.run(run()) == [0, 1, 1, 2]
    assert service.lane().view.writing == 0


# -- the worker threads (`ServiceLoop`) against the same oracle -------------------------

@pytest.fixture(params=["off", "batch"])
def threaded(request, tmp_path: Path) -> Iterator[tuple[Side, Side]]:
    """A service whose port is served by two worker threads, and the Python path."""
    made = []
    for workers, compiled in ((2, True), (0, False)):
        store = LevelDBStore(tmp_path / f"workers-{workers}", SPACE.width, fsync=request.param)
        agent = Agent(Identity(NAME, None, None, 9000, "http://127.0.0.1:1", 1000), store, SPACE)
        replicator = Replicator(agent.ownership, NAME, b"s" * 32)
        limits = ServiceLimits(max_value=MAX_VALUE, workers=workers)
        service = MetadataService(agent, replicator, limits, compiled=compiled)
        # A clock that stands still: its sampler never slides the window, so `_ops` is cumulative.
        service.ops.clock = itertools.repeat(service.ops.clock()).__next__
        made.append(Side(service, store))
    yield made[0], made[1]
    for side in made:
        asyncio.run(side.store.close())


async def _over_tcp(service: MetadataService, chunks: list[bytes]) -> bytes:
    """`_exchange` through the worker threads: the service listens, a client connects."""
    port = await service.start("127.0.0.1", 0)
    loop = asyncio.get_running_loop()
    try:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        for chunk in chunks:
            writer.write(chunk)
            await writer.drain()
            await asyncio.sleep(0)
        received = b""
        end = encode_reply(MARK)
        while not received.endswith(end):
            got = await asyncio.wait_for(reader.read(1 << 16), 10)
            if not got:
                break
            received += got
        writer.close()
        return received
    finally:
        await loop.run_in_executor(None, lambda: None)   # let a handed-over reply finish
        await service.stop()


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(view=views(), stream=streams())
def test_the_worker_threads_answer_exactly_as_the_python_path(threaded, view, stream):
    _answers_as_the_python_path(threaded, view, stream, _over_tcp)


def test_the_worker_threads_answer_on_the_lane_and_hand_over_the_rest(threaded):
    """Not a lane that answers nothing, nor one that hands everything over:
    a served GET, EXISTS, PING and SET are the threads' own
    (`compiled_requests`), the SET with ``--fsync batch`` too, answered once
    a sync covered it; the declined SET XX GET and bad key are the service's,
    in order on the same connection."""
    workers, _ = threaded
    _apply(workers.service, ([Role(SPACE, 1, True, [Member(NAME, "127.0.0.1:1")])], [], False), 1)
    stream = [encode_command(b"GET", b"/a") + encode_command(b"PING") + encode_command(b"SET", b"/a", b"v"),
              encode_command(b"SET", b"/a", b"w", b"XX", b"GET") + encode_command(b"GET", b"rel")
              + encode_command(b"EXISTS", b"/a") + encode_command(b"ECHO", MARK)]
    got = asyncio.run(_over_tcp(workers.service, stream))
    assert got == (b"$-1\r\n+PONG\r\n+OK\r\n$1\r\nv\r\n-ERR invalid path: path must be absolute: b'rel'\r\n"
                   b":1\r\n" + encode_reply(MARK))
    assert workers.service.stats["compiled_requests"] == 4
    syncs = workers.store.disk_syncs()
    if workers.store.fsync == "batch":
        assert syncs is not None and sum(syncs.counts) >= 1   # the lane's SET waited for one


def _one_worker(path: Path, fsync: FsyncMode) -> tuple[LevelDBStore, MetadataService, RecordAccess]:
    """A service on one worker thread over a LevelDB store at `path`, and
    the store's record access, for a test to replace parts of in its lane."""
    store = LevelDBStore(path, SPACE.width, fsync=fsync)
    agent = Agent(Identity(NAME, None, None, 9000, "http://127.0.0.1:1", 1000), store, SPACE)
    service = MetadataService(agent, Replicator(agent.ownership, NAME, b"s" * 32),
                              ServiceLimits(max_value=MAX_VALUE, workers=1))
    access = store.record_access()
    assert access is not None
    return store, service, access


async def _exchanges(service: MetadataService, steps: list[tuple[list[list[bytes]], bytes]]) -> list[bytes]:
    """Start `service`; on one connection send each step's commands at once
    and read as many bytes as its expected replies have; what was read."""
    port = await service.start("127.0.0.1", 0)
    try:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        got = []
        for frames, expected in steps:
            writer.write(b"".join(encode_command(*frame) for frame in frames))
            got.append(await asyncio.wait_for(reader.readexactly(len(expected)), 10))
        writer.close()
        return got
    finally:
        await service.stop()


@pytest.mark.parametrize("fsync", ["off", "batch"])
def test_a_drain_waits_for_a_write_the_threads_admitted_before_a_freeze(tmp_path: Path, fsync: FsyncMode):
    """A store call releases the GIL, so the event loop can freeze a block
    while a worker's write to it is under way. A migration freezes, drains,
    then copies: the drain must not return before that write has landed, or
    the copy misses an acknowledged write. The put here is made slow (0.3 s,
    the GIL released) so that the freeze surely falls inside it; under
    ``batch`` it is the batch of the worker's turn, written when the turn
    ends."""
    store, service, access = _one_worker(tmp_path / "db", fsync)
    agent = service.agent
    entered = threading.Event()

    def slow_put(key: bytes, value: bytes, **options: object) -> None:
        entered.set()
        time.sleep(0.3)
        access.put(key, value, **options)

    def slow_batch(pairs: list[tuple[bytes, bytes]]) -> None:
        assert access.put_batch is not None
        entered.set()
        time.sleep(0.3)
        access.put_batch(pairs)

    # native=None: the lane then calls these instead of the extension's own table.
    slowed = (dataclasses.replace(access, put_batch=slow_batch, native=None) if fsync == "batch"
              else dataclasses.replace(access, put=slow_put, native=None))
    service._lane = service._fast_lane(slowed)
    _apply(service, ([Role(SPACE, 1, True, [Member(NAME, "127.0.0.1:1")])], [], False), 1)

    async def run() -> tuple[list[Record], bytes]:
        port = await service.start("127.0.0.1", 0)
        loop = asyncio.get_running_loop()
        try:
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.write(encode_command(b"SET", b"/a", b"v"))
            await loop.run_in_executor(None, entered.wait, 5)
            service.ownership.freeze([SPACE])           # what a migration does first...
            await agent.inflight.drain()                # ...then waits for what it admitted...
            # ...and copies.
            copied = [row async for chunk in store.scan(SPACE.first, SPACE.last) for row in chunk]
            reply = await asyncio.wait_for(reader.readexactly(5), 5)
            writer.close()
            return copied, reply
        finally:
            await service.stop()

    copied, reply = asyncio.run(run())
    assert reply == b"+OK\r\n" and service.stats["compiled_requests"] == 1
    assert [row[1] for row in copied] == ["/a"]
    asyncio.run(store.close())


def test_a_failed_sync_fails_the_replies_that_needed_it_and_every_later_write(tmp_path: Path):
    """Under ``--fsync batch`` a worker holds the replies that need a sync
    (a SET, a GET of a key not yet synced); when that sync fails, each of
    them gets the error the Python path words, the replies between them go
    out as they were, and every later write fails too: a second fsync could
    lie about the first. The lane's sync is made to fail from its second."""
    store, service, access = _one_worker(tmp_path / "db", "batch")
    assert access.sync_failure is not None
    syncs: list[int] = []

    def sync() -> None:
        syncs.append(len(syncs) + 1)
        if len(syncs) >= 2:
            raise OSError(5, "Input/output error")

    group = SyncGroup(seconds=Histogram(REQUEST_BUCKETS), sync=sync)
    service._lane = service._fast_lane(dataclasses.replace(access, group=group))
    _apply(service, ([Role(SPACE, 1, True, [Member(NAME, "127.0.0.1:1")])], [], False), 1)
    error = encode_reply(internal_error(access.sync_failure("Input/output error")))

    pipeline = [[b"GET", b"/a"], [b"SET", b"/b", b"w"], [b"GET", b"/b"], [b"PING"], [b"SET", b"/c", b"x"]]
    got = asyncio.run(_exchanges(service, [
        ([[b"SET", b"/a", b"v"]], b"+OK\r\n"),
        (pipeline, b"$1\r\nv\r\n" + error + error + b"+PONG\r\n" + error),
        ([[b"SET", b"/d", b"y"]], error)]))
    assert got[0] == b"+OK\r\n"
    assert got[1] == b"$1\r\nv\r\n" + error + error + b"+PONG\r\n" + error
    assert got[2] == error
    assert syncs == [1, 2] and service.stats["internal_errors"] == 4   # never tried again
    asyncio.run(store.close())


def test_writes_the_store_fails_to_apply_fail_the_replies_that_show_them(tmp_path: Path):
    """Under ``--fsync batch`` a worker's writes land as one batch when its
    turn ends. If the store refuses that batch, the replies that showed it
    (the SET, a GET of the value it set) get the Python path's internal
    error, the rest of the turn goes out as it was, and the next turn's
    writes are tried afresh (a refused write is not a failed sync)."""
    store, service, access = _one_worker(tmp_path / "db", "batch")
    assert access.put_batch is not None
    put_batch = access.put_batch
    refusals = [OSError(28, "No space left on device")]

    def refusing(pairs: list[tuple[bytes, bytes]]) -> None:
        if refusals:
            raise refusals.pop()
        put_batch(pairs)

    service._lane = service._fast_lane(dataclasses.replace(access, put_batch=refusing, native=None))
    _apply(service, ([Role(SPACE, 1, True, [Member(NAME, "127.0.0.1:1")])], [], False), 1)
    error = encode_reply(internal_error("[Errno 28] No space left on device"))
    pipeline = [[b"SET", b"/b", b"w"], [b"PING"], [b"GET", b"/b"], [b"GET", b"/c"]]

    got = asyncio.run(_exchanges(service, [
        (pipeline, error + b"+PONG\r\n" + error + b"$-1\r\n"),
        ([[b"SET", b"/b", b"x"], [b"GET", b"/b"]], b"+OK\r\n$1\r\nx\r\n")]))
    assert got == [error + b"+PONG\r\n" + error + b"$-1\r\n", b"+OK\r\n$1\r\nx\r\n"]
    assert service.stats["internal_errors"] == 2
    asyncio.run(store.close())


FAULT_KEYS = [b"/k%d" % i for i in range(5)]


@st.composite
def writes_and_reads(draw: st.DrawFn) -> list[list[list[bytes]]]:
    """Chunks (each sent at once) of SET, GET and PING on a few keys."""
    def command() -> list[bytes]:
        name = draw(st.sampled_from([b"SET", b"SET", b"GET", b"PING"]))
        if name == b"PING":
            return [name]
        key = draw(st.sampled_from(FAULT_KEYS))
        return [name, key, draw(st.binary(min_size=1, max_size=8))] if name == b"SET" else [name, key]
    return [[command() for _ in range(draw(st.integers(1, 5)))] for _ in range(draw(st.integers(1, 6)))]


def _replies(raw: bytes) -> list[object]:
    parser = RespParser()
    parser.feed(raw)
    out: list[object] = []
    while (reply := parser.next_reply())[0]:
        out.append(reply[1])
    return out


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(stream=writes_and_reads(), fail_from=st.sampled_from([None, 1, 1, 2, 3]))
def test_with_syncs_failing_nothing_acknowledged_is_lost_and_the_rest_answers_as_the_python_path(
        tmp_path_factory: pytest.TempPathFactory, stream: list[list[list[bytes]]],
        fail_from: int | None) -> None:
    """The worker threads under ``--fsync batch``, their syncs failing from
    the `fail_from`-th on (or never), against the Python path with syncs
    that never fail. The model disk is what LevelDB held for the keys when
    the last successful sync ran (it runs once the writes it covers have
    landed). Every SET acknowledged, and every value a GET showed, is on
    that disk (or a later SET's value is); once a sync failed no SET is
    acknowledged again; and every reply up to the first error is the Python
    path's."""
    tmp = tmp_path_factory.mktemp("faults")
    sides = []
    for workers, compiled in ((1, True), (0, False)):
        store = LevelDBStore(tmp / f"db-{compiled}", SPACE.width, fsync="batch")
        agent = Agent(Identity(NAME, None, None, 9000, "http://127.0.0.1:1", 1000), store, SPACE)
        service = MetadataService(agent, Replicator(agent.ownership, NAME, b"s" * 32),
                                  ServiceLimits(max_value=MAX_VALUE, workers=workers), compiled=compiled)
        _apply(service, ([Role(SPACE, 1, True, [Member(NAME, "127.0.0.1:1")])], [], False), 1)
        sides.append(Side(service, store))
    (workers_side, oracle) = sides
    access = workers_side.store.record_access()
    assert access is not None
    records = {raw: record_key(mdid_of_key(raw, SPACE), raw.decode(), SPACE.width) for raw in FAULT_KEYS}
    disk: dict[bytes, bytes | None] = {}
    syncs: list[int] = []

    def sync() -> None:
        syncs.append(len(syncs) + 1)
        if fail_from is not None and len(syncs) >= fail_from:
            raise OSError(5, "Input/output error")
        disk.clear()
        disk.update({raw: access.get(record) for raw, record in records.items()})

    group = SyncGroup(seconds=Histogram(REQUEST_BUCKETS), sync=sync)
    workers_side.service._lane = workers_side.service._fast_lane(dataclasses.replace(access, group=group))
    chunks = [b"".join(encode_command(*c) for c in chunk) for chunk in stream]
    chunks.append(encode_command(b"ECHO", MARK))
    try:
        got = _replies(asyncio.run(_over_tcp(workers_side.service, chunks)))
        expected = _replies(asyncio.run(_exchange(oracle.service, chunks)))
    finally:
        for side in sides:
            asyncio.run(side.store.close())
    commands = [c for chunk in stream for c in chunk]
    assert len(got) == len(expected) == len(commands) + 1
    errors = [i for i, reply in enumerate(got) if isinstance(reply, ErrorReply)]
    first_error = errors[0] if errors else len(got)
    assert got[:first_error] == expected[:first_error]
    if fail_from is None:
        assert not errors
    for i, (command, reply) in enumerate(zip(commands, got, strict=False)):
        if command[0] == b"PING":
            assert reply == SimpleString("PONG")
            continue
        if i > first_error and command[0] == b"SET":
            assert isinstance(reply, ErrorReply)   # a failed sync is final
        shown = command[2] if command[0] == b"SET" and reply == OK else reply
        if isinstance(shown, bytes):   # acknowledged, or read: on disk, or overwritten by a later SET
            later = {c[2] for c in commands[i + 1:] if c[0] == b"SET" and c[1] == command[1]}
            assert disk.get(command[1]) in {shown} | later


# -- the limits at their edges, at the service's defaults -------------------------------

@pytest.fixture(params=[0, 2], ids=["on the event loop", "on two worker threads"])
def at_defaults(request, tmp_path: Path) -> Iterator[tuple[Side, Side]]:
    """The lane (on the event loop, or the worker threads) and the Python
    path, both with the service's default limits (`MAX_KEY`, `MAX_VALUE`)."""
    made = []
    for workers, compiled in ((request.param, True), (0, False)):
        store = LevelDBStore(tmp_path / f"defaults-{compiled}", SPACE.width, fsync="off")
        agent = Agent(Identity(NAME, None, None, 9000, "http://127.0.0.1:1", 1000), store, SPACE)
        service = MetadataService(agent, Replicator(agent.ownership, NAME, b"s" * 32),
                                  ServiceLimits(workers=workers), compiled=compiled)
        service.ops.clock = itertools.repeat(service.ops.clock()).__next__
        made.append(Side(service, store))
    yield made[0], made[1]
    for side in made:
        asyncio.run(side.store.close())


def test_the_limits_at_their_edges_answer_as_the_python_path(at_defaults):
    """A file name of `NAME_MAX` bytes and one over, a key of `MAX_KEY`
    bytes and one over, a value at the service's limit and one over: the
    same bytes back as the Python path, each at-limit one answered by the
    lane itself, each one over refused (by the parser, or by the Python
    path's key check, never by the lane)."""
    compiled, _ = at_defaults
    limit = compiled.service.limits.max_value
    name, long_name = b"/d\0" + b"n" * NAME_MAX, b"/d\0" + b"n" * (NAME_MAX + 1)
    key, long_key = b"/" + b"k" * (MAX_KEY - 1), b"/" + b"k" * MAX_KEY
    value, long_value = b"v" * limit, b"v" * (limit + 1)
    # (A command right after a refused argument is the Python path's on the
    # threads: the parser discards the rest of the refused one first.)
    commands = [[b"SET", name, b"x"], [b"GET", name], [b"SET", long_name, b"x"], [b"GET", long_name],
                [b"SET", key, value], [b"GET", key], [b"EXISTS", key], [b"SET", long_key, b"x"],
                [b"GET", long_key], [b"SET", b"/v", long_value], [b"ECHO", MARK]]
    stream = [encode_command(*command) for command in commands]
    exchange = _over_tcp if compiled.service.limits.workers else _exchange
    view = ([Role(SPACE, 0, True, [Member(NAME, "127.0.0.1:1")])], [], False)
    _answers_as_the_python_path(at_defaults, view, stream, exchange)
    # SET and GET of the name and of the key, EXISTS of the key.
    assert compiled.service.stats["compiled_requests"] == 5
    assert compiled.service.stats["oversized_arguments"] == 3   # the long key's SET and GET, the long value


def test_at_the_limit_an_unread_command_is_answered_and_the_next_connection_goes(tmp_path: Path):
    """The event loop attaches a newcomer before it reads what the earlier
    connections sent, so at `--max-clients` the least recently useful
    connection may hold a complete command it has not read yet (the race of
    `test_port9000_abuse`'s reclaim case, made certain here). That command is
    read and answered first (`Connection.catch_up`), and the slot goes to the
    next connection, which sent nothing."""
    store = LevelDBStore(tmp_path / "db", SPACE.width, fsync="off")
    agent = Agent(Identity(NAME, None, None, 9000, "http://127.0.0.1:1", 1000), store, SPACE)
    service = MetadataService(agent, Replicator(agent.ownership, NAME, b"s" * 32),
                              ServiceLimits(max_clients=2))
    pairs = [socket.socketpair() for _ in range(3)]

    async def run() -> tuple[bytes, bytes]:
        loop = asyncio.get_running_loop()
        transports = []
        try:
            for n, (ours, theirs) in enumerate(pairs):
                theirs.setblocking(False)
                if n == 2:  # the older one's command is in its socket when the newcomer comes
                    await loop.sock_sendall(pairs[0][1], encode_command(b"PING"))
                transports.append((await loop.connect_accepted_socket(lambda: Connection(service), ours))[0])
                await asyncio.sleep(0.01)  # each one useful later than the one before
            return (await asyncio.wait_for(loop.sock_recv(pairs[0][1], 100), 5),
                    await asyncio.wait_for(loop.sock_recv(pairs[1][1], 100), 5))
        finally:
            for transport in transports:
                transport.abort()
            for _, theirs in pairs:
                theirs.close()

    try:
        older, idle = asyncio.run(run())
    finally:
        asyncio.run(store.close())
    assert older == b"+PONG\r\n"
    assert idle == b"", "the idle connection should have been the one reclaimed"
    assert service.stats["reclaimed_connections"] == 1
