"""The Redis store: records in a real redis-server, with an index ordered by mdid.

Layout, every key under the store's ``prefix``:

* ``{prefix}k:{path}`` -> value, so ``redis-cli GET k:/a/b`` shows a record;
* ``{prefix}idx``, a sorted set whose members are ``be(mdid) + path`` all
  with score 0. Equal scores make Redis order members by bytes, i.e. by
  ``(mdid, path bytes)``, and ZLEXCOUNT / ZRANGEBYLEX then count and scan any
  mdid range in O(log n + k). (Scores are doubles: they cannot hold 128-bit
  IDs, nor even all 32-bit ones with a path tie-break, hence lex order.)
* ``{prefix}state``, the agent's state document as JSON.

Writes change a value and its index member in one MULTI/EXEC transaction,
so the two never disagree. Because a path always has the same mdid, the
member of a value key is known without reading anything. A conditional write
(`put_if`, for SET NX/XX/GET) must read before it writes, which MULTI/EXEC
cannot express, so it is one small Lua script: Redis runs a script alone,
so the check, the value and the index change together.

Every command goes through one pipelining `RedisConnection`, shared by all
of the service's coroutines: the store is on the hot path of every client
request, and that connection costs little more than the round trip. It
reconnects by itself, from the next request, after the server went away.

With ``redis-server:DIR`` the store runs its own server and keeps it
running: a `ServerKeeper` watches the process (a pidfd on the event loop, no
polling) and restarts it when it dies; its append-only file brings the data
back. Requests in between get ``TRYAGAIN`` from the service. A server that
keeps dying (more than `RESTARTS_ALLOWED` times in `RESTART_WINDOW` seconds)
or cannot be started is not worth retrying: the keeper logs it as critical
and makes the agent exit with an error, so that whatever supervises the
agent sees it.

Durability (`FsyncMode`). redis-server, not the agent, holds the data, so a
killed agent loses nothing. With ``redis-server:DIR`` the mode sets that
server's ``appendfsync``: ``always`` for both ``always`` and ``batch``,
because Redis already commits in groups: it appends the writes of one round
of its event loop to its file, fsyncs once, and only then sends that round's
replies, so the store's pipelined writes share one sync and no reply shows
an unsynced write. ``off`` keeps Redis's default ``everysec`` (a background
fsync each second: a power loss takes about the last second or two).

A ``redis://`` or ``unix://`` server is somebody else's, and the store does
not reconfigure it: that would silently change the durability and speed of
its other clients, and would be undone by its next restart unless its
config file were rewritten too. Unless ``fsync`` is ``off``, the store reads
its ``appendonly`` and ``appendfsync`` at open and every
`DURABILITY_CHECK_INTERVAL` seconds, and logs a warning naming what to change
whenever they fall short (`RedisStore.durability_problem`).
"""

from __future__ import annotations

import asyncio
import itertools
import json
import logging
import os
import time
from collections import deque
from collections.abc import AsyncIterator, Callable, Sequence
from pathlib import Path
from typing import Any, cast

from nat_agent.redis_conn import RedisConnection, RedisReplyError
from nat_agent.redis_server import RedisServer, RedisServerError, RedisServerExited
from nat_agent.store import (
    DEFAULT_FSYNC,
    Condition,
    FsyncMode,
    IfEqual,
    InDirectory,
    KeyRange,
    Record,
    Removal,
    Store,
    check_batch,
    check_fsync,
    check_width,
    decode_path,
    encode_path,
    entry_bounds,
    key_range,
    record_key,
    scan_start,
    split_record_key,
)

__all__ = ["DURABILITY_CHECK_INTERVAL", "RESTARTS_ALLOWED", "RESTART_WINDOW", "RedisStore",
           "ServerKeeper"]

log = logging.getLogger("metaflow.agent.store")

_SOCKET_NAME = "redis.sock"
_DELETE_BATCH = 1000
"""Records removed per transaction by `RedisStore.delete_range`."""

_APPENDFSYNC: dict[FsyncMode, str] = {"always": "always", "batch": "always", "off": "everysec"}
"""The ``appendfsync`` an own redis-server runs with, per mode."""

DURABILITY_CHECK_INTERVAL = 10.0
"""Seconds between two reads of a foreign server's persistence settings."""

RESTARTS_ALLOWED = 3
RESTART_WINDOW = 60.0
"""An own redis-server is restarted at most RESTARTS_ALLOWED times within
RESTART_WINDOW seconds; one more death and the agent gives up."""

