"""The MetaFlow client: what a distributed file system imports on its metadata path.

    from client_lib import FileMetadata, MetaFlowClient, MetaFlowError

    with MetaFlowClient() as mf:                    # one per process; thread-safe
        mf.put("/user/a/data.csv", FileMetadata.new_file("/user/a/data.csv", 1 << 30, now_ms))
        meta = mf.stat("/user/a/data.csv")         # a FileMetadata, or None if absent

The contract
------------
There is no lookup and no map of servers. The client hashes the path into its
MetaDataID (`client_lib.mdid`, the same function every agent and the
controller use) and sends the request to that ID *as an IP address* on port
9000; the switches' longest-prefix flows deliver it to the server that owns
the ID. A request is therefore one round trip on a connection (plus a TCP
connect when none is open to that ID). The client host needs one route: the
MetaDataID space (default ``100.64.0.0/10``) towards the fabric.

Methods, the same on both clients: ``get`` (the raw value), ``put`` (bytes or
a `FileMetadata`), ``delete`` and ``exists`` (booleans), ``stat`` (a
`FileMetadata`). A path is ``str`` (UTF-8; names from ``os.fsdecode`` keep
their bytes) or ``bytes``, absolute, and normalized lexically on both sides,
so ``/a//b/.`` is ``/a/b``.

For a file system's metadata engine: ``create`` writes only if nothing is
there (``SET NX``) and ``compare_and_set`` only if the value is exactly the
one given (``SET IFEQ``); both say whether they wrote. Any key may also be an
entry of a directory, ``entry_key(directory, name)``, which lives on the
directory's server, and ``entries(directory, after, count)`` lists a page of
them with their values in name order (``ELIST``, one range scan). A directory
exists while its header (the value at its own path) does: ``create_entry``
adds an entry only to an existing directory and ``remove_directory`` deletes
the header only while there are no entries, each atomically on the
directory's server (`NamespaceError` carries ENOENT or ENOTEMPTY).

Without the fabric: one agent directly
--------------------------------------
``via="HOST[:PORT]"`` sends every request to one agent (``PORT`` defaults to
``port``). An agent that owns the whole space serves every path::

    metaflowctl secret /tmp/secret
    metaflow-agent --store leveldb:/tmp/md --listen 127.0.0.1:9000 --rewrite none \
        --own 100.64.0.0/10 --secret-file /tmp/secret

and ``MetaFlowClient(via="127.0.0.1:9000")`` talks to it. ``route=`` is the
general form: a function from the MetaDataID address (text) to ``(host,
port)``, for emulating the fabric's table over several agents (tests,
benchmarks). Everything else below is the same.

Retries and the deadline
------------------------
Each call has an overall ``deadline`` (seconds, default 5): no call takes
longer, whatever the network does. Within it the client retries what may pass:

* TRYAGAIN: the ID's block is frozen while it migrates (writes only);
* MOVED: the server no longer owns the ID (a stale pooled connection, or the
  flows not yet updated). A ``MOVED <id> <ip>:<port>`` reply that names the
  new owner's address is followed at once, once per call (``follow_moved``);
  after that the switches decide again, so a wrong hint cannot send a call in
  circles. One that names a MetaDataID (the agent's "ask the switches") is
  retried through the route;
* a timeout, a refused, reset or closed connection.

Retries back off exponentially with jitter (`RetryPolicy`: at most
``attempts`` tries, pauses from ``base`` up to ``cap``); each attempt
(connect, send, reply) is bounded by ``timeout`` and by what is left of the
deadline. When either runs out, `Unavailable` says how many attempts were made
and the last reason.

Idempotency
-----------
Every request is idempotent (GET, EXISTS and ELIST read; SET writes the whole
value; DEL removes), which is what makes retrying after a timeout safe even
when the first attempt was applied. The visible effect: a DEL, ``create`` or
``compare_and_set`` whose reply was lost reports False on its retry (nothing
to delete; something there; not the old value any more). A conditional write
can never overwrite a newer value on a retry; to tell "applied on the lost
attempt" from "lost the race", give each value something unique (a version,
a writer's token) and read it back.

Pooling
-------
After a reply, the connection stays open and is reused for the same
MetaDataID (it leads to the same server). At most ``max_idle`` idle
connections are kept in all; beyond that the least recently used one is
closed. A connection that answered MOVED or TRYAGAIN, failed or timed out is
closed, never reused, and an idle one the server has since closed is noticed
and dropped before it is used. ``reuse=False`` opens a connection per request
(the paper's setting).

Threads and event loops
-----------------------
`MetaFlowClient` blocks and is thread-safe: share one per process (the pool
is under a lock; requests run in parallel). `AsyncMetaFlowClient` has the same
methods as coroutines and belongs to the event loop it is used on. Close
either (``close()``, or ``with`` / ``async with``) to close its connections.

Errors
------
Everything the client raises is a `MetaFlowError` (`client_lib.errors`):

* `InvalidPath`, `InvalidArgument` (also ``ValueError``): the caller's input,
  such as a relative path or a malformed space; nothing was sent.
* `ServerError`: the server refused (``-ERR ...``, say a value above its
  limit); not retried.
* `BadReply`: the peer does not speak RESP or answered out of protocol (the
  wrong port?); not retried.
* `MetadataFormatError`: ``stat`` found a value that is not a `FileMetadata`
  (``get`` returns it raw).
* `Unavailable`: the deadline or the attempts ran out; ``.attempts`` and
  ``.reason`` say how.
"""

