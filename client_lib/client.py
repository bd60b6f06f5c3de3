"""What a distributed file system imports on its metadata path.

There is no lookup: the client hashes the path into a MetaDataID and sends
the request to that ID *as an address* on port 9000; the switches deliver it
to the owner. So a request is one TCP round trip (plus the connect, as in the
paper, which opens a connection per request). An open connection to the same
MetaDataID is reused, since it reaches the same server.

Retries: while a block moves between servers the old owner answers
TRYAGAIN (writes frozen) and then MOVED (flows not yet updated, or a stale
route), and a connection may time out; all three are retried with capped
exponential backoff and jitter. Everything else is an error of the caller's
(`InvalidPath`, `ServerError`) or a broken peer (`BadReply`); after the last
retry, `Unavailable` says what kept failing.

Every request is idempotent (SET of the same value, GET, EXISTS, DEL), which
is what makes retrying after a timeout safe; the one visible effect is that
a DEL whose reply was lost reports False on its retry.

`MetaFlowClient` is blocking and thread-safe (connections are pooled under a
lock); `AsyncMetaFlowClient` has the same methods as coroutines.
"""

from __future__ import annotations

import asyncio
import random
import socket
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Callable, Generic, TypeVar

from client_lib.cidr import Block
from client_lib.mdid import DEFAULT_SPACE, mdid_of_key, normalize_path
from client_lib.metadata import FileMetadata
from client_lib.resp import (
    ErrorReply,
    ProtocolError,
    Reply,
    RespParser,
    SimpleString,
    encode_command,
)

T = TypeVar("T")
C = TypeVar("C")
Route = Callable[[str], tuple[str, int]]


class MetaFlowError(Exception):
    """Base of every error the client raises."""


class InvalidPath(MetaFlowError, ValueError):
    """The path cannot be a key: not absolute, NUL, too long."""


class ServerError(MetaFlowError):
    """The server refused the request (`-ERR ...`): retrying would not help."""


class BadReply(MetaFlowError):
    """The peer's bytes are not the reply we expected (not a MetaFlow server?)."""


class Unavailable(MetaFlowError):
    """Every attempt failed with a retryable condition; `reason` is the last."""

    def __init__(self, path: str, attempts: int, reason: str) -> None:
        super().__init__(f"{path}: gave up after {attempts} attempts: {reason}")
        self.reason = reason


class _Retry(Exception):
    """Internal: this attempt failed in a way the next one may not."""


@dataclass(frozen=True)
class RetryPolicy:
    attempts: int = 10
    base: float = 0.005   # seconds before the first retry
    cap: float = 0.5      # longest pause between attempts

    def delay(self, attempt: int) -> float:
        """Full jitter on a capped exponential: spreads out clients that all
        hit the same frozen block at once."""
        return random.uniform(0.5, 1.0) * min(self.cap, self.base * (2 ** attempt))


@dataclass
class ClientStats:
    requests: int = 0
    retries: int = 0
    moved: int = 0
    tryagain: int = 0
    timeouts: int = 0
    connects: int = 0


@dataclass(frozen=True)
class _Op(Generic[T]):
    """One request, fully prepared: where it goes and how to read the answer."""

    path: str
    address: str
    frame: bytes
    decode: Callable[[Reply], T]


class _IdlePool(Generic[C]):
    """Open connections by MetaDataID address, least recently used evicted
    first once more than `limit` are idle."""

    def __init__(self, limit: int, close: Callable[[C], None]) -> None:
        self.limit = limit
        self._close = close
        self._idle: OrderedDict[str, list[C]] = OrderedDict()
        self._count = 0

    def take(self, address: str) -> C | None:
        conns = self._idle.get(address)
        if not conns:
            return None
        self._count -= 1
        conn = conns.pop()
        if not conns:
            del self._idle[address]
        return conn

    def give(self, address: str, conn: C) -> None:
        self._idle.setdefault(address, []).append(conn)
        self._idle.move_to_end(address)
        self._count += 1
        while self._count > self.limit:
            _, conns = self._idle.popitem(last=False)
            self._count -= len(conns)
            for old in conns:
                self._close(old)

    def clear(self) -> None:
        idle, self._idle, self._count = self._idle, OrderedDict(), 0
        for conns in idle.values():
            for conn in conns:
                self._close(conn)