# KEYS: value key, index, the directory header's value key ("indir").
# ARGV: value, condition ("absent", "present", "equal", "indir" or ""), index
# member, the value "equal" compares with.
# Returns {written (0/1), previous value or nil}.
_PUT_IF = b"""
local old = redis.call('GET', KEYS[1])
if (ARGV[2] == 'absent' and old) or (ARGV[2] == 'present' and not old)
   or (ARGV[2] == 'equal' and old ~= ARGV[4])
   or (ARGV[2] == 'indir' and (old or redis.call('EXISTS', KEYS[3]) == 0)) then
  return {0, old}
end
redis.call('SET', KEYS[1], ARGV[1])
redis.call('ZADD', KEYS[2], 0, ARGV[3])
return {1, old}
"""


# KEYS: value key, index. ARGV: index member, the value to compare with.
# Returns 1 if deleted, 0 if absent or holding another value.
_DELETE_IF = b"""
if redis.call('GET', KEYS[1]) ~= ARGV[2] then
  return 0
end
redis.call('DEL', KEYS[1])
redis.call('ZREM', KEYS[2], ARGV[1])
return 1
"""


# KEYS: the header's value key, index. ARGV: the header's index member, then
# the ZRANGEBYLEX bounds of its entries. Returns 1 removed, 0 absent, -1 not empty.
_REMOVE_DIRECTORY = b"""
if #redis.call('ZRANGEBYLEX', KEYS[2], ARGV[2], ARGV[3], 'LIMIT', 0, 1) > 0 then
  return -1
end
if redis.call('DEL', KEYS[1]) == 0 then
  return 0
end
redis.call('ZREM', KEYS[2], ARGV[1])
return 1
"""


def _exit_agent(reason: str) -> None:
    """Give up on the store by ending the process loudly. SystemExit raised
    in a loop callback leaves the event loop; the daemon's shutdown then runs
    as on SIGTERM (rules removed, store closed) and the exit status is 1."""
    log.critical("giving up: %s; the agent exits", reason)
    raise SystemExit(f"metaflow-agent: {reason}")


class ServerKeeper:
    """Restarts a store's own redis-server when it dies; gives up (calls
    `give_up` with the reason, from a loop callback) when it dies too often
    or will not start."""

    def __init__(
        self,
        server: RedisServer,
        give_up: Callable[[str], None] = _exit_agent,
        restarts: int = RESTARTS_ALLOWED,
        window: float = RESTART_WINDOW,
    ) -> None:
        self.server = server
        self.restarts = 0
        self._loop = asyncio.get_running_loop()
        self._give_up = give_up
        self._allowed = restarts
        self._window = window
        self._deaths: deque[float] = deque()
        self._pidfd: int | None = None
        self._restarting: asyncio.Task[None] | None = None
        self._watch()

    def _watch(self) -> None:
        pid = self.server.pid
        assert pid is not None
        self._pidfd = os.pidfd_open(pid)  # readable once the process has exited
        self._loop.add_reader(self._pidfd, self._died)

    def _unwatch(self) -> None:
        if self._pidfd is not None:
            self._loop.remove_reader(self._pidfd)
            os.close(self._pidfd)
            self._pidfd = None

    def _died(self) -> None:
        self._unwatch()
        pid, status = self.server.pid, self.server.reap()
        if self._one_death_too_many(f"redis-server {pid}", status):
            return
        log.error("redis-server %s died (status %s); restarting it from its append-only file",
                  pid, status)
        self._restarting = self._loop.create_task(self._restart())

    def _one_death_too_many(self, who: str, status: object) -> bool:
        """Count a death; past the allowance, give up and say so."""
        now = time.monotonic()
        self._deaths.append(now)
        while self._deaths[0] < now - self._window:
            self._deaths.popleft()
        if len(self._deaths) <= self._allowed:
            return False
        self._fail(f"{who} died {len(self._deaths)} times within {self._window:g} s (last status {status})")
        return True

    async def _restart(self) -> None:
        try:
            while True:
                try:
                    self.server.launch()  # on the loop's thread: see RedisServer.launch
                    await asyncio.to_thread(self.server.wait_ready)
                    break
                except RedisServerExited as exc:
                    # Killed while starting, perhaps just as it answered: one
                    # more death, not a server that cannot start.
                    if self._one_death_too_many("redis-server", exc.status):
                        return
                    log.error("redis-server died while starting (status %s); starting it again",
                              exc.status)
        except RedisServerError as exc:
            self._fail(f"cannot restart redis-server: {exc}")
            return
        finally:
            self._restarting = None
        self.restarts += 1
        log.warning("redis-server restarted as %s", self.server.pid)
        self._watch()

    def _fail(self, reason: str) -> None:
        self._loop.call_soon(self._give_up, reason)  # a callback, so SystemExit leaves the loop

    async def close(self) -> None:
        """Stop watching (before the server is stopped on purpose); waits for a
        restart under way, so that no server is started behind our back."""
        self._unwatch()
        if self._restarting is not None:
            await asyncio.wait({self._restarting})
            self._unwatch()

