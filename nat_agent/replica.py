"""Replication, the backup's side: the listener primaries stream writes to
(``--replication``, `client_lib.constants.REPLICATION_PORT`).

`nat_agent.replication` describes the wire. Here each command is checked
against this agent's own view before it touches the store: the block must
be held here as a backup at exactly the epoch the sender names, with the
sender as that role's primary, and the agent must not be suspended. So a
deposed primary (whose epoch is older) is answered ``-STALE <epoch>`` and
learns it was deposed, and nothing a stranger or a stale server sends is
ever applied. Commands of one connection are applied one at a time, in
arrival order (`connection.Connection` reads no further while one waits
on the store).

The catch-up copy of a sync (`nat_agent.syncs`):

* ``RBEGIN <block> <epoch>`` wipes the block here (whatever an earlier life
  left), and from then on the keys the live stream writes or deletes in it
  are remembered;
* ``RCOPY <block> <epoch> <mdid> <path> <value>`` writes a record of the
  primary's copy, unless the stream has touched that key since RBEGIN: the
  stream's value is newer than any copy of it;
* ``REND <block> <epoch>`` ends the copy.

A connection must authenticate (``AUTH``, `replication.check_hello`) with
its first command and within ``read_timeout`` of connecting; anything else
is answered with an error and the connection is closed.
"""

from __future__ import annotations

import asyncio
import logging
from collections import Counter
from collections.abc import Awaitable, Callable

from client_lib.api.auth import Verifier
from client_lib.cidr import Block
from client_lib.constants import MAX_KEY
from client_lib.errors import AuthError
from client_lib.resp import OK, ErrorReply, Reply, encode_reply
from nat_agent.agent import Agent
from nat_agent.connection import Connection, sweep
from nat_agent.replication import check_hello
from nat_agent.store import decode_path

log = logging.getLogger("metaflow.agent.replica")

IDLE_S = 3600.0
"""A primary's connection may stay idle this long (it reopens on its next write)."""

_OK = encode_reply(OK)

Handler = Callable[[Connection, list[bytes]], Awaitable[Reply]]


