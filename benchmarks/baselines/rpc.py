"""RESP calls over kept-open connections: how the baselines' lookups travel.

Lookup RPCs (client to lookup server, and Chord's and G-HBA's forwards
between servers) reuse connections, one per call in flight, so the
baselines pay no connect per lookup: the comparison gives them every
chance. The metadata request itself is sent by `bench_client`, per request
or reused, the same way for every scheme.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
from typing import TypeVar

from client_lib.client import exchange_async
from client_lib.resp import ErrorReply, Reply, encode_command

Conn = tuple[asyncio.StreamReader, asyncio.StreamWriter]
Located = tuple[bytes | None, int, bytes]
"""A lookup's answer: the owner's data address (nil: nobody), forwards, level."""
T = TypeVar("T")


class RpcError(Exception):
    """The peer answered with an error, something else than expected, or not at all."""


def expect(address: str, reply: Reply, kind: type[T]) -> T:
    """`reply` if it is a `kind`; a peer that answers otherwise is broken."""
    if not isinstance(reply, kind):
        raise RpcError(f"{address}: expected a {kind.__name__} reply, got {reply!r:.200}")
    return reply


def located(address: str, reply: Reply) -> Located:
    """`reply` as a lookup's answer, checked."""
    match reply:
        case [bytes() | None as ip, int(forwards), bytes(level)]:
            return ip, forwards, level
    raise RpcError(f"{address}: not a lookup answer [ip, forwards, level]: {reply!r:.200}")


async def exchange(conn: Conn, frame: bytes, timeout: float) -> Reply:
    """Send one request frame and read one reply."""
    return await exchange_async(*conn, frame, timeout)


async def connect(host: str, port: int, timeout: float) -> Conn:
    conn = await asyncio.wait_for(asyncio.open_connection(host, port), timeout)
    with contextlib.suppress(OSError):  # closed by the peer already: the exchange will say so
        conn[1].get_extra_info("socket").setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return conn


class RpcPool:
    """Idle connections per peer address ("host:port")."""

    def __init__(self, timeout: float = 5.0) -> None:
        self.timeout = timeout
        self._idle: dict[str, list[Conn]] = {}
        self.calls = 0

    async def call(self, address: str, *args: bytes | str | int) -> Reply:
        """A lookup RPC: an error reply raises."""
        reply = await self.call_frame(address, encode_command(*args))
        if isinstance(reply, ErrorReply):
            raise RpcError(f"{address}: {reply.message}")
        return reply

    async def call_frame(self, address: str, frame: bytes) -> Reply:
        """Any request: the reply as it came, error replies included."""
        idle = self._idle.setdefault(address, [])
        conn = idle.pop() if idle else None
        try:
            if conn is None:
                host, port = address.rsplit(":", 1)
                conn = await connect(host, int(port), self.timeout)
            self.calls += 1
            reply = await exchange(conn, frame, self.timeout)
        except (TimeoutError, OSError) as exc:
            if conn is not None:
                conn[1].close()
            raise RpcError(f"{address}: {exc!r}") from None
        idle.append(conn)
        return reply

    async def lookup(self, address: str, *args: bytes | str | int) -> Located:
        """A lookup RPC (WHO, CHORD, GHBA): its answer, checked."""
        return located(address, await self.call(address, *args))

    def close(self) -> None:
        for conns in self._idle.values():
            for _, writer in conns:
                writer.close()
        self._idle.clear()
