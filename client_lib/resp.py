"""The RESP subset MetaFlow speaks on port 9000: the wire contract, and the client's side of it.

Defined here, once, for both ends: the framing rules and their hard limits
(`RespFraming`), the reply values (`Reply`: `SimpleString`, `ErrorReply`,
integers, bulk strings, arrays), and the MOVED redirection's text
(`moved_message`, `parse_moved`). The client's half is here too: the command
encoder (`encode_command`) and the reply parser (`RespParser`). The server's
half, parsing commands as Redis does (with per-argument limits) and encoding
replies, is the agent's: `nat_agent.resp_commands`, built on the same
`RespFraming`, so the framing rules cannot drift apart and a client never
imports a server.

The parser is incremental and sans-I/O: `feed` bytes as they arrive and pull
complete messages; a half-sent frame simply yields nothing until the rest
arrives, and the caller's deadline decides when to give up.

``max_bulk`` is a hard cap, enforced while parsing, before the bytes are
buffered: a frame announcing a longer bulk string (a 4 GiB one, say) is a
`BulkTooLarge` protocol error at its header, and the connection is closed,
since reading that much just to skip it is not worth it.

The reply parser reads RESP2, which is all the MetaFlow client asks for (a
connection that asked for RESP3 with ``HELLO 3`` differs only in the null
and map encodings of what MetaFlow sends).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

CRLF = b"\r\n"

# Default limits. The value limit is the agent's configurable one; these
# bound what a frame may announce before the agent even looks at it.
DEFAULT_MAX_BULK = 1 << 20
DEFAULT_MAX_ARGS = 64
DEFAULT_MAX_LINE = 64 * 1024
_MAX_NESTING = 8

class ProtocolError(ValueError):
    """The peer sent bytes that are not RESP (or exceed a hard limit).

    The connection cannot be resynchronized after this: the caller answers
    once with the message and closes.
    """


class BulkTooLarge(ProtocolError):
    """A bulk string header announced more bytes than ``max_bulk``."""

    def __init__(self, size: int, limit: int) -> None:
        super().__init__(f"bulk string of {size} bytes exceeds the limit of {limit} bytes")
        self.size = size
        self.limit = limit


@dataclass(frozen=True)
class ErrorReply:
    """A `-` reply: the first word is the code (ERR, MOVED, TRYAGAIN, ...)."""

    message: str

    @property
    def code(self) -> str:
        return self.message.split(" ", 1)[0]

    @property
    def detail(self) -> str:
        parts = self.message.split(" ", 1)
        return parts[1] if len(parts) > 1 else ""


@dataclass(frozen=True)
class SimpleString:
    """A `+` reply (distinct from a bulk string so that `+OK` stays visible)."""

    value: str


Reply = SimpleString | ErrorReply | int | bytes | None | list[Any] | dict[Any, Any]
"""A decoded reply. A dict is a RESP3 map (a flat key, value array in RESP2);
the parser never produces one, since it reads RESP2."""


class Incomplete(Exception):
    """The buffer ends inside the message being parsed: wait for more bytes.
    Raised by `RespFraming`'s steps, caught by the parsers built on them."""


_OPENED = object()  # internal: an array header was read; its elements follow


class RespFraming:
    """One connection direction's bytes and the framing rules both sides
    share: lines, lengths, bulk strings and array headers, each within its
    hard limit. The reply parser (`RespParser`, below) and the agent's command
    parser (`nat_agent.resp_commands.CommandParser`) are built on it, each
    adding the messages it reads."""

    def __init__(self, max_bulk: int = DEFAULT_MAX_BULK, max_args: int = DEFAULT_MAX_ARGS,
                 max_line: int = DEFAULT_MAX_LINE) -> None:
        self.max_bulk = max_bulk
        self.max_args = max_args
        self.max_line = max_line
        self._buf = bytearray()
        self._pos = 0
        # Bytes the buffer must hold before a new attempt can get further:
        # without it, a large value arriving in many chunks would be
        # re-parsed from its start once per chunk.
        self._wanted = 0

    def feed(self, data: bytes) -> None:
        self._buf += data

    @property
    def pending(self) -> int:
        """Bytes received but not yet consumed by a complete message."""
        return len(self._buf)

    def _line(self) -> bytes:
        end = self._buf.find(CRLF, self._pos)
        if end < 0:
            if len(self._buf) - self._pos > self.max_line:
                raise ProtocolError(f"line longer than {self.max_line} bytes")
            self._wanted = len(self._buf) + 1
            raise Incomplete
        if end - self._pos > self.max_line:
            raise ProtocolError(f"line longer than {self.max_line} bytes")
        line = bytes(self._buf[self._pos:end])
        self._pos = end + 2
        return line

    def _length(self, header: bytes, what: str) -> int:
        """A decimal integer as Redis writes one: an optional minus and ASCII
        digits, nothing else (Python's int() would also take spaces, a plus
        and underscores, which no RESP peer sends)."""
        if not (header[1:] if header[:1] == b"-" else header).isdigit():
            raise ProtocolError(f"invalid {what} length {header[:32]!r}")
        return int(header)

    def _bulk_size(self, header: bytes) -> int:
        """The length a bulk header announces (-1 for null), within the hard cap."""
        size = self._length(header, "bulk")
        if size < -1:
            raise ProtocolError(f"invalid bulk length {size}")
        if size > self.max_bulk:
            raise BulkTooLarge(size, self.max_bulk)
        return size

    def _bulk_body(self, size: int) -> bytes:
        end = self._pos + size
        if len(self._buf) < end + 2:
            self._wanted = end + 2
            raise Incomplete
        if self._buf[end:end + 2] != CRLF:
            raise ProtocolError("bulk string not terminated by CRLF")
        data = bytes(self._buf[self._pos:end])
        self._pos = end + 2
        return data

    def _count(self, header: bytes) -> int:
        count = self._length(header, "array")
        if count < -1:
            raise ProtocolError(f"invalid array length {count}")
        if count > self.max_args:
            raise ProtocolError(f"array of {count} elements exceeds the limit of {self.max_args}")
        return count