from __future__ import annotations

import asyncio
import errno
import ipaddress
import itertools
import math
import random
import select
import socket
import threading
import time
from abc import ABC, abstractmethod
from collections import OrderedDict, deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Generic, Protocol, Self, TypeVar

from client_lib.cidr import Block
from client_lib.constants import ELIST_DEFAULT, ELIST_MAX, METAFLOW_PORT, TCP_FASTOPEN_CONNECT
from client_lib.errors import (
    BadReply,
    InvalidArgument,
    InvalidPath,
    MetadataFormatError,
    MetaFlowError,
    NamespaceError,
    ServerError,
    Unavailable,
)
from client_lib.mdid import DEFAULT_SPACE, entry_key, mdid_of_key, normalize_key
from client_lib.metadata import FileMetadata
from client_lib.resp import (
    ErrorReply,
    ProtocolError,
    Reply,
    RespParser,
    SimpleString,
    encode_command,
    parse_moved,
)

__all__ = [
    "host_port",
    "DEFAULT_DEADLINE",
    "DEFAULT_TIMEOUT",
    "AsyncMetaFlowClient",
    "BadReply",
    "ClientStats",
    "InvalidArgument",
    "InvalidPath",
    "MetaFlowClient",
    "MetaFlowError",
    "MetadataFormatError",
    "RetryPolicy",
    "Route",
    "ServerError",
    "Unavailable",
    "exchange_async",
]

T = TypeVar("T")
C = TypeVar("C")


class _HasFileno(Protocol):
    """A socket of any library (`_still_open` polls its descriptor)."""

    def fileno(self) -> int: ...


Route = Callable[[str], tuple[str, int]]
"""Where a request for a MetaDataID address (text) goes: ``(host, port)``."""
Destination = tuple[str, int]
Stream = tuple[asyncio.StreamReader, asyncio.StreamWriter]

DEFAULT_TIMEOUT = 2.0
"""Seconds one attempt (connect, send, reply) may take."""
DEFAULT_DEADLINE = 5.0
"""Seconds one call may take, all its attempts and pauses included."""

_MAX_REPLY = 1 << 30
"""Largest bulk reply accepted: the agent's value limit is its own setting
(``--max-value``), so the client only guards against a nonsense header."""
_ERRNO = {"ENOENT": errno.ENOENT, "ENOTEMPTY": errno.ENOTEMPTY}
"""Error replies of the namespace commands, as POSIX errors (`NamespaceError`)."""
_MAX_REPLY_ELEMENTS = 2 * ELIST_MAX
"""Largest array reply: a full page of ``ELIST`` (a name and a value per entry)."""
_MIN_ATTEMPT = 0.01
"""Seconds an attempt needs to be worth starting; a pause is shortened to
leave this much of the deadline, and a call with less left gives up."""


@dataclass(frozen=True)
class RetryPolicy:
    """How many attempts a call may make and how long to pause between them;
    the call's deadline bounds them in time."""

    attempts: int = 10
    base: float = 0.005   # seconds before the first retry
    cap: float = 0.5      # longest pause between attempts

    def __post_init__(self) -> None:
        if isinstance(self.attempts, bool) or not isinstance(self.attempts, int) or self.attempts < 1:
            raise InvalidArgument(f"attempts must be a positive integer, not {self.attempts!r}")
        numbers = all(isinstance(x, int | float) and not isinstance(x, bool) for x in (self.base, self.cap))
        if not numbers or not 0 <= self.base <= self.cap < math.inf:
            raise InvalidArgument(f"need 0 <= base <= cap < inf, not base={self.base!r} cap={self.cap!r}")

    def delay(self, retry: int) -> float:
        """The pause before retry number `retry` (0 first): a random half to
        all of a capped exponential, which spreads out clients that all hit
        the same frozen block at once."""
        return random.uniform(0.5, 1.0) * min(self.cap, self.base * (1 << min(retry, 62)))


