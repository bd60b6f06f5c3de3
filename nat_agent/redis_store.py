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
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Sequence
from pathlib import Path

import redis.asyncio as aioredis

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
    """Records in a redis-server reached through ``client``.

    ``server``, if given, is a redis-server this store owns and stops on close.
    """

    kind = "redis"

    def __init__(
        self,
        client: aioredis.Redis,
        width: int,
        *,
        prefix: bytes = b"",
        server: RedisServer | None = None,
    ) -> None:
        check_width(width)
        self.width = width
        self.prefix = prefix
        self.server = server
        self._client = client
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
        if (host is None) == (unix_socket is None):
            raise ValueError("give either host (and port) or unix_socket")
        if unix_socket is not None:
            client = aioredis.Redis(unix_socket_path=unix_socket, db=db, decode_responses=False)
        else:
            client = aioredis.Redis(host=host, port=port, db=db, decode_responses=False)
        return cls(client, width, prefix=prefix, server=server)

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
        return await self._client.get(value_key)

    async def put(self, mdid: int, path: str, value: bytes) -> None:
        value_key, member = self._keys(mdid, path)
        async with self._client.pipeline(transaction=True) as tx:
            tx.set(value_key, value)
            tx.zadd(self._index, {member: 0})
            await tx.execute()

    async def delete(self, mdid: int, path: str) -> bool:
        value_key, member = self._keys(mdid, path)
        async with self._client.pipeline(transaction=True) as tx:
            tx.delete(value_key)
            tx.zrem(self._index, member)
            deleted, _ = await tx.execute()
        return deleted == 1

    async def exists(self, mdid: int, path: str) -> bool:
        value_key, _ = self._keys(mdid, path)
        return await self._client.exists(value_key) == 1

    async def count(self, first: int, last: int) -> int:
        bounds = key_range(first, last, self.width)
        if bounds is None:
            return 0
        return await self._client.zlexcount(self._index, *_lex_bounds(bounds))

    async def _member_pages(self, bounds: KeyRange, batch: int) -> AsyncIterator[list[bytes]]:
        """Index members of ``bounds`` in pages of at most ``batch``.

        Each page resumes strictly after the last member seen, so deleting
        pages already returned does not disturb the walk, and writes behind
        the cursor cannot make it loop.
        """
        low, high = _lex_bounds(bounds)
        while True:
            page = await self._client.zrangebylex(self._index, low, high, start=0, num=batch)
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
            values = await self._client.mget([self._value_key(m[size:]) for m in members])
            chunk = [
                (*split_record_key(member, self.width), value)
                for member, value in zip(members, values)
                if value is not None
            ]
            if chunk:
                yield chunk

    async def put_many(self, records: Sequence[Record]) -> None:
        # Dicts keep the last of duplicates, as a sequence of puts would.
        values: dict[bytes, bytes] = {}
        members: dict[bytes, int] = {}
        for mdid, path, value in records:
            value_key, member = self._keys(mdid, path)
            values[value_key] = value
            members[member] = 0
        if not values:
            return
        async with self._client.pipeline(transaction=True) as tx:
            tx.mset(values)
            tx.zadd(self._index, members)
            await tx.execute()

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
            async with self._client.pipeline(transaction=True) as tx:
                tx.delete(*(self._value_key(m[size:]) for m in members))
                tx.zrem(self._index, *members)
                _, gone = await tx.execute()
            removed += gone
        return removed

    async def total(self) -> int:
        return await self._client.zcard(self._index)

    async def load_state(self) -> dict | None:
        raw = await self._client.get(self._state)
        return None if raw is None else json.loads(raw)

    async def save_state(self, state: dict) -> None:
        await self._client.set(self._state, json.dumps(state, sort_keys=True).encode())

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        await self._client.aclose()
        if self.server is not None:
            await asyncio.to_thread(self.server.stop)


def _lex_bounds(bounds: KeyRange) -> tuple[bytes, bytes]:
    """ZRANGEBYLEX bounds of a key range: ``[start`` and ``(stop`` or ``+``."""
    return b"[" + bounds.start, b"+" if bounds.stop is None else b"(" + bounds.stop
