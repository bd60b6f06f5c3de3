"""The mount's reads on its trio event loop: `TrioMetaFlowClient` for
MetaFlow, `CentralReads` for the central redis-server baseline.

Why: the FUSE mount (`client_lib.fs.mount`) runs on trio, and a call of the
blocking client from it must go to a worker thread and back, which measured
more than the request itself (about 115 µs of hops around a 70 µs GET on
loopback). Its lookups and getattrs, most of its requests, are single GETs
whose answer needs no further I/O, so it sends those from its event loop
with this client instead. Requires trio (the ``fs`` extra).

It is the same client as the others, not a copy: `_Surface` prepares each
request, decides what a reply means, what is retried and when, and keeps
the idle connections; only the exchange on a socket is trio's here. Its
one method is the read the mount makes (``get``); add others the same way
when a trio program needs them. `CentralReads` is the same read
for ``--central-redis`` (`client_lib.fs.central`), so that a side-by-side
run still compares where the records live and nothing else.
"""

from __future__ import annotations

import errno
import os
import socket
from typing import Protocol, TypeVar, cast

import trio

from client_lib.client import (
    _MAX_REPLY,
    _MAX_REPLY_ELEMENTS,
    Destination,
    _AsyncSurface,
    _Attempt,
    _Op,
    _redirected,
    _still_open,
)
from client_lib.errors import ServerError, Unavailable
from client_lib.mdid import normalize_key
from client_lib.resp import ErrorReply, ProtocolError, Reply, RespParser, encode_command

__all__ = ["CentralReads", "Reads", "TrioMetaFlowClient", "request"]

T = TypeVar("T")


class Reads(Protocol):
    """What the mount reads on its event loop: one record (None if there is none)."""

    async def get(self, path: str | bytes) -> bytes | None: ...
    def close(self) -> None: ...


async def request(sock: socket.socket, frame: bytes, max_bulk: int = _MAX_REPLY,
                  max_args: int = _MAX_REPLY_ELEMENTS) -> Reply:
    """Send one request frame on a non-blocking socket and read its one
    reply, waiting in trio's loop; a peer that closes first raises
    ConnectionResetError. The caller bounds it in time. Plain socket calls
    rather than a `trio.SocketStream`: a stream's checks and wrappers cost
    as much as the rest of a read (measured)."""
    pending = memoryview(frame)
    while pending:
        try:
            pending = pending[sock.send(pending):]
        except BlockingIOError:
            await trio.lowlevel.wait_writable(sock)
    parser = RespParser(max_bulk=max_bulk, max_args=max_args)
    while True:
        done, reply = parser.next_reply()
        if done:
            return reply
        try:
            data = sock.recv(65536)
        except BlockingIOError:
            await trio.lowlevel.wait_readable(sock)
            continue
        if not data:
            raise ConnectionResetError("server closed the connection")
        parser.feed(data)


async def connect(host: str, port: int) -> socket.socket:
    """A non-blocking TCP connection (``TCP_NODELAY``), connected in trio's loop."""
    infos = await trio.socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    if not infos:
        raise OSError(f"no address for {host}:{port}")
    family, kind, proto, _, address = infos[0]
    sock = socket.socket(family, kind, proto)
    try:
        sock.setblocking(False)
        failed = sock.connect_ex(address)
        if failed == errno.EINPROGRESS:
            await trio.lowlevel.wait_writable(sock)
            failed = sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR)
        if failed:
            raise OSError(failed, f"connect to {host}:{port}: {os.strerror(failed)}")
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    except BaseException:
        sock.close()
        raise
    return sock


class TrioMetaFlowClient(_AsyncSurface[socket.socket]):
    """`MetaFlowClient`'s arguments and contract, for one trio run: its
    methods are coroutines, and a call cancelled by trio closes the
    connection it was using."""

    _sleep = staticmethod(trio.sleep)

    @staticmethod
    def _discard(conn: socket.socket) -> None:
        conn.close()

    async def get(self, path: str | bytes) -> bytes | None:
        """The value stored at `path`, or None."""
        return await self._run(self._get(path))

    def close(self) -> None:
        """Close the idle connections (the client stays usable)."""
        self._close_idle()

    async def _exchange(self, op: _Op[T], attempt: _Attempt) -> Reply:
        conn: socket.socket | None = None
        try:
            with trio.fail_after(attempt.left()):
                conn = await (self._connect(attempt.hint) if attempt.hint else self._checkout(op.address))
                reply = await request(conn, op.frame)
        except (OSError, ProtocolError, trio.TooSlowError) as exc:
            if conn is not None:
                conn.close()
            failure = TimeoutError("attempt deadline passed") if isinstance(exc, trio.TooSlowError) else exc
            raise self._failure(failure, self._where(op, attempt), attempt) from None
        except BaseException:   # cancelled: the connection may hold half a reply
            if conn is not None:
                conn.close()
            raise
        if attempt.hint or _redirected(reply):
            conn.close()
        else:
            with self._lock:
                self._pool.give(op.address, conn)
        return reply

    async def _checkout(self, address: str) -> socket.socket:
        while True:
            with self._lock:
                conn = self._pool.take(address)
            if conn is None:
                return await self._connect(self._destination(address))
            if _still_open(conn):
                return conn
            conn.close()

    async def _connect(self, destination: Destination) -> socket.socket:
        self._count("connects")
        return await connect(*destination)


class CentralReads:
    """`CentralRecords.get` on trio: ``GET`` of the normalized key on one
    redis-server, over idle connections kept for reuse. As that client, it
    does not retry: a failure is `Unavailable` (the baseline is one server)."""

    def __init__(self, host: str, port: int, timeout: float = 30.0) -> None:
        self.host, self.port, self.timeout = host, port, timeout
        self._idle: list[socket.socket] = []

    async def get(self, path: str | bytes) -> bytes | None:
        conn = self._idle.pop() if self._idle else None
        try:
            with trio.fail_after(self.timeout):
                if conn is None:
                    conn = await connect(self.host, self.port)
                reply = await request(conn, encode_command(b"GET", normalize_key(path)))
        except BaseException as exc:
            if conn is not None:
                conn.close()
            if isinstance(exc, OSError | ProtocolError | trio.TooSlowError):
                raise Unavailable(f"central redis-server {self.host}:{self.port}", 1,
                                  str(exc) or type(exc).__name__) from None
            raise
        self._idle.append(conn)
        if isinstance(reply, ErrorReply):
            raise ServerError(reply.message)
        return cast(bytes | None, reply)

    def close(self) -> None:
        """Close the idle connections (usable again after)."""
        idle, self._idle = self._idle, []
        for conn in idle:
            conn.close()
