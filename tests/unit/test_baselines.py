"""Baseline placements: lookups always find the true owner, at the cost each scheme claims."""

from __future__ import annotations

import math
import random
from collections import Counter

import pytest
from hypothesis import given, settings, strategies as st

from benchmarks.baselines.placement import CentralCoordinator, Chord, HashMapping, OneHop, Ring

SERVERS = [f"server{i}" for i in range(64)]
KEYS = [f"/user/{i // 10}/file{i}".encode() for i in range(3000)]


@pytest.mark.parametrize("scheme", [HashMapping(SERVERS), CentralCoordinator(SERVERS, "server0"),
                                    OneHop(SERVERS), Chord(SERVERS)])
def test_every_lookup_ends_at_the_owner(scheme):
    rng = random.Random(1)
    rpcs = []
    for key in KEYS:
        found = scheme.lookup(key, rng)
        assert found.owner == scheme.owner(key)
        rpcs.append(found.rpcs)
    expected = {"hash": (0, 0), "central": (1, 1), "onehop": (1, 1)}
    if scheme.name in expected:
        assert (min(rpcs), max(rpcs)) == expected[scheme.name]
    else:  # Chord: O(log N) hops, about half of log2 N on average
        assert max(rpcs) <= math.log2(len(SERVERS)) + 2
        assert 0.3 * math.log2(len(SERVERS)) <= sum(rpcs) / len(rpcs) <= 0.8 * math.log2(len(SERVERS)) + 1


@settings(max_examples=30, deadline=None)
@given(st.integers(2, 300), st.integers(0, 2**32 - 1), st.integers(0, 1000))
def test_chord_agrees_with_the_ring_for_any_membership(n, salt, seed):
    servers = [f"s{salt}-{i}" for i in range(n)]
    chord, ring = Chord(servers), Ring(servers)
    rng = random.Random(seed)
    for i in range(50):
        key = f"/k/{seed}/{i}".encode()
        found = chord.lookup(key, rng)
        assert found.owner == ring.owner(key)
        assert found.rpcs <= math.ceil(math.log2(n)) + 2


def test_hash_and_ring_spread_keys_over_every_server():
    for scheme in (HashMapping(SERVERS), OneHop(SERVERS)):
        load = Counter(scheme.owner(k) for k in KEYS)
        assert len(load) > 0.9 * len(SERVERS)