class RespParser(RespFraming):
    """The client's incremental reply parser for one connection."""

    def __init__(self, max_bulk: int = DEFAULT_MAX_BULK, max_args: int = DEFAULT_MAX_ARGS,
                 max_line: int = DEFAULT_MAX_LINE) -> None:
        super().__init__(max_bulk, max_args, max_line)
        self._arrays: list[tuple[list[Reply], int]] = []  # arrays being filled

    def next_reply(self) -> tuple[bool, Reply]:
        """(True, reply) for the next complete reply, else (False, None).

        Replies can be large arrays (a store's MGET of a thousand values), so
        this parse resumes where the last attempt stopped: finished elements
        stay on `_arrays` and their bytes are not looked at again.
        """
        if len(self._buf) < self._wanted:
            return False, None
        while True:
            start = self._pos
            try:
                value = self._scalar_or_open_array()
            except Incomplete:
                self._pos = start
                self._compact()
                return False, None
            if value is _OPENED:
                continue
            reply: Reply = value  # type: ignore[assignment]  # not _OPENED, so a Reply
            while self._arrays:
                items, expected = self._arrays[-1]
                items.append(reply)
                if len(items) < expected:
                    break
                self._arrays.pop()
                reply = items
            else:
                del self._buf[: self._pos]
                self._pos = self._wanted = 0
                return True, reply

    def _scalar_or_open_array(self) -> Reply | object:
        line = self._line()
        kind, rest = line[:1], line[1:]
        if kind == b"+":
            return SimpleString(rest.decode("utf-8", "replace"))
        if kind == b"-":
            return ErrorReply(rest.decode("utf-8", "replace"))
        if kind == b":":
            return self._length(rest, "integer")
        if kind == b"$":
            size = self._bulk_size(rest)
            return None if size == -1 else self._bulk_body(size)
        if kind == b"*":
            count = self._count(rest)
            if count == -1:
                return None
            if count == 0:
                return []
            if len(self._arrays) >= _MAX_NESTING:
                raise ProtocolError("arrays nested too deep")
            self._arrays.append(([], count))
            return _OPENED
        raise ProtocolError(f"unknown reply type {kind!r}")

    def _compact(self) -> None:
        """Drop the bytes of finished array elements once they are most of the buffer."""
        if self._pos > 65536 and self._pos * 2 > len(self._buf):
            del self._buf[: self._pos]
            self._wanted = max(0, self._wanted - self._pos)
            self._pos = 0


# -- encoding --------------------------------------------------------------

def _as_bytes(value: bytes | str | int) -> bytes:
    if isinstance(value, bytes):
        return value
    if isinstance(value, str):
        return value.encode("utf-8")
    return str(value).encode("ascii")


def encode_command(*args: bytes | str | int) -> bytes:
    parts = [b"*%d\r\n" % len(args)]
    for arg in args:
        data = _as_bytes(arg)
        parts.append(b"$%d\r\n%s\r\n" % (len(data), data))
    return b"".join(parts)


# The two simple strings servers answer most, and clients compare replies to.
OK = SimpleString("OK")
PONG = SimpleString("PONG")


# -- redirections ----------------------------------------------------------

def moved_message(mdid: int, host: str, port: int) -> str:
    """The text of a MOVED error reply (without its ``-``): ``MOVED <id> <host>:<port>``.

    This is the shape Redis Cluster uses (``MOVED <slot> <ip>:<port>``), so
    `redis-cli -c` follows it and redis-py raises its ``MovedError``; the
    "slot" is the MetaDataID as a decimal integer. An IPv6 host is written
    without brackets, as Redis does (readers split at the last colon).
    """
    if mdid < 0 or not 0 < port < 65536 or not host or any(c in host for c in " \r\n"):
        raise ValueError(f"cannot redirect {mdid} to {host!r}:{port}")
    return f"MOVED {mdid} {host}:{port}"


def parse_moved(message: str) -> tuple[int, str, int]:
    """``(mdid, host, port)`` of a MOVED error's text; `ProtocolError` if malformed.

    Accepts the message with or without its leading ``-``, and a bracketed
    IPv6 host.
    """
    parts = message.removeprefix("-").split(" ")
    if len(parts) != 3 or parts[0] != "MOVED":
        raise ProtocolError(f"not a MOVED reply: {message[:100]!r}")
    ident, address = parts[1], parts[2]
    host, sep, port = address.rpartition(":")
    host = host.removeprefix("[").removesuffix("]")
    if not (ident.isascii() and ident.isdigit()) or not sep or not host \
            or not (port.isascii() and port.isdigit()) or not 0 < int(port) < 65536:
        raise ProtocolError(f"malformed MOVED reply: {message[:100]!r}")
    return int(ident), host, int(port)
