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

from client_lib.client import exchange_async
from client_lib.resp import ErrorReply, Reply, encode_command

Conn = tuple[asyncio.StreamReader, asyncio.StreamWriter]


class RpcError(Exception):
    """The peer answered with an error, or not at all."""


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
        except (OSError, asyncio.TimeoutError) as exc:
            if conn is not None:
                conn[1].close()
            raise RpcError(f"{address}: {exc!r}") from None
        idle.append(conn)
        return reply

    def close(self) -> None:
        for conns in self._idle.values():
            for _, writer in conns:
                writer.close()
        self._idle.clear()
