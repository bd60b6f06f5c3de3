"""Tests for btree.cidr: the Block type, exact minimal covers, most_aligned and lpm.

Minimality is checked against an independent dynamic program over aligned
blocks; most_aligned against a scan of every point of small ranges.
"""

from __future__ import annotations

import ipaddress
from functools import cache

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from client_lib.cidr import WIDTHS, Block, cover, lpm, most_aligned


def tz(x: int, width: int) -> int:
    """Trailing zero bits of x, with 0 counting as `width` (it is aligned to everything)."""
    return width if x == 0 else (x & -x).bit_length() - 1


def blocks(width: int) -> st.SearchStrategy[Block]:
    @st.composite
    def build(draw):
        plen = draw(st.integers(0, width))
        first = draw(st.integers(0, (1 << width) - 1))
        first &= ~((1 << (width - plen)) - 1)
        return Block(first, plen, width)

    return build()


any_block = st.one_of(blocks(32), blocks(128))


# -- Block -----------------------------------------------------------------------


@pytest.mark.parametrize(
    "text, first, plen, width",
    [
        ("100.64.0.0/10", 0x64400000, 10, 32),
        ("0.0.0.0/0", 0, 0, 32),
        ("255.255.255.255/32", 0xFFFFFFFF, 32, 32),
        ("10.0.0.0/26", 0x0A000000, 26, 32),
        ("2001:db8::/32", 0x20010DB8 << 96, 32, 128),
        ("::/0", 0, 0, 128),
        ("::1/128", 1, 128, 128),
        ("ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff/128", (1 << 128) - 1, 128, 128),
    ],
)
def test_parse_known_values(text, first, plen, width):
    b = Block.parse(text)
    assert (b.first, b.plen, b.width) == (first, plen, width)
    assert str(b) == str(ipaddress.ip_network(text))
    assert Block.parse(str(b)) == b


@settings(max_examples=300, deadline=None)
@given(any_block)
def test_str_parse_round_trip(b):
    text = str(b)
    assert Block.parse(text) == b
    net = ipaddress.ip_network(text)
    assert int(net.network_address) == b.first
    assert net.prefixlen == b.plen and net.max_prefixlen == b.width
    assert b.size == net.num_addresses
    assert b.last == int(net.broadcast_address)
    assert b.address() == str(net.network_address)
    assert b.address(b.last) == str(net.broadcast_address)


@pytest.mark.parametrize(
    "args",
    [
        (0, 0, 64),            # bad width
        (0, 0, 0),
        (0, 33, 32),           # plen too long
        (0, -1, 32),           # negative plen
        (0, 129, 128),
        (1, 31, 32),           # host bit set
        (0x0A000001, 24, 32),
        (1, 0, 32),
        (-256, 24, 32),        # negative first
        (1 << 32, 32, 32),     # beyond the width
        (1 << 32, 0, 32),
        (1 << 128, 128, 128),
    ],
)
def test_block_validation_errors(args):
    with pytest.raises(ValueError):
        Block(*args)


@pytest.mark.parametrize("text", ["10.0.0.1/24", "100.65.0.0/10", "2001:db8::1/64", "not-an-ip/8",
                                  "10.0.0.0/33"])
def test_parse_rejects_host_bits_and_garbage(text):
    with pytest.raises(ValueError):
        Block.parse(text)


@settings(max_examples=300, deadline=None)
@given(any_block)
def test_halves_parent_covers(b):
    assert b.covers(b)
    assert b.contains(b.first) and b.contains(b.last)
    assert not b.contains(b.first - 1) and not b.contains(b.last + 1)
    if b.plen == b.width:
        with pytest.raises(ValueError):
            b.halves()
    else:
        lo, hi = b.halves()
        assert lo.plen == hi.plen == b.plen + 1 and lo.width == hi.width == b.width
        assert lo.first == b.first and lo.last + 1 == hi.first and hi.last == b.last
        assert b.covers(lo) and b.covers(hi)
        assert not lo.covers(b) and not lo.covers(hi) and not hi.covers(lo)
        assert lo.parent() == b and hi.parent() == b
        assert lo < hi
    if b.plen == 0:
        with pytest.raises(ValueError):
            b.parent()
    else:
        p = b.parent()
        assert p.plen == b.plen - 1 and p.width == b.width
        assert p.covers(b) and not b.covers(p)
        assert b in p.halves()