_DEFAULT_RETRY = RetryPolicy()


@dataclass
class ClientStats:
    """What a client has done, for monitoring (``vars(client.stats)``)."""

    requests: int = 0
    retries: int = 0
    moved: int = 0
    tryagain: int = 0
    timeouts: int = 0
    connects: int = 0
    hints: int = 0      # MOVED hints followed


class _Retry(Exception):
    """Internal: this attempt failed in a way the next one may not; `hint` is
    where a MOVED reply said the ID went."""

    def __init__(self, reason: str, hint: Destination | None = None) -> None:
        super().__init__(reason)
        self.hint = hint


@dataclass(frozen=True)
class _Op(Generic[T]):
    """One request, fully prepared: where it goes and how to read the answer."""

    path: str
    address: str
    frame: bytes
    decode: Callable[[Reply], T]


@dataclass(slots=True)
class _Attempt:
    """One try of a call: after `pause`, to `hint` if a MOVED reply named the
    owner (else through the route), done by `until` (monotonic seconds)."""

    hint: Destination | None
    pause: float
    until: float
    seconds: float

    def left(self) -> float:
        """Seconds left for this attempt; none left is a timeout, checked before
        every blocking step (a socket timeout of 0 would mean non-blocking)."""
        left = self.until - time.monotonic()
        if left <= 0:
            raise TimeoutError("attempt deadline passed")
        return left


class _Call:
    """The retry budget of one call: which attempt comes next, when, and with
    how much time, or that the call is over. Sans-I/O, so both clients share
    the deadline arithmetic and only sleep and exchange their own way."""

    __slots__ = ("_surface", "_what", "_end", "_made", "_reason", "_hint", "_hinted", "_late")

    def __init__(self, surface: _Surface[Any], what: str) -> None:
        self._surface = surface
        self._what = what
        self._end = time.monotonic() + surface.deadline
        self._made = 0
        self._reason = ""
        self._hint: Destination | None = None
        self._hinted = False
        self._late = False

    def next(self) -> _Attempt | None:
        """The next attempt, or None when the attempts or the deadline ran out."""
        surface = self._surface
        made = self._made
        if made >= surface.retry.attempts:
            return None
        now = time.monotonic()
        hint, pause = None, 0.0
        if made:  # a retry: at once to a hint, else after a pause that leaves time to try
            left = self._end - now
            if left < _MIN_ATTEMPT:
                self._late = True
                return None
            hint, self._hint = self._hint, None
            if not hint:
                pause = min(surface.retry.delay(made - 1), left - _MIN_ATTEMPT)
            surface._count("retries")
            if hint:
                surface._count("hints")
        self._made = made + 1
        start = now + pause
        until = min(start + surface.timeout, self._end)
        return _Attempt(hint, pause, until, until - start)

    def failed(self, retry: _Retry) -> None:
        self._reason = str(retry)
        if retry.hint and not self._hinted and self._surface.follow_moved:
            self._hint, self._hinted = retry.hint, True

    def gave_up(self) -> Unavailable:
        what = self._what
        if self._late:
            what += f" (deadline {self._surface.deadline:g} s)"
        return Unavailable(what, self._made, self._reason)


class _IdlePool(Generic[C]):
    """Idle connections by MetaDataID address, at most `limit` in all.

    Beyond the limit the least recently returned connection is closed: one
    connection, whatever its address, so the pool keeps exactly `limit`.
    Connections are tickets in one LRU order, and each address keeps its own
    tickets oldest first; so the oldest ticket overall is always the first of
    its address, and take, give and evict are O(1).
    """

    def __init__(self, limit: int, close: Callable[[C], object]) -> None:
        self.limit = limit
        self._close = close
        self._lru: OrderedDict[int, tuple[str, C]] = OrderedDict()
        self._tickets: dict[str, deque[int]] = {}
        self._next = itertools.count()

    def __len__(self) -> int:
        return len(self._lru)

    def take(self, address: str) -> C | None:
        """The most recently returned connection to `address` (the likeliest
        still open), or None."""
        tickets = self._tickets.get(address)
        if not tickets:
            return None
        ticket = tickets.pop()
        if not tickets:
            del self._tickets[address]
        return self._lru.pop(ticket)[1]

    def give(self, address: str, conn: C) -> None:
        ticket = next(self._next)
        self._lru[ticket] = (address, conn)
        self._tickets.setdefault(address, deque()).append(ticket)
        while len(self._lru) > self.limit:
            _, (oldest, old) = self._lru.popitem(last=False)
            tickets = self._tickets[oldest]
            tickets.popleft()
            if not tickets:
                del self._tickets[oldest]
            self._close(old)

    def drain(self) -> list[C]:
        """Empty the pool and hand back its connections for closing."""
        conns = [conn for _, conn in self._lru.values()]
        self._lru.clear()
        self._tickets.clear()
        return conns


