"""The file system's records in one central ``redis-server``: the baseline
the mount is measured against (``metaflow-fs --central-redis HOST:PORT``).

This is how JuiceFS is commonly deployed: every client's metadata requests go
to one Redis, and each multi-step check (a create in an existing directory, an
rmdir of an empty one, a compare-and-set) is a Lua script, atomic there. The
namespace, rename and chunk logic above it are exactly the mount's, so a
side-by-side run compares where the records live, not two file systems.

Layout: each record at its normalized key; a directory's entry names also in
a sorted set (all scores 0, so ordered bytewise) at ``ELIST_INDEX + directory``,
which a page lists with ``ZRANGEBYLEX`` and reads with ``MGET``.
"""

from __future__ import annotations

import errno
import socket
import threading
from typing import cast

from client_lib.constants import ELIST_DEFAULT, ELIST_MAX
from client_lib.errors import NamespaceError, ServerError, Unavailable
from client_lib.mdid import entry_key, normalize_key
from client_lib.resp import ErrorReply, Reply, RespParser, encode_command

__all__ = ["CentralRecords"]

ELIST_INDEX = b"\x00idx"
"""Prefix of a directory's index of names (no normalized key starts with NUL)."""

# Every script's KEYS[1] is the record; entry scripts' KEYS[2] the directory's
# index, ARGV[1] the entry's name there.
_PUT = b"""
redis.call('SET', KEYS[1], ARGV[2])
if KEYS[2] then redis.call('ZADD', KEYS[2], 0, ARGV[1]) end
return 1
"""
_CREATE = b"""
if redis.call('EXISTS', KEYS[1]) == 1 then return 0 end
redis.call('SET', KEYS[1], ARGV[2])
if KEYS[2] then redis.call('ZADD', KEYS[2], 0, ARGV[1]) end
return 1
"""
_COMPARE_AND_SET = b"""
if redis.call('GET', KEYS[1]) ~= ARGV[2] then return 0 end
redis.call('SET', KEYS[1], ARGV[3])
return 1
"""
_DELETE = b"""
if ARGV[2] ~= '' and redis.call('GET', KEYS[1]) ~= ARGV[3] then return 0 end
if redis.call('DEL', KEYS[1]) == 0 then return 0 end
if KEYS[2] then redis.call('ZREM', KEYS[2], ARGV[1]) end
return 1
"""
# KEYS: entry, index, header.
_CREATE_ENTRY = b"""
if redis.call('EXISTS', KEYS[3]) == 0 then return -1 end
if redis.call('EXISTS', KEYS[1]) == 1 then return 0 end
redis.call('SET', KEYS[1], ARGV[2])
redis.call('ZADD', KEYS[2], 0, ARGV[1])
return 1
"""
# KEYS: header, index.
_REMOVE_DIRECTORY = b"""
if redis.call('ZCARD', KEYS[2]) > 0 then return -1 end
return redis.call('DEL', KEYS[1])
"""


class CentralRecords:
    """`client_lib.fs.records.Records` over one redis-server; thread-safe (a
    connection per thread). Failures are `Unavailable` (no retries: the
    baseline is one server, which is up or not)."""

    def __init__(self, host: str, port: int, timeout: float = 30.0) -> None:
        self.host, self.port, self.timeout = host, port, timeout
        self._local = threading.local()
        self._all: list[socket.socket] = []
        self._lock = threading.Lock()

    # -- the Records surface -------------------------------------------------------------

    def get(self, path: str | bytes) -> bytes | None:
        return cast(bytes | None, self._call(b"GET", normalize_key(path)))

    def put(self, path: str | bytes, value: bytes) -> None:
        self._script(_PUT, path, value)

    def create(self, path: str | bytes, value: bytes) -> bool:
        return self._script(_CREATE, path, value) == 1

    def compare_and_set(self, path: str | bytes, old: bytes, new: bytes) -> bool:
        return self._script(_COMPARE_AND_SET, path, old, new) == 1

    def delete(self, path: str | bytes) -> bool:
        return self._script(_DELETE, path, b"", b"") == 1

    def delete_if_equal(self, path: str | bytes, value: bytes) -> bool:
        return self._script(_DELETE, path, b"1", value) == 1

    def entries(self, directory: str | bytes, after: str | bytes = b"",
                count: int = ELIST_DEFAULT) -> list[tuple[bytes, bytes]]:
        key = normalize_key(directory)
        low = b"(" + entry_key(key, after)[len(key) + 1:] if after else b"-"
        names = cast(list[bytes], self._call(b"ZRANGEBYLEX", ELIST_INDEX + key, low, b"+",
                                             b"LIMIT", 0, count))
        if not names:
            return []
        values = cast(list[bytes | None], self._call(b"MGET", *(key + b"\0" + n for n in names)))
        return [(n, v) for n, v in zip(names, values, strict=True) if v is not None]

    def create_entry(self, directory: str | bytes, name: str | bytes, value: bytes) -> bool:
        key = normalize_key(directory)
        entry = entry_key(key, name)
        done = self._call(b"EVAL", _CREATE_ENTRY, 3, entry, ELIST_INDEX + key, key,
                          entry[len(key) + 1:], value)
        if done == -1:
            raise NamespaceError(errno.ENOENT, f"no such directory: {key!r}")
        return done == 1

    def remove_directory(self, directory: str | bytes) -> bool:
        key = normalize_key(directory)
        done = self._call(b"EVAL", _REMOVE_DIRECTORY, 2, key, ELIST_INDEX + key)
        if done == -1:
            raise NamespaceError(errno.ENOTEMPTY, f"directory not empty: {key!r}")
        return done == 1

    def close(self) -> None:
        with self._lock:
            for conn in self._all:
                conn.close()
            self._all.clear()
        self._local = threading.local()

    # -- wire ------------------------------------------------------------------------------

    def _script(self, script: bytes, path: str | bytes, *args: bytes) -> Reply:
        """A script on one record, and on its directory's index when it is an entry."""
        key = normalize_key(path)
        directory, nul, name = key.partition(b"\0")
        keys = [key, ELIST_INDEX + directory] if nul else [key]
        return self._call(b"EVAL", script, len(keys), *keys, name, *args)

    def _call(self, *command: bytes | int) -> Reply:
        conn, parser = self._connection()
        try:
            conn.sendall(encode_command(*command))
            while True:
                done, reply = parser.next_reply()
                if done:
                    break
                data = conn.recv(1 << 20)
                if not data:
                    raise ConnectionError("redis-server closed the connection")
                parser.feed(data)
        except OSError as exc:
            self._drop()
            raise Unavailable(f"central redis-server {self.host}:{self.port}", 1, str(exc)) from None
        if isinstance(reply, ErrorReply):
            raise ServerError(reply.message)
        return reply

    def _connection(self) -> tuple[socket.socket, RespParser]:
        held = getattr(self._local, "conn", None)
        if held is None:
            try:
                conn = socket.create_connection((self.host, self.port), timeout=self.timeout)
            except OSError as exc:
                raise Unavailable(f"central redis-server {self.host}:{self.port}", 1, str(exc)) from None
            conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            held = self._local.conn = (conn, RespParser(max_bulk=1 << 30, max_args=ELIST_MAX))
            with self._lock:
                self._all.append(conn)
        return cast(tuple[socket.socket, RespParser], held)

    def _drop(self) -> None:
        held = getattr(self._local, "conn", None)
        if held is not None:
            held[0].close()
            self._local.conn = None

