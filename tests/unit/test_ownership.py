"""The agent's ownership view: serve, TRYAGAIN while frozen, MOVED after hand-off."""

from __future__ import annotations

import pytest
from hypothesis import given
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
    with pytest.raises(OwnershipError, match="partly"):
        own2.disown([B("100.64.0.0/11")])
    assert own2.own([B("100.64.0.0/12")]) == []
    assert own2.disown([B("100.96.0.0/12")]) == []
    with pytest.raises(OwnershipError, match="not owned"):
        own2.freeze([B("100.96.0.0/12")])
    with pytest.raises(OwnershipError, match="bit block"):
        own2.own([Block.parse("fd00::/64")])


blocks_st = st.integers(11, 18).flatmap(
    lambda plen: st.integers(0, 2 ** (plen - 10) - 1).map(
        lambda i: Block(SPACE.first + (i << (32 - plen)), plen)))


@given(st.lists(blocks_st, max_size=12), st.lists(st.integers(SPACE.first, SPACE.last), min_size=1, max_size=50))
def test_disowned_ids_are_moved_and_the_rest_served(cuts, probes):
    own = Ownership(32, [SPACE])
    gone: list[Block] = []
    for block in cuts:
        if any(g.covers(block) for g in gone):
            continue
        if any(block.covers(g) for g in gone):
            with pytest.raises(OwnershipError):
                own.disown([block])
            continue
        own.disown([block])
        gone.append(block)
    for probe in probes:
        moved = any(g.contains(probe) for g in gone)
        assert own.decide(probe, True).verdict is (Verdict.MOVED if moved else Verdict.SERVE)
    assert sum(b.size for b in own.owned) + sum(g.size for g in gone) == SPACE.size