def host_port(text: str, default_port: int) -> Destination:
    """'HOST', 'HOST:PORT', '[IPV6]:PORT' or a bare IPv6 address (`InvalidArgument`, a
    ValueError, otherwise: argparse takes it as a type's refusal)."""
    if not isinstance(text, str):
        raise InvalidArgument(f"via is text, HOST[:PORT], not {text!r}")
    if text.startswith("["):
        host, _, rest = text[1:].partition("]")
        if rest and not rest.startswith(":"):
            raise InvalidArgument(f"via {text!r}: expected [IPV6]:PORT")
        port = rest[1:]
    elif text.count(":") == 1:
        host, port = text.split(":")
    else:
        host, port = text, ""
    try:
        number = int(port) if port else default_port
    except ValueError:
        number = -1
    if not host or not 0 < number < 65536:
        raise InvalidArgument(f"via {text!r}: expected HOST[:PORT] with a port in 1..65535")
    return host, number


def _moved_hint(reply: ErrorReply, space: Block) -> Destination | None:
    """The server a MOVED reply names as the ID's new owner, if it names one:
    ``MOVED <id> <host>:<port>`` with a host outside the MetaDataID space. A
    MetaDataID there (the agent's "ask the switches") and the older
    ``MOVED <mdid-ip>`` name no one, so the route is tried again."""
    try:
        _, host, port = parse_moved(reply.message)
    except ProtocolError:
        return None
    try:
        ip = ipaddress.ip_address(host)
    except ValueError:
        return host, port  # a name: not an ID
    if ip.max_prefixlen == space.width and space.contains(int(ip)):
        return None
    return host, port


def _positive(name: str, value: float, finite: bool = True) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not value > 0 \
            or (finite and not math.isfinite(value)):
        raise InvalidArgument(f"{name} must be a positive number of seconds, not {value!r}")
    return float(value)


