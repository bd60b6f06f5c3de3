"""Tests for btree.ortc.LpmTrie: correctness and minimality of the incremental ORTC tables
(and of the plain form), and the exactness of the changes `refresh` reports.

Every function here lives on a 64-address space, so it can be evaluated on
every address and compared with an independent dynamic program that places
prefix entries on every node of the full binary trie down to single addresses.
"""

from __future__ import annotations

from functools import cache

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from btree.ortc import LpmTrie
from client_lib.cidr import Block, cover, lpm

UP = "^up"
VALUES = ("a", "b", "c", UP)
SPACES = (Block.parse("10.0.0.0/26"), Block.parse("2001:db8::40/122"))
NO_DEFAULT = object()  # marker used by the brute force for "no default" (never a value)


# -- helpers -----------------------------------------------------------------------


def partition_of(space: Block, f: list) -> list[tuple[Block, str]]:
    """The function as sorted, disjoint (block, value): runs covered minimally."""
    out: list[tuple[Block, str]] = []
    start = 0
    for i in range(1, len(f) + 1):
        if i == len(f) or f[i] != f[start]:
            out.extend((b, f[start]) for b in cover(space.first + start, space.first + i - 1, space.width))
            start = i
    return out


def brute_cost(f: list, default) -> int:
    """Minimal LPM entries realising f when unmatched addresses fall to `default`.

    opt(node, inherited) = min(no entry here, 1 + entry with some value w here),
    recursing down to single addresses, where the entry (or the inherited value)
    must equal f.
    """
    n = len(f)
    depth = n.bit_length() - 1
    values = sorted(set(f), key=repr)

    @cache
    def opt(start: int, plen: int, inherited) -> int:
        size = 1 << (depth - plen)
        if size == 1:
            return 0 if f[start] == inherited else 1
        half = size // 2
        no_entry = opt(start, plen + 1, inherited) + opt(start + half, plen + 1, inherited)
        with_entry = 1 + min(opt(start, plen + 1, w) + opt(start + half, plen + 1, w) for w in values)
        return min(no_entry, with_entry)

    return opt(0, 0, NO_DEFAULT if default is None else default)


def evaluate(space: Block, entries, default) -> list:
    out = []
    for i in range(space.size):
        v = lpm(entries, space.first + i)
        out.append(default if v is None else v)
    return out


def plain_reference(space: Block, f: list, default) -> list[tuple[Block, str]]:
    """The paper's form, computed independently: every run of equal values other than
    the default, covered by its minimal CIDR list."""
    return [(b, v) for b, v in partition_of(space, f) if v != default]


DEFAULTS = (UP, "a", None)


def build(space: Block, f: list, default, minimal: bool = True, explicit_up: bool = True) -> LpmTrie:
    items = [(b, v) for b, v in partition_of(space, f) if explicit_up or v != UP]
    return LpmTrie.from_partition(space, items, UP, default, minimal)


def check_trie(trie: LpmTrie, space: Block, f: list) -> None:
    """Everything that must hold of a (refreshed) trie representing f."""
    assert [trie.value(space.first + i) for i in range(space.size)] == f
    # leaves: the function as maximal aligned blocks, in order, covering the space
    leaves = list(trie.leaves())
    assert leaves[0][0].first == space.first and leaves[-1][0].last == space.last
    for (a, _), (b, _) in zip(leaves, leaves[1:]):
        assert a.last + 1 == b.first
    for block, value in leaves:
        assert all(f[x - space.first] == value for x in range(block.first, block.last + 1))
        if block.plen > space.plen:  # maximal: the parent block is not constant
            parent = block.parent()
            assert len({f[x - space.first] for x in range(parent.first, parent.last + 1)}) > 1
    entries = trie.entries()
    prefixes = [b for b, _ in entries]
    assert len(set(prefixes)) == len(prefixes), "one entry per prefix"
    assert all(space.covers(b) for b in prefixes)
    assert prefixes == sorted(prefixes, key=lambda b: (b.first, b.plen)), "address order"
    assert evaluate(space, entries, trie.default) == f, "entries do not realise the function"
    assert len(entries) == trie.cost() == len(trie)
    if trie.minimal:
        assert trie.cost() == brute_cost(f, trie.default)
    else:
        assert entries == plain_reference(space, f, trie.default)
        assert trie.cost() >= brute_cost(f, trie.default)


def functions(space_size: int = 64):
    """A function on 64 addresses: a few runs with random (unaligned) boundaries, or noise."""
    return st.one_of(_runs(space_size),
                     st.lists(st.sampled_from(VALUES), min_size=space_size, max_size=space_size))


