"""Client connections of the metadata service, as asyncio protocol callbacks.

Why not asyncio streams: a request is a few tens of microseconds of work, and
streams add a future per read and a task per timeout on top; the protocol
callbacks add nothing. Why run commands eagerly: with the embedded LevelDB
store, a command's coroutine never actually waits, so it is driven by hand
(`coro.send(None)`) and answered within the same callback, with no task at
all. Only a command that really suspends (the Redis store's round trip) is
handed to a task, and the connection reads no further commands until it is
answered, so replies stay in request order. (Python 3.12's eager task
factory does the same; this runs on 3.11.)

Timeouts are enforced by one sweeper per service rather than a timer per
request: every connection records when it last made progress.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any, Awaitable, Coroutine, Protocol

from client_lib.resp import (
    OK,
    BulkTooLarge,
    ErrorReply,
    ProtocolError,
    RespParser,
    encode_reply,
)

log = logging.getLogger("metaflow.agent.service")


class Host(Protocol):
    """What a connection needs from the service that owns it."""

    stats: Any
    max_bulk: int

    def execute(self, command: list[bytes]) -> Coroutine[Any, Any, bytes]: ...
    def attach(self, conn: Connection) -> ErrorReply | None: ...  # a refusal, or None
    def detach(self, conn: Connection) -> None: ...


async def _resume(coro: Coroutine[Any, Any, bytes], waiting: Awaitable | None) -> bytes:
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
            return done.value


class Connection(asyncio.Protocol):
    """One client. Pipelined commands are answered in order."""

    def __init__(self, host: Host) -> None:
        self.host = host
        self.parser = RespParser(max_bulk=host.max_bulk)
        self.transport: asyncio.Transport | None = None
        self.peer: object = None
        self.last_progress = time.monotonic()
        self._waiting: asyncio.Task | None = None   # a command suspended in the store
        self._closing = False

    # -- asyncio callbacks ---------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        self.peer = transport.get_extra_info("peername")
        refusal = self.host.attach(self)
        if refusal is not None:
            self.close_with(refusal)

    def data_received(self, data: bytes) -> None:
        self.last_progress = time.monotonic()
        self.parser.feed(data)
        if self._waiting is None and not self._closing:
            self._answer()

    def connection_lost(self, exc: Exception | None) -> None:
        if self.parser.pending and not self._closing:
            self.host.stats["dropped_connections"] += 1
            log.info("client %s closed mid-request with %d bytes unread", self.peer, self.parser.pending)
        self._closing = True
        if self._waiting is not None:
            self._waiting.cancel()
        self.host.detach(self)

    def pause_writing(self) -> None:
        """The client is not reading its replies: stop reading its requests."""
        self.transport.pause_reading()

    def resume_writing(self) -> None:
        self.transport.resume_reading()

    # -- answering -------------------------------------------------------------

    def _answer(self) -> None:
        """Answer every complete command; stop at one that must wait."""
        replies: list[bytes] = []
        try:
            while (command := self.parser.next_command()) is not None:
                if command[0].upper() == b"QUIT":
                    self.transport.write(b"".join(replies) + encode_reply(OK))
                    self.close()
                    return
                coro = self.host.execute(command)
                try:
                    waiting = coro.send(None)
                except StopIteration as done:
                    replies.append(done.value)
                    continue
                self.transport.write(b"".join(replies))
                self._waiting = asyncio.get_running_loop().create_task(self._finish(coro, waiting))
                return
        except ProtocolError as exc:
            self.host.stats["protocol_errors"] += 1
            log.warning("client %s: protocol error: %s; closing", self.peer, exc)
            self.transport.write(b"".join(replies))
            detail = "value too large" if isinstance(exc, BulkTooLarge) else "protocol error"
            self.close_with(ErrorReply(f"ERR {detail}: {exc}"))
            return
        if replies:
            self.transport.write(b"".join(replies))

    async def _finish(self, coro: Coroutine[Any, Any, bytes], waiting: Awaitable | None) -> None:
        reply = await _resume(coro, waiting)
        self._waiting = None
        if not self._closing:
            self.transport.write(reply)
            self.last_progress = time.monotonic()
            self._answer()

    # -- closing ---------------------------------------------------------------

    def close_with(self, reply: ErrorReply) -> None:
        if not self._closing:
            self.transport.write(encode_reply(reply))
            self.close()

    def close(self) -> None:
        self._closing = True
        self.transport.close()

    def expire(self, now: float, read_timeout: float, idle_timeout: float) -> None:
        """Called by the sweeper: close a half-sent request or an idle client."""
        if self._closing or self._waiting is not None:
            return
        quiet = now - self.last_progress
        if self.parser.pending and quiet > read_timeout:
            self.host.stats["timeouts"] += 1
            log.warning("client %s sent half a request (%d bytes) and stalled for %.1f s; closing",
                        self.peer, self.parser.pending, quiet)
            self.close_with(ErrorReply(f"ERR timeout: request incomplete after {read_timeout:g} s"))
        elif not self.parser.pending and quiet > idle_timeout:
            self.close()
