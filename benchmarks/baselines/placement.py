"""Where keys live and which servers a lookup visits, for each baseline.

A lookup is the list of servers a client must ask, in order, before it can
send the request to the owner; its length is the number of lookup RPCs.
MetaFlow's is always empty (the switches route), as is hash mapping's (the
client computes the owner, the latency floor); a central coordinator costs
one RPC to one server; One-Hop one RPC to any server (each knows the full
membership); Chord O(log N) hops along finger tables.

Keys and server names are hashed with the same BLAKE2b as MetaDataIDs, so
every scheme spreads the same namespace the same way.
"""

from __future__ import annotations

import bisect
import hashlib
import random
from dataclasses import dataclass
from typing import Protocol, Sequence

RING_BITS = 32


def ring_id(data: bytes, bits: int = RING_BITS) -> int:
    return int.from_bytes(hashlib.blake2b(data, digest_size=8).digest(), "big") % (1 << bits)


@dataclass(frozen=True)
class Lookup:
    owner: str
    visited: tuple[str, ...]      # servers asked before the owner (the lookup RPCs)

    @property
    def rpcs(self) -> int:
        return len(self.visited)


class Placement(Protocol):
    name: str

    def owner(self, key: bytes) -> str: ...
    def lookup(self, key: bytes, rng: random.Random) -> Lookup: ...


class HashMapping:
    """The client hashes the key to a server directly: no lookup at all."""

    name = "hash"

    def __init__(self, servers: Sequence[str]) -> None:
        self.servers = list(servers)

    def owner(self, key: bytes) -> str:
        return self.servers[ring_id(key, 64) % len(self.servers)]

    def lookup(self, key: bytes, rng: random.Random) -> Lookup:
        return Lookup(self.owner(key), ())


class Ring:
    """Consistent hashing: a key belongs to the first server at or after its ID."""

    def __init__(self, servers: Sequence[str], bits: int = RING_BITS) -> None:
        self.bits = bits
        self.ids = sorted((ring_id(s.encode(), bits), s) for s in servers)
        if len({i for i, _ in self.ids}) != len(self.ids):
            raise ValueError("two servers hash to the same ring position; rename one")
        self.positions = [i for i, _ in self.ids]

    def successor(self, point: int) -> tuple[int, str]:
        i = bisect.bisect_left(self.positions, point % (1 << self.bits))
        return self.ids[i % len(self.ids)]

    def owner(self, key: bytes) -> str:
        return self.successor(ring_id(key, self.bits))[1]


class CentralCoordinator(Ring):
    """One directory server knows every key's owner: one RPC, always to it."""

    name = "central"

    def __init__(self, servers: Sequence[str], coordinator: str) -> None:
        super().__init__(servers)
        self.coordinator = coordinator

    def lookup(self, key: bytes, rng: random.Random) -> Lookup:
        return Lookup(self.owner(key), (self.coordinator,))


class OneHop(Ring):
    """Every server holds the full membership: ask any one of them, once."""

    name = "onehop"

    def lookup(self, key: bytes, rng: random.Random) -> Lookup:
        return Lookup(self.owner(key), (rng.choice(self.ids)[1],))


class Chord(Ring):
    """Stoica et al.'s lookup: each server knows its successor and the
    successors of n + 2^i; a lookup starts at a random server and jumps to
    the closest preceding finger until the key falls between a server and
    its successor: O(log N) hops."""

    name = "chord"

    def __init__(self, servers: Sequence[str], bits: int = RING_BITS) -> None:
        super().__init__(servers, bits)
        size = 1 << bits
        self.fingers = {node: [self.successor((node + (1 << i)) % size)[0] for i in range(bits)]
                        for node, _ in self.ids}
        self.names = dict(self.ids)
        self.successor_of = {node: self.successor((node + 1) % size)[0] for node, _ in self.ids}

    @staticmethod
    def _after(x: int, a: int, b: int) -> bool:
        """x in the ring interval (a, b]."""
        return a < x <= b if a < b else x > a or x <= b

    @staticmethod
    def _inside(x: int, a: int, b: int) -> bool:
        """x in the open ring interval (a, b)."""
        return a < x < b if a < b else x > a or x < b

    def _closest_preceding(self, node: int, key: int) -> int:
        for finger in reversed(self.fingers[node]):
            if self._inside(finger, node, key):
                return finger
        return node

    def lookup(self, key_bytes: bytes, rng: random.Random) -> Lookup:
        key = ring_id(key_bytes, self.bits)
        node = rng.choice(self.ids)[0]
        visited = [self.names[node]]
        while not self._after(key, node, self.successor_of[node]):
            nxt = self._closest_preceding(node, key)
            if nxt == node:
                nxt = self.successor_of[node]
            node = nxt
            visited.append(self.names[node])
        return Lookup(self.names[self.successor_of[node]], tuple(visited))