@st.composite
def _runs(draw, space_size: int):
    cuts = sorted(set(draw(st.lists(st.integers(1, space_size - 1), max_size=10))))
    bounds = [0, *cuts, space_size]
    f = []
    for a, b in zip(bounds, bounds[1:]):
        f.extend([draw(st.sampled_from(VALUES))] * (b - a))
    return f


# -- from_partition --------------------------------------------------------------------


@settings(max_examples=150, deadline=None)
@given(f=functions(), space=st.sampled_from(SPACES), explicit_up=st.booleans(),
       default=st.sampled_from(DEFAULTS), minimal=st.booleans())
def test_from_partition_is_correct_and_minimal(f, space, explicit_up, default, minimal):
    trie = build(space, f, default, minimal, explicit_up)
    check_trie(trie, space, f)


def test_from_partition_with_non_maximal_blocks_collapses():
    space = SPACES[0]
    items = [(Block(space.first + i, 32), "a") for i in range(64)]  # 64 single addresses
    for minimal in (True, False):
        trie = LpmTrie.from_partition(space, items, UP, UP, minimal)
        assert list(trie.leaves()) == [(space, "a")]
        assert trie.entries() == [(space, "a")]
        assert LpmTrie.from_partition(space, items, UP, "a", minimal).entries() == []
        assert LpmTrie.from_partition(space, items, UP, None, minimal).cost() == 1


def test_from_partition_rejects_overlaps():
    space = SPACES[0]
    with pytest.raises(ValueError):
        LpmTrie.from_partition(space, [(Block.parse("10.0.0.0/27"), "a"), (Block.parse("10.0.0.0/28"), "b")],
                               UP, UP)


def test_empty_partition_is_background():
    space = SPACES[0]
    trie = LpmTrie.from_partition(space, [], UP, UP)
    assert trie.entries() == [] and trie.cost() == 0
    trie = LpmTrie.from_partition(space, [], UP, None)
    assert trie.entries() == [(space, UP)] and trie.cost() == 1
    trie = LpmTrie(space, UP, UP)
    assert trie.entries() == [] and len(trie) == 0


def test_nested_entry_example():
    """a on all of /26 except one /28 carved out UP: two nested entries beat the plain form."""
    space = SPACES[0]
    f = ["a"] * 64
    f[16:32] = [UP] * 16
    trie = build(space, f, UP, minimal=True, explicit_up=False)
    assert trie.entries() == [(space, "a"), (Block.parse("10.0.0.16/28"), UP)]
    assert brute_cost(f, UP) == 2
    plain = build(space, f, UP, minimal=False, explicit_up=False)
    assert plain.entries() == [(Block.parse("10.0.0.0/28"), "a"), (Block.parse("10.0.0.32/27"), "a")]


# -- assign + refresh: incremental ------------------------------------------------------------------


