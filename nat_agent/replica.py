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

``RMSET`` (a primary worker's turn of SETs to one block) is checked whole:
every record must pass the RSET checks, or none is applied; then they are
written as one batch, with one sync.

A connection must authenticate (``AUTH``, `replication.check_hello`) with
its first command and within ``read_timeout`` of connecting; anything else
is answered with an error and the connection is closed.

Why commands of one connection overlap. With a durable store a write
returns only once it is on disk (``--fsync``), and a primary sends all its
writes over one connection: applied one after the other, each would wait a
whole sync, and the backup would take a few hundred writes a second. So a
command is *started* in arrival order (the store takes it in that order,
before anything waits), and the next one starts while the earlier ones
wait for their sync, which they then share (group commit); replies still
go out in order. Two commands on one key never overlap (the later waits),
and ``RBEGIN`` (which wipes a block) waits for everything before it and
holds back everything after it.
"""

from __future__ import annotations

import asyncio
import logging
from collections import Counter, deque
from collections.abc import Awaitable, Callable
from typing import cast

from client_lib.api.auth import Verifier
from client_lib.cidr import Block
from client_lib.constants import MAX_KEY
from client_lib.errors import AuthError
from client_lib.resp import OK, ErrorReply, ProtocolError, Reply
from nat_agent.agent import Agent
from nat_agent.connection import resume
from nat_agent.extension import command_parser
from nat_agent.ownership import Held
from nat_agent.replication import TURN_RECORDS, check_hello
from nat_agent.resp_commands import ArgumentTooLarge, encode_reply, internal_error
from nat_agent.store import decode_path

log = logging.getLogger("metaflow.agent.replica")

MAX_STARTED = 4096
"""Commands of one connection started and not yet answered, at most; then it
is not read until some are answered."""

Handler = Callable[["Stream", list[bytes]], Awaitable[Reply]]
_KEYED = {b"RSET", b"RDEL", b"RCOPY"}   # commands whose argument 4 is a key (a path)
MAX_ARGS = 3 + 3 * TURN_RECORDS
"""Arguments of one command, at most: an ``RMSET`` of a worker's turn, its name included."""


def _keys_of(command: list[bytes]) -> list[bytes]:
    """The keys (paths) a command writes: argument 4 of RSET, RDEL and RCOPY,
    and every third from 4 on of RMSET."""
    name = command[0].upper()
    if name in _KEYED and len(command) > 4:
        return [command[4]]
    if name == b"RMSET":
        return command[4::3]
    return []


def _arity_fits(expected: int | None, arity: int) -> bool:
    """Whether a command has the arguments its name takes (None: RMSET's
    block, epoch and one or more records of three)."""
    if expected is None:
        return arity >= 5 and (arity - 2) % 3 == 0
    return arity == expected


class Refused(Exception):
    """A command this backup must not apply; the reply says why."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.reply = ErrorReply(message)


class ReplicaServer:
    """The listener: checks and applies what primaries send (`Stream` frames it)."""

    def __init__(self, agent: Agent, verifier: Verifier, max_value: int, read_timeout: float = 5.0) -> None:
        self.agent = agent
        self.store = agent.store
        self.ownership = agent.ownership
        self.verifier = verifier
        self.read_timeout = read_timeout
        self.max_bulk = max_value + MAX_KEY
        self.stats: Counter[str] = Counter()
        self._max_value = max_value
        self._streams: set[Stream] = set()
        self._touched: dict[tuple[Stream, Block], set[str]] = {}   # syncs under way: keys streamed
        self._blocks: dict[bytes, Block] = {}
        self._server: asyncio.AbstractServer | None = None
        # name: (handler, arguments after the name)
        # name: (handler, arguments after the name; None: RMSET's records)
        self._commands: dict[bytes, tuple[Handler, int | None]] = {
            b"RSET": (self._rset, 5), b"RDEL": (self._rdel, 4), b"RBEGIN": (self._rbegin, 2),
            b"RCOPY": (self._rcopy, 5), b"REND": (self._rend, 2), b"PING": (self._ping, 0),
            b"RMSET": (self._rmset, None),
        }

    def arg_limit(self, name: bytes, index: int) -> int:
        """Only values may be long: argument 5 of RSET and RCOPY, and every
        third from 5 on of RMSET."""
        if index == 5 or (index > 5 and (index - 5) % 3 == 0 and name.upper() == b"RMSET"):
            return self._max_value
        return MAX_KEY

    # -- lifecycle -------------------------------------------------------------

    async def start(self, host: str, port: int) -> int:
        loop = asyncio.get_running_loop()
        self._server = await loop.create_server(lambda: Stream(self), host, port, reuse_address=True)
        return int(self._server.sockets[0].getsockname()[1])

    async def stop(self) -> None:
        if self._server is None:
            return
        self._server.close()
        for stream in list(self._streams):
            stream.close()
        await self._server.wait_closed()
        self._server = None

    # -- streams (called by `Stream`) -----------------------------------------------

    def attach(self, stream: Stream) -> None:
        self._streams.add(stream)
        asyncio.get_running_loop().call_later(self.read_timeout, self._deadline, stream)

    def detach(self, stream: Stream) -> None:
        self._streams.discard(stream)
        for key in [k for k in self._touched if k[0] is stream]:
            del self._touched[key]

    def _deadline(self, stream: Stream) -> None:
        if stream in self._streams and stream.sender is None:
            self.stats["unauthenticated"] += 1
            stream.close_with(ErrorReply(f"ERR authenticate within {self.read_timeout:g} s"))

    def hello(self, stream: Stream, command: list[bytes]) -> bytes:
        """The first command must be a valid AUTH; anything else closes the stream."""
        try:
            if command[0].upper() != b"AUTH":
                raise AuthError("not authenticated: the first command must be AUTH", 401)
            sender, answer = check_hello(self.verifier, command[1:])
        except AuthError as exc:
            self.stats["unauthenticated"] += 1
            log.warning("replication connection from %s refused: %s", stream.peer, exc)
            stream.close_with(ErrorReply(f"ERR {exc}"))
            return b""
        stream.sender = sender
        log.info("replication stream from %s (%s) opened", sender, stream.peer)
        return encode_reply(answer)

    async def execute(self, stream: Stream, command: list[bytes]) -> bytes:
        name = command[0].upper()
        spec = self._commands.get(name)
        if spec is None or not _arity_fits(spec[1], len(command) - 1):
            self.stats["malformed"] += 1
            return encode_reply(ErrorReply(f"ERR unknown command or wrong number of arguments: "
                                           f"{name[:32].decode('utf-8', 'replace')}"))
        token = self.agent.inflight.begin()   # a disown waits for it before deleting the block
        try:
            return encode_reply(await spec[0](stream, command[1:]))
        except Refused as exc:
            self.stats["refused"] += 1
            return encode_reply(exc.reply)
        except ValueError as exc:
            self.stats["malformed"] += 1
            return encode_reply(ErrorReply(f"ERR malformed {name.decode('utf-8', 'replace')}: {exc}"))
        except ConnectionError as exc:  # the store is out of reach: the primary must not count on us
            self.stats["store_unavailable"] += 1
            return encode_reply(ErrorReply(f"ERR store unavailable: {exc}"))
        finally:
            self.agent.inflight.end(token)

    # -- checks --------------------------------------------------------------------

    def _block(self, raw: bytes) -> Block:
        block = self._blocks.get(raw)
        if block is None:
            if len(self._blocks) > 4096:
                self._blocks.clear()
            block = self._blocks[raw] = Block.parse(raw.decode("ascii"))
        return block

    def _backup_of(self, stream: Stream, block: Block, epoch: int, ident: int) -> Held:
        """Refuse unless `ident` (in `block`) is held here as a backup at exactly
        `epoch`, with this connection's sender as the primary; its role here."""
        if self.ownership.suspended:
            raise Refused("SUSPENDED restarted, waiting for the controller")
        held = self.ownership.held_at(ident)
        if held is None or not block.contains(ident):
            raise Refused(f"NOTHELD {block}")
        if held.epoch != epoch:
            raise Refused(f"STALE {held.epoch}")
        if held.role.primary or held.primary != stream.sender:
            raise Refused(f"ERR {stream.sender} is not the primary of {held.block} at epoch "
                          f"{epoch} here (its primary is {held.primary})")
        return held

    def _record(self, stream: Stream, args: list[bytes]) -> tuple[Block, int, str]:
        block, epoch, ident = self._block(args[0]), int(args[1]), int(args[2])
        self._backup_of(stream, block, epoch, ident)
        return block, ident, decode_path(args[3])

    # -- the stream ------------------------------------------------------------------

    async def _rset(self, stream: Stream, args: list[bytes]) -> Reply:
        _, ident, path = self._record(stream, args)
        self._touch(ident, path)
        await self.store.put(ident, path, args[4])
        self.stats["applied"] += 1
        return OK

    async def _rdel(self, stream: Stream, args: list[bytes]) -> Reply:
        _, ident, path = self._record(stream, args)
        self._touch(ident, path)
        await self.store.delete(ident, path)
        self.stats["applied"] += 1
        return OK

    async def _rmset(self, stream: Stream, args: list[bytes]) -> Reply:
        """A primary's turn of SETs to one block, all checked before any is
        applied, then written as one batch (one sync)."""
        block, epoch = self._block(args[0]), int(args[1])
        records = []
        passed: Block | None = None   # the held block whose role the last full check passed
        for at in range(2, len(args), 3):
            ident = int(args[at])
            # A turn's records lie in one held block: nothing the check reads
            # can change during this loop, so one check serves them all.
            if passed is None or not (passed.contains(ident) and block.contains(ident)):
                passed = self._backup_of(stream, block, epoch, ident).block
            records.append((ident, decode_path(args[at + 1]), args[at + 2]))
        for ident, path, _ in records:
            self._touch(ident, path)
        await self.store.put_many(records)
        self.stats["applied"] += len(records)
        return OK

    def _touch(self, ident: int, path: str) -> None:
        if self._touched:
            for (_, block), paths in self._touched.items():
                if block.contains(ident):
                    paths.add(path)

    # -- the catch-up copy --------------------------------------------------------------

    async def _rbegin(self, stream: Stream, args: list[bytes]) -> Reply:
        block, epoch = self._block(args[0]), int(args[1])
        if self.ownership.unheld(block):
            raise Refused(f"NOTHELD {block}")
        for held in self.ownership.overlapping(block):
            self._backup_of(stream, held.block, epoch, held.block.first)
        self._touched[(stream, block)] = set()
        wiped = await self.store.delete_range(block.first, block.last)
        log.info("sync of %s (epoch %d) from %s begins; %d old records wiped", block, epoch,
                 stream.sender, wiped)
        return OK

    async def _rcopy(self, stream: Stream, args: list[bytes]) -> Reply:
        block, ident, path = self._record(stream, args)
        touched = self._touched.get((stream, block))
        if touched is None:
            raise Refused(f"ERR no sync of {block} begun on this connection")
        if path in touched:
            self.stats["copies_skipped"] += 1  # the stream wrote it since: that value is newer
        else:
            await self.store.put(ident, path, args[4])
            self.stats["copied"] += 1
        return OK

    async def _rend(self, stream: Stream, args: list[bytes]) -> Reply:
        block, epoch = self._block(args[0]), int(args[1])
        if self._touched.pop((stream, block), None) is None:
            raise Refused(f"ERR no sync of {block} begun on this connection")
        log.info("sync of %s (epoch %d) from %s complete", block, epoch, stream.sender)
        return OK

    async def _ping(self, stream: Stream, args: list[bytes]) -> Reply:
        return OK


class Stream(asyncio.Protocol):
    """One primary's connection: commands started in order, overlapping while
    they wait on the store, answered in order."""

    def __init__(self, server: ReplicaServer) -> None:
        self.server = server
        self.parser = command_parser(server.max_bulk, server.arg_limit, MAX_ARGS)
        self.transport: asyncio.Transport
        self.peer: object = None
        self.sender: str | None = None   # set once authenticated
        self._answers: deque[bytes | asyncio.Task[bytes]] = deque()   # in command order
        self._keys: Counter[bytes] = Counter()   # keys with a command under way
        self._barrier: asyncio.Task[bytes] | None = None
        self._next: list[bytes] | None = None     # a command that must wait before it starts
        self._reading = True
        self._writable = True
        self._closed = False
        self._pumping = False   # a pump is scheduled for the end of this turn

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)
        self.peer = transport.get_extra_info("peername")
        self.server.attach(self)

    def data_received(self, data: bytes) -> None:
        self.parser.feed(data)
        self._pump()

    def connection_lost(self, exc: Exception | None) -> None:
        self._closed = True
        self.server.detach(self)   # commands under way finish; their answers go nowhere

    def pause_writing(self) -> None:
        self._writable = False
        self._pause()

    def resume_writing(self) -> None:
        self._writable = True
        self._pump()

    def _pause(self) -> None:
        if self._reading and not self._closed:
            self._reading = False
            self.transport.pause_reading()

    def _pump(self) -> None:
        """Start every command that may start now, then send the answers that are ready."""
        self._pumping = False
        while not self._closed:
            if not self._writable or len(self._answers) >= MAX_STARTED:
                self._pause()
                break
            command = self._next
            if command is None:
                try:
                    command = self.parser.next_command()
                except ArgumentTooLarge as exc:
                    self._answers.append(encode_reply(ErrorReply(f"ERR {exc}")))
                    continue
                except ProtocolError as exc:
                    self.close_with(ErrorReply(f"ERR protocol error: {exc}"))
                    return
                if command is None:
                    break
            if not self._may_start(command):
                self._next = command
                break
            self._next = None
            self._start(command)
        if self._reading is False and self._writable and len(self._answers) < MAX_STARTED // 2 \
                and not self._closed:
            self._reading = True
            self.transport.resume_reading()
        self._flush()

    def _may_start(self, command: list[bytes]) -> bool:
        if self._barrier is not None:
            return False
        name = command[0].upper()
        if name == b"RBEGIN":
            return not any(isinstance(a, asyncio.Task) for a in self._answers)
        return not any(self._keys[key] for key in _keys_of(command))

    def _start(self, command: list[bytes]) -> None:
        if self.sender is None:
            self._answers.append(self.server.hello(self, command))
            return
        coro = self.server.execute(self, command)
        try:
            waiting = coro.send(None)
        except StopIteration as done:
            self._answers.append(cast(bytes, done.value))
            return
        task = asyncio.get_running_loop().create_task(resume(coro, waiting))
        keys = _keys_of(command)
        for key in keys:
            self._keys[key] += 1
        if command[0].upper() == b"RBEGIN":
            self._barrier = task
        task.add_done_callback(lambda _task: self._finished(_task, keys))
        self._answers.append(task)

    def _finished(self, task: asyncio.Task[bytes], keys: list[bytes]) -> None:
        """A command's wait ended; a group commit ends many at once, so their
        answers are sent together at the end of this turn of the loop."""
        for key in keys:
            self._keys[key] -= 1
            if not self._keys[key]:
                del self._keys[key]
        if task is self._barrier:
            self._barrier = None
        if not self._pumping:
            self._pumping = True
            asyncio.get_running_loop().call_soon(self._pump)

    def _flush(self) -> None:
        ready: list[bytes] = []
        answers = self._answers
        while answers:
            first = answers[0]
            if isinstance(first, asyncio.Task):
                if not first.done():
                    break
                ready.append(_answer_of(first))
            else:
                ready.append(first)
            answers.popleft()
        if ready and not self._closed:
            self.transport.write(b"".join(ready))

    def close_with(self, reply: ErrorReply) -> None:
        if not self._closed:
            self.transport.write(encode_reply(reply))
            self.close()

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            self.transport.close()
            self.server.detach(self)


def _answer_of(task: asyncio.Task[bytes]) -> bytes:
    if task.cancelled():
        return encode_reply(ErrorReply("ERR cancelled: the agent is shutting down"))
    exc = task.exception()
    if exc is not None:
        log.error("replication command failed", exc_info=exc)
        return encode_reply(internal_error(exc))
    return task.result()
