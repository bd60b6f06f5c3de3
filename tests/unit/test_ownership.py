"""The agent's ownership view: serve, TRYAGAIN while frozen, MOVED after
hand-off; roles with epochs (primary or backup, fenced, degraded, suspended)."""

from __future__ import annotations

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from client_lib.api.admin import Member, Role
from client_lib.cidr import Block
from client_lib.errors import InvalidArgument
from nat_agent.ownership import Ownership, OwnershipError, Verdict, solo_role

SPACE = Block.parse("100.64.0.0/10")
B = Block.parse
ME = "me"


def owning(*blocks: Block) -> Ownership:
    """A standalone agent's view: the primary of a set of one for each block."""
    own = Ownership(32, ME)
    own.assign([solo_role(b, ME, "127.0.0.1:1") for b in blocks])
    return own


def test_serve_freeze_and_hand_off():
    own = owning(SPACE)
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


def take(own: Ownership, *blocks: Block) -> list[Block]:
    """Assign `blocks` as a standalone primary; returns the newly held parts."""
    return own.assign([solo_role(b, ME, "127.0.0.1:1") for b in blocks]).added


def test_disown_part_of_a_block_keeps_the_rest():
    own = owning(SPACE)
    part = B("100.100.0.0/16")
    own.disown([part])
    assert not own.owns_all([part])
    assert sum(b.size for b in own.owned) == SPACE.size - part.size
    assert own.decide(part.first - 1, True).verdict is Verdict.SERVE
    assert own.decide(part.last + 1, True).verdict is Verdict.SERVE
    assert take(own, part) == [part]  # and back: a block swallowed by a bigger one is fine too
    assert take(own, SPACE) == []
    assert own.owned == [SPACE]


def test_conflicts_are_errors_and_repeats_are_no_ops():
    own = owning(B("100.64.0.0/13"), B("100.72.0.0/14"))
    own.disown([B("100.72.0.0/15")])
    # swallows 100.74.0.0/15; only the parts not held before are new
    assert take(own, B("100.72.0.0/13")) == [B("100.72.0.0/15"), B("100.76.0.0/14")]
    assert own.owned == [B("100.64.0.0/13"), B("100.72.0.0/13")]
    own2 = owning(B("100.64.0.0/12"), B("100.80.0.0/13"))
    assert take(own2, B("100.64.0.0/12")) == []
    assert own2.disown([B("100.96.0.0/12")]) == []
    with pytest.raises(OwnershipError, match="not its primary"):
        own2.freeze([B("100.96.0.0/12")])
    with pytest.raises(OwnershipError, match="bit block"):
        take(own2, Block.parse("fd00::/64"))


def test_disowning_a_partly_owned_block_releases_what_is_owned_of_it():
    own = owning(B("100.64.0.0/12"), B("100.80.0.0/13"), B("100.96.0.0/11"))
    own.freeze([B("100.80.0.0/13")])
    released = own.disown([B("100.64.0.0/11")], moved_to="10.0.0.9:9000")
    assert released == [B("100.64.0.0/12"), B("100.80.0.0/13")]
    assert own.owned == [B("100.96.0.0/11")] and own.frozen == []
    decision = own.decide(B("100.88.0.0/13").first, write=False)  # never owned, inside the hint
    assert decision.verdict is Verdict.MOVED and decision.hint == "10.0.0.9:9000"
    assert own.disown([B("100.64.0.0/11")]) == []  # a retry is a no-op


def test_unheld_parts_of_a_block():
    own = owning(B("100.64.0.0/12"), B("100.84.0.0/14"))
    assert own.unheld(B("100.64.0.0/13")) == []
    assert own.unheld(B("100.96.0.0/11")) == [B("100.96.0.0/11")]
    assert sorted(own.unheld(B("100.64.0.0/11"))) == [B("100.80.0.0/14"), B("100.88.0.0/13")]
    assert sorted(own.unheld(SPACE)) == [B("100.80.0.0/14"), B("100.88.0.0/13"), B("100.96.0.0/11")]