@dataclass
class _Surface:
    """The shared part of both clients: ID math and request preparation."""

    space: Block | str = DEFAULT_SPACE
    port: int = 9000
    timeout: float = 2.0
    retry: RetryPolicy = field(default_factory=RetryPolicy)
    reuse: bool = True
    max_idle: int = 64
    route: Route | None = None
    stats: ClientStats = field(default_factory=ClientStats)

    def __post_init__(self) -> None:
        if isinstance(self.space, str):
            self.space = Block.parse(self.space)

    def mdid(self, path: str | bytes) -> int:
        return mdid_of_key(self._key(path), self.space)

    def address(self, path: str | bytes) -> str:
        return self.space.address(self.mdid(path))

    def _destination(self, address: str) -> tuple[str, int]:
        return self.route(address) if self.route else (address, self.port)

    @staticmethod
    def _key(path: str | bytes) -> bytes:
        try:
            return normalize_path(path)
        except (TypeError, ValueError) as exc:
            raise InvalidPath(str(exc)) from None

    def _op(self, decode: Callable[[Reply], T], command: str, path: str | bytes, *rest: bytes) -> _Op[T]:
        key = self._key(path)
        return _Op(key.decode("utf-8", "replace"), self.space.address(mdid_of_key(key, self.space)),
                   encode_command(command, key, *rest), decode)

    def _get(self, path):
        return self._op(_bulk, "GET", path)

    def _put(self, path, value: bytes | FileMetadata):
        data = value.to_bytes() if isinstance(value, FileMetadata) else bytes(value)
        return self._op(_ok, "SET", path, data)

    def _delete(self, path):
        return self._op(_flag, "DEL", path)

    def _exists(self, path):
        return self._op(_flag, "EXISTS", path)

    def _stat(self, path):
        return self._op(_metadata, "GET", path)

    def _failure(self, exc: OSError | ProtocolError, address: str) -> Exception:
        """What a broken exchange means: bytes that are not RESP are the peer's
        fault (no retry); a timeout (socket's or asyncio's, both TimeoutError)
        or a lost connection may pass, so it is retried."""
        if isinstance(exc, ProtocolError):
            return BadReply(f"{address}: {exc}")
        if isinstance(exc, TimeoutError):
            self.stats.timeouts += 1
            return _Retry(f"timeout after {self.timeout:g} s talking to {address}")
        return _Retry(f"{address}: {exc}")

    def _check(self, reply: Reply) -> Reply:
        if isinstance(reply, ErrorReply):
            if reply.code == "MOVED":
                self.stats.moved += 1
                raise _Retry(reply.message)
            if reply.code == "TRYAGAIN":
                self.stats.tryagain += 1
                raise _Retry(reply.message)
            raise ServerError(reply.message)
        return reply


def _redirected(reply: Reply) -> bool:
    """MOVED or TRYAGAIN: this connection leads to a server that is giving the
    ID away (or already has), so it must not be reused for that ID; a new
    connection follows the switches' current flows."""
    return isinstance(reply, ErrorReply) and reply.code in ("MOVED", "TRYAGAIN")


def _bulk(reply: Reply) -> bytes | None:
    if reply is None or isinstance(reply, bytes):
        return reply
    raise BadReply(f"expected a bulk string, got {reply!r}")


def _ok(reply: Reply) -> None:
    if reply != SimpleString("OK"):
        raise BadReply(f"expected +OK, got {reply!r}")


def _flag(reply: Reply) -> bool:
    if not isinstance(reply, int):
        raise BadReply(f"expected an integer, got {reply!r}")
    return reply > 0


def _metadata(reply: Reply) -> FileMetadata | None:
    data = _bulk(reply)
    return None if data is None else FileMetadata.from_bytes(data)