def test_covers_is_not_symmetric_and_respects_disjointness():
    a = Block.parse("10.0.0.0/8")
    b = Block.parse("10.1.0.0/16")
    c = Block.parse("11.0.0.0/8")
    assert a.covers(b) and not b.covers(a)
    assert not a.covers(c) and not c.covers(a)
    assert Block.parse("0.0.0.0/0").covers(c)


# -- cover ------------------------------------------------------------------------


def assert_exact(result, first, last, width):
    assert all(b.width == width for b in result)
    if first > last:
        assert result == []
        return
    assert result, "a non-empty range needs at least one block"
    assert result[0].first == first
    assert result[-1].last == last
    for a, b in zip(result, result[1:]):
        assert a.last + 1 == b.first, "blocks must be sorted, disjoint and contiguous"
    assert sum(b.size for b in result) == last - first + 1


def brute_min_cover(first: int, last: int) -> int:
    """Fewest aligned blocks whose disjoint union is exactly [first, last] (small ranges)."""

    @cache
    def best(i: int) -> int:
        if i == last + 1:
            return 0
        options = []
        size = 1
        while i % size == 0 and i + size - 1 <= last:
            options.append(1 + best(i + size))
            size <<= 1
        return min(options)

    return best(first)


@pytest.mark.parametrize("base, width",
                         [(0, 32), (0x0A010200, 32), (0xFFFFFFC0, 32), (0x20010DB8 << 96, 128)])
def test_cover_exhaustive_in_a_64_address_window(base, width):
    for lo in range(64):
        for hi in range(lo, 64):
            result = cover(base + lo, base + hi, width)
            assert_exact(result, base + lo, base + hi, width)
            assert len(result) == brute_min_cover(lo, hi), (lo, hi)


@settings(max_examples=200, deadline=None)
@given(
    base=st.sampled_from([0, 0x0A000000, 0x64400000, 0xFFFFFF00]),
    lo=st.integers(0, 255),
    span=st.integers(0, 255),
    width=st.sampled_from(WIDTHS),
)
def test_cover_minimal_inside_a_slash24(base, lo, span, width):
    hi = min(255, lo + span)
    if width == 128:
        base <<= 96
    result = cover(base + lo, base + hi, width)
    assert_exact(result, base + lo, base + hi, width)
    assert len(result) == brute_min_cover(lo, hi)


def draw_range(data, width: int) -> tuple[int, int]:
    """Any non-empty range of a `width`-bit space."""
    a = data.draw(st.integers(0, (1 << width) - 1))
    b = data.draw(st.integers(0, (1 << width) - 1))
    return min(a, b), max(a, b)


@settings(max_examples=200, deadline=None)
@given(st.data(), st.sampled_from(WIDTHS))
def test_cover_exact_on_large_ranges(data, width):
    first, last = draw_range(data, width)
    result = cover(first, last, width)
    assert_exact(result, first, last, width)
    assert len(result) <= 2 * width
    # no two neighbours could be one block (necessary for minimality)
    for x, y in zip(result, result[1:]):
        if x.plen == y.plen and x.plen > 0:
            assert x.parent() != y.parent()


def test_cover_edge_cases():
    assert cover(5, 4) == []
    assert cover(0, (1 << 32) - 1) == [Block(0, 0, 32)]
    assert cover(0, (1 << 128) - 1, 128) == [Block(0, 0, 128)]
    assert cover(7, 7) == [Block(7, 32, 32)]
    full = Block.parse("100.64.0.0/10")
    assert cover(full.first, full.last) == [full]
    with pytest.raises(ValueError):
        cover(-1, 5)
    with pytest.raises(ValueError):
        cover(0, 1 << 32)
    with pytest.raises(ValueError):
        cover(0, 1 << 128, 128)


# -- most_aligned -------------------------------------------------------------------