class _Surface(ABC, Generic[C]):
    """The shared part of both clients: settings, ID math, request
    preparation, the meaning of replies and failures, the pool of idle
    connections of type C (each client says how one is closed)."""

    def __init__(self, space: Block | str = DEFAULT_SPACE, *, port: int = METAFLOW_PORT,
                 timeout: float = DEFAULT_TIMEOUT, deadline: float = DEFAULT_DEADLINE,
                 retry: RetryPolicy = _DEFAULT_RETRY, reuse: bool = True, max_idle: int = 64,
                 via: str | None = None, route: Route | None = None, follow_moved: bool = True,
                 fast_open: bool = False) -> None:
        """`space`: the MetaDataID space (a `Block` or CIDR text), the same as the
        agents'. `port`: the metadata port. `timeout`: seconds per attempt;
        `deadline`: seconds per call (may be ``math.inf``: then `retry.attempts`
        alone bounds a call). `retry`: attempts and backoff. `reuse`, `max_idle`:
        pooling. `via` or `route`: the standalone route (module docstring).
        `follow_moved`: try the owner a MOVED reply names before the switches
        (turn off where servers' own addresses are not reachable from clients).
        `fast_open`: send a new connection's first request in its SYN (TCP Fast
        Open), so that a request to an ID this client has no connection to
        costs one round trip instead of two; it takes effect only where the
        kernels allow it without cookies (docs/sites.md), else connections
        open as usual."""
        try:
            self.space = space if isinstance(space, Block) else Block.parse(space)
        except (TypeError, ValueError) as exc:
            raise InvalidArgument(f"space {space!r} is not a CIDR block: {exc}") from None
        if isinstance(port, bool) or not isinstance(port, int) or not 0 < port < 65536:
            raise InvalidArgument(f"port must be in 1..65535, not {port!r}")
        if isinstance(max_idle, bool) or not isinstance(max_idle, int) or max_idle < 0:
            raise InvalidArgument(f"max_idle must be an integer >= 0, not {max_idle!r}")
        if not isinstance(retry, RetryPolicy):
            raise InvalidArgument(f"retry must be a RetryPolicy, not {retry!r}")
        if via is not None and route is not None:
            raise InvalidArgument("give via or route, not both")
        self.port = port
        self.timeout = _positive("timeout", timeout)
        self.deadline = _positive("deadline", deadline, finite=False)
        self.retry = retry
        self.max_idle = max_idle if reuse else 0
        self.follow_moved = follow_moved
        self.fast_open = fast_open
        if via is not None:
            fixed = host_port(via, port)
            self.route: Route | None = lambda _address: fixed
        else:
            self.route = route
        self.stats = ClientStats()
        self._pool: _IdlePool[C] = _IdlePool(self.max_idle, self._discard)
        self._lock = threading.Lock()  # the pool's and the stats' (one client, many threads)

    @staticmethod
    @abstractmethod
    def _discard(conn: C) -> None:
        """Close one connection that leaves the pool."""

    def _close_idle(self) -> None:
        """Close every idle connection now (`close` of the clients whose sockets close at once)."""
        with self._lock:
            conns = self._pool.drain()
        for conn in conns:
            self._discard(conn)

    def mdid(self, path: str | bytes) -> int:
        """The MetaDataID of `path` in this client's space."""
        return mdid_of_key(self._key(path), self.space)

    def address(self, path: str | bytes) -> str:
        """The MetaDataID of `path` as the address a request for it is sent to."""
        return self.space.address(self.mdid(path))

    def _count(self, name: str) -> None:
        with self._lock:
            setattr(self.stats, name, getattr(self.stats, name) + 1)

    def _destination(self, address: str) -> Destination:
        return self.route(address) if self.route else (address, self.port)

    @staticmethod
    def _key(path: str | bytes) -> bytes:
        try:
            return normalize_key(path)
        except TypeError as exc:
            raise InvalidPath(str(exc)) from None

    def _op(self, decode: Callable[[Reply], T], command: str, path: str | bytes, *rest: bytes) -> _Op[T]:
        key = self._key(path)
        return _Op(key.decode("utf-8", "replace"), self.space.address(mdid_of_key(key, self.space)),
                   encode_command(command, key, *rest), decode)

    def _get(self, path: str | bytes) -> _Op[bytes | None]:
        return self._op(_bulk, "GET", path)

    def _put(self, path: str | bytes, value: bytes | FileMetadata) -> _Op[None]:
        return self._op(_ok, "SET", path, _value(value))

    def _create(self, path: str | bytes, value: bytes | FileMetadata) -> _Op[bool]:
        return self._op(_written, "SET", path, _value(value), b"NX")

    def _compare_and_set(self, path: str | bytes, old: bytes | FileMetadata,
                         new: bytes | FileMetadata) -> _Op[bool]:
        return self._op(_written, "SET", path, _value(new), b"IFEQ", _value(old))

    def _entries(self, directory: str | bytes, after: str | bytes,
                 count: int) -> _Op[list[tuple[bytes, bytes]]]:
        key = self._directory(directory)
        if not 1 <= count <= ELIST_MAX:
            raise InvalidArgument(f"count must be from 1 to {ELIST_MAX}, not {count}")
        name = entry_key(key, after)[len(key) + 1:] if after else b""
        return self._op(_pairs, "ELIST", key, name, str(count).encode())

    def _create_entry(self, directory: str | bytes, name: str | bytes,
                      value: bytes | FileMetadata) -> _Op[bool]:
        key = self._directory(directory)
        entry = entry_key(key, name)
        return self._op(_written, "ECREATE", key, entry[len(key) + 1:], _value(value))

    def _remove_directory(self, directory: str | bytes) -> _Op[bool]:
        return self._op(_flag, "ERMDIR", self._directory(directory))

    def _directory(self, directory: str | bytes) -> bytes:
        key = self._key(directory)
        if b"\0" in key:
            raise InvalidPath(f"a directory's path, not an entry key: {directory!r}")
        return key

    def _delete(self, path: str | bytes) -> _Op[bool]:
        return self._op(_flag, "DEL", path)

    def _delete_if_equal(self, path: str | bytes, value: bytes | FileMetadata) -> _Op[bool]:
        return self._op(_flag, "DELIFEQ", path, _value(value))

    def _exists(self, path: str | bytes) -> _Op[bool]:
        return self._op(_flag, "EXISTS", path)

    def _stat(self, path: str | bytes) -> _Op[FileMetadata | None]:
        return self._op(_metadata, "GET", path)

    def _call(self, op: _Op[T]) -> _Call:
        self._count("requests")
        return _Call(self, op.path)

    def _failure(self, exc: OSError | ProtocolError, where: str, attempt: _Attempt) -> Exception:
        """What a broken exchange means: bytes that are not RESP are the peer's
        fault (no retry); a timeout (socket's or asyncio's, both TimeoutError)
        or a refused or lost connection may pass, so it is retried."""
        if isinstance(exc, ProtocolError):
            return BadReply(f"{where}: {exc}")
        if isinstance(exc, TimeoutError):
            self._count("timeouts")
            return _Retry(f"timeout after {attempt.seconds:.3g} s talking to {where}")
        return _Retry(f"{where}: {exc}")

    def _check(self, reply: Reply) -> Reply:
        if isinstance(reply, ErrorReply):
            if reply.code == "MOVED":
                self._count("moved")
                raise _Retry(reply.message, _moved_hint(reply, self.space))
            if reply.code == "TRYAGAIN":
                self._count("tryagain")
                raise _Retry(reply.message)
            if reply.code in _ERRNO:
                raise NamespaceError(_ERRNO[reply.code], reply.message)
            raise ServerError(reply.message)
        return reply

    @staticmethod
    def _where(op: _Op[T], attempt: _Attempt) -> str:
        return f"{attempt.hint[0]}:{attempt.hint[1]} (MOVED hint)" if attempt.hint else op.address


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