class MetaFlowClient(_Surface):
    """Blocking client. `with MetaFlowClient() as c: c.put("/a", meta)`."""

    def __post_init__(self) -> None:
        super().__post_init__()
        self._pool: _IdlePool[socket.socket] = _IdlePool(self.max_idle, socket.socket.close)
        self._lock = threading.Lock()

    def get(self, path: str | bytes) -> bytes | None:
        return self._run(self._get(path))

    def put(self, path: str | bytes, value: bytes | FileMetadata) -> None:
        return self._run(self._put(path, value))

    def delete(self, path: str | bytes) -> bool:
        return self._run(self._delete(path))

    def exists(self, path: str | bytes) -> bool:
        return self._run(self._exists(path))

    def stat(self, path: str | bytes) -> FileMetadata | None:
        return self._run(self._stat(path))

    def close(self) -> None:
        with self._lock:
            self._pool.clear()

    def __enter__(self) -> MetaFlowClient:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _run(self, op: _Op[T]) -> T:
        self.stats.requests += 1
        reason = ""
        for attempt in range(self.retry.attempts):
            if attempt:
                self.stats.retries += 1
                time.sleep(self.retry.delay(attempt - 1))
            try:
                return op.decode(self._check(self._exchange(op)))
            except _Retry as exc:
                reason = str(exc)
        raise Unavailable(op.path, self.retry.attempts, reason)

    def _exchange(self, op: _Op) -> Reply:
        sock = self._checkout(op.address)
        try:
            sock.sendall(op.frame)
            parser = RespParser(max_bulk=1 << 30)
            while True:
                done, reply = parser.next_reply()
                if done:
                    break
                data = sock.recv(65536)
                if not data:
                    raise ConnectionResetError("server closed the connection")
                parser.feed(data)
        except (OSError, ProtocolError) as exc:
            sock.close()
            raise self._failure(exc, op.address) from None
        if _redirected(reply):
            sock.close()
        else:
            self._checkin(op.address, sock)
        return reply

    def _checkout(self, address: str) -> socket.socket:
        with self._lock:
            sock = self._pool.take(address)
        if sock is not None:
            return sock
        self.stats.connects += 1
        try:
            sock = socket.create_connection(self._destination(address), timeout=self.timeout)
        except socket.timeout:
            self.stats.timeouts += 1
            raise _Retry(f"connect to {address} timed out") from None
        except OSError as exc:
            raise _Retry(f"connect to {address}: {exc}") from None
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        return sock

    def _checkin(self, address: str, sock: socket.socket) -> None:
        if not self.reuse:
            sock.close()
            return
        with self._lock:
            self._pool.give(address, sock)


async def exchange_async(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, frame: bytes,
                         timeout: float) -> Reply:
    """Send one request frame and read its one reply, each read within
    `timeout`; a peer that closes first raises ConnectionResetError. Shared
    with the benchmark's lookup RPCs, which talk RESP over the same streams."""
    writer.write(frame)
    parser = RespParser(max_bulk=1 << 30)
    while True:
        done, reply = parser.next_reply()
        if done:
            return reply
        data = await asyncio.wait_for(reader.read(65536), timeout)
        if not data:
            raise ConnectionResetError("server closed the connection")
        parser.feed(data)


class AsyncMetaFlowClient(_Surface):
    """The asyncio twin of `MetaFlowClient`, for one event loop."""

    def __post_init__(self) -> None:
        super().__post_init__()
        self._pool: _IdlePool[tuple[asyncio.StreamReader, asyncio.StreamWriter]] = _IdlePool(
            self.max_idle, lambda conn: conn[1].close())

    async def get(self, path: str | bytes) -> bytes | None:
        return await self._run(self._get(path))

    async def put(self, path: str | bytes, value: bytes | FileMetadata) -> None:
        return await self._run(self._put(path, value))

    async def delete(self, path: str | bytes) -> bool:
        return await self._run(self._delete(path))

    async def exists(self, path: str | bytes) -> bool:
        return await self._run(self._exists(path))

    async def stat(self, path: str | bytes) -> FileMetadata | None:
        return await self._run(self._stat(path))

    async def close(self) -> None:
        self._pool.clear()

    async def __aenter__(self) -> AsyncMetaFlowClient:
        return self

    async def __aexit__(self, *exc) -> None:
        await self.close()

    async def _run(self, op: _Op[T]) -> T:
        self.stats.requests += 1
        reason = ""
        for attempt in range(self.retry.attempts):
            if attempt:
                self.stats.retries += 1
                await asyncio.sleep(self.retry.delay(attempt - 1))
            try:
                return op.decode(self._check(await self._exchange(op)))
            except _Retry as exc:
                reason = str(exc)
        raise Unavailable(op.path, self.retry.attempts, reason)

    async def _exchange(self, op: _Op) -> Reply:
        reader, writer = await self._checkout(op.address)
        try:
            reply = await exchange_async(reader, writer, op.frame, self.timeout)
        except (OSError, ProtocolError) as exc:
            writer.close()
            raise self._failure(exc, op.address) from None
        if self.reuse and not _redirected(reply):
            self._pool.give(op.address, (reader, writer))
        else:
            writer.close()
        return reply

    async def _checkout(self, address: str) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        conn = self._pool.take(address)
        if conn is not None:
            return conn
        self.stats.connects += 1
        host, port = self._destination(address)
        try:
            conn = await asyncio.wait_for(asyncio.open_connection(host, port), self.timeout)
        except asyncio.TimeoutError:
            self.stats.timeouts += 1
            raise _Retry(f"connect to {address} timed out") from None
        except OSError as exc:
            raise _Retry(f"connect to {address}: {exc}") from None
        try:
            conn[1].get_extra_info("socket").setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        except OSError as exc:  # the peer closed it already (a refusal, a reset): the transport let go
            conn[1].close()
            raise _Retry(f"connection to {address} closed at once: {exc}") from None
        return conn
