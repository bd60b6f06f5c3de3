"""The RESP subset MetaFlow speaks on port 9000, shared by client and agent.

Both sides use one sans-I/O parser so that the framing rules (and their
limits) cannot drift apart. The parser is incremental: `feed` bytes as they
arrive and pull complete messages; a half-sent frame simply yields nothing
until the rest arrives, and the caller's deadline decides when to give up.

Limits are enforced while parsing, before the bytes are buffered:

* ``max_bulk`` is a hard cap: a frame announcing a longer bulk string (a
  4 GiB one, say) is a `BulkTooLarge` protocol error at its header, and the
  connection is closed, since reading that much just to skip it is not worth it.
* ``limit(name, index)`` (optional, commands only) gives each argument its
  own limit, so a key can be held to `client_lib.constants.MAX_KEY` while a
  value may be a mebibyte. An argument over its limit refuses the *command*,
  not the connection: `next_command` raises `ArgumentTooLarge` at the
  argument's header and then discards the rest of that command as it
  arrives, without buffering it; the caller answers an error and goes on.

Requests are parsed as Redis parses them, including inline commands typed
into telnet, and blank lines between commands are skipped (``redis-cli
--pipe`` input often has them). Replies are RESP2 unless a connection asked
for RESP3 (``HELLO 3``), where only the null and map encodings differ for
what MetaFlow sends; `encode_reply` takes the protocol. The reply parser
reads RESP2, which is all the MetaFlow client asks for.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

CRLF = b"\r\n"

# Default limits. The value limit is the agent's configurable one; these
# bound what a frame may announce before the agent even looks at it.
DEFAULT_MAX_BULK = 1 << 20
DEFAULT_MAX_ARGS = 64
DEFAULT_MAX_LINE = 64 * 1024
_MAX_NESTING = 8

ArgLimit = Callable[[bytes, int], int]
"""``limit(name, index)``: the most bytes argument ``index`` of command ``name``
may have. Index 0 is the command name itself, asked with an empty ``name``."""


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


class ArgumentTooLarge(ValueError):
    """A command argument over its own limit: the command is refused, the
    connection is not (the parser discards the rest of the command as it
    arrives, so the next `next_command` carries on after it)."""

    def __init__(self, name: bytes, index: int, size: int, limit: int) -> None:
        what = ("command name" if index == 0 else
                f"argument {index} of '{name[:32].decode('utf-8', 'replace').lower()}'")
        super().__init__(f"{what} of {size} bytes exceeds the limit of {limit} bytes")
        self.name = name
        self.index = index
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


class _Incomplete(Exception):
    """Internal: the buffer ends inside the message being parsed."""


_OPENED = object()  # internal: an array header was read; its elements follow


class RespParser:
    """Incremental RESP parser for one connection direction."""

    def __init__(
        self,
        max_bulk: int = DEFAULT_MAX_BULK,
        max_args: int = DEFAULT_MAX_ARGS,
        max_line: int = DEFAULT_MAX_LINE,
        limit: ArgLimit | None = None,
    ) -> None:
        self.max_bulk = max_bulk
        self.max_args = max_args
        self.max_line = max_line
        self.limit = limit
        self._buf = bytearray()
        self._pos = 0
        # Bytes the buffer must hold before a new attempt can get further:
        # without it, a large value arriving in many chunks would be
        # re-parsed from its start once per chunk.
        self._wanted = 0
        self._arrays: list[tuple[list[Reply], int]] = []  # replies: arrays being filled
        # A refused command being discarded: how many of its bulk strings are
        # left (counting the current one), and how many payload bytes of the
        # current one (-1: its header has not been read yet).
        self._refused = 0
        self._left = -1

    def feed(self, data: bytes) -> None:
        self._buf += data

    @property
    def pending(self) -> int:
        """Bytes received but not yet consumed by a complete message."""
        return len(self._buf)

    @property
    def busy(self) -> bool:
        """Whether a request has started and not ended: bytes are buffered, or a
        refused command is still being discarded (with nothing buffered)."""
        return bool(self._buf) or self._refused > 0

    def next_command(self) -> list[bytes] | None:
        """The next complete command (array of bulk strings, or inline), or None.

        Raises `ArgumentTooLarge` for a command with an argument over its
        limit (and carries on after it at the next call), `ProtocolError` for
        bytes that cannot be framed. Commands are small (a key and one value
        at most), so an incomplete one is parsed again from its start when
        more bytes arrive; `_wanted` keeps that to once per missing piece
        rather than once per chunk.
        """
        while True:
            if self._refused:
                try:
                    self._discard()
                except _Incomplete:
                    return None
            if not self._buf or len(self._buf) < self._wanted:
                return None
            self._pos = 0
            try:
                command = self._command()
            except _Incomplete:
                return None
            del self._buf[: self._pos]
            self._wanted = 0
            if command:
                return command
            # A blank line between commands: skipped, as Redis does.

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
            except _Incomplete:
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
            return self._bulk(rest)
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

    # -- framing ---------------------------------------------------------

    def _line(self) -> bytes:
        end = self._buf.find(CRLF, self._pos)
        if end < 0:
            if len(self._buf) - self._pos > self.max_line:
                raise ProtocolError(f"line longer than {self.max_line} bytes")
            self._wanted = len(self._buf) + 1
            raise _Incomplete
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

    def _bulk(self, header: bytes) -> bytes | None:
        size = self._bulk_size(header)
        return None if size == -1 else self._bulk_body(size)

    def _bulk_body(self, size: int) -> bytes:
        end = self._pos + size
        if len(self._buf) < end + 2:
            self._wanted = end + 2
            raise _Incomplete
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

    def _command(self) -> list[bytes]:
        """One command, or [] for a blank line."""
        line = self._line()
        if not line.startswith(b"*"):
            return self._inline(line)
        count = self._count(line[1:])
        if count <= 0:
            raise ProtocolError("empty command")
        args: list[bytes] = []
        limit = self.limit
        for index in range(count):
            size = self._argument_size()
            if limit is not None:
                name = args[0] if args else b""
                most = limit(name, index)
                if size > most:
                    self._refuse(count - index, size)
                    raise ArgumentTooLarge(name, index, size, most)
            args.append(self._bulk_body(size))
        return args

    def _argument_size(self) -> int:
        """The length a command argument's header announces (a bulk string, not null)."""
        header = self._line()
        if not header.startswith(b"$"):
            raise ProtocolError(f"expected a bulk string, got {header[:1]!r}")
        size = self._bulk_size(header[1:])
        if size == -1:
            raise ProtocolError("null bulk string in a command")
        return size

    def _inline(self, line: bytes) -> list[bytes]:
        """Inline commands (`PING\\r\\n`), as typed into telnet or nc."""
        args = line.split()
        if len(args) > self.max_args:
            raise ProtocolError(f"inline command of {len(args)} words exceeds the limit of {self.max_args}")
        if self.limit is not None:
            for index, arg in enumerate(args):
                most = self.limit(args[0] if index else b"", index)
                if len(arg) > most:
                    self._refuse(0, 0)
                    raise ArgumentTooLarge(args[0] if index else b"", index, len(arg), most)
        return args

    # -- refused commands --------------------------------------------------

    def _refuse(self, bulks: int, size: int) -> None:
        """Forget the refused command's bytes so far; discard `bulks` more bulk
        strings, the first of which has `size` payload bytes and no header left."""
        del self._buf[: self._pos]
        self._pos = self._wanted = 0
        self._refused = bulks
        self._left = size

    def _discard(self) -> None:
        """Drop a refused command's remaining bytes as they arrive (raises
        `_Incomplete` until it is all gone). Headers are still checked, so the
        connection stays in step with the client's framing."""
        buf = self._buf
        while self._refused:
            if self._left < 0:
                self._pos = 0
                size = self._argument_size()
                del buf[: self._pos]
                self._pos = self._wanted = 0
                self._left = size
            dropped = min(self._left, len(buf))
            del buf[:dropped]
            self._left -= dropped
            if self._left or len(buf) < 2:
                raise _Incomplete
            if buf[:2] != CRLF:
                raise ProtocolError("bulk string not terminated by CRLF")
            del buf[:2]
            self._refused -= 1
            self._left = -1


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


