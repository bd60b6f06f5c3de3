"""RESP from both ends: the client's side (`client_lib.resp`) against the
agent's (`nat_agent.resp_commands`), on the framing they share: round trips,
limits, and fuzzing."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from client_lib.resp import (
    BulkTooLarge,
    ErrorReply,
    ProtocolError,
    RespParser,
    SimpleString,
    encode_command,
    moved_message,
    parse_moved,
)
from nat_agent.resp_commands import ArgumentTooLarge, CommandParser, encode_reply

args_st = st.lists(st.binary(max_size=200), min_size=1, max_size=10)
line_text = st.text(alphabet=st.characters(codec="utf-8", exclude_characters="\r\n"), max_size=30)
reply_st = st.recursive(
    st.none() | st.integers(-(2**63), 2**63 - 1) | st.binary(max_size=100)
    | st.builds(SimpleString, line_text)
    | st.builds(ErrorReply, line_text.filter(bool)),
    lambda children: st.lists(children, max_size=5), max_leaves=20)


def _commands(stream: bytes, chunks: list[int]) -> list[list[bytes]]:
    parser, out, pos = CommandParser(), [], 0
    for size in chunks + [len(stream)]:
        parser.feed(stream[pos:pos + size])
        pos += size
        while (cmd := parser.next_command()) is not None:
            out.append(cmd)
    return out


@given(st.lists(args_st, min_size=1, max_size=5), st.lists(st.integers(0, 50), max_size=30))
def test_commands_survive_any_chunking(commands, chunks):
    stream = b"".join(encode_command(*c) for c in commands)
    assert _commands(stream, chunks) == commands


@given(reply_st)
def test_replies_round_trip(value):
    parser = RespParser(max_args=1000)
    data = encode_reply(value)
    for i in range(len(data) - 1):  # every strict prefix is incomplete, not an error
        partial = RespParser(max_args=1000)
        partial.feed(data[:i])
        assert partial.next_reply() == (False, None)
    parser.feed(data)
    assert parser.next_reply() == (True, value)
    assert parser.pending == 0


def test_inline_commands_as_typed_into_nc():
    parser = CommandParser()
    parser.feed(b"PING\r\nGET /a/b\r\n")
    assert parser.next_command() == [b"PING"]
    assert parser.next_command() == [b"GET", b"/a/b"]
    assert parser.next_command() is None


@pytest.mark.parametrize("frame, message", [
    (b"*1\r\n:5\r\n", "expected a bulk string"),
    (b"*x\r\n", "invalid array length"),
    (b"*1\r\n$abc\r\n", "invalid bulk length"),
    (b"*1\r\n$3\r\nabcd\r\n", "not terminated by CRLF"),
    (b"*1\r\n$-1\r\n", "null bulk string"),
    (b"*0\r\n", "empty command"),
    (b"*65\r\n", "exceeds the limit"),
])
def test_malformed_commands_raise_protocol_error(frame, message):
    parser = CommandParser()
    parser.feed(frame)
    with pytest.raises(ProtocolError, match=message):
        parser.next_command()


def test_blank_lines_between_commands_are_skipped_as_redis_does():
    """`redis-cli --pipe` input often has them; they used to be a fatal error."""
    parser = CommandParser()
    parser.feed(b"\r\n \r\n*1\r\n$4\r\nPING\r\n\r\n\r\nECHO x\r\n\r\n")
    assert parser.next_command() == [b"PING"]
    assert parser.next_command() == [b"ECHO", b"x"]
    assert parser.next_command() is None
    assert not parser.busy


def _key_limit(name: bytes, index: int) -> int:
    """Like the agent's: SET's value may be 100 bytes, everything else 8."""
    return 100 if index == 2 and name.upper() == b"SET" else 8


def test_oversized_argument_refused_at_its_header_and_skipped_unbuffered():
    parser = CommandParser(limit=_key_limit)
    parser.feed(b"*2\r\n$3\r\nGET\r\n$1000000\r\n")
    with pytest.raises(ArgumentTooLarge, match="argument 1 of 'get' of 1000000 bytes exceeds the limit of 8"):
        parser.next_command()
    for _ in range(100):  # the key arrives: nothing of it is kept
        parser.feed(b"k" * 10_000)
        assert parser.next_command() is None
        assert parser.pending == 0 and parser.busy
    parser.feed(b"\r\n*3\r\n$3\r\nset\r\n$2\r\n/a\r\n$100\r\n" + b"v" * 100 + b"\r\n")
    assert parser.next_command() == [b"set", b"/a", b"v" * 100]  # values have their own limit
    assert not parser.busy


def test_refusal_skips_the_rest_of_the_command_and_checks_its_framing():
    parser = CommandParser(limit=_key_limit)
    parser.feed(b"*4\r\n$3\r\nDEL\r\n$9\r\n123456789\r\n$2\r\n/b\r\n$3\r\n/cd\r\nPING\r\n")
    with pytest.raises(ArgumentTooLarge) as err:
        parser.next_command()
    assert (err.value.name, err.value.index, err.value.size, err.value.limit) == (b"DEL", 1, 9, 8)
    assert parser.next_command() == [b"PING"]
    parser.feed(b"*2\r\n$9\r\nLONGNAMES\r\n$1\r\nx\r\n")  # the name itself is argument 0
    with pytest.raises(ArgumentTooLarge, match="command name of 9 bytes"):
        parser.next_command()
    assert parser.next_command() is None and not parser.busy
    parser.feed(b"*2\r\n$3\r\nGET\r\n$9\r\n123456789XX")  # not CRLF after the skipped bytes
    with pytest.raises(ArgumentTooLarge):
        parser.next_command()
    with pytest.raises(ProtocolError, match="not terminated"):
        parser.next_command()


def test_inline_arguments_have_the_same_limits():
    parser = CommandParser(limit=_key_limit)
    parser.feed(b"GET /a/very/long/key\r\nGET /short\r\n")
    with pytest.raises(ArgumentTooLarge, match="argument 1 of 'get'"):
        parser.next_command()
    assert parser.next_command() == [b"GET", b"/short"]


def test_a_refused_command_beyond_the_hard_cap_is_still_fatal():
    parser = CommandParser(max_bulk=1000, limit=_key_limit)
    parser.feed(b"*2\r\n$3\r\nGET\r\n$4000000000\r\n")
    with pytest.raises(BulkTooLarge):
        parser.next_command()


command_st = st.tuples(st.sampled_from([b"GET", b"SET", b"set", b"DEL"]),
                       st.lists(st.binary(max_size=120), max_size=3))


@given(st.lists(st.tuples(command_st, st.booleans()), min_size=1, max_size=6),
       st.lists(st.integers(1, 60), max_size=40))
def test_refusals_and_blank_lines_survive_any_chunking(commands: list[tuple[tuple[bytes, list[bytes]], bool]],
                                                        chunks: list[int]) -> None:
    """However the stream is cut, each command comes out whole, or is refused
    (at its first oversized argument), in order; blank lines vanish."""
    stream = b"".join(encode_command(name, *args) + (b"\r\n" if blank else b"")
                      for (name, args), blank in commands)
    expected: list[object] = []
    for (name, args), _ in commands:
        too_big = [i for i, arg in enumerate([name, *args]) if len(arg) > _key_limit(name, i)]
        expected.append(("refused", too_big[0]) if too_big else [name, *args])
    parser, got, pos = CommandParser(limit=_key_limit), list[object](), 0
    for size in chunks + [len(stream)]:
        parser.feed(stream[pos:pos + size])
        pos += size
        while True:
            try:
                command = parser.next_command()
            except ArgumentTooLarge as exc:
                got.append(("refused", exc.index))
                continue
            if command is None:
                break
            got.append(command)
        assert parser.pending <= 2 * 120 + 64  # never a refused argument's bytes, beyond a chunk
    assert got == expected and not parser.busy


def test_resp3_encodes_null_and_maps_and_resp2_flattens_maps():
    hello = {b"proto": 3, b"modules": [], b"x": None}
    assert encode_reply(None, resp3=True) == b"_\r\n"
    assert encode_reply([None, b"a"], resp3=True) == b"*2\r\n_\r\n$1\r\na\r\n"
    assert encode_reply(hello, resp3=True) == (
        b"%3\r\n$5\r\nproto\r\n:3\r\n$7\r\nmodules\r\n*0\r\n$1\r\nx\r\n_\r\n")
    flat = encode_reply(hello)
    parser = RespParser()
    parser.feed(flat)
    assert parser.next_reply() == (True, [b"proto", 3, b"modules", [], b"x", None])


def test_oversized_bulk_rejected_at_its_header():
    parser = CommandParser(max_bulk=100)
    parser.feed(b"*3\r\n$3\r\nSET\r\n$2\r\n/a\r\n$4000000000\r\n")
    with pytest.raises(BulkTooLarge) as err:
        parser.next_command()
    assert err.value.size == 4_000_000_000


def test_endless_line_rejected():
    parser = CommandParser(max_line=1000)
    parser.feed(b"x" * 999)
    assert parser.next_command() is None
    parser.feed(b"x" * 10)
    with pytest.raises(ProtocolError, match="line longer"):
        parser.next_command()


def test_deep_nesting_rejected():
    parser = RespParser()
    parser.feed(b"*1\r\n" * 20 + b":1\r\n")
    with pytest.raises(ProtocolError, match="nested"):
        parser.next_reply()


@settings(max_examples=2000)
@given(st.binary(max_size=300))
def test_fuzz_command_parser_never_fails_otherwise(data):
    """Any bytes either parse, wait for more, or raise ProtocolError: never
    another exception, and never an unbounded buffer."""
    parser = CommandParser(max_bulk=64, max_line=128)
    parser.feed(data)
    try:
        while parser.next_command() is not None:
            pass
    except ProtocolError:
        return
    assert parser.pending <= len(data)


@settings(max_examples=1000)
@given(st.lists(st.binary(max_size=100), max_size=5))
def test_fuzz_refusals_never_fail_otherwise(chunks):
    """With per-argument limits, any bytes (in any pieces) either parse, wait,
    are refused one command at a time, or raise ProtocolError."""
    parser = CommandParser(max_bulk=64, max_line=128, limit=_key_limit)
    for chunk in chunks:
        parser.feed(chunk)
        while True:
            try:
                if parser.next_command() is None:
                    break
            except ArgumentTooLarge:
                continue
            except ProtocolError:
                return
    assert parser.pending <= sum(map(len, chunks))


@settings(max_examples=1000)
@given(st.binary(max_size=300))
def test_fuzz_reply_parser_never_fails_otherwise(data):
    parser = RespParser(max_bulk=64, max_line=128)
    parser.feed(data)
    try:
        while parser.next_reply()[0]:
            pass
    except ProtocolError:
        pass


@settings(max_examples=500)
@given(args_st, st.integers(0, 10**6), st.binary(min_size=1, max_size=20))
def test_fuzz_mutated_frames(command, where, junk):
    """A valid frame with bytes spliced in: still only ProtocolError or a parse."""
    frame = encode_command(*command)
    at = where % (len(frame) + 1)
    parser = CommandParser()
    parser.feed(frame[:at] + junk + frame[at:])
    try:
        while parser.next_command() is not None:
            pass
    except ProtocolError:
        pass


@given(st.lists(reply_st, min_size=1, max_size=4), st.lists(st.integers(1, 40), max_size=60))
def test_replies_survive_any_chunking(values, chunks):
    """One parser fed in arbitrary pieces resumes mid-array and mid-bulk."""
    stream = b"".join(encode_reply(v) for v in values)
    parser, got, pos = RespParser(max_args=1000), [], 0
    for size in chunks + [len(stream)]:
        parser.feed(stream[pos:pos + size])
        pos += size
        while (reply := parser.next_reply())[0]:
            got.append(reply[1])
    assert got == values and parser.pending == 0


@given(st.integers(0, 2**128 - 1), st.sampled_from(["10.0.0.2", "100.64.1.2", "::1", "fe80::1:2"]),
       st.integers(1, 65535))
def test_moved_round_trips_in_the_shape_redis_clients_parse(ident, host, port):
    message = moved_message(ident, host, port)
    assert message == f"MOVED {ident} {host}:{port}"
    assert parse_moved(message) == parse_moved("-" + message) == (ident, host, port)
    # redis-py's MovedError reads it this way: the slot, then host and port at the last colon.
    slot, node = message.split(" ", 1)[1].split(" ")
    assert (int(slot), *node.rsplit(":", 1)) == (ident, host, str(port))


@pytest.mark.parametrize("message", [
    "MOVED 100.64.0.1", "MOVED 100.64.0.1 10.0.0.2:9000", "MOVED 12 10.0.0.2", "MOVED 12 10.0.0.2:0",
    "MOVED 12 10.0.0.2:65536", "MOVED 12 :9000", "MOVED -1 10.0.0.2:9000", "MOVED \u0661 a:1",
    "MOVED 12 a:1 extra", "TRYAGAIN 12 a:1", "",
])
def test_malformed_moved_is_a_protocol_error(message):
    with pytest.raises(ProtocolError):
        parse_moved(message)


@pytest.mark.parametrize("ident, host, port", [(-1, "a", 1), (1, "", 1), (1, "a b", 1), (1, "a", 0)])
def test_moved_message_refuses_what_no_client_could_parse(ident, host, port):
    with pytest.raises(ValueError):
        moved_message(ident, host, port)