class RedisStore(Store):
    """Records in a redis-server reached through ``conn``.

    ``server``, if given, is a redis-server this store owns and stops on close.
    ``fsync`` is only recorded here; `connect` and `with_own_server` act on it.
    """

    kind = "redis"

    def __init__(
        self,
        conn: RedisConnection,
        width: int,
        *,
        prefix: bytes = b"",
        server: RedisServer | None = None,
        fsync: FsyncMode = DEFAULT_FSYNC,
    ) -> None:
        check_width(width)
        self.width = width
        self.fsync = check_fsync(fsync)
        self.prefix = prefix
        self.server = server
        self._conn = conn
        self._index = prefix + b"idx"
        self._state = prefix + b"state"
        self._values = prefix + b"k:"
        self._closed = False
        self.keeper: ServerKeeper | None = None
        self.durability_problem: str | None = None
        """Why a foreign server's settings fall short of ``fsync``, as last read."""
        self._durability_watch: asyncio.Task[None] | None = None

    @classmethod
    def connect(
        cls,
        width: int,
        *,
        host: str | None = None,
        port: int = 6379,
        unix_socket: str | None = None,
        db: int = 0,
        prefix: bytes = b"",
        server: RedisServer | None = None,
        fsync: FsyncMode = DEFAULT_FSYNC,
    ) -> RedisStore:
        """A store on an existing server at ``host:port`` or ``unix_socket``.

        The connection is made lazily, by the first command, in the running
        event loop. Unless the server is ours (``server``) or ``fsync`` is
        ``off``, its persistence settings are checked from then on.
        """
        conn = RedisConnection(host=host, port=port, unix_socket=unix_socket, db=db)
        store = cls(conn, width, prefix=prefix, server=server, fsync=fsync)
        if server is None and store.fsync != "off":
            store._durability_watch = asyncio.get_running_loop().create_task(store._watch_durability())
        return store

    @classmethod
    def with_own_server(
        cls,
        directory: Path,
        width: int,
        give_up: Callable[[str], None] = _exit_agent,
        fsync: FsyncMode = DEFAULT_FSYNC,
    ) -> RedisStore:
        """Start a redis-server in ``directory`` (unix socket only) and store there.

        Blocks until the server answers; closing the store stops it. Call it in
        the running event loop: a `ServerKeeper` on that loop restarts the
        server when it dies, and calls `give_up` (default: the agent exits
        with an error) when it keeps dying.
        """
        check_width(width)
        appendfsync = _APPENDFSYNC[check_fsync(fsync)]
        server = RedisServer(directory, unix_socket=directory / _SOCKET_NAME, appendfsync=appendfsync).start()
        store = cls.connect(width, unix_socket=str(server.unix_socket), server=server, fsync=fsync)
        try:
            store.keeper = ServerKeeper(server, give_up)
        except BaseException:
            server.stop()
            raise
        return store

    def _value_key(self, path_bytes: bytes) -> bytes:
        return self._values + path_bytes

    def _keys(self, mdid: int, path: str) -> tuple[bytes, bytes]:
        """The record's value key and index member (validating the mdid)."""
        member = record_key(mdid, path, self.width)
        return self._value_key(encode_path(path)), member

    async def get(self, mdid: int, path: str) -> bytes | None:
        value_key, _ = self._keys(mdid, path)
        return cast(bytes | None, await self._conn.call(b"GET", value_key))

    async def put(self, mdid: int, path: str, value: bytes) -> None:
        value_key, member = self._keys(mdid, path)
        await self._conn.transaction(
            [(b"SET", value_key, value), (b"ZADD", self._index, 0, member)]
        )

    async def put_if(
        self, mdid: int, path: str, value: bytes, when: Condition | None = None
    ) -> tuple[bool, bytes | None]:
        value_key, member = self._keys(mdid, path)
        header_key, expected = value_key, b""
        condition: bytes | str = b""
        if isinstance(when, IfEqual):
            condition, expected = b"equal", when.value
        elif isinstance(when, InDirectory):
            header_key, condition = self._keys(mdid, when.directory)[0], b"indir"
        elif when is not None:
            condition = when
        written, old = cast(list[Any], await self._conn.call(
            b"EVAL", _PUT_IF, 3, value_key, self._index, header_key, value, condition, member, expected))
        return written == 1, old

    async def remove_directory(self, mdid: int, directory: str) -> Removal:
        value_key, member = self._keys(mdid, directory)
        start, stop = entry_bounds(mdid, directory, "", self.width)
        done = await self._conn.call(b"EVAL", _REMOVE_DIRECTORY, 2, value_key, self._index,
                                     member, b"[" + start, b"(" + stop)
        return "removed" if done == 1 else "absent" if done == 0 else "not-empty"

    async def entries(self, mdid: int, directory: str, after: str, limit: int) -> list[tuple[str, bytes]]:
        start, stop = entry_bounds(mdid, directory, after, self.width)
        low = (b"(" if after else b"[") + start
        members = cast(list[bytes], await self._conn.call(
            b"ZRANGEBYLEX", self._index, low, b"(" + stop, b"LIMIT", 0, limit))
        if not members:
            return []
        skip = len(start) - len(encode_path(after))
        head = check_width(self.width)
        values = cast(list[bytes | None], await self._conn.call(
            b"MGET", *(self._value_key(m[head:]) for m in members)))
        # a record deleted between the two calls is left out
        return [(decode_path(m[skip:]), v) for m, v in zip(members, values, strict=True) if v is not None]

    async def delete(self, mdid: int, path: str, if_equal: bytes | None = None) -> bool:
        value_key, member = self._keys(mdid, path)
        if if_equal is not None:
            return await self._conn.call(b"EVAL", _DELETE_IF, 2, value_key, self._index,
                                         member, if_equal) == 1
        deleted, _ = await self._conn.transaction(
            [(b"DEL", value_key), (b"ZREM", self._index, member)]
        )
        return deleted == 1

    async def exists(self, mdid: int, path: str) -> bool:
        value_key, _ = self._keys(mdid, path)
        return await self._conn.call(b"EXISTS", value_key) == 1

    async def count(self, first: int, last: int) -> int:
        bounds = key_range(first, last, self.width)
        if bounds is None:
            return 0
        return cast(int, await self._conn.call(b"ZLEXCOUNT", self._index, *_lex_bounds(bounds)))

    async def _member_pages(self, bounds: KeyRange, batch: int,
                            after: tuple[int, str] | None = None) -> AsyncIterator[list[bytes]]:
        """Index members of ``bounds`` (from `after` on, see `Store.scan`) in
        pages of at most ``batch``.

        Each page resumes strictly after the last member seen, so deleting
        pages already returned does not disturb the walk, and writes behind
        the cursor cannot make it loop.
        """
        start, inclusive = scan_start(bounds, after, self.width)
        low, high = (b"[" if inclusive else b"(") + start, _lex_bounds(bounds)[1]
        while True:
            page = cast(
                list[bytes],
                await self._conn.call(b"ZRANGEBYLEX", self._index, low, high, b"LIMIT", 0, batch),
            )
            if page:
                yield page
            if len(page) < batch:
                return
            low = b"(" + page[-1]

    async def scan(self, first: int, last: int, batch: int = 1000,
                   after: tuple[int, str] | None = None) -> AsyncIterator[list[Record]]:
        """Records page by page; each page is read at its own moment, not a snapshot.

        A record deleted between reading a page of the index and reading its
        values is skipped.
        """
        check_batch(batch)
        bounds = key_range(first, last, self.width)
        if bounds is None:
            return
        size = self.width // 8
        async for members in self._member_pages(bounds, batch, after):
            keys = [self._value_key(m[size:]) for m in members]
            values = cast(list[bytes | None], await self._conn.call(b"MGET", *keys))
            chunk = [
                (*split_record_key(member, self.width), value)
                for member, value in zip(members, values, strict=True)
                if value is not None
            ]
            if chunk:
                yield chunk

    async def put_many(self, records: Sequence[Record]) -> None:
        # A dict keeps the last of duplicates, as a sequence of puts would.
        values: dict[bytes, bytes] = {}
        members: list[bytes | int] = []
        for mdid, path, value in records:
            value_key, member = self._keys(mdid, path)
            values[value_key] = value
            members += (0, member)  # a duplicate member is harmless: ZADD sets it twice
        if not values:
            return
        await self._conn.transaction([
            (b"MSET", *itertools.chain.from_iterable(values.items())),
            (b"ZADD", self._index, *members),
        ])

    async def delete_range(self, first: int, last: int) -> int:
        """Remove the range in transactions of up to 1000 records.

        Each record's value and member go together; the range as a whole is
        not one transaction, because one that removes millions of keys would
        stall every other client of the server. Callers freeze writes to the
        range first (a migration does), so nothing is missed.
        """
        bounds = key_range(first, last, self.width)
        if bounds is None:
            return 0
        size = self.width // 8
        removed = 0
        async for members in self._member_pages(bounds, _DELETE_BATCH):
            _, gone = await self._conn.transaction([
                (b"DEL", *[self._value_key(m[size:]) for m in members]),
                (b"ZREM", self._index, *members),
            ])
            removed += cast(int, gone)
        return removed

    async def total(self) -> int:
        return cast(int, await self._conn.call(b"ZCARD", self._index))

    async def size_bytes(self) -> int:
        """The server's ``used_memory``: Redis holds its whole data set in memory,
        and that (not its append-only file, which a rewrite shrinks at will, nor
        the keys under this prefix alone, which only a scan could add up) is what
        fills up and what ``maxmemory`` limits."""
        info = cast(bytes, await self._conn.call(b"INFO", b"memory"))
        fields = dict(line.partition(b":")[::2] for line in info.splitlines())
        return int(fields[b"used_memory"])   # in every Redis's INFO memory

    async def load_state(self) -> dict[str, Any] | None:
        raw = cast(bytes | None, await self._conn.call(b"GET", self._state))
        return None if raw is None else cast(dict[str, Any], json.loads(raw))

    async def save_state(self, state: dict[str, Any]) -> None:
        await self._conn.call(b"SET", self._state, json.dumps(state, sort_keys=True).encode())

    async def _watch_durability(self) -> None:
        """Check a foreign server's persistence now and every interval; warn on
        each change for the worse. A server that cannot be reached keeps its
        last verdict: the requests that need it fail on their own."""
        while True:
            try:
                problem = await self._durability_problem()
            except ConnectionError:
                problem = self.durability_problem
            except RedisReplyError as exc:
                problem = f"its settings cannot be read ({exc}), so its durability is unknown"
            if problem is not None and problem != self.durability_problem:
                log.warning("redis at %s: %s", self._conn.address, problem)
            elif problem is None and self.durability_problem is not None:
                log.info("redis at %s now persists as --fsync %s needs", self._conn.address, self.fsync)
            self.durability_problem = problem
            await asyncio.sleep(DURABILITY_CHECK_INTERVAL)

    async def _durability_problem(self) -> str | None:
        """What in the server's settings falls short of ``fsync`` (None: nothing)."""
        reply = cast(list[bytes], await self._conn.call(b"CONFIG", b"GET", b"append*"))
        settings = dict(zip(reply[::2], reply[1::2], strict=True))
        fix = f"--fsync {self.fsync} needs appendonly yes and appendfsync always (in its redis.conf)"
        if settings.get(b"appendonly") != b"yes":
            return f"appendonly is not yes, so a restart of it loses every record; {fix}"
        if (appendfsync := settings.get(b"appendfsync")) != b"always":
            shown = appendfsync.decode(errors="replace") if appendfsync else "unknown"
            return f"appendfsync is {shown}, so a power loss can take acknowledged writes; {fix}"
        return None

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        if self._durability_watch is not None:
            self._durability_watch.cancel()
            await asyncio.wait({self._durability_watch})
        if self.keeper is not None:
            await self.keeper.close()
        await self._conn.close()
        if self.server is not None:
            await asyncio.to_thread(self.server.stop)


def _lex_bounds(bounds: KeyRange) -> tuple[bytes, bytes]:
    """ZRANGEBYLEX bounds of a key range: ``[start`` and ``(stop`` or ``+``."""
    return b"[" + bounds.start, b"+" if bounds.stop is None else b"(" + bounds.stop
