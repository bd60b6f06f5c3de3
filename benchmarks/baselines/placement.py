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
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from itertools import pairwise
from typing import Protocol, Self

from client_lib.cidr import Block
from client_lib.mdid import mdid_of_key

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
    """Consistent hashing: a key belongs to the first point at or after its
    position. By default servers sit where their names hash and keys where
    theirs do; `over_partition` instead puts one point at the end of every
    range a MetaFlow partition gives a server, so the baselines place every
    key exactly where MetaFlow does and differ only in how it is found."""

    def __init__(self, servers: Sequence[str] = (), bits: int = RING_BITS, *,
                 points: Sequence[tuple[int, str]] | None = None,
                 position: Callable[[bytes], int] | None = None) -> None:
        self.bits = bits
        self.ids = sorted(points if points is not None else [(ring_id(s.encode(), bits), s) for s in servers])
        if not self.ids:
            raise ValueError("a ring needs at least one server")
        if len({i for i, _ in self.ids}) != len(self.ids):
            raise ValueError("two servers hash to the same ring position; rename one")
        self.positions = [i for i, _ in self.ids]
        self.names = dict(self.ids)
        self.servers = sorted(set(self.names.values()))
        self.position = position or (lambda key: ring_id(key, bits))

    @classmethod
    def over_partition(cls, blocks: Mapping[str, Iterable[Block]], space: Block, **kw) -> Self:
        """The ring of a MetaFlow partition: each maximal run of consecutive
        blocks with one owner is a (virtual) node at the run's last ID; a
        key's position is its MetaDataID's offset in the space."""
        runs: list[tuple[int, int, str]] = sorted(
            (b.first - space.first, b.last - space.first, name) for name, bs in blocks.items() for b in bs)
        if not runs or runs[0][0] != 0 or runs[-1][1] != space.size - 1 or any(
                a[1] + 1 != b[0] for a, b in pairwise(runs)):
            raise ValueError("the blocks do not tile the space exactly")
        points = [(last, name) for (_, last, name), nxt in zip(runs, [*runs[1:], None], strict=True)
                  if nxt is None or nxt[2] != name]
        return cls(bits=space.size.bit_length() - 1, points=points,
                   position=lambda key: mdid_of_key(key, space) - space.first, **kw)

    def successor(self, point: int) -> tuple[int, str]:
        i = bisect.bisect_left(self.positions, point % (1 << self.bits))
        return self.ids[i % len(self.ids)]

    def owner(self, key: bytes) -> str:
        return self.successor(self.position(key))[1]


class CentralCoordinator(Ring):
    """One directory server knows every key's owner: one RPC, always to it."""

    name = "central"

    def __init__(self, servers: Sequence[str] = (), coordinator: str = "", **kw) -> None:
        super().__init__(servers, **kw)
        self.coordinator = coordinator or self.servers[0]

    def lookup(self, key: bytes, rng: random.Random) -> Lookup:
        return Lookup(self.owner(key), (self.coordinator,))


class OneHop(Ring):
    """Every server holds the full membership: ask any one of them, once."""

    name = "onehop"

    def lookup(self, key: bytes, rng: random.Random) -> Lookup:
        return Lookup(self.owner(key), (rng.choice(self.servers),))


class Chord(Ring):
    """Stoica et al.'s lookup: each node knows its successor and the
    successors of n + 2^i; a lookup jumps to the closest preceding finger
    until the key falls between a node and its successor: O(log N) hops.

    Over a partition a server holds several nodes (virtual nodes); a hop
    between two nodes of one server is local, so only hops to another server
    are RPCs. Finger tables are computed from the whole membership at start
    (a static cluster: no stabilisation protocol to run)."""

    name = "chord"

    def __init__(self, servers: Sequence[str] = (), bits: int = RING_BITS, **kw) -> None:
        super().__init__(servers, bits, **kw)
        size = 1 << self.bits
        self.fingers = {node: [self.successor((node + (1 << i)) % size)[0] for i in range(self.bits)]
                        for node in self.positions}
        self.successor_of = {node: self.successor((node + 1) % size)[0] for node in self.positions}
        self.nodes_of: dict[str, list[int]] = {}
        for node, name in self.ids:
            self.nodes_of.setdefault(name, []).append(node)

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

    def entry(self, server: str, key: int) -> int:
        """Where a lookup arriving at `server` starts: its own node that
        precedes the key most closely (any of them is correct; this one
        saves hops). A server that holds no node (it owns no data) starts
        at a fixed node it knows, its name's successor, as a Chord client
        would start at its bootstrap node."""
        nodes = self.nodes_of.get(server) or [self.successor(ring_id(server.encode(), self.bits))[0]]
        return min(nodes, key=lambda node: (key - node) % (1 << self.bits))

    def step(self, node: int, key: int) -> tuple[str | None, int]:
        """One node's decision: (owner, node) if its successor owns the key,
        else (None, the next node to ask)."""
        succ = self.successor_of[node]
        if self._after(key, node, succ):
            return self.names[succ], node
        nxt = self._closest_preceding(node, key)
        return None, succ if nxt == node else nxt

    def route(self, server: str, key: int) -> Lookup:
        """The servers a lookup for ring position `key` visits, starting at `server`."""
        node = self.entry(server, key)
        visited = [server]
        while True:
            if self.names[node] != visited[-1]:
                visited.append(self.names[node])
            owner, node = self.step(node, key)
            if owner is not None:
                return Lookup(owner, tuple(visited))

    def lookup(self, key_bytes: bytes, rng: random.Random) -> Lookup:
        return self.route(rng.choice(self.servers), self.position(key_bytes))