def test_a_bad_block_in_a_list_changes_nothing():
    own = owning(SPACE)
    bad = Block.parse("fd00::/64")
    for change in (lambda bs: take(own, *bs), own.disown, own.freeze):
        with pytest.raises(OwnershipError, match="bit block"):
            change([B("100.64.0.0/12"), bad])
    assert own.owned == [SPACE] and own.frozen == []


# -- roles ------------------------------------------------------------------------

OTHER, THIRD = Member("other", "127.0.0.1:2"), Member("third", "127.0.0.1:3")
MINE = Member(ME, "127.0.0.1:1")


def primary(block: Block, epoch: int, *backups: Member, serving: bool = True) -> Role:
    return Role(block, epoch, True, [MINE, *backups], serving)


def backup(block: Block, epoch: int, lead: Member = OTHER) -> Role:
    return Role(block, epoch, False, [lead, MINE])


def test_only_a_serving_primary_serves_and_a_backup_answers_moved():
    own = Ownership(32, ME)
    low, high = SPACE.halves()
    own.assign([primary(low, 3, OTHER, serving=False), backup(high, 3)])
    assert own.owned == [low] and own.held == [low, high]
    waiting = own.decide(low.first, write=False)
    assert waiting.verdict is Verdict.TRYAGAIN and "not served here yet" in waiting.reason
    moved = own.decide(high.first, write=False)
    assert moved.verdict is Verdict.MOVED and moved.hint is None and moved.held is not None
    own.assign([primary(low, 3, OTHER)])  # same epoch: the flows are in place, it serves
    served = own.decide(low.first, write=True)
    assert served.verdict is Verdict.SERVE and served.held is not None
    assert [p.name for p in served.held.peers] == ["other"] and served.held.peers[0].required


def test_an_older_epoch_is_refused_and_changes_nothing():
    own = Ownership(32, ME)
    own.assign([primary(SPACE, 5, OTHER)])
    low = SPACE.halves()[0]
    with pytest.raises(OwnershipError, match="newer epoch 5"):
        own.assign([backup(B("100.127.0.0/16"), 6), primary(low, 4)])  # one good role, one stale
    assert own.roles == [primary(SPACE, 5, OTHER)]
    own.assign([primary(SPACE, 5, OTHER, THIRD)])   # equal epoch: an update
    assert [m.name for m in own.roles[0].members] == [ME, "other", "third"]


def test_an_assignment_for_part_of_a_block_replaces_that_part_only():
    own = Ownership(32, ME)
    own.assign([primary(SPACE, 1, OTHER)])
    part = B("100.80.0.0/12")
    assert own.assign([backup(part, 2)]).added == []   # held already: its records stay
    roles = {r.block: r for r in own.roles}
    assert roles[part] == backup(part, 2)
    assert sorted(roles) == sorted([part, *[b for b in roles if b != part]])
    assert sum(b.size for b in roles) == SPACE.size
    assert all(r.epoch == 1 and r.primary for b, r in roles.items() if b != part)
    assert own.decide(part.first, write=True).verdict is Verdict.MOVED
    assert own.decide(SPACE.first, write=True).verdict is Verdict.SERVE
    # a role over the whole space again swallows every part (epoch 2 is not older than any)
    own.assign([primary(SPACE, 2, OTHER)])
    assert own.roles == [primary(SPACE, 2, OTHER)]


def test_malformed_roles_are_refused_before_anything_changes():
    own = owning(SPACE)
    low, high = SPACE.halves()
    for bad in ([Role(low, 1, True, [OTHER, MINE])],          # primary, but listed second
                [Role(low, 1, False, [MINE, OTHER])],         # backup, but listed first
                [Role(low, 1, True, [OTHER])],                # not a member at all
                [Role(low, 1, True, [MINE, MINE])],           # twice
                [Role(low, -1, True, [MINE])],
                [primary(low, 1), primary(SPACE, 1)]):        # two roles for the same IDs
        with pytest.raises(InvalidArgument):
            own.assign(bad)
    assert own.roles == [solo_role(SPACE, ME, "127.0.0.1:1")]
    assert own.assign([primary(high, 0)]).added == []


