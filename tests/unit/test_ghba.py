"""G-HBA: Bloom filters, the grouped replica layout, and lookups that always end at the owner."""

from __future__ import annotations

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from benchmarks.baselines.ghba import (
    BloomFilter,
    Ghba,
    GhbaLayout,
    GhbaNode,
    Probe,
    Resolution,
    group_size_for,
    resolve,
)
from benchmarks.baselines.placement import HashMapping, Lookup


class FixedHome(random.Random):
    """An rng whose `choice` always picks the given home server."""

    def __init__(self, home: str) -> None:
        super().__init__(0)
        self.home = home

    def choice(self, seq):
        return self.home


def servers(n: int) -> list[str]:
    return [f"mds{i}" for i in range(n)]


def keys(n: int, prefix: str = "/f") -> list[bytes]:
    return [f"{prefix}/{i // 10}/file{i}".encode() for i in range(n)]


def scheme(n: int, n_keys: int = 200, **kwargs) -> tuple[Ghba, list[bytes]]:
    names = servers(n)
    stored = keys(n_keys)
    return Ghba(names, HashMapping(names).owner, stored, **kwargs), stored


# --- Bloom filter ---------------------------------------------------------------------------

def test_bloom_filter_has_no_false_negatives_and_about_the_target_false_positive_rate() -> None:
    bloom = BloomFilter.for_items(1000, 0.01)
    present = keys(1000)
    for key in present:
        bloom.add(key)
    assert all(key in bloom for key in present)
    false_positives = sum(key in bloom for key in keys(10_000, "/absent"))
    assert 0.004 <= false_positives / 10_000 <= 0.02


def test_for_items_picks_the_optimal_size() -> None:
    bloom = BloomFilter.for_items(1000, 0.01)
    assert 9500 <= bloom.bits <= 9600 and bloom.hashes == 7      # 9.59 bits/key, k = 6.6 -> 7


@settings(max_examples=50, deadline=None)
@given(st.lists(st.binary(max_size=40), max_size=60), st.integers(1, 2000), st.integers(1, 12))
def test_bloom_filter_round_trips_through_bytes(items: list[bytes], bits: int, hashes: int) -> None:
    bloom = BloomFilter(bits, hashes)
    for item in items:
        bloom.add(item)
    copy = BloomFilter.from_bytes(bloom.to_bytes())
    assert (copy.bits, copy.hashes) == (bits, hashes)
    assert copy.to_bytes() == bloom.to_bytes()
    assert all(item in copy for item in items)
    assert len(bloom.to_bytes()) == 12 + (bits + 7) // 8


def test_from_bytes_rejects_a_truncated_filter() -> None:
    data = BloomFilter(100, 3).to_bytes()
    with pytest.raises(ValueError):
        BloomFilter.from_bytes(data[:-1])
    with pytest.raises(ValueError):
        BloomFilter.from_bytes(data[:5])


# --- layout ---------------------------------------------------------------------------------

def test_group_size_matches_the_papers_optima() -> None:
    assert [group_size_for(n) for n in (30, 60, 100)] == [5, 7, 9]
    assert all(1 <= group_size_for(n) <= n for n in range(1, 500))


@settings(max_examples=200, deadline=None)
@given(st.data(), st.integers(1, 120))
def test_each_group_holds_every_filter_exactly_once(data: st.DataObject, n: int) -> None:
    size = data.draw(st.integers(1, n))
    layout = GhbaLayout(tuple(servers(n)), size)
    groups = layout.groups()
    assert [s for g in groups for s in g] == list(layout.servers)
    assert all(len(g) == size for g in groups[:-1]) and 1 <= len(groups[-1]) <= size
    for group in groups:
        held = [layout.replicas_held_by(member) for member in group]
        flat = [s for h in held for s in h]
        assert sorted(flat) == sorted(layout.servers)             # disjoint and covering
        assert all(h[0] == member for h, member in zip(held, group))
        assert max(map(len, held)) - min(map(len, held)) <= 1     # balanced within the group
        assert all(layout.group_of(member) == group for member in group)


def test_layout_rejects_bad_group_sizes() -> None:
    for size in (0, 4):
        with pytest.raises(ValueError):
            GhbaLayout(("a", "b", "c"), size)


# --- lookups --------------------------------------------------------------------------------

@pytest.mark.parametrize("fp_rate", [0.01, 0.6])
def test_every_lookup_ends_at_the_owner_for_any_number_of_servers(fp_rate: float) -> None:
    rng = random.Random(7)
    for n in range(1, 41):
        ghba, stored = scheme(n, 120, fp_rate=fp_rate)
        owner = HashMapping(servers(n)).owner
        for key in stored + stored[:40]:                           # some repeats reach the LRU level
            found = ghba.lookup(key, rng)
            assert found.owner == owner(key)
            assert 1 <= found.rpcs <= 1 + 2 * n + n                # home, probes, wrong candidates
        assert sum(ghba.levels().values()) == 160


@settings(max_examples=30, deadline=None)
@given(st.data(), st.integers(1, 40), st.integers(0, 2**16))
def test_lookups_end_at_the_owner_for_any_group_size(data: st.DataObject, n: int, seed: int) -> None:
    ghba, stored = scheme(n, 60, group_size=data.draw(st.integers(1, n)), fp_rate=0.3, lru_capacity=8)
    owner = HashMapping(servers(n)).owner
    rng = random.Random(seed)
    for key in stored + stored:
        assert ghba.lookup(key, rng).owner == owner(key)


