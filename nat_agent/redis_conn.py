"""A minimal pipelining asyncio connection to one redis-server.

Why not redis-py: the Redis store is on the metadata service's hot path
(one store call per client request), and redis.asyncio spends far more per
command than the round trip itself (a connection pool, locks, command
packing and a pipeline object per transaction). This module keeps only what
the store needs:

* one TCP or unix-socket connection, shared by every coroutine, built on
  `asyncio.Protocol` (no stream reader, so no per-read task wake-ups);
* pipelining: each caller writes its commands and waits on its own future,
  queued FIFO, because Redis answers every connection's commands in order;
* atomic batches: `pipeline` writes all its commands in one
  ``transport.write``, so a MULTI ... EXEC block is contiguous on the wire
  and no other caller's command can land inside it.

Replies are parsed by `client_lib.resp`, the reply parser MetaFlow's client uses.
WATCH, SUBSCRIBE and other connection-state commands other than the
initial SELECT are unsupported: the connection is shared, so such state
would leak between callers. For the same reason a blocking command (BLPOP)
stalls every caller queued behind it.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Sequence
from types import TracebackType
from typing import cast

from client_lib.resp import ErrorReply, ProtocolError, Reply, RespParser, encode_command

__all__ = ["Arg", "RedisConnection", "RedisNotReady", "RedisReplyError"]

Arg = bytes | str | int
"""A command argument, as `client_lib.resp.encode_command` takes it."""

# We trust our own server's replies; these bound only a broken one. Replies
# are arrays of up to a scan page (or a batch of MSET/EXEC replies), and
# bulk strings as long as Redis itself allows (proto-max-bulk-len).
_MAX_REPLY_ELEMENTS = 1 << 31
_MAX_REPLY_BULK = 512 << 20


class RedisReplyError(Exception):
    """Redis answered a command with an error reply (``-ERR ...``, ``-WRONGTYPE ...``).

    The connection stays usable: the error was a reply like any other.
    """

    def __init__(self, reply: ErrorReply) -> None:
        super().__init__(reply.message)
        self.reply = reply

    @property
    def code(self) -> str:
        """The error's first word: ``ERR``, ``WRONGTYPE``, ``EXECABORT``..."""
        return self.reply.code


class RedisNotReady(RedisReplyError, ConnectionError):
    """``-LOADING``: the server accepts connections but is still reading its
    data back (just restarted). Also a `ConnectionError`, because to a caller
    it is the same as a server not yet there: retry later."""


class _Pending:
    """One caller's batch: the replies gathered so far and the future to resolve."""

    __slots__ = ("future", "expected", "replies")

    def __init__(self, future: asyncio.Future[list[Reply]], expected: int) -> None:
        self.future = future
        self.expected = expected
        self.replies: list[Reply] = []


class _RespProtocol(asyncio.Protocol):
    """One live socket: writes batches and hands replies out in FIFO order.

    A caller that gives up (is cancelled) leaves its entry queued, so its
    replies are still consumed and the order holds for everyone behind it.
    """

    def __init__(self, loop: asyncio.AbstractEventLoop, address: str) -> None:
        self._loop = loop
        self._address = address
        self._transport: asyncio.Transport | None = None
        self._parser = RespParser(max_bulk=_MAX_REPLY_BULK, max_args=_MAX_REPLY_ELEMENTS)
        self._pending: deque[_Pending] = deque()
        self.lost: asyncio.Future[None] = loop.create_future()
        """Resolved once the socket is closed, whatever closed it."""

    @property
    def usable(self) -> bool:
        """Whether new commands can still be sent (not closing, not lost)."""
        return self._transport is not None and not self._transport.is_closing()

    def send(self, payload: bytes, expected: int) -> asyncio.Future[list[Reply]]:
        """Write ``payload`` (``expected`` commands); the future gets their replies."""
        assert self._transport is not None and expected > 0
        pending = _Pending(self._loop.create_future(), expected)
        self._pending.append(pending)
        self._transport.write(payload)
        return pending.future

    def close(self, reason: str) -> None:
        """Fail what is still awaiting replies with ``reason``, then close the socket."""
        self._fail_pending(ConnectionError(reason))
        assert self._transport is not None
        self._transport.close()

    # -- asyncio.Protocol ------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # A cast, not an isinstance check: uvloop's transports do not subclass asyncio's.
        self._transport = cast(asyncio.Transport, transport)

    def data_received(self, data: bytes) -> None:
        parser = self._parser
        parser.feed(data)
        try:
            while True:
                complete, reply = parser.next_reply()
                if not complete:
                    return
                self._deliver(reply)
        except ProtocolError as exc:
            # Nothing after an unparsable byte can be matched to a caller.
            self.close(f"redis at {self._address} sent an unparsable reply: {exc}")

    def _deliver(self, reply: Reply) -> None:
        if not self._pending:
            raise ProtocolError(f"unsolicited reply {reply!r}")
        head = self._pending[0]
        head.replies.append(reply)
        if len(head.replies) == head.expected:
            self._pending.popleft()
            if not head.future.done():  # a cancelled caller's replies are dropped
                head.future.set_result(head.replies)

    def connection_lost(self, exc: Exception | None) -> None:
        cause = "closed by the server" if exc is None else str(exc)
        self._fail_pending(
            ConnectionError(f"lost the connection to redis at {self._address}: {cause}")
        )
        if not self.lost.done():
            self.lost.set_result(None)

    def _fail_pending(self, error: ConnectionError) -> None:
        while self._pending:
            future = self._pending.popleft().future
            if not future.done():
                future.set_exception(error)


