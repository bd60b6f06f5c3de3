"""The compiled command parser against the Python one, its oracle (issue 13);
and the compiled lane's request-seconds histogram against `Latency`'s placement.

Both parsers get the same random byte stream (well-formed commands, inline
commands, blank lines, oversized arguments, broken headers, stray bytes) in
the same random chunks, under random limits; after every chunk each is
drained, and what they return, raise (type, message and fields) and report
(`pending`, `busy`) must be identical. A protocol error ends a stream, as
it ends a connection.
"""

from __future__ import annotations

import inspect
import math
from collections.abc import Callable

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from client_lib.api.metrics import REQUEST_BUCKETS
from client_lib.resp import BulkTooLarge, ProtocolError, encode_command
from nat_agent._fastpath import CommandParser, Histogram
from nat_agent.latency import Latency
from nat_agent.resp_commands import ArgLimit, ArgumentTooLarge
from nat_agent.resp_commands import CommandParser as Oracle

Outcome = tuple[object, ...]

WORDS = st.binary(min_size=0, max_size=40)
NAMES = st.sampled_from([b"GET", b"SET", b"DEL", b"PING", b"set", b"ELIST"])


def _bulk_frame(draw: st.DrawFn) -> bytes:
    args = [draw(NAMES), *draw(st.lists(WORDS, max_size=5))]
    frame = encode_command(*args)
    if draw(st.integers(0, 9)) == 0:  # a bulk string whose terminator is wrong
        cut = draw(st.integers(0, len(frame)))
        frame = frame[:cut] + b"X" + frame[cut:]
    return frame


def _inline_frame(draw: st.DrawFn) -> bytes:
    words = draw(st.lists(st.binary(min_size=1, max_size=30).filter(lambda w: b"\r\n" not in w), max_size=6))
    spaces = draw(st.sampled_from([b" ", b"  ", b"\t", b" \x0b"]))
    return spaces.join(words) + b"\r\n"


HUGE = b"9" * 35
HEADERS = [b"*abc\r\n", b"*-2\r\n", b"*-1\r\n", b"*0\r\n", b"*007\r\n$1\r\na\r\n", b"*1\r\n$-1\r\n",
           b"*1\r\n$-7\r\n", b"*1\r\n:3\r\n", b"*1\r\n$ 1\r\n", b"*+1\r\n", b"*1_0\r\n",
           b"*" + HUGE + b"\r\n", b"*1\r\n$" + HUGE + b"\r\n", b"*1\r\n$-" + HUGE + b"\r\n",
           b"*1\r\n$'\"\x00\xff\r\n", b"\r\n", b"\r\n\r\n"]


@st.composite
def streams(draw: st.DrawFn) -> bytes:
    pieces = []
    for kind in draw(st.lists(st.integers(0, 4), min_size=1, max_size=8)):
        if kind == 0:
            pieces.append(_bulk_frame(draw))
        elif kind == 1:
            pieces.append(_inline_frame(draw))
        elif kind == 2:
            pieces.append(draw(st.sampled_from(HEADERS)))
        elif kind == 3:
            pieces.append(draw(st.binary(max_size=12)))
        else:
            pieces.append(draw(st.lists(st.sampled_from(list(b"*$-+:019\r\n aX")), max_size=16).map(bytes)))
    return b"".join(pieces)


def _limit(key_limit: int, value_limit: int) -> ArgLimit:
    def limit(name: bytes, index: int) -> int:
        if index == 0:
            return 16
        return value_limit if name.upper() == b"SET" and index == 2 else key_limit
    return limit


def _drain(parser: Oracle | CommandParser) -> tuple[list[Outcome], bool]:
    """Every outcome `next_command` gives until it has nothing; True if the
    stream is over (a protocol error)."""
    out: list[Outcome] = []
    while True:
        try:
            command = parser.next_command()
        except ArgumentTooLarge as exc:
            out.append(("too large", str(exc), exc.name, exc.index, exc.size, exc.limit))
            continue
        except BulkTooLarge as exc:
            out.append(("bulk too large", str(exc), exc.size, exc.limit))
            return out, True
        except ProtocolError as exc:
            out.append((type(exc).__name__, str(exc)))
            return out, True
        if command is None:
            return out, False
        out.append(("command", list(command)))


def _run(make: Callable[[], Oracle | CommandParser], stream: bytes, cuts: list[int]) -> list[Outcome]:
    parser = make()
    seen: list[Outcome] = []
    bounds = [0, *sorted(set(cuts)), len(stream)]
    for start, end in zip(bounds, bounds[1:]):
        parser.feed(stream[start:end])
        outcomes, over = _drain(parser)
        seen += outcomes
        seen.append(("state", parser.pending, parser.busy))
        if over:
            break
    return seen


