"""Baseline placements: lookups always find the true owner, at the cost each scheme claims."""

from __future__ import annotations

import math
import random
from collections import Counter

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from benchmarks.baselines.placement import (
    CentralCoordinator,
    Chord,
    HashMapping,
    OneHop,
    Ring,
)
from client_lib.cidr import Block
from client_lib.mdid import mdid_of_key

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


def _partition(servers: int, pieces: int, seed: int, space: Block) -> dict[str, list[Block]]:
    """`pieces` equal blocks of the space dealt to servers at random (so a
    server owns several runs, as after MetaFlow's splits)."""
    rng = random.Random(seed)
    plen = space.plen + pieces.bit_length() - 1
    blocks = [Block(space.first + i * (space.size // pieces), plen) for i in range(pieces)]
    owners = [f"s{i % servers}" for i in range(pieces)]
    rng.shuffle(owners)
    out: dict[str, list[Block]] = {}
    for block, owner in zip(blocks, owners):
        out.setdefault(owner, []).append(block)
    return out


@settings(max_examples=25, deadline=None)
@given(st.integers(1, 12), st.sampled_from([1, 2, 4, 16, 64]), st.integers(0, 1000))
def test_partition_ring_places_keys_where_metaflow_does(servers, pieces, seed):
    space = Block.parse("100.64.0.0/10")
    servers = min(servers, pieces)
    blocks = _partition(servers, pieces, seed, space)
    block_owner = {b: name for name, bs in blocks.items() for b in bs}
    rng = random.Random(seed)
    schemes = [Ring.over_partition(blocks, space), OneHop.over_partition(blocks, space),
               CentralCoordinator.over_partition(blocks, space), Chord.over_partition(blocks, space)]
    for i in range(60):
        key = f"/p/{seed}/{i}".encode()
        mdid = mdid_of_key(key, space)
        truth = next(name for b, name in block_owner.items() if b.contains(mdid))
        for scheme in schemes:
            assert scheme.owner(key) == truth
        found = schemes[-1].lookup(key, rng)
        assert found.owner == truth
        assert schemes[-1].route("idle-server", mdid - space.first).owner == truth  # owns nothing yet
        assert all(a != b for a, b in zip(found.visited, found.visited[1:]))  # local hops are free
        assert found.rpcs <= math.ceil(math.log2(len(schemes[-1].ids))) + 2


def test_partition_must_tile_the_space():
    space = Block.parse("100.64.0.0/10")
    blocks = _partition(2, 4, 0, space)
    blocks["s0"].pop()
    with pytest.raises(ValueError, match="tile"):
        Ring.over_partition(blocks, space)