@settings(max_examples=300, deadline=None)
@given(
    base=st.sampled_from([0, 1, 0x0A000000, 0x0A0000F3, 0xFFFFF000]),
    lo=st.integers(0, 1023),
    span=st.integers(0, 1023),
)
def test_most_aligned_brute_force(base, lo, span):
    lo += base
    hi = min(lo + span, (1 << 32) - 1)
    p = most_aligned(lo, hi)
    assert lo <= p <= hi
    best = max(tz(x, 32) for x in range(lo, hi + 1))
    assert tz(p, 32) == best
    # unique: only one point of an interval can be the most aligned
    assert [x for x in range(lo, hi + 1) if tz(x, 32) == best] == [p]


@settings(max_examples=300, deadline=None)
@given(st.data(), st.sampled_from(WIDTHS))
def test_most_aligned_large_ranges(data, width):
    lo, hi = draw_range(data, width)
    p = most_aligned(lo, hi, width)
    assert lo <= p <= hi
    t = tz(p, width)
    if t < width:
        step = 1 << (t + 1)
        assert (hi // step) * step < lo, "a more aligned point exists in the range"


def test_most_aligned_examples_and_errors():
    assert most_aligned(0, 10) == 0
    assert most_aligned(5, 5) == 5
    assert most_aligned(5, 9) == 8
    assert most_aligned(3, 6) == 4
    assert most_aligned(0x0A000001, 0x0AFFFFFF) == 0x0A800000
    assert most_aligned(1, (1 << 32) - 1) == 1 << 31
    assert most_aligned(1, (1 << 128) - 1, 128) == 1 << 127
    with pytest.raises(ValueError):
        most_aligned(9, 5)


# -- lpm ---------------------------------------------------------------------------


def reference_lpm(table, addr, width=32):
    best = None
    for block, value in table:
        mask = ((1 << width) - 1) ^ ((1 << (width - block.plen)) - 1)
        if addr & mask == block.first and (best is None or block.plen > best[0]):
            best = (block.plen, value)
    return None if best is None else best[1]


def test_lpm_examples():
    table = {
        Block.parse("10.0.0.0/8"): "a",
        Block.parse("10.1.0.0/16"): "b",
        Block.parse("10.1.2.0/24"): "c",
        Block.parse("0.0.0.0/0"): "default",
    }
    addr = lambda s: int(ipaddress.IPv4Address(s))  # noqa: E731
    assert lpm(table, addr("10.1.2.3")) == "c"
    assert lpm(table, addr("10.1.3.3")) == "b"
    assert lpm(table, addr("10.2.0.0")) == "a"
    assert lpm(table, addr("11.0.0.0")) == "default"
    assert lpm(list(table.items()), addr("10.1.2.255")) == "c"
    assert lpm([], 5) is None
    assert lpm({Block.parse("10.0.0.0/8"): "a"}, addr("9.255.255.255")) is None


@settings(max_examples=100, deadline=None)
@given(
    st.lists(st.tuples(st.builds(lambda plen, x: Block(x & ~((1 << (32 - plen)) - 1), plen),
                                 st.sampled_from([0, 8, 24, 25, 28, 30, 31, 32]), st.integers(0, 0xFFFF)),
                       st.integers(0, 5)),
             max_size=12),
    st.lists(st.integers(0, 0xFFFF), min_size=1, max_size=20),
)
def test_lpm_matches_reference(raw, probes):
    # keep one value per prefix (a table has one entry per match)
    table = dict((b, v) for b, v in raw)
    # put the probes where the prefixes are
    bases = [b.first for b in table] or [0]
    for i, off in enumerate(probes):
        a = (bases[i % len(bases)] + off) % (1 << 32)
        assert lpm(table, a) == reference_lpm(table.items(), a)
        assert lpm(list(table.items()), a) == reference_lpm(table.items(), a)


@given(st.integers(0, 2**32 - 1))
def test_an_ipv4_address_reads_as_ipaddress_writes_it(value):
    """`address` formats IPv4 with inet_ntoa (every request's destination);
    it must be the text ipaddress gives, for every 32-bit value."""
    assert Block(0, 0, 32).address(value) == str(ipaddress.IPv4Address(value))
    assert Block.parse("100.64.0.0/10").address() == "100.64.0.0"
