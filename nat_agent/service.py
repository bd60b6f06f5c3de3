"""The metadata service on port 9000: a RESP subset over the server's store.

Why RESP: every Redis client and `redis-cli -h <mdid> -p 9000` work against
it, so a person can poke at any MetaDataID from a shell. Why re-check
ownership on the server: the switches route by flow entries that change a
little later (or earlier) than the data moves, so the last word on whether a
key may be served here is the agent's own view (`ownership.Ownership`).

Connection handling is defensive because this port faces every client of the
file system: a frame that is not RESP, a value over the limit, or a client
that stops halfway through a frame gets one error line and a closed
connection; nothing of another client's is touched. Commands on one
connection are answered in order (pipelining works); the connection handling
itself is in `connection.py`.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import Counter
from dataclasses import dataclass
from typing import Awaitable, Callable, TypeVar

from client_lib.mdid import PATH_MAX, mdid_of_key, normalize_path
from client_lib.resp import OK, PONG, ErrorReply, Reply, encode_reply
from nat_agent.agent import Agent
from nat_agent.connection import Connection
from nat_agent.ownership import Decision, Verdict

log = logging.getLogger("metaflow.agent.service")
T = TypeVar("T")


@dataclass(frozen=True)
class ServiceLimits:
    max_value: int = 1 << 20      # bytes in one value
    read_timeout: float = 5.0     # seconds a started frame may take to complete
    idle_timeout: float = 300.0   # seconds a connection may sit without a request
    max_clients: int = 4096       # open connections; more are refused at once


class CommandError(Exception):
    """A request that gets an error reply; the connection stays usable."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.reply = ErrorReply(message)


Handler = Callable[[list[bytes]], Awaitable[Reply]]


