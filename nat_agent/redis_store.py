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
member of a value key is known without reading anything.

Every command goes through one pipelining `RedisConnection`, shared by all
of the service's coroutines: the store is on the hot path of every client
request, and that connection costs little more than the round trip.
"""

from __future__ import annotations

import asyncio
import itertools
import json
from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from typing import cast

from nat_agent.redis_conn import RedisConnection
from nat_agent.redis_server import RedisServer
from nat_agent.store import (
    KeyRange,
    Record,
    Store,
    check_batch,
    check_width,
    encode_path,
    key_range,
    record_key,
    split_record_key,
)

__all__ = ["RedisStore"]

_SOCKET_NAME = "redis.sock"
_DELETE_BATCH = 1000
"""Records removed per transaction by `RedisStore.delete_range`."""

class RedisStore(Store):
    """Records in a redis-server reached through ``conn``.

    ``server``, if given, is a redis-server this store owns and stops on close.
    """

    kind = "redis"

    def __init__(
        self,
        conn: RedisConnection,
        width: int,
        *,
        prefix: bytes = b"",
        server: RedisServer | None = None,
    ) -> None:
        check_width(width)
        self.width = width
        self.prefix = prefix
        self.server = server
        self._conn = conn
        self._index = prefix + b"idx"
        self._state = prefix + b"state"
        self._values = prefix + b"k:"
        self._closed = False

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
    ) -> RedisStore:
        """A store on an existing server at ``host:port`` or ``unix_socket``.

        The connection is made lazily, by the first command, in the running
        event loop.
        """
        conn = RedisConnection(host=host, port=port, unix_socket=unix_socket, db=db)
        return cls(conn, width, prefix=prefix, server=server)

    @classmethod
    def with_own_server(cls, directory: Path, width: int) -> RedisStore:
        """Start a redis-server in ``directory`` (unix socket only) and store there.

        Blocks until the server answers; closing the store stops it.
        """
        check_width(width)
        server = RedisServer(directory, unix_socket=directory / _SOCKET_NAME).start()
        return cls.connect(width, unix_socket=str(server.unix_socket), server=server)

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

    async def delete(self, mdid: int, path: str) -> bool:
        value_key, member = self._keys(mdid, path)
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

    async def _member_pages(self, bounds: KeyRange, batch: int) -> AsyncIterator[list[bytes]]:
        """Index members of ``bounds`` in pages of at most ``batch``.

        Each page resumes strictly after the last member seen, so deleting
        pages already returned does not disturb the walk, and writes behind
        the cursor cannot make it loop.
        """
        low, high = _lex_bounds(bounds)
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

    async def scan(self, first: int, last: int, batch: int = 1000) -> AsyncIterator[list[Record]]:
        """Records page by page; each page is read at its own moment, not a snapshot.

        A record deleted between reading a page of the index and reading its
        values is skipped.
        """
        check_batch(batch)
        bounds = key_range(first, last, self.width)
        if bounds is None:
            return
        size = self.width // 8
        async for members in self._member_pages(bounds, batch):
            keys = [self._value_key(m[size:]) for m in members]
            values = cast(list[bytes | None], await self._conn.call(b"MGET", *keys))
            chunk = [
                (*split_record_key(member, self.width), value)
                for member, value in zip(members, values)
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

    async def load_state(self) -> dict | None:
        raw = cast(bytes | None, await self._conn.call(b"GET", self._state))
        return None if raw is None else json.loads(raw)

    async def save_state(self, state: dict) -> None:
        await self._conn.call(b"SET", self._state, json.dumps(state, sort_keys=True).encode())

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        await self._conn.close()
        if self.server is not None:
            await asyncio.to_thread(self.server.stop)


def _lex_bounds(bounds: KeyRange) -> tuple[bytes, bytes]:
    """ZRANGEBYLEX bounds of a key range: ``[start`` and ``(stop`` or ``+``."""
    return b"[" + bounds.start, b"+" if bounds.stop is None else b"(" + bounds.stop