def test_exclusive_drops_everything_not_listed_and_ends_a_suspension():
    own = Ownership(32, ME)
    low, high = SPACE.halves()
    own.assign([primary(low, 1), backup(high, 1)])
    own.suspended = True
    assert own.decide(low.first, write=False).verdict is Verdict.TRYAGAIN
    assert "restarted" in own.decide(low.first, write=False).reason
    own.freeze([low])
    result = own.assign([primary(B("100.64.0.0/12"), 2)], exclusive=True)
    assert result.dropped == [B("100.80.0.0/12"), high] and result.added == []
    assert own.held == [B("100.64.0.0/12")] and own.frozen == [] and not own.suspended
    assert own.decide(low.first, write=False).verdict is Verdict.SERVE
    assert own.assign([], exclusive=True).dropped == [B("100.64.0.0/12")]   # a server declared failed
    assert own.held == []


def test_fenced_and_degraded_hold_a_primary_back_until_a_newer_epoch():
    own = Ownership(32, ME)
    low, high = SPACE.halves()
    own.assign([primary(low, 4, OTHER), primary(high, 4, OTHER)])
    assert own.fence(SPACE, 4) == []          # the same epoch is not newer
    assert own.fence(low, 5) == [low]
    assert own.degrade(high, 3) == []         # not the epoch held
    assert own.degrade(high, 4) == [high]
    assert own.degraded == [low, high]
    assert "fenced" in own.decide(low.first, False).reason
    assert "degraded" in own.decide(high.first, False).reason
    own.assign([primary(low, 4, OTHER), primary(high, 4, OTHER)])   # same epoch: still held back
    assert own.degraded == [low, high]
    own.assign([primary(SPACE, 6, OTHER)])
    assert own.degraded == [] and own.decide(low.first, True).verdict is Verdict.SERVE


def test_a_member_synced_here_stays_synced_within_the_epoch():
    own = Ownership(32, ME)
    fresh = Member("other", "127.0.0.1:2", synced=False)
    own.assign([primary(SPACE, 7, fresh)])
    held = own.decide(SPACE.first, True).held
    assert held is not None and not held.peers[0].required
    own.update_peer(SPACE, 7, "other", required=True)
    own.update_peer(SPACE, 7, "other", synced=True)
    assert own.roles[0].members[1].synced
    own.assign([primary(SPACE, 7, fresh, serving=True)])   # an older message of the same epoch
    held = own.decide(SPACE.first, True).held
    assert held is not None and held.peers[0].required and own.roles[0].members[1].synced
    own.assign([primary(SPACE, 8, fresh)])                 # a new epoch: the controller's word
    held = own.decide(SPACE.first, True).held
    assert held is not None and not held.peers[0].required


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
    own = owning(SPACE)
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


CELL = 14   # the model's granularity: the /10 space as 16 cells of a /14
cells_st = st.integers(11, CELL).flatmap(
    lambda plen: st.integers(0, 2 ** (plen - 10) - 1).map(
        lambda i: Block(SPACE.first + (i << (32 - plen)), plen)))
ops_st = st.lists(st.tuples(st.sampled_from(["primary", "backup", "disown"]), cells_st,
                            st.integers(0, 6)), max_size=25)


@given(ops_st)
def test_roles_follow_a_cell_model_and_epochs_never_go_back(ops: list[tuple[str, Block, int]]) -> None:
    """Random assignments (of any part, at any epoch) and disowns against a
    model of 16 cells, each held at an epoch in a role or not held: an
    assignment is refused exactly when some cell it covers is held at a
    newer epoch, and then nothing changes."""
    own = Ownership(32, ME)
    model: list[tuple[int, bool] | None] = [None] * 16

    def cells(block: Block) -> range:
        first = (block.first - SPACE.first) >> (32 - CELL)
        return range(first, first + (block.size >> (32 - CELL)))

    for kind, block, epoch in ops:
        if kind == "disown":
            own.disown([block])
            for c in cells(block):
                model[c] = None
            continue
        role = primary(block, epoch, OTHER) if kind == "primary" else backup(block, epoch)
        newer = any(held is not None and held[0] > epoch for held in (model[c] for c in cells(block)))
        if newer:
            before = own.roles
            with pytest.raises(OwnershipError):
                own.assign([role])
            assert own.roles == before
            continue
        own.assign([role])
        for c in cells(block):
            model[c] = (epoch, kind == "primary")
    parts = own.parts()
    assert all(a.block.last < b.block.first for a, b in zip(parts, parts[1:], strict=False))
    for c, expected in enumerate(model):
        probe = SPACE.first + (c << (32 - CELL)) + 77
        decision = own.decide(probe, write=True)
        if expected is None:
            assert decision.held is None and decision.verdict is Verdict.MOVED
        else:
            assert decision.held is not None and decision.held.epoch == expected[0]
            assert decision.verdict is (Verdict.SERVE if expected[1] else Verdict.MOVED)