class MetadataService:
    """One server's RESP endpoint. `stats` counts what happened, for the admin API."""

    def __init__(self, agent: Agent, limits: ServiceLimits = ServiceLimits()) -> None:
        self.agent = agent
        self.store = agent.store
        self.ownership = agent.ownership
        self.space = agent.space
        self.limits = limits
        self.stats: Counter[str] = Counter()
        self._connections: set[Connection] = set()
        self._started = time.monotonic()
        self._server: asyncio.AbstractServer | None = None
        self._sweeper: asyncio.Task | None = None
        # name: (handler, min args, max args, stats counter); args after the name
        self._commands: dict[bytes, tuple[Handler, int, int, str]] = {
            name: (handler, least, most, "cmd_" + name.decode().lower())
            for name, handler, least, most in (
                (b"PING", self._ping, 0, 1),
                (b"GET", self._get, 1, 1),
                (b"SET", self._set, 2, 2),
                (b"DEL", self._del, 1, 64),
                (b"EXISTS", self._exists, 1, 64),
                (b"STAT", self._stat, 1, 1),
                (b"INFO", self._info, 0, 1),
                (b"COMMAND", self._command, 0, 8),
            )
        }

    # -- lifecycle ---------------------------------------------------------

    @property
    def max_bulk(self) -> int:
        return max(self.limits.max_value, PATH_MAX + 64)

    async def start(self, host: str, port: int) -> int:
        """Listen on host:port; returns the bound port (port 0 picks one)."""
        loop = asyncio.get_running_loop()
        self._server = await loop.create_server(lambda: Connection(self), host, port,
                                                backlog=1024, reuse_address=True)
        self._sweeper = loop.create_task(self._sweep(), name="connection-sweeper")
        return self._server.sockets[0].getsockname()[1]

    async def stop(self) -> None:
        """Stop accepting, then close every client connection."""
        if self._server is None:
            return
        self._server.close()
        for conn in list(self._connections):
            conn.close()
        self._sweeper.cancel()
        await self._server.wait_closed()
        self._server = None

    # -- connections (called by `Connection`) ----------------------------------

    def attach(self, conn: Connection) -> ErrorReply | None:
        if len(self._connections) >= self.limits.max_clients:
            self.stats["refused_connections"] += 1
            if self.stats["refused_connections"] % 100 == 1:
                log.warning("refusing %s: %d clients connected (limit %d), %d refused so far",
                            conn.peer, len(self._connections), self.limits.max_clients,
                            self.stats["refused_connections"])
            # TRYAGAIN, not ERR: overload is transient and clients back off and retry.
            return ErrorReply(f"TRYAGAIN max number of clients reached ({self.limits.max_clients})")
        self._connections.add(conn)
        self.stats["connections"] += 1
        return None

    def detach(self, conn: Connection) -> None:
        self._connections.discard(conn)

    async def _sweep(self) -> None:
        limits = self.limits
        interval = min(1.0, max(0.05, min(limits.read_timeout, limits.idle_timeout) / 4))
        while True:
            await asyncio.sleep(interval)
            now = time.monotonic()
            for conn in list(self._connections):
                conn.expire(now, limits.read_timeout, limits.idle_timeout)

    # -- commands ----------------------------------------------------------

    async def execute(self, command: list[bytes]) -> bytes:
        name = command[0].upper()
        spec = self._commands.get(name)
        if spec is None:
            self.stats["unknown_commands"] += 1
            shown = command[0][:64].decode("utf-8", "replace")
            return encode_reply(ErrorReply(f"ERR unknown command '{shown}'"))
        handler, least, most, counter = spec
        if not least <= len(command) - 1 <= most:
            return encode_reply(ErrorReply(
                f"ERR wrong number of arguments for '{name.decode().lower()}' command"))
        self.stats[counter] += 1
        try:
            return encode_reply(await handler(command[1:]))
        except CommandError as exc:
            self.stats["errors"] += 1
            return encode_reply(exc.reply)

    def _key(self, raw: bytes, write: bool) -> tuple[int, str, Decision]:
        """Normalize a key, compute its MetaDataID, and decide who answers."""
        try:
            key = normalize_path(raw)
            path = key.decode("utf-8")
        except UnicodeDecodeError:
            raise CommandError("ERR invalid path: not valid UTF-8") from None
        except ValueError as exc:
            raise CommandError(f"ERR invalid path: {exc}") from None
        ident = mdid_of_key(key, self.space)
        return ident, path, self.ownership.decide(ident, write)

    def _owned_key(self, raw: bytes, write: bool) -> tuple[int, str]:
        ident, path, decision = self._key(raw, write)
        if decision.verdict is Verdict.SERVE:
            return ident, path
        address = self.space.address(ident)
        if decision.verdict is Verdict.TRYAGAIN:
            self.stats["tryagain"] += 1
            raise CommandError(f"TRYAGAIN {address} block {decision.block} is migrating")
        self.stats["moved"] += 1
        hint = f" {decision.hint}" if decision.hint else ""
        raise CommandError(f"MOVED {address}{hint}")

    async def _ping(self, args: list[bytes]) -> Reply:
        return args[0] if args else PONG

    async def _admitted(self, work: Awaitable[T]) -> T:
        """Run store work that passed the ownership check, visible to
        `InFlight.drain` until it has finished."""
        token = self.agent.inflight.begin()
        try:
            return await work
        finally:
            self.agent.inflight.end(token)

    async def _get(self, args: list[bytes]) -> Reply:
        ident, path = self._owned_key(args[0], write=False)
        return await self._admitted(self.store.get(ident, path))

    async def _set(self, args: list[bytes]) -> Reply:
        value = args[1]
        if len(value) > self.limits.max_value:
            raise CommandError(f"ERR value of {len(value)} bytes exceeds the limit of "
                               f"{self.limits.max_value} bytes")
        ident, path = self._owned_key(args[0], write=True)
        await self._admitted(self.store.put(ident, path, value))
        return OK

    def _keys(self, args: list[bytes], write: bool) -> list[tuple[int, str]]:
        """All keys of a multi-key command, checked before any is touched."""
        return [self._owned_key(raw, write) for raw in args]

    async def _del(self, args: list[bytes]) -> Reply:
        keys = self._keys(args, write=True)
        return await self._admitted(self._sum(self.store.delete, keys))

    async def _exists(self, args: list[bytes]) -> Reply:
        keys = self._keys(args, write=False)
        return await self._admitted(self._sum(self.store.exists, keys))

    @staticmethod
    async def _sum(check: Callable[[int, str], Awaitable[bool]], keys: list[tuple[int, str]]) -> int:
        return sum([await check(ident, path) for ident, path in keys])

    async def _stat(self, args: list[bytes]) -> Reply:
        """Where a key lives and whether it is here: a debugging aid that never
        answers MOVED, so it also explains *why* a key is not served."""
        ident, path, decision = self._key(args[0], write=False)
        value = await self.store.get(ident, path) if decision.verdict is Verdict.SERVE else None
        state = {Verdict.SERVE: "owned", Verdict.MOVED: "not-owned", Verdict.TRYAGAIN: "migrating"}
        if decision.verdict is Verdict.SERVE and any(f.contains(ident) for f in self.ownership.frozen):
            state[Verdict.SERVE] = "migrating"
        return [b"path", path.encode(), b"mdid", self.space.address(ident).encode(),
                b"block", str(decision.block or "-").encode(),
                b"state", state[decision.verdict].encode(),
                b"exists", int(value is not None), b"bytes", len(value) if value is not None else 0]

    async def _info(self, args: list[bytes]) -> Reply:
        lines = [
            "# metaflow-agent",
            f"store:{self.store.kind}",
            f"space:{self.space}",
            f"owned_blocks:{','.join(map(str, self.ownership.owned)) or '-'}",
            f"frozen_blocks:{','.join(map(str, self.ownership.frozen)) or '-'}",
            f"keys:{await self.store.total()}",
            f"connected_clients:{len(self._connections)}",
            f"uptime_s:{time.monotonic() - self._started:.0f}",
        ]
        lines += [f"{k}:{v}" for k, v in sorted(self.stats.items())]
        return "\r\n".join(lines).encode() + b"\r\n"

    async def _command(self, args: list[bytes]) -> Reply:
        """`redis-cli` asks for COMMAND DOCS in interactive mode; we have none."""
        return []