def _value(value: bytes | FileMetadata) -> bytes:
    if isinstance(value, FileMetadata):
        return value.to_bytes()
    if isinstance(value, bytes | bytearray | memoryview):
        return bytes(value)
    raise InvalidArgument(f"a value is bytes or a FileMetadata, not {type(value).__name__}")


def _written(reply: Reply) -> bool:
    """A conditional SET: +OK if it wrote, nil if its condition stopped it."""
    if reply is None:
        return False
    _ok(reply)
    return True


def _pairs(reply: Reply) -> list[tuple[bytes, bytes]]:
    if not isinstance(reply, list) or len(reply) % 2 or not all(isinstance(x, bytes) for x in reply):
        raise BadReply(f"expected an array of names and values, got {reply!r}")
    return [(name, value) for name, value in zip(reply[::2], reply[1::2], strict=True)]


def _flag(reply: Reply) -> bool:
    if not isinstance(reply, int):
        raise BadReply(f"expected an integer, got {reply!r}")
    return reply > 0


def _metadata(reply: Reply) -> FileMetadata | None:
    data = _bulk(reply)
    return None if data is None else FileMetadata.from_bytes(data)


def _is_ipv4(host: str) -> bool:
    """Whether `host` is dotted-quad IPv4 text (what `Block.address` makes),
    strictly: not a name, not IPv6, not inet_aton's short or octal forms."""
    try:
        socket.inet_pton(socket.AF_INET, host)
    except (OSError, UnicodeError):
        return False
    return True


def _fast_open(sock: socket.socket) -> None:
    """Make `connect` return at once and the first send carry the SYN
    (``TCP_FASTOPEN_CONNECT``); a kernel without it opens the connection as usual."""
    try:
        sock.setsockopt(socket.IPPROTO_TCP, TCP_FASTOPEN_CONNECT, 1)
    except OSError:
        pass


def _still_open(sock: _HasFileno) -> bool:
    """Whether an idle connection can carry a request: it must not be readable,
    since an idle connection that is has been closed by the peer (a server
    reclaiming idle connections) or holds bytes nobody asked for. One poll
    with no wait, so a reclaimed connection costs no failed attempt (poll,
    not select: a file system's descriptors may be numbered past 1024)."""
    poller = select.poll()
    poller.register(sock, select.POLLIN)
    return not poller.poll(0)