@settings(max_examples=600)
@given(stream=streams(), cuts=st.lists(st.integers(0, 400), max_size=12) | st.just("every byte"),
       max_bulk=st.integers(1, 60), max_args=st.integers(1, 8), max_line=st.integers(2, 80),
       limits=st.none() | st.tuples(st.integers(0, 30), st.integers(0, 40)))
def test_the_compiled_parser_answers_exactly_as_the_python_one(
        stream: bytes, cuts: list[int] | str, max_bulk: int, max_args: int, max_line: int,
        limits: tuple[int, int] | None) -> None:
    limit = None if limits is None else _limit(*limits)
    at = list(range(1, len(stream))) if isinstance(cuts, str) else [c for c in cuts if c < len(stream)]
    expected = _run(lambda: Oracle(max_bulk, max_args, max_line, limit), stream, at)
    assert _run(lambda: CommandParser(max_bulk, max_args, max_line, limit), stream, at) == expected


def test_the_compiled_parser_defaults_are_the_python_ones() -> None:
    """`CommandParser()` is what a connection parses with (`Connection`,
    the replica's); its defaults are written out in `parser.rs` (Rust holds
    them as literals), and must be the Python parser's (`client_lib.resp.DEFAULT_MAX_*`)."""
    ours = inspect.signature(CommandParser).parameters
    theirs = inspect.signature(Oracle).parameters
    assert {name: p.default for name, p in ours.items()} == {name: p.default for name, p in theirs.items()}


def test_defaults_match_and_a_pipeline_parses_in_one_go() -> None:
    frames = b"".join(encode_command(b"SET", b"/k/%d" % i, b"v" * i) for i in range(200)) + b"PING\r\n"
    ours, theirs = CommandParser(), Oracle()
    for parser in (ours, theirs):
        parser.feed(frames)
    drained = _drain(ours)
    assert drained == _drain(theirs) and len(drained[0]) == 201
    assert not ours.busy and ours.pending == 0
    for parser in (ours, theirs):  # over the default 1 MiB hard cap: refused at the header
        parser.feed(encode_command(b"SET", b"/big", b"x" * ((1 << 20) + 1)))
    drained = _drain(ours)
    assert drained == _drain(theirs)
    assert drained == ([("bulk too large", f"bulk string of {(1 << 20) + 1} bytes exceeds the limit of "
                                            f"{1 << 20} bytes", (1 << 20) + 1, 1 << 20)], True)


def _edges(bounds: tuple[float, ...]) -> list[float]:
    """Each bound, the nearest floats on either side of it, 0 and far past the last."""
    near = [v for b in bounds for v in (math.nextafter(b, 0.0), b, math.nextafter(b, math.inf))]
    return [0.0, *near, bounds[-1] * 1000]


@settings(max_examples=200)
@given(extra=st.lists(st.floats(0.0, 10.0, allow_nan=False), max_size=30))
def test_the_lane_histogram_places_seconds_as_latency_does(extra: list[float]) -> None:
    """Bucket by bucket the same counts as the Python path's `Latency` for the
    same observations (a value on a bound goes into that bound's bucket, as
    Prometheus' ``le`` says), so the two add up into one histogram."""
    compiled, python = Histogram(REQUEST_BUCKETS), Latency(REQUEST_BUCKETS)
    for seconds in (*_edges(REQUEST_BUCKETS), *extra):
        compiled.observe(seconds)
        python.observe(seconds)
    counts, total = compiled.snapshot()
    assert counts == python.counts
    assert total == pytest.approx(python.total, abs=1e-9 * (len(extra) + 40))  # summed in whole nanoseconds


def test_a_lane_histogram_added_to_latency_is_one_histogram() -> None:
    compiled, python = Histogram(REQUEST_BUCKETS), Latency(REQUEST_BUCKETS)
    compiled.observe(REQUEST_BUCKETS[0])
    compiled.observe(REQUEST_BUCKETS[-1] * 2)
    python.observe(REQUEST_BUCKETS[1])
    both = python.plus(*compiled.snapshot())
    assert both.cumulative()[:2] == [(str(REQUEST_BUCKETS[0]), 1), (str(REQUEST_BUCKETS[1]), 2)]
    assert both.cumulative()[-1] == ("+Inf", 3)
    assert both.total == pytest.approx(REQUEST_BUCKETS[0] + REQUEST_BUCKETS[1] + REQUEST_BUCKETS[-1] * 2)
    assert python.counts[0] == 0 and sum(python.counts) == 1   # a copy: the Python path's own is unchanged


def test_a_lane_histogram_refuses_what_is_not_a_duration_or_bounds_out_of_order() -> None:
    with pytest.raises(ValueError, match="ascend"):
        Histogram([0.1, 0.1])
    histogram = Histogram(REQUEST_BUCKETS)
    for wrong in (-1e-9, math.nan):
        with pytest.raises(ValueError, match="not a duration"):
            histogram.observe(wrong)
    assert histogram.snapshot() == ([0] * (len(REQUEST_BUCKETS) + 1), 0.0)
