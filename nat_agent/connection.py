"""Client connections of the metadata service, as asyncio protocol callbacks.

Why not asyncio streams: a request is a few tens of microseconds of work, and
streams add a future per read and a task per timeout on top; the protocol
callbacks add nothing. Why run commands eagerly: with the embedded LevelDB
store, a command's coroutine never actually waits, so it is driven by hand
(`coro.send(None)`) and answered within the same callback, with no task at
all. Only a command that really suspends (the Redis store's round trip) is
handed to a task, and the connection reads no further commands until it is
answered, so replies stay in request order. (Python 3.12's eager task
factory does the same; this runs on 3.11.) Code that a command runs must
therefore not need a current task (no `asyncio.timeout` on its first step).
Before any of that, the host's compiled `FastLane` answers what it can of the
leading commands (most GETs and SETs) in one call; the first command it
declines, and everything after it, take the path above.

No client can make the agent hold much on its behalf:

* Unsent replies are bounded. Replies are written in batches of up to
  `FLUSH_BYTES`; once the transport holds `UNSENT_HIGH` bytes that the client
  has not read, the connection stops answering *and* reading, and resumes
  when the client has drained it below `UNSENT_LOW`. A client that pipelines
  a thousand GETs of a 1 MiB value and never reads costs about
  `UNSENT_HIGH + FLUSH_BYTES` plus one value.
* Unanswered requests are bounded: while a command waits in the store, at
  most `READ_AHEAD` bytes more are read.
* A request has a deadline (`--read-timeout`) counted from its first byte,
  which later bytes do not extend: a byte a second cannot hold a connection.
  Only answering a command starts a new request's clock.

Timeouts are enforced by one sweeper per service rather than a timer per
request: every connection records when it last made useful progress (a
command answered, replies drained) and when its current request began.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections import Counter
from collections.abc import Awaitable, Coroutine
from typing import TYPE_CHECKING, Any, Protocol, cast

from client_lib.resp import OK, ErrorReply, ProtocolError
from nat_agent.extension import command_parser
from nat_agent.resp_commands import ArgLimit, ArgumentTooLarge, encode_reply

if TYPE_CHECKING:
    from nat_agent.extension import FastLane

log = logging.getLogger("metaflow.agent.service")

UNSENT_HIGH = 1 << 20
"""Unsent reply bytes at which a connection stops reading and answering."""
UNSENT_LOW = 256 << 10
"""...and below which it starts again."""
FLUSH_BYTES = 64 << 10
"""Replies are gathered up to this many bytes per write (small pipelined
replies go out together; large ones reach the transport's accounting at once)."""
READ_AHEAD = 256 << 10
"""Bytes read beyond the command a connection waits on before it stops reading."""
RECLAIMED = "ERR connection reclaimed: "
"""How a busy connection is told that its slot went to another (the reason follows)."""


class Client(Protocol):
    """What a command's handler may read or set of the client that sent it:
    a `Connection` here, or a connection of `nat_agent._fastpath.ServiceLoop`'s
    worker threads (`service.WorkerClient`)."""

    resp3: bool
    ident: int
    peer: object


def settled(stats: Counter[str], peer: object, parsed: list[bytes] | Exception) -> tuple[bytes, bool] | None:
    """The reply, and whether the connection then closes, to what the parser
    gave that no handler runs for: a refused argument, a protocol error, QUIT.
    None: `parsed` is a command for the service to execute."""
    if isinstance(parsed, ArgumentTooLarge):
        stats["oversized_arguments"] += 1
        return encode_reply(ErrorReply(f"ERR {parsed}")), False
    if isinstance(parsed, ProtocolError):
        stats["protocol_errors"] += 1
        log.warning("client %s: protocol error: %s; closing", peer, parsed)
        return encode_reply(ErrorReply(f"ERR protocol error: {parsed}")), True
    if isinstance(parsed, Exception):
        raise parsed
    if parsed[0].upper() == b"QUIT":
        return encode_reply(OK), True
    return None


class Host(Protocol):
    """What a connection needs from the service that owns it."""

    @property
    def stats(self) -> Counter[str]: ...
    @property
    def max_bulk(self) -> int: ...  # the hard cap of any bulk string (closes the connection)
    @property
    def arg_limit(self) -> ArgLimit | None: ...  # per-argument limits (refuse the command)

    def execute(self, command: list[bytes], conn: Client) -> Coroutine[Any, Any, bytes]: ...
    def lane(self) -> FastLane | None: ...  # the compiled path for the common commands, if any
    def attach(self, conn: Connection) -> ErrorReply | None: ...  # a refusal, or None
    def detach(self, conn: Connection) -> None: ...


class PythonPathHost:
    """The part of a `Host` that a small RESP daemon shares (the baselines'
    lookup daemon, a site's propagation agent): no compiled lane, no
    per-argument limits, its connections tracked so that a stop closes them;
    it gives `max_bulk` and `execute`."""

    arg_limit: ArgLimit | None = None

    def __init__(self) -> None:
        self.stats: Counter[str] = Counter()
        self._connections: set[Connection] = set()

    def lane(self) -> None:
        return None   # every command runs on the Python path

    def attach(self, conn: Connection) -> ErrorReply | None:
        self._connections.add(conn)
        return None

    def detach(self, conn: Connection) -> None:
        self._connections.discard(conn)

    def close_connections(self) -> None:
        for conn in list(self._connections):
            conn.close()


async def resume(coro: Coroutine[Any, Any, bytes], waiting: Any) -> bytes:
    """Finish a coroutine that was started by hand and suspended on `waiting`
    (an asyncio future, or None for a bare yield to the loop)."""
    while True:
        try:
            if waiting is None:
                await asyncio.sleep(0)
            else:
                # The coroutine's own `await` marked the future as being waited
                # on; clear it as asyncio's Task does, so that we may await it.
                waiting._asyncio_future_blocking = False
                await waiting
        except asyncio.CancelledError:
            if waiting is None or not waiting.cancelled():
                coro.close()  # we were cancelled (shutdown), not what it awaited
                raise
        except BaseException:
            pass  # the coroutine reads the future's exception itself when resumed
        try:
            waiting = coro.send(None)
        except StopIteration as done:
            return cast(bytes, done.value)


class Connection(asyncio.Protocol):
    """One client. Pipelined commands are answered in order.

    `resp3` is the reply protocol the client chose with HELLO (RESP2 until
    then); `ident` is the number the service gave the connection.
    """

    def __init__(self, host: Host) -> None:
        self.host = host
        self.parser = command_parser(host.max_bulk, host.arg_limit)
        self.transport: asyncio.Transport  # set by connection_made, before any other callback
        self.peer: object = None
        self.ident = 0
        self.resp3 = False
        self.useful = time.monotonic()     # last useful progress: connected, answered, drained
        self.started = self.useful         # when the current (incomplete) request began
        self._waiting: asyncio.Task[None] | None = None   # a command suspended in the store
        self._paused = False                # the client is not reading its replies
        self._reading = True
        self._closing = False
        self._closed_at = 0.0

    @property
    def waiting(self) -> bool:
        """Whether a command of this connection is suspended in the store."""
        return self._waiting is not None

    # -- asyncio callbacks ---------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # A cast, not an isinstance check: uvloop's transports do not subclass asyncio's.
        self.transport = cast(asyncio.Transport, transport)
        self.transport.set_write_buffer_limits(high=UNSENT_HIGH, low=UNSENT_LOW)
        self.peer = transport.get_extra_info("peername")
        refusal = self.host.attach(self)
        if refusal is not None:
            self.close_with(refusal, linger=False)

    def data_received(self, data: bytes) -> None:
        if self._closing:
            return  # closing: what the client still sends is read only to be dropped (`close`)
        now = time.monotonic()
        parser = self.parser
        if not parser.busy:
            self.started = now  # the first byte of a new request
        parser.feed(data)
        if self._waiting is None:
            if not self._paused:
                self._answer(now)
        elif parser.pending > READ_AHEAD:
            self._pause_reading()

    def connection_lost(self, exc: Exception | None) -> None:
        if self.parser.busy and not self._closing:
            dropped(self.host.stats, self.peer, self.parser.pending)
        self._closing = True
        if self._waiting is not None:
            self._waiting.cancel()
        self.host.detach(self)

    def pause_writing(self) -> None:
        """The client is not reading its replies: stop answering and reading."""
        self._paused = True
        self._pause_reading()

    def resume_writing(self) -> None:
        self._paused = False
        if self._closing:
            return
        now = time.monotonic()
        self.useful = now
        if self._waiting is None:
            self._resume_reading()
            self._answer(now)

    def _pause_reading(self) -> None:
        if self._reading and not self._closing:
            self._reading = False
            self.transport.pause_reading()

    def _resume_reading(self) -> None:
        if not self._reading and not self._closing:
            self._reading = True
            self.transport.resume_reading()

    # -- answering -------------------------------------------------------------

    def _answer(self, now: float) -> None:
        """Answer every complete command; stop at one that must wait, or once
        the client has too many unread replies (`resume_writing` goes on)."""
        transport = self.transport
        parser = self.parser
        lane = self.host.lane()
        replies: list[bytes] = []
        size = 0
        while parser.busy:
            # The compiled path answers what it can of the leading commands;
            # the first one it declines is the Python path's (below).
            reply = lane.answer(parser, self.resp3, FLUSH_BYTES - size) if lane is not None else None
            if reply is None:
                reply = self._next_reply(now, replies)
                if reply is None:
                    break
            replies.append(reply)
            size += len(reply)
            if size >= FLUSH_BYTES:
                transport.write(b"".join(replies))  # may call pause_writing
                replies.clear()
                size = 0
                self.useful = self.started = now
                if self._paused:
                    return
        if replies:
            transport.write(b"".join(replies))
            self.useful = self.started = now

    def _next_reply(self, now: float, replies: list[bytes]) -> bytes | None:
        """The reply to the next complete command on the Python path, or None
        when there is none to give now: no complete command, or one that
        must wait (handed to a task) or ends the connection, in which cases
        `replies` so far are written first (and the list emptied)."""
        try:
            command: list[bytes] | Exception | None = self.parser.next_command()
        except (ArgumentTooLarge, ProtocolError) as exc:
            command = exc
        if command is None:
            return None
        immediate = settled(self.host.stats, self.peer, command)
        if immediate is not None:
            reply, close = immediate
            if not close:
                return reply
            self._write_out(replies)
            self.transport.write(reply)
            self.close()
            return None
        assert not isinstance(command, Exception)
        coro = self.host.execute(command, self)
        try:
            waiting = coro.send(None)
        except StopIteration as done:
            return cast(bytes, done.value)
        self._write_out(replies)
        self.useful = self.started = now
        self._waiting = asyncio.get_running_loop().create_task(self._finish(coro, waiting))
        return None

    def _write_out(self, replies: list[bytes]) -> None:
        self.transport.write(b"".join(replies))
        replies.clear()

    async def _finish(self, coro: Coroutine[Any, Any, bytes], waiting: Awaitable[Any] | None) -> None:
        reply = await resume(coro, waiting)
        self._waiting = None
        if self._closing:
            return
        self.transport.write(reply)
        now = time.monotonic()
        self.useful = self.started = now
        if not self._paused:
            self._resume_reading()
            self._answer(now)

    # -- closing ---------------------------------------------------------------

    def close_with(self, reply: ErrorReply, linger: bool = True) -> None:
        if not self._closing:
            self.transport.write(encode_reply(reply))
            self.close(linger)

    def close(self, linger: bool = True) -> None:
        """Close once the replies written so far are sent. With `linger` (a
        connection the service keeps until the sweeper is done with it), half-close (a FIN
        after them), then read, and drop, what the client still sends until it
        closes its end. Closing the socket outright while bytes the client sent
        are unread makes the kernel answer with a reset, and a reset can make
        the client's kernel discard the replies it had not read yet: a
        client trickling a request past its deadline lost its timeout error
        that way. The sweeper aborts a close that the client does not let
        finish (`expire`). Without `linger` (refused or reclaimed, so no
        longer the sweeper's), the socket is closed at once."""
        if not self._closing:
            if not self._reading and not self._paused:
                self._resume_reading()   # paused for read-ahead: its end must be seen
            self._closing = True
            self._closed_at = time.monotonic()
            if linger and self.transport.can_write_eof():
                self.transport.write_eof()   # its end: eof_received's default closes the transport
            else:
                self.transport.close()

    def abort(self) -> None:
        """Drop the connection and whatever is unsent, at once."""
        self._closing = True
        self.transport.abort()
        self.host.detach(self)

    def reclaim(self, why: str) -> None:
        """Free this connection's slot for another client (see `staleness`)."""
        if self._closing or self._paused:
            self.abort()
        elif self.parser.busy:
            self.close_with(ErrorReply(RECLAIMED + why), linger=False)
            self.host.detach(self)
        else:
            self.close(linger=False)  # idle: a silent close, as for an idle timeout
            self.host.detach(self)

    def catch_up(self) -> bool:
        """Read what the client has sent and answer what of it is complete,
        before the service judges this connection idle (`_reclaim_one`): the
        loop reads a socket only when it comes round to it, so a newcomer's
        first command may sit unread while many connections are accepted.
        Whether it made progress (a reply, a command waiting, or closing);
        one that is paused, waiting or closing is left as it is."""
        if self._closing or self._paused or self._waiting is not None:
            return False
        before = self.useful
        fd = self.transport.get_extra_info("socket").fileno()
        while not (self._closing or self._paused or self._waiting is not None):
            try:
                data = os.read(fd, FLUSH_BYTES)  # the transport's own read then finds nothing (EAGAIN)
            except (BlockingIOError, InterruptedError):
                break
            except OSError:
                return False  # broken: the transport hears of it too
            if not data:
                return False  # gone: the transport reads the end of the stream again
            self.data_received(data)
        return self._closing or self._waiting is not None or self.useful > before

    def staleness(self) -> tuple[bool, bool, bool, float]:
        """Sort key, most reclaimable first: connections already closing, then
        those with an incomplete request, then the others, each the one whose
        last useful progress is oldest first (idle the longest, or stuck in an
        old incomplete request, or not reading its replies); one waiting on
        the store is reclaimed last, if ever. Incomplete requests go first
        since a storm of reconnecting tricklers (each reconnection at the
        limit reclaims one, which reconnects in turn) reclaimed a client's new
        connection between its connect and its command, as the oldest not yet
        useful, though every other was a trickler with half a command sent."""
        return self._waiting is not None, not self._closing, not self.parser.busy, self.useful

    def expire(self, now: float, read_timeout: float, idle_timeout: float) -> None:
        """Called by the sweeper: close an overdue request or an idle client."""
        if self._closing:
            if now - self._closed_at > read_timeout:
                self.abort()  # its last replies were never read
            return
        if self._waiting is not None:
            return
        if self._paused:
            if now - self.useful > idle_timeout:
                log.info("client %s read none of its replies for %.0f s; dropping it",
                         self.peer, now - self.useful)
                self.abort()
        elif self.parser.busy:
            if now - self.started > read_timeout:
                overdue(self.host.stats, self.peer, now - self.started, self.parser.pending)
                self.close_with(timed_out(read_timeout))
        elif now - self.useful > idle_timeout:
            self.close()


def dropped(stats: Counter[str], peer: object, pending: int) -> None:
    """A client closed in the middle of a request (`pending` bytes of it
    read): counted and logged here for either path (the worker threads
    report it too)."""
    stats["dropped_connections"] += 1
    log.info("client %s closed mid-request with %d bytes unread", peer, pending)


def overdue(stats: Counter[str], peer: object, age: float, pending: int) -> None:
    """A request still incomplete `age` seconds after its first byte, which
    is about to be answered `timed_out`: counted and logged here for either path."""
    stats["timeouts"] += 1
    log.warning("client %s started a request %.1f s ago and has not finished it (%d bytes so far); closing",
                peer, age, pending)


def timed_out(read_timeout: float) -> ErrorReply:
    """The reply to a request still incomplete `read_timeout` seconds after
    its first byte (the connection then closes); the worker threads send it too."""
    return ErrorReply(f"ERR timeout: request incomplete after {read_timeout:g} s")


def sweep_interval(read_timeout: float, idle_timeout: float) -> float:
    """How often the timeouts are checked: a quarter of the shorter one, from
    50 ms to 1 s (so a deadline is kept to within a quarter of itself)."""
    return min(1.0, max(0.05, min(read_timeout, idle_timeout) / 4))


async def sweep(connections: set[Connection], read_timeout: float, idle_timeout: float) -> None:
    """Enforce the timeouts of a server's `connections` (a live set), forever:
    one task per server instead of a timer per request."""
    interval = sweep_interval(read_timeout, idle_timeout)
    while True:
        await asyncio.sleep(interval)
        now = time.monotonic()
        for conn in list(connections):
            conn.expire(now, read_timeout, idle_timeout)
