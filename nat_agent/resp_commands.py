"""The server's side of RESP on port 9000: commands parsed as Redis parses
them, and replies encoded; the agent's, since only a server needs them.

The wire contract this is one end of (framing and its hard limits, the reply
values, MOVED) is `client_lib.resp`, whose `RespFraming` the command parser
is built on, so the two sides cannot drift apart; the client library never
imports this module.

`CommandParser` is also the oracle of the compiled parser of the same name
(`nat_agent._fastpath.CommandParser`, nat_agent/fastpath/src/parser.rs):
tests/unit/test_fastpath.py feeds both the same bytes, in the same chunks,
and asks for the same commands and the same exceptions.

Requests are parsed as Redis parses them, including inline commands typed
into telnet, and blank lines between commands are skipped (``redis-cli
--pipe`` input often has them).

``limit(name, index)`` (optional) gives each argument its own limit, so a
key can be held to `client_lib.constants.MAX_KEY` while a value may be a
mebibyte. An argument over its limit refuses the *command*, not the
connection: `next_command` raises `ArgumentTooLarge` at the argument's
header and then discards the rest of that command as it arrives, without
buffering it; the caller answers an error and goes on.

Replies are RESP2 unless a connection asked for RESP3 (``HELLO 3``), where
only the null and map encodings differ for what MetaFlow sends;
`encode_reply` takes the protocol.
"""

from __future__ import annotations

from collections.abc import Callable

from client_lib.resp import (
    CRLF,
    DEFAULT_MAX_ARGS,
    DEFAULT_MAX_BULK,
    DEFAULT_MAX_LINE,
    ErrorReply,
    Incomplete,
    ProtocolError,
    Reply,
    RespFraming,
    SimpleString,
)

ArgLimit = Callable[[bytes, int], int]
"""``limit(name, index)``: the most bytes argument ``index`` of command ``name``
may have. Index 0 is the command name itself, asked with an empty ``name``."""


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


class CommandParser(RespFraming):
    """Incremental command parser for one client connection."""

    def __init__(self, max_bulk: int = DEFAULT_MAX_BULK, max_args: int = DEFAULT_MAX_ARGS,
                 max_line: int = DEFAULT_MAX_LINE, limit: ArgLimit | None = None) -> None:
        super().__init__(max_bulk, max_args, max_line)
        self.limit = limit
        # A refused command being discarded: how many of its bulk strings are
        # left (counting the current one), and how many payload bytes of the
        # current one (-1: its header has not been read yet).
        self._refused = 0
        self._left = -1

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
                except Incomplete:
                    return None
            if not self._buf or len(self._buf) < self._wanted:
                return None
            self._pos = 0
            try:
                command = self._command()
            except Incomplete:
                return None
            del self._buf[: self._pos]
            self._wanted = 0
            if command:
                return command
            # A blank line between commands: skipped, as Redis does.


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
        `Incomplete` until it is all gone). Headers are still checked, so the
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
                raise Incomplete
            if buf[:2] != CRLF:
                raise ProtocolError("bulk string not terminated by CRLF")
            del buf[:2]
            self._refused -= 1
            self._left = -1


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
        data = value.encode("utf-8") if isinstance(value, str) else bytes(value)
        return b"$%d\r\n%s\r\n" % (len(data), data)
    if isinstance(value, list):
        return b"*%d\r\n" % len(value) + b"".join(encode_reply(v, resp3) for v in value)
    if isinstance(value, dict):
        header = b"%%%d\r\n" % len(value) if resp3 else b"*%d\r\n" % (2 * len(value))
        return header + b"".join(encode_reply(k, resp3) + encode_reply(v, resp3) for k, v in value.items())
    raise TypeError(f"cannot encode {type(value).__name__} as RESP")


def internal_error(exc: object) -> ErrorReply:
    """The reply to a command that failed inside the agent (a store's error,
    a sync that failed): the service's, the compiled workers' and the
    replication listener's wording."""
    return ErrorReply(f"ERR internal error: {exc}")
