"""The per-range request counts of ``POST /ops`` (`nat_agent.ops_meter`), without an agent."""

from __future__ import annotations

import math
from array import array

import pytest
from hypothesis import given
from hypothesis import strategies as st

from client_lib.cidr import Block
from nat_agent.ops_meter import OPS_WINDOW_S, SAMPLE_S, Buckets, OpsMeter

SPACE = Block.parse("100.64.0.0/14")   # 2**18 IDs: buckets of 4
SIZE = 4


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


@pytest.mark.parametrize(("space", "shift", "number"), [
    ("0.0.0.0/0", 16, 1 << 16),
    ("100.64.0.0/10", 6, 1 << 16),
    ("100.64.0.0/16", 0, 1 << 16),
    ("10.9.0.0/28", 0, 16),        # narrower than 16 bits: one bucket per ID
    ("fd00::/8", 104, 1 << 16),
])
def test_the_space_is_cut_by_the_top_16_bits_of_the_offset(space: str, shift: int, number: int) -> None:
    block = Block.parse(space)
    buckets = Buckets.of(block)
    assert (buckets.first, buckets.shift, buckets.number) == (block.first, shift, number)
    assert buckets.index(block.first) == 0 and buckets.index(block.last) == number - 1


def test_requests_count_in_their_range_and_nowhere_else() -> None:
    meter = OpsMeter(SPACE, clock=Clock())
    for ident in (SPACE.first, SPACE.first + 3, SPACE.first + 3, SPACE.last):
        meter.count(ident)
    window = meter.window()
    assert window.ops(SPACE.first, SPACE.last) == 4
    assert window.ops(SPACE.first, SPACE.first + SIZE - 1) == 3
    assert window.ops(SPACE.first + SIZE, SPACE.last - SIZE) == 0
    assert window.ops(SPACE.last - SIZE + 1, SPACE.last) == 1


def test_a_range_that_cuts_a_bucket_gets_its_share() -> None:
    meter = OpsMeter(SPACE, clock=Clock())
    for _ in range(10):
        meter.count(SPACE.first)
    window = meter.window()
    assert [window.ops(SPACE.first + i, SPACE.first + i) for i in range(SIZE)] == [3, 2, 3, 2]
    assert window.ops(SPACE.first, SPACE.first + 1) == 5
    assert window.ops(SPACE.first + 1, SPACE.first + 2) == 5


def test_the_lanes_counts_add_to_the_python_paths() -> None:
    lane = array("Q", [0]) * Buckets.of(SPACE).number
    meter = OpsMeter(SPACE, lane=lane.tobytes, clock=Clock())
    meter.count(SPACE.first)
    lane[0] += 2
    lane[-1] += 5
    window = meter.window()
    assert window.ops(SPACE.first, SPACE.first) + window.ops(SPACE.first + 1, SPACE.first + SIZE - 1) == 3
    assert window.ops(SPACE.last - SIZE + 1, SPACE.last) == 5
    with pytest.raises(ValueError, match="buckets"):
        OpsMeter(SPACE, lane=lane[:-1].tobytes)


def test_the_window_slides_and_says_how_long_it_is() -> None:
    clock = Clock()
    meter = OpsMeter(SPACE, clock=clock)
    meter.count(SPACE.first)                         # at 100, before the first snapshot after it
    for step in range(1, 10):
        clock.now = 100 + step * SAMPLE_S
        meter.sample()
        meter.count(SPACE.first)                     # one per sample
        clock.now += 0.5 * SAMPLE_S
        window = meter.window()
        oldest = max(0, math.ceil(step + 0.5 - OPS_WINDOW_S / SAMPLE_S))   # snapshot within the window
        assert window.seconds == pytest.approx((step + 0.5 - oldest) * SAMPLE_S)
        assert window.seconds <= OPS_WINDOW_S
        assert window.ops(SPACE.first, SPACE.last) == step + 1 - oldest   # one before each snapshot
    for _ in range(round(OPS_WINDOW_S / SAMPLE_S) + 1):   # then nothing for a whole window
        clock.now += SAMPLE_S
        meter.sample()
    assert meter.window().ops(SPACE.first, SPACE.last) == 0


def test_a_stalled_sampler_gives_a_longer_window_not_a_wrong_one() -> None:
    clock = Clock()
    meter = OpsMeter(SPACE, clock=clock)
    meter.count(SPACE.first)
    clock.now += 3 * OPS_WINDOW_S
    window = meter.window()
    assert (window.ops(SPACE.first, SPACE.last), window.seconds) == (1, 3 * OPS_WINDOW_S)
    meter.sample()
    clock.now += 1
    assert (meter.window().ops(SPACE.first, SPACE.last), meter.window().seconds) == (0, 1)


# A few hot buckets at the start of the space, so that random cuts often fall inside them.
HOT = st.lists(st.integers(0, 4 * SIZE - 1), max_size=60)


@given(requests=HOT, cuts=st.lists(st.integers(1, 6 * SIZE), max_size=12))
def test_the_ranges_of_a_partition_sum_to_the_total(requests: list[int], cuts: list[int]) -> None:
    meter = OpsMeter(SPACE, clock=Clock())
    for offset in requests:
        meter.count(SPACE.first + offset)
    window = meter.window()
    starts = sorted({SPACE.first + c for c in cuts} | {SPACE.first})
    ends = [s - 1 for s in starts[1:]] + [SPACE.last]
    assert sum(window.ops(a, b) for a, b in zip(starts, ends)) == len(requests)


@given(requests=HOT, first=st.integers(0, 4 * SIZE - 1), length=st.integers(1, SIZE))
def test_a_part_of_a_bucket_gets_its_share_rounded_never_more_than_the_bucket(
        requests: list[int], first: int, length: int) -> None:
    meter = OpsMeter(SPACE, clock=Clock())
    for offset in requests:
        meter.count(SPACE.first + offset)
    window = meter.window()
    bucket = first // SIZE
    length = min(length, (bucket + 1) * SIZE - first)   # inside the one bucket
    in_bucket = sum(1 for r in requests if r // SIZE == bucket)
    got = window.ops(SPACE.first + first, SPACE.first + first + length - 1)
    assert 0 <= got <= in_bucket
    assert abs(got - in_bucket * length / SIZE) < 1