def test_a_repeated_lookup_from_the_same_home_hits_the_lru() -> None:
    ghba, stored = scheme(30, 300)
    key = stored[0]
    owner = ghba.owner(key)
    home = next(s for s in ghba.servers if s not in ghba.layout.group_of(owner))
    first = ghba.lookup(key, FixedHome(home))
    assert first.owner == owner and ghba.levels().get("lru", 0) == 0
    again = ghba.lookup(key, FixedHome(home))
    assert again == Lookup(owner, (home,)) and ghba.levels()["lru"] == 1


def absent_key(ghba: Ghba) -> bytes:
    """A key no server has and no filter anywhere claims."""
    for i in range(10_000):
        key = f"/new/file{i}".encode()
        if not any(node.segment_hits(key) for node in ghba.nodes.values()):
            return key
    raise AssertionError("every candidate key is a false positive somewhere")


@pytest.mark.parametrize("n", [1, 2, 7, 23, 40])
def test_a_key_nobody_has_is_a_miss_after_a_global_multicast(n: int) -> None:
    ghba, _ = scheme(n)
    key = absent_key(ghba)
    home = ghba.servers[-1]                                      # in the last, possibly short, group
    group_probes = len(ghba.layout.group_of(home)) - 1
    found = ghba.lookup(key, FixedHome(home))
    assert found.owner == ghba.owner(key)                        # a create goes where the placement says
    assert found.rpcs == 1 + (n - 1) + group_probes
    assert ghba.levels() == {"miss": 1}
    assert ghba.nodes[home].lru_lookup(key) is None              # nothing learnt from a miss


def test_a_forced_false_positive_is_retried_with_exclude() -> None:
    ghba, stored = scheme(9, 300, group_size=3, fp_rate=1e-6)
    key = stored[0]
    owner = ghba.owner(key)
    home = next(s for s in ghba.servers if owner not in ghba.nodes[s].held)
    node = ghba.nodes[home]
    wrong = node.held[1]
    liar = BloomFilter.for_items(10)
    liar.add(key)
    node.set_replica(wrong, liar)
    assert node.segment_hits(key) == [wrong]

    found = ghba.lookup(key, FixedHome(home))
    members = tuple(s for s in ghba.layout.group_of(home) if s != home)
    assert found.owner == owner
    assert found.visited == (home, wrong) + members               # wrong candidate, then the group
    assert found.rpcs == 1 + 1 + len(members)
    assert ghba.levels() == {"group": 1}
    assert node.lru_lookup(key) == owner


def test_a_stale_lru_entry_is_excluded_and_forgotten() -> None:
    ghba, stored = scheme(9, 300, group_size=3, fp_rate=1e-6)
    key = stored[0]
    owner = ghba.owner(key)
    home = next(s for s in ghba.servers if s != owner)
    wrong = next(s for s in ghba.servers if s not in (owner, home))
    ghba.nodes[home].remember(key, wrong)
    found = ghba.lookup(key, FixedHome(home))
    assert found.owner == owner and found.visited[:2] == (home, wrong)
    assert ghba.nodes[home].lru_lookup(key) == owner


# --- the sans-I/O procedure ----------------------------------------------------------------

def test_resolve_yields_a_group_then_a_global_probe_for_an_unknown_key() -> None:
    layout = GhbaLayout(tuple(servers(5)), 2)
    node = GhbaNode("mds0", layout)
    procedure = resolve(node, b"/nowhere")
    assert next(procedure) == Probe("group", ("mds1",))
    assert procedure.send([[]]) == Probe("global", ("mds1", "mds2", "mds3", "mds4"))
    with pytest.raises(StopIteration) as done:
        procedure.send([False, False, False, False])
    assert done.value.value == Resolution(None, "miss", 5)


def test_resolve_takes_a_unique_group_hit_and_remembers_it() -> None:
    layout = GhbaLayout(tuple(servers(5)), 2)
    node = GhbaNode("mds0", layout)
    procedure = resolve(node, b"/k")
    next(procedure)
    with pytest.raises(StopIteration) as done:
        procedure.send([["mds3"]])
    assert done.value.value == Resolution("mds3", "group", 1)
    assert node.lru_lookup(b"/k") == "mds3"


def test_set_replica_refuses_filters_outside_the_segment() -> None:
    layout = GhbaLayout(tuple(servers(6)), 2)
    node = GhbaNode("mds0", layout)
    not_held = next(s for s in layout.servers if s not in node.held)
    for server in ("mds0", not_held):
        with pytest.raises(ValueError):
            node.set_replica(server, BloomFilter(8, 1))


def test_own_filter_grows_with_the_key_count_and_is_a_snapshot() -> None:
    node = GhbaNode("mds0", GhbaLayout(("mds0",), 1))
    stored = keys(5000)
    for key in stored:
        node.add_own(key)
    bloom = node.own_filter()
    assert all(key in bloom for key in stored)
    assert sum(key in bloom for key in keys(5000, "/absent")) / 5000 <= 0.02
    shipped = bloom.to_bytes()
    node.add_own(b"/later")
    assert bloom.to_bytes() == shipped                           # a snapshot, not the live filter
    assert node.has(b"/later") and b"/later" in node.own_filter()
