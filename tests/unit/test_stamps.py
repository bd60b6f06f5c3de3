"""Stamped values (`client_lib.stamps`, the ``replicated`` strategy of
issue 29): a stamp survives the round trip, values without one are older
than any, a writer's stamps only grow, and a site taking updates by
`step` ends with the newest whatever their order and repetitions."""

from __future__ import annotations

import random

import pytest
from hypothesis import assume, given
from hypothesis import strategies as st

from client_lib.constants import MAX_VALUE
from client_lib.errors import InvalidArgument
from client_lib.stamps import (
    MAGIC,
    MAX_WRITER,
    Clock,
    Stamp,
    Step,
    is_tombstone,
    stamp_of,
    stamped,
    step,
    unstamped,
)
from nat_agent.site_sync import apply_update

stamps = st.builds(Stamp, st.integers(0, (1 << 64) - 1), st.binary(min_size=1, max_size=MAX_WRITER))


@given(stamps, st.binary(max_size=200))
def test_a_stamped_value_gives_back_its_stamp_and_value(stamp: Stamp, value: bytes) -> None:
    assert unstamped(stamped(value, stamp)) == (stamp, value)


@given(st.binary(max_size=60), stamps)
def test_a_value_without_a_whole_stamp_has_none(value: bytes, stamp: Stamp) -> None:
    if not value.startswith(MAGIC):
        assert unstamped(value) == (None, value)
    header = stamp.header
    for cut in range(len(header)):   # a stamp cut anywhere (its writer's name too) is no stamp
        assert unstamped(header[:cut]) == (None, header[:cut])
    assert unstamped(MAGIC + bytes(8) + b"\x00") == (None, MAGIC + bytes(8) + b"\x00")


def test_stamps_order_by_time_then_writer_and_bad_ones_are_refused() -> None:
    assert Stamp(1, b"z") < Stamp(2, b"a") and Stamp(2, b"a") < Stamp(2, b"b")
    for ns, writer in ((-1, b"w"), (1 << 64, b"w"), (0, b""), (0, b"w" * (MAX_WRITER + 1))):
        with pytest.raises(InvalidArgument):
            Stamp(ns, writer)
    with pytest.raises(InvalidArgument, match="exceeds the limit"):
        stamped(bytes(MAX_VALUE), Stamp(0, b"w"))
    with pytest.raises(InvalidArgument, match="stamped"):
        step(None, b"plain")


def test_a_writers_stamps_grow_even_when_its_clock_stands_still_or_steps_back(
        monkeypatch: pytest.MonkeyPatch) -> None:
    times = iter([100, 100, 50, 200, 199])
    monkeypatch.setattr("client_lib.stamps.time.time_ns", lambda: next(times))
    clock = Clock(b"east/1")
    assert [clock.next().ns for _ in range(5)] == [100, 101, 102, 200, 201]


class Site:
    """One site's copies, taking updates as the propagation agent writes
    them: a read, then a create or compare-and-set (`nat_agent.site_sync.apply_update`)."""

    def __init__(self) -> None:
        self.held: dict[bytes, bytes] = {}

    def get(self, key: bytes) -> bytes | None:
        return self.held.get(key)

    def create(self, key: bytes, value: bytes) -> bool:
        return self.held.setdefault(key, value) is value

    def compare_and_set(self, key: bytes, old: bytes, new: bytes) -> bool:
        if self.held.get(key) != old:
            return False
        self.held[key] = new
        return True


@given(st.lists(st.tuples(stamps, st.binary(max_size=8)), min_size=1, max_size=12), st.randoms(),
       st.booleans())
def test_a_site_ends_with_the_newest_update_whatever_the_order_and_repeats(
        updates: list[tuple[Stamp, bytes]], rand: random.Random, unstamped_first: bool) -> None:
    values = [stamped(value, stamp) for stamp, value in updates]
    delivered = values + [rand.choice(values) for _ in range(len(values))]
    rand.shuffle(delivered)
    site = Site()
    if unstamped_first:
        site.held[b"/k"] = b"written by another tool"
    for value in delivered:
        taken = apply_update(site, b"/k", value)
        assert taken in Step
    newest = max(updates, key=lambda u: u[0])[0]
    assert stamp_of(site.held[b"/k"]) == newest


@given(stamps, stamps, st.binary(max_size=8))
def test_a_tombstone_orders_against_writes_by_its_stamp(deleted: Stamp, written: Stamp, value: bytes) -> None:
    assume(deleted != written)   # one writer's stamps never repeat, and stamps name their writer
    tombstone = deleted.tombstone
    assert is_tombstone(tombstone) and unstamped(tombstone) == (deleted, b"")
    assert not is_tombstone(stamped(value, written))
    assert not is_tombstone(tombstone + b"x")   # a tombstone carries nothing after its stamp
    site = Site()
    for update in (stamped(value, written), tombstone):   # whichever came last by stamp wins, in any order
        apply_update(site, b"/k", update)
    assert site.held[b"/k"] == (tombstone if deleted > written else stamped(value, written))