class Refused(Exception):
    """A command this backup must not apply; the reply says why."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.reply = ErrorReply(message)


class ReplicaServer:
    """The listener. Implements `connection.Host`."""

    def __init__(self, agent: Agent, verifier: Verifier, max_value: int, read_timeout: float = 5.0) -> None:
        self.agent = agent
        self.store = agent.store
        self.ownership = agent.ownership
        self.verifier = verifier
        self.read_timeout = read_timeout
        self.max_bulk = max_value + MAX_KEY
        self.stats: Counter[str] = Counter()
        self._max_value = max_value
        self._senders: dict[Connection, str] = {}   # authenticated connections -> sender name
        self._connections: set[Connection] = set()
        self._touched: dict[tuple[Connection, Block], set[str]] = {}   # syncs under way: keys streamed
        self._blocks: dict[bytes, Block] = {}
        self._server: asyncio.AbstractServer | None = None
        self._sweeper: asyncio.Task[None] | None = None
        # name: (handler, arguments after the name)
        self._commands: dict[bytes, tuple[Handler, int]] = {
            b"RSET": (self._rset, 5), b"RDEL": (self._rdel, 4), b"RBEGIN": (self._rbegin, 2),
            b"RCOPY": (self._rcopy, 5), b"REND": (self._rend, 2), b"PING": (self._ping, 0),
        }

    def arg_limit(self, name: bytes, index: int) -> int:
        """Only the value of RSET and RCOPY (argument 5) may be long."""
        return self._max_value if index == 5 else MAX_KEY

    # -- lifecycle -------------------------------------------------------------

    async def start(self, host: str, port: int) -> int:
        loop = asyncio.get_running_loop()
        self._server = await loop.create_server(lambda: Connection(self), host, port, reuse_address=True)
        self._sweeper = loop.create_task(sweep(self._connections, self.read_timeout, IDLE_S),
                                         name="replica-sweeper")
        return int(self._server.sockets[0].getsockname()[1])

    async def stop(self) -> None:
        if self._server is None:
            return
        self._server.close()
        for conn in list(self._connections):
            conn.abort()
        if self._sweeper is not None:
            self._sweeper.cancel()
        await self._server.wait_closed()
        self._server = None

    # -- connections (called by `Connection`) -------------------------------------

    def attach(self, conn: Connection) -> ErrorReply | None:
        self._connections.add(conn)
        asyncio.get_running_loop().call_later(self.read_timeout, self._deadline, conn)
        return None

    def detach(self, conn: Connection) -> None:
        self._connections.discard(conn)
        self._senders.pop(conn, None)
        for key in [k for k in self._touched if k[0] is conn]:
            del self._touched[key]

    def _deadline(self, conn: Connection) -> None:
        if conn in self._connections and conn not in self._senders:
            self.stats["unauthenticated"] += 1
            conn.close_with(ErrorReply(f"ERR authenticate within {self.read_timeout:g} s"))
            self.detach(conn)

    async def execute(self, command: list[bytes], conn: Connection) -> bytes:
        sender = self._senders.get(conn)
        if sender is None:
            return self._hello(command, conn)
        name = command[0].upper()
        spec = self._commands.get(name)
        if spec is None or len(command) - 1 != spec[1]:
            self.stats["malformed"] += 1
            return encode_reply(ErrorReply(f"ERR unknown command or wrong number of arguments: "
                                           f"{name[:32].decode('utf-8', 'replace')}"))
        try:
            return encode_reply(await spec[0](conn, command[1:]))
        except Refused as exc:
            self.stats["refused"] += 1
            return encode_reply(exc.reply)
        except ValueError as exc:
            self.stats["malformed"] += 1
            return encode_reply(ErrorReply(f"ERR malformed {name.decode('utf-8', 'replace')}: {exc}"))
        except ConnectionError as exc:  # the store is out of reach: the primary must not count on us
            self.stats["store_unavailable"] += 1
            return encode_reply(ErrorReply(f"ERR store unavailable: {exc}"))

    def _hello(self, command: list[bytes], conn: Connection) -> bytes:
        """The first command must be a valid AUTH; anything else closes the connection."""
        try:
            if command[0].upper() != b"AUTH":
                raise AuthError("not authenticated: the first command must be AUTH", 401)
            sender, answer = check_hello(self.verifier, command[1:])
        except AuthError as exc:
            self.stats["unauthenticated"] += 1
            log.warning("replication connection from %s refused: %s", conn.peer, exc)
            conn.close_with(ErrorReply(f"ERR {exc}"))
            return b""
        self._senders[conn] = sender
        log.info("replication stream from %s (%s) opened", sender, conn.peer)
        return encode_reply(answer)

    # -- checks --------------------------------------------------------------------

    def _block(self, raw: bytes) -> Block:
        block = self._blocks.get(raw)
        if block is None:
            if len(self._blocks) > 4096:
                self._blocks.clear()
            block = self._blocks[raw] = Block.parse(raw.decode("ascii"))
        return block

    def _backup_of(self, conn: Connection, block: Block, epoch: int, ident: int) -> None:
        """Refuse unless `ident` (in `block`) is held here as a backup at exactly
        `epoch`, with this connection's sender as the primary."""
        if self.ownership.suspended:
            raise Refused("SUSPENDED restarted, waiting for the controller")
        held = self.ownership.held_at(ident)
        if held is None or not block.contains(ident):
            raise Refused(f"NOTHELD {block}")
        if held.epoch != epoch:
            raise Refused(f"STALE {held.epoch}")
        if held.role.primary or held.primary != self._senders[conn]:
            raise Refused(f"ERR {self._senders[conn]} is not the primary of {held.block} at epoch "
                          f"{epoch} here (its primary is {held.primary})")

    def _record(self, conn: Connection, args: list[bytes]) -> tuple[Block, int, str]:
        block, epoch, ident = self._block(args[0]), int(args[1]), int(args[2])
        self._backup_of(conn, block, epoch, ident)
        return block, ident, decode_path(args[3])

    # -- the stream ------------------------------------------------------------------

    async def _rset(self, conn: Connection, args: list[bytes]) -> Reply:
        _, ident, path = self._record(conn, args)
        self._touch(ident, path)
        await self.store.put(ident, path, args[4])
        self.stats["applied"] += 1
        return OK

    async def _rdel(self, conn: Connection, args: list[bytes]) -> Reply:
        _, ident, path = self._record(conn, args)
        self._touch(ident, path)
        await self.store.delete(ident, path)
        self.stats["applied"] += 1
        return OK

    def _touch(self, ident: int, path: str) -> None:
        if self._touched:
            for (_, block), paths in self._touched.items():
                if block.contains(ident):
                    paths.add(path)

    # -- the catch-up copy --------------------------------------------------------------

    async def _rbegin(self, conn: Connection, args: list[bytes]) -> Reply:
        block, epoch = self._block(args[0]), int(args[1])
        if self.ownership.unheld(block):
            raise Refused(f"NOTHELD {block}")
        for held in self.ownership.overlapping(block):
            self._backup_of(conn, held.block, epoch, held.block.first)
        self._touched[(conn, block)] = set()
        wiped = await self.store.delete_range(block.first, block.last)
        log.info("sync of %s (epoch %d) from %s begins; %d old records wiped", block, epoch,
                 self._senders[conn], wiped)
        return OK

    async def _rcopy(self, conn: Connection, args: list[bytes]) -> Reply:
        block, ident, path = self._record(conn, args)
        touched = self._touched.get((conn, block))
        if touched is None:
            raise Refused(f"ERR no sync of {block} begun on this connection")
        if path in touched:
            self.stats["copies_skipped"] += 1  # the stream wrote it since: that value is newer
        else:
            await self.store.put(ident, path, args[4])
            self.stats["copied"] += 1
        return OK

    async def _rend(self, conn: Connection, args: list[bytes]) -> Reply:
        block, epoch = self._block(args[0]), int(args[1])
        if self._touched.pop((conn, block), None) is None:
            raise Refused(f"ERR no sync of {block} begun on this connection")
        log.info("sync of %s (epoch %d) from %s complete", block, epoch, self._senders[conn])
        return OK

    async def _ping(self, conn: Connection, args: list[bytes]) -> Reply:
        return OK