def _single_line(text: str) -> bytes:
    """Simple strings and errors cannot contain CR or LF; flatten them."""
    return text.replace("\r", " ").replace("\n", " ").encode("utf-8", "replace")


def encode_reply(value: Reply, resp3: bool = False) -> bytes:
    """A reply in RESP2, or in RESP3 for a connection that said ``HELLO 3``:
    there, null is ``_`` and a dict is a map; everything else is the same."""
    if value is None:
        return b"_\r\n" if resp3 else b"$-1\r\n"
    if isinstance(value, SimpleString):
        return b"+" + _single_line(value.value) + CRLF
    if isinstance(value, ErrorReply):
        return b"-" + _single_line(value.message) + CRLF
    if isinstance(value, bool):
        return b":%d\r\n" % int(value)
    if isinstance(value, int):
        return b":%d\r\n" % value
    if isinstance(value, (bytes, bytearray, str)):
        data = _as_bytes(bytes(value) if isinstance(value, bytearray) else value)
        return b"$%d\r\n%s\r\n" % (len(data), data)
    if isinstance(value, list):
        return b"*%d\r\n" % len(value) + b"".join(encode_reply(v, resp3) for v in value)
    if isinstance(value, dict):
        header = b"%%%d\r\n" % len(value) if resp3 else b"*%d\r\n" % (2 * len(value))
        return header + b"".join(encode_reply(k, resp3) + encode_reply(v, resp3) for k, v in value.items())
    raise TypeError(f"cannot encode {type(value).__name__} as RESP")


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