# -- the compiled path's table ------------------------------------------------------

def _fast(ranges: list[tuple[int, int]], probe: int) -> bool:
    return any(first <= probe <= last for first, last in ranges)


PROBES = [SPACE.first + (c << (32 - CELL)) + offset for c in range(16) for offset in (0, 77, (1 << 18) - 1)]
few_cells_st = st.sampled_from([Block(SPACE.first + (i << 20), 12) for i in range(4)]
                               + [Block(SPACE.first + (i << 19), 13) for i in range(8)])
"""Fewer, larger blocks than `cells_st`, so that freezes, fences and
degrades often land on what an earlier step assigned."""
fast_ops_st = st.lists(st.tuples(st.sampled_from(["solo", "replicated", "waiting", "backup", "disown",
                                                  "freeze", "unfreeze", "fence", "degrade", "suspend",
                                                  "resume", "synced"]),
                                 few_cells_st, st.integers(0, 4)), max_size=25)


@settings(max_examples=300)
@given(fast_ops_st)
def test_fast_ranges_are_what_decide_serves_alone_and_move_with_the_version(ops) -> None:
    """`fast_ranges` (what the compiled path answers by itself) holds exactly
    the IDs `decide` serves, for reads; for writes (minus frozen parts) those
    with no other member, and for replicated writes those with; and any change of what `decide` says
    moves `version`, which is all the service watches to refresh the table:
    told (`on_version`) once the change is made, so that the table read
    when told is the one the operation leaves."""
    own = Ownership(32, ME)
    told: list[tuple[int, tuple[list[tuple[int, int]], ...]]] = []
    own.on_version = lambda version: told.append((version, own.fast_ranges()))

    def seen() -> list[tuple[Verdict, Verdict, bool]]:
        out = []
        for probe in PROBES:
            read, write = own.decide(probe, write=False), own.decide(probe, write=True)
            out.append((read.verdict, write.verdict, bool(read.held and read.held.peers)))
        return out

    for kind, block, epoch in ops:
        version, before, table = own.version, seen(), own.fast_ranges()
        try:
            if kind in ("solo", "replicated", "waiting"):
                role = primary(block, epoch, *([OTHER] if kind != "solo" else []), serving=kind != "waiting")
                own.assign([role])
            elif kind == "backup":
                own.assign([backup(block, epoch)])
            elif kind == "disown":
                own.disown([block])
            elif kind == "freeze":
                own.freeze([block])
            elif kind == "unfreeze":
                own.unfreeze([block])
            elif kind == "fence":
                own.fence(block, epoch)
            elif kind == "degrade":
                own.degrade(block, epoch)
            elif kind == "synced":
                own.update_peer(block, epoch, OTHER.name, synced=True)
            else:
                own.suspended = kind == "suspend"
        except OwnershipError:
            pass
        if own.version == version:
            assert seen() == before and own.fast_ranges() == table
        else:
            assert told[-1] == (own.version, own.fast_ranges())
        reads, writes, replicated = own.fast_ranges()
        assert reads == sorted(reads) and writes == sorted(writes) and replicated == sorted(replicated)
        for probe, (read, write, peers) in zip(PROBES, seen(), strict=True):
            assert _fast(reads, probe) == (read is Verdict.SERVE)
            assert _fast(writes, probe) == (write is Verdict.SERVE and not peers)
            assert _fast(replicated, probe) == (write is Verdict.SERVE and peers)