class MetaFlowClient(_Surface[socket.socket]):
    """Blocking, thread-safe client (module docstring: contract, retries, errors).

    ``MetaFlowClient()`` goes through the fabric; ``MetaFlowClient(via="127.0.0.1:9000")``
    talks to one agent directly. Keyword arguments are described on `_Surface.__init__`.
    """

    @staticmethod
    def _discard(conn: socket.socket) -> None:
        conn.close()

    def get(self, path: str | bytes) -> bytes | None:
        """The value stored at `path`, or None."""
        return self._run(self._get(path))

    def put(self, path: str | bytes, value: bytes | FileMetadata) -> None:
        """Store `value` at `path`, replacing what was there."""
        return self._run(self._put(path, value))

    def delete(self, path: str | bytes) -> bool:
        """Remove `path`; whether it existed."""
        return self._run(self._delete(path))

    def create(self, path: str | bytes, value: bytes | FileMetadata) -> bool:
        """Store `value` at `path` only if nothing is there; whether it did."""
        return self._run(self._create(path, value))

    def compare_and_set(self, path: str | bytes, old: bytes | FileMetadata,
                        new: bytes | FileMetadata) -> bool:
        """Replace the value at `path` with `new` only if it is exactly `old`; whether it did."""
        return self._run(self._compare_and_set(path, old, new))

    def entries(self, directory: str | bytes, after: str | bytes = b"",
                count: int = ELIST_DEFAULT) -> list[tuple[bytes, bytes]]:
        """Up to `count` entries of `directory` whose names sort after `after`,
        as (name, value) in name order; the next page starts after the last name."""
        return self._run(self._entries(directory, after, count))

    def create_entry(self, directory: str | bytes, name: str | bytes, value: bytes | FileMetadata) -> bool:
        """Entry `name` of `directory`, only if the name is free (False if not)
        and the directory exists, that is its header, the value at its own
        path, does (`NamespaceError` ENOENT if not)."""
        return self._run(self._create_entry(directory, name, value))

    def remove_directory(self, directory: str | bytes) -> bool:
        """Delete the directory's header if it has no entries (`NamespaceError`
        ENOTEMPTY if it has); whether there was a header."""
        return self._run(self._remove_directory(directory))

    def delete_if_equal(self, path: str | bytes, value: bytes | FileMetadata) -> bool:
        """Remove `path` only if it holds exactly `value`; whether it did (so a
        retry of a delete that was applied says False)."""
        return self._run(self._delete_if_equal(path, value))

    def exists(self, path: str | bytes) -> bool:
        return self._run(self._exists(path))

    def stat(self, path: str | bytes) -> FileMetadata | None:
        """The `FileMetadata` stored at `path`, or None."""
        return self._run(self._stat(path))

    def close(self) -> None:
        """Close the idle connections (the client stays usable)."""
        self._close_idle()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _run(self, op: _Op[T]) -> T:
        call = self._call(op)
        while (attempt := call.next()) is not None:
            if attempt.pause:
                time.sleep(attempt.pause)
            try:
                return op.decode(self._check(self._exchange(op, attempt)))
            except _Retry as exc:
                call.failed(exc)
        raise call.gave_up()

    def _exchange(self, op: _Op[T], attempt: _Attempt) -> Reply:
        sock: socket.socket | None = None
        try:
            if attempt.hint:
                sock = self._connect(attempt.hint, attempt)
            else:
                sock = self._checkout(op.address, attempt)
            sock.settimeout(attempt.left())
            sock.sendall(op.frame)
            parser = RespParser(max_bulk=_MAX_REPLY, max_args=_MAX_REPLY_ELEMENTS)
            while True:
                done, reply = parser.next_reply()
                if done:
                    break
                sock.settimeout(attempt.left())
                data = sock.recv(65536)
                if not data:
                    raise ConnectionResetError("server closed the connection")
                parser.feed(data)
        except (OSError, ProtocolError) as exc:
            if sock is not None:
                sock.close()
            raise self._failure(exc, self._where(op, attempt), attempt) from None
        if attempt.hint or _redirected(reply):
            sock.close()  # a hint's server is not where the switches send this ID
        else:
            with self._lock:
                self._pool.give(op.address, sock)
        return reply

    def _checkout(self, address: str, attempt: _Attempt) -> socket.socket:
        while True:
            with self._lock:
                sock = self._pool.take(address)
            if sock is None:
                return self._connect(self._destination(address), attempt)
            if _still_open(sock):
                return sock
            sock.close()

    def _connect(self, destination: Destination, attempt: _Attempt) -> socket.socket:
        self._count("connects")
        host, port = destination
        if _is_ipv4(host):  # a MetaDataID: no resolver call (it cost what the rest of our Python did)
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            try:
                if self.fast_open:
                    _fast_open(sock)
                sock.settimeout(attempt.left())
                sock.connect((host, port))
            except BaseException:
                sock.close()
                raise
        else:  # a name or IPv6: resolved, every address tried
            sock = socket.create_connection(destination, timeout=attempt.left())
        try:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        except OSError:
            sock.close()
            raise
        return sock


async def _request(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, frame: bytes) -> Reply:
    """Send one request frame and read its one reply; a peer that closes first
    raises ConnectionResetError. The caller bounds it in time."""
    writer.write(frame)
    await writer.drain()
    parser = RespParser(max_bulk=_MAX_REPLY, max_args=_MAX_REPLY_ELEMENTS)
    while True:
        done, reply = parser.next_reply()
        if done:
            return reply
        data = await reader.read(65536)
        if not data:
            raise ConnectionResetError("server closed the connection")
        parser.feed(data)


async def exchange_async(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, frame: bytes,
                         timeout: float) -> Reply:
    """One request and its reply within `timeout` seconds in all (TimeoutError
    otherwise). Shared with the benchmark's lookup RPCs, which talk RESP over
    the same streams. `wait_for`, not `asyncio.timeout`: the lookup daemon
    runs its handlers outside any task (`nat_agent.connection` drives them
    eagerly), where `asyncio.timeout` refuses to start on Python 3.11."""
    return await asyncio.wait_for(_request(reader, writer, frame), timeout)


