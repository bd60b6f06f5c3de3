"""The agent's ownership view: serve, TRYAGAIN while frozen, MOVED after hand-off."""

from __future__ import annotations

import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from client_lib.cidr import Block
from nat_agent.ownership import Ownership, OwnershipError, Verdict

SPACE = Block.parse("100.64.0.0/10")
B = Block.parse


def test_serve_freeze_and_hand_off():
    own = Ownership(32, [SPACE])
    half_a, half_b = SPACE.halves()
    inside = half_b.first + 12345
    assert own.decide(inside, write=True).verdict is Verdict.SERVE
    own.freeze([half_b])
    assert own.decide(inside, write=True).verdict is Verdict.TRYAGAIN
    assert own.decide(inside, write=False).verdict is Verdict.SERVE  # reads still served
    assert own.decide(half_a.first, write=True).verdict is Verdict.SERVE
    own.disown([half_b], moved_to="10.0.0.7:9000")
    decision = own.decide(inside, write=False)
    assert decision.verdict is Verdict.MOVED and decision.hint == "10.0.0.7:9000"
    assert own.owned == [half_a] and own.frozen == []


def test_disown_part_of_a_block_keeps_the_rest():
    own = Ownership(32, [SPACE])
    part = B("100.100.0.0/16")
    own.disown([part])
    assert not own.owns_all([part])
    assert sum(b.size for b in own.owned) == SPACE.size - part.size
    assert own.decide(part.first - 1, True).verdict is Verdict.SERVE
    assert own.decide(part.last + 1, True).verdict is Verdict.SERVE
    own.own([part])  # and back: a block swallowed by a bigger one is fine too
    own.own([SPACE])
    assert own.owned == [SPACE]


def test_conflicts_are_errors_and_repeats_are_no_ops():
    own = Ownership(32, [B("100.64.0.0/13"), B("100.72.0.0/14")])
    own.disown([B("100.72.0.0/15")])
    assert own.own([B("100.72.0.0/13")]) == [B("100.72.0.0/13")]  # swallows 100.74.0.0/15
    assert own.owned == [B("100.64.0.0/13"), B("100.72.0.0/13")]
    own2 = Ownership(32, [B("100.64.0.0/12"), B("100.80.0.0/13")])
    assert own2.own([B("100.64.0.0/12")]) == []
    assert own2.disown([B("100.96.0.0/12")]) == []
    with pytest.raises(OwnershipError, match="not owned"):
        own2.freeze([B("100.96.0.0/12")])
    with pytest.raises(OwnershipError, match="bit block"):
        own2.own([Block.parse("fd00::/64")])


def test_disowning_a_partly_owned_block_releases_what_is_owned_of_it():
    own = Ownership(32, [B("100.64.0.0/12"), B("100.80.0.0/13"), B("100.96.0.0/11")])
    own.freeze([B("100.80.0.0/13")])
    released = own.disown([B("100.64.0.0/11")], moved_to="10.0.0.9:9000")
    assert released == [B("100.64.0.0/12"), B("100.80.0.0/13")]
    assert own.owned == [B("100.96.0.0/11")] and own.frozen == []
    decision = own.decide(B("100.88.0.0/13").first, write=False)  # never owned, inside the hint
    assert decision.verdict is Verdict.MOVED and decision.hint == "10.0.0.9:9000"
    assert own.disown([B("100.64.0.0/11")]) == []  # a retry is a no-op


def test_unowned_parts_of_a_block():
    own = Ownership(32, [B("100.64.0.0/12"), B("100.84.0.0/14")])
    assert own.unowned(B("100.64.0.0/13")) == []
    assert own.unowned(B("100.96.0.0/11")) == [B("100.96.0.0/11")]
    assert sorted(own.unowned(B("100.64.0.0/11"))) == [B("100.80.0.0/14"), B("100.88.0.0/13")]
    assert sorted(own.unowned(SPACE)) == [B("100.80.0.0/14"), B("100.88.0.0/13"), B("100.96.0.0/11")]


def test_a_bad_block_in_a_list_changes_nothing():
    own = Ownership(32, [SPACE])
    bad = Block.parse("fd00::/64")
    for change in (own.own, own.disown, own.freeze):
        with pytest.raises(OwnershipError, match="bit block"):
            change([B("100.64.0.0/12"), bad])
    assert own.owned == [SPACE] and own.frozen == []


def _overlap(a: Block, b: Block) -> int:
    """IDs two blocks share: CIDR blocks either nest or are disjoint."""
    return min(a.size, b.size) if a.covers(b) or b.covers(a) else 0


blocks_st = st.integers(11, 18).flatmap(
    lambda plen: st.integers(0, 2 ** (plen - 10) - 1).map(
        lambda i: Block(SPACE.first + (i << (32 - plen)), plen)))


@example(cuts=[B("100.80.0.0/13"), B("100.88.0.0/13"), B("100.80.0.0/12")],
         probes=[B("100.80.0.0/12").first, B("100.88.0.0/13").last, B("100.96.0.0/12").first])
@given(st.lists(blocks_st, max_size=12),
       st.lists(st.integers(SPACE.first, SPACE.last), min_size=1, max_size=50))
def test_disowned_ids_are_moved_and_the_rest_served(cuts, probes):
    """Disowning a block releases exactly what was owned of it, whatever
    earlier cuts took (the example: both halves first, then the whole)."""
    own = Ownership(32, [SPACE])
    for block in cuts:
        before = own.owned
        released = own.disown([block])
        assert all(block.covers(r) for r in released)
        assert sum(r.size for r in released) == sum(_overlap(b, block) for b in before)
        assert not any(_overlap(b, block) for b in own.owned)
    for probe in probes:
        moved = any(c.contains(probe) for c in cuts)
        assert own.decide(probe, True).verdict is (Verdict.MOVED if moved else Verdict.SERVE)
    outermost = {c for c in cuts if not any(o != c and o.covers(c) for o in cuts)}
    assert sum(b.size for b in own.owned) + sum(c.size for c in outermost) == SPACE.size