@st.composite
def assignments(draw, space: Block):
    out = []
    for _ in range(draw(st.integers(1, 12))):
        plen = draw(st.integers(space.plen, space.width))
        offset = draw(st.integers(0, space.size - 1))
        size = 1 << (space.width - plen)
        block = Block(space.first + offset // size * size, plen, space.width)
        out.append((block, draw(st.sampled_from(VALUES))))
    return out


def apply_change(entries: list, change) -> list:
    """Apply a TableChange to a table, checking it is consistent with it."""
    table = dict(entries)
    for block, value in change.removed:
        assert table.get(block) == value, f"removed {block} which held {table.get(block)!r}, not {value!r}"
        del table[block]
    for block, value in change.added:
        assert block not in table, f"added {block} which is already there"
        table[block] = value
    for block, value in change.modified:
        assert block in table and table[block] != value, f"modified {block} to the same or missing"
        table[block] = value
    return sorted(table.items(), key=lambda bv: (bv[0].first, bv[0].plen))


@settings(max_examples=120, deadline=None)
@given(st.data())
def test_incremental_assign_matches_rebuild(data):
    space = data.draw(st.sampled_from(SPACES))
    default = data.draw(st.sampled_from(DEFAULTS))
    minimal = data.draw(st.booleans())
    start = data.draw(st.one_of(st.none(), functions()))
    if start is None:
        trie, f = LpmTrie(space, UP, default, minimal), [UP] * space.size
    else:
        f = list(start)
        trie = build(space, f, default, minimal, explicit_up=False)
    batches = data.draw(st.lists(assignments(space), min_size=1, max_size=4))
    for batch in batches:
        before = trie.entries()
        for block, value in batch:
            trie.assign(block, value)
            for x in range(block.first, block.last + 1):
                f[x - space.first] = value
            assert [trie.value(space.first + i) for i in range(space.size)] == f
            if minimal:  # pass 2 is current before any refresh
                assert trie.cost() == brute_cost(f, default)
        assert trie.entries() == before, "entries change only on refresh"
        change = trie.refresh()
        after = trie.entries()
        assert apply_change(before, change) == after
        assert bool(change) == (before != after)
        fresh = build(space, f, default, minimal)
        assert trie.cost() == fresh.cost()
        assert after == fresh.entries()
        check_trie(trie, space, f)
    assert trie.refresh().removed == [] and not trie.refresh()
    # the internal state is canonical: same dicts as a fresh build
    fresh = build(space, f, default, minimal)
    assert trie._leaf == fresh._leaf
    assert trie._inner == fresh._inner


@settings(max_examples=60, deadline=None)
@given(f=functions(), data=st.data(), default=st.sampled_from(DEFAULTS))
def test_assign_then_undo_restores_everything(f, data, default):
    """The pattern FlowPlanner.cost_of relies on: assign, read cost, assign the old values back."""
    space = SPACES[0]
    trie = build(space, f, default)
    leaf_before, inner_before, entries_before = dict(trie._leaf), dict(trie._inner), trie.entries()
    # blocks on which f is constant (sub-blocks of leaves), like moved blocks
    leaves = list(trie.leaves())
    picks = data.draw(st.lists(st.sampled_from(leaves), min_size=1, max_size=4, unique=True))
    moves = []
    for block, _ in picks:
        plen = data.draw(st.integers(block.plen, block.width))
        size = 1 << (block.width - plen)
        off = data.draw(st.integers(0, block.size - 1)) // size * size
        moves.append((Block(block.first + off, plen, block.width), data.draw(st.sampled_from(VALUES))))
    undo = [(b, trie.value(b.first)) for b, _ in moves]
    g = list(f)
    for b, v in moves:
        trie.assign(b, v)
        for x in range(b.first, b.last + 1):
            g[x - space.first] = v
    assert trie.cost() == brute_cost(g, default)
    for b, v in reversed(undo):
        trie.assign(b, v)
    assert trie._leaf == leaf_before and trie._inner == inner_before
    assert trie.cost() == len(entries_before)
    change = trie.refresh()
    assert not change, change
    assert trie.entries() == entries_before


def test_assign_outside_space_raises():
    trie = LpmTrie(SPACES[0], UP, UP)
    with pytest.raises(ValueError):
        trie.assign(Block.parse("10.0.0.64/26"), "a")
    with pytest.raises(ValueError):
        trie.assign(Block.parse("10.0.0.0/25"), "a")


def test_assign_whole_space_and_single_address():
    space = SPACES[0]
    one = Block(space.first + 63, 32)
    trie = LpmTrie(space, UP, UP)
    trie.assign(space, "a")
    change = trie.refresh()
    assert change.added == [(space, "a")] and not change.removed and not change.modified
    assert trie.entries() == [(space, "a")]
    trie.assign(one, "b")
    change = trie.refresh()
    assert change.added == [(one, "b")] and not change.removed and not change.modified
    assert trie.entries() == [(space, "a"), (one, "b")]
    trie.assign(space, "b")
    change = trie.refresh()
    assert change.removed == [(one, "b")] and change.modified == [(space, "b")] and not change.added
    trie.assign(space, UP)
    change = trie.refresh()
    assert change.removed == [(space, "b")] and trie.entries() == []


# -- default None ---------------------------------------------------------------------------


@settings(max_examples=80, deadline=None)
@given(f=functions(), space=st.sampled_from(SPACES))
def test_no_default_forces_a_covering_entry(f, space):
    """The root group has no default: every address must be matched by some entry."""
    trie = build(space, f, None)
    entries = trie.entries()
    for i in range(space.size):
        assert lpm(entries, space.first + i) == f[i]
    assert trie.cost() == brute_cost(f, None) >= 1
    # no default costs exactly one more than the best default would
    assert trie.cost() == 1 + min(build(space, f, v).cost() for v in VALUES)
    plain = build(space, f, None, minimal=False)
    for i in range(space.size):
        assert lpm(plain.entries(), space.first + i) == f[i]


def test_no_default_constant_function():
    space = SPACES[0]
    assert LpmTrie.from_partition(space, [(space, "a")], UP, None).entries() == [(space, "a")]
    assert LpmTrie.from_partition(space, [(space, "a")], UP, "a").entries() == []