class RedisConnection:
    """A lazily (re)connected, pipelining connection to ``host:port`` or ``unix_socket``.

    Connects at the first command, in the running event loop, and belongs to
    that loop from then on. When the socket is lost, every command awaiting
    a reply fails with `ConnectionError`; the next command reconnects (and
    re-selects ``db``). Error replies raise `RedisReplyError`, and a server
    still loading its data raises `RedisNotReady`, a `ConnectionError` too.
    """

    def __init__(
        self,
        *,
        host: str | None = None,
        port: int = 6379,
        unix_socket: str | None = None,
        db: int = 0,
        connect_timeout: float = 5.0,
    ) -> None:
        if (host is None) == (unix_socket is None):
            raise ValueError("give either host (and port) or unix_socket")
        self.host = host
        self.port = port
        self.unix_socket = unix_socket
        self.db = db
        self.connect_timeout = connect_timeout
        self.address = unix_socket if unix_socket is not None else f"{host}:{port}"
        self._protocol: _RespProtocol | None = None
        self._connecting = asyncio.Lock()
        self._closed = False

    async def call(self, *args: Arg) -> Reply:
        """Send one command and return its reply."""
        # Checked inline, not in a helper coroutine: this is the hot path.
        protocol = self._protocol
        if protocol is None or not protocol.usable:
            protocol = await self._reconnect()
        (reply,) = await protocol.send(encode_command(*args), 1)
        _raise_errors(reply)
        return reply

    async def pipeline(self, commands: Sequence[Sequence[Arg]]) -> list[Reply]:
        """Send ``commands`` in one write and return their replies, in order.

        If any reply, or any element of an array reply (EXEC's results), is an
        error, raises `RedisReplyError` for the first one; the other replies
        are then discarded but the connection stays in step.
        """
        if not commands:
            return []
        protocol = self._protocol
        if protocol is None or not protocol.usable:
            protocol = await self._reconnect()
        payload = b"".join([encode_command(*command) for command in commands])
        replies = await protocol.send(payload, len(commands))
        for reply in replies:
            _raise_errors(reply)
        return replies

    async def transaction(self, commands: Sequence[Sequence[Arg]]) -> list[Reply]:
        """Run ``commands`` in one MULTI/EXEC block; returns EXEC's replies.

        A command Redis refuses to queue (bad arity, unknown command) aborts
        the whole block; one failing at run time (WRONGTYPE) does not undo
        the others, as in Redis. Both raise `RedisReplyError`.
        """
        replies = await self.pipeline([(b"MULTI",), *commands, (b"EXEC",)])
        results = replies[-1]
        assert isinstance(results, list), "EXEC is nil only after a WATCH, which is unsupported"
        return results

    async def _reconnect(self) -> _RespProtocol:
        """The usable protocol, connecting first if needed (one attempt at a time)."""
        async with self._connecting:
            if self._closed:
                raise ConnectionError(f"the connection to redis at {self.address} is closed")
            if self._protocol is None or not self._protocol.usable:
                self._protocol = await self._open()
            return self._protocol

    async def _open(self) -> _RespProtocol:
        """A new socket (with ``db`` selected), within ``connect_timeout``.

        The attempt is a task of its own, timed by `asyncio.wait`, because the
        caller may not be a task: the metadata service drives a command's
        coroutine by hand, and a reconnect happens on that path, where
        `asyncio.timeout` (and 3.12's `wait_for`) fail for want of a current task.
        """
        attempt = asyncio.get_running_loop().create_task(self._connect())
        try:
            await asyncio.wait({attempt}, timeout=self.connect_timeout)
        finally:
            if not attempt.done():
                attempt.cancel()  # timed out, or our caller was cancelled
        if attempt.cancelled():
            raise ConnectionError(
                f"cannot connect to redis at {self.address}: no answer within {self.connect_timeout:g} s")
        return attempt.result()

    async def _connect(self) -> _RespProtocol:
        loop = asyncio.get_running_loop()

        def factory() -> _RespProtocol:
            return _RespProtocol(loop, self.address)

        try:
            if self.unix_socket is not None:
                _, protocol = await loop.create_unix_connection(factory, self.unix_socket)
            else:
                _, protocol = await loop.create_connection(factory, cast(str, self.host), self.port)
        except OSError as exc:
            raise ConnectionError(f"cannot connect to redis at {self.address}: {exc}") from exc
        if self.db:
            try:
                # Sent first, so every later command on this socket runs in `db`.
                (reply,) = await protocol.send(encode_command(b"SELECT", self.db), 1)
                _raise_errors(reply)
            except BaseException:
                protocol.close(f"cannot select database {self.db} on redis at {self.address}")
                raise
        return protocol

    async def close(self) -> None:
        """Close the socket and refuse further commands; idempotent.

        Commands still awaiting replies fail with `ConnectionError`.
        """
        self._closed = True
        async with self._connecting:  # let a connect under way finish, then close it
            protocol, self._protocol = self._protocol, None
        if protocol is not None:
            protocol.close(f"the connection to redis at {self.address} was closed")
            await protocol.lost

    async def __aenter__(self) -> RedisConnection:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()


def _raise_errors(reply: Reply) -> None:
    """Raise the error reply, or the first error inside an array reply (EXEC's)."""
    if type(reply) is ErrorReply:
        raise (RedisNotReady if reply.code == "LOADING" else RedisReplyError)(reply)
    if type(reply) is list:
        for item in reply:
            if type(item) is ErrorReply:
                raise RedisReplyError(item)