class _AsyncSurface(_Surface[C]):
    """The async clients' retry loop (`AsyncMetaFlowClient`, the mount's
    `TrioMetaFlowClient`): each says how it sleeps and how it exchanges."""

    @staticmethod
    @abstractmethod
    async def _sleep(seconds: float, /) -> None:
        """Its event loop's sleep."""

    @abstractmethod
    async def _exchange(self, op: _Op[T], attempt: _Attempt) -> Reply:
        """One request and its reply on a connection of its own kind."""

    async def _run(self, op: _Op[T]) -> T:
        call = self._call(op)
        while (attempt := call.next()) is not None:
            if attempt.pause:
                await self._sleep(attempt.pause)
            try:
                return op.decode(self._check(await self._exchange(op, attempt)))
            except _Retry as exc:
                call.failed(exc)
        raise call.gave_up()


class AsyncMetaFlowClient(_AsyncSurface[Stream]):
    """The asyncio twin of `MetaFlowClient`, for one event loop: the same
    arguments, the same methods as coroutines."""

    _sleep = staticmethod(asyncio.sleep)

    @staticmethod
    def _discard(conn: Stream) -> None:
        conn[1].close()

    async def get(self, path: str | bytes) -> bytes | None:
        return await self._run(self._get(path))

    async def put(self, path: str | bytes, value: bytes | FileMetadata) -> None:
        return await self._run(self._put(path, value))

    async def delete(self, path: str | bytes) -> bool:
        return await self._run(self._delete(path))

    async def create(self, path: str | bytes, value: bytes | FileMetadata) -> bool:
        return await self._run(self._create(path, value))

    async def compare_and_set(self, path: str | bytes, old: bytes | FileMetadata,
                              new: bytes | FileMetadata) -> bool:
        return await self._run(self._compare_and_set(path, old, new))

    async def entries(self, directory: str | bytes, after: str | bytes = b"",
                      count: int = ELIST_DEFAULT) -> list[tuple[bytes, bytes]]:
        return await self._run(self._entries(directory, after, count))

    async def create_entry(self, directory: str | bytes, name: str | bytes,
                           value: bytes | FileMetadata) -> bool:
        return await self._run(self._create_entry(directory, name, value))

    async def remove_directory(self, directory: str | bytes) -> bool:
        return await self._run(self._remove_directory(directory))

    async def delete_if_equal(self, path: str | bytes, value: bytes | FileMetadata) -> bool:
        return await self._run(self._delete_if_equal(path, value))

    async def exists(self, path: str | bytes) -> bool:
        return await self._run(self._exists(path))

    async def stat(self, path: str | bytes) -> FileMetadata | None:
        return await self._run(self._stat(path))

    async def close(self) -> None:
        """Close the idle connections and wait until they are closed."""
        writers = [writer for _, writer in self._pool.drain()]
        for writer in writers:
            writer.close()
        await asyncio.gather(*(writer.wait_closed() for writer in writers), return_exceptions=True)

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def _exchange(self, op: _Op[T], attempt: _Attempt) -> Reply:
        try:
            async with asyncio.timeout(attempt.left()):
                conn = await (self._connect(attempt.hint) if attempt.hint else self._checkout(op.address))
        except OSError as exc:
            raise self._failure(exc, self._where(op, attempt), attempt) from None
        try:
            async with asyncio.timeout(attempt.left()):
                reply = await _request(*conn, op.frame)
        except BaseException as exc:  # a cancelled call closes its connection too
            conn[1].close()
            if isinstance(exc, OSError | ProtocolError):
                raise self._failure(exc, self._where(op, attempt), attempt) from None
            raise
        if attempt.hint or _redirected(reply):
            conn[1].close()
        else:
            self._pool.give(op.address, conn)
        return reply

    async def _checkout(self, address: str) -> Stream:
        while (conn := self._pool.take(address)) is not None:
            if not (conn[1].is_closing() or conn[0].at_eof()):
                return conn
            conn[1].close()
        return await self._connect(self._destination(address))

    async def _connect(self, destination: Destination) -> Stream:
        self._count("connects")
        if self.fast_open and _is_ipv4(destination[0]):
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            sock.setblocking(False)
            _fast_open(sock)
            try:
                await asyncio.get_running_loop().sock_connect(sock, destination)
            except BaseException:
                sock.close()
                raise
            reader, writer = await asyncio.open_connection(sock=sock)
        else:
            reader, writer = await asyncio.open_connection(*destination)
        try:
            writer.get_extra_info("socket").setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        except OSError:  # the peer closed it already (a refusal, a reset): the transport let go
            writer.close()
            raise
        return reader, writer
