"""G-HBA: grouped hierarchical Bloom-filter arrays (Hua et al., "Supporting
Scalable and Adaptive Metadata Management in Ultra Large-scale File Systems").

Every server summarises the keys it stores in a Bloom filter. Servers are
split into groups; within a group each member holds its own filter plus
replicas of a disjoint share of the other groups' filters, so the group as a
whole holds every server's filter exactly once (Section 2.2). The member's
share is its *segment*. A lookup at a home server climbs four levels until a
single server is named (Section 2.3):

  L1 "lru"     the home's record of recently resolved keys;
  L2 "segment" the filters the home holds;
  L3 "group"   multicast to the other members of the home's group, which
               answer from their segments (the group sees every filter);
  L4 "global"  multicast to every server, which answers exactly.

Here the placement is fixed elsewhere (`owner_of`); G-HBA only decides how a
client finds the owner. The lookup procedure, `resolve`, is sans-I/O: it
yields the probes a networked daemon sends as RPCs, so the same logic runs
in-process (`Ghba`, for tests and the simulator) and over the network.
"""

from __future__ import annotations

import hashlib
import math
import random
import struct
from collections import Counter, OrderedDict
from collections.abc import Callable, Generator, Iterable, Sequence
from dataclasses import dataclass

from benchmarks.baselines.placement import Lookup

_HEADER = struct.Struct(">QI")     # bits, hashes: makes a shipped filter self-describing


class BloomFilter:
    """A set summary with no false negatives and a tunable false-positive rate.

    The k bit positions come from double hashing (Kirsch and Mitzenmacher) of
    one BLAKE2b digest, the hash MetaFlow uses everywhere, so a membership
    test costs one digest whatever k is.
    """

    def __init__(self, bits: int, hashes: int) -> None:
        if bits < 1 or hashes < 1:
            raise ValueError(f"a Bloom filter needs bits >= 1 and hashes >= 1, got {bits}, {hashes}")
        self.bits = bits
        self.hashes = hashes
        self._array = bytearray((bits + 7) // 8)

    @classmethod
    def for_items(cls, items: int, fp_rate: float = 0.01) -> BloomFilter:
        """The smallest filter holding `items` keys at `fp_rate`: m = -n ln p / ln²2
        bits and k = (m/n) ln 2 hashes, the optimum the paper cites (Section 3.4)."""
        if not 0 < fp_rate < 1:
            raise ValueError(f"fp_rate must be in (0, 1), got {fp_rate}")
        items = max(items, 1)
        bits = math.ceil(-items * math.log(fp_rate) / math.log(2) ** 2)
        return cls(bits, max(1, round(bits / items * math.log(2))))

    def _positions(self, key: bytes) -> Iterable[int]:
        digest = hashlib.blake2b(key, digest_size=16).digest()
        h1 = int.from_bytes(digest[:8], "big")
        h2 = int.from_bytes(digest[8:], "big") | 1      # odd, so the k probes differ
        return ((h1 + i * h2) % self.bits for i in range(self.hashes))

    def add(self, key: bytes) -> None:
        for pos in self._positions(key):
            self._array[pos >> 3] |= 1 << (pos & 7)

    def __contains__(self, key: bytes) -> bool:
        return all(self._array[pos >> 3] & (1 << (pos & 7)) for pos in self._positions(key))

    def to_bytes(self) -> bytes:
        """Header and bit array: what a server ships to the member replicating it."""
        return _HEADER.pack(self.bits, self.hashes) + bytes(self._array)

    @classmethod
    def from_bytes(cls, data: bytes) -> BloomFilter:
        if len(data) < _HEADER.size:
            raise ValueError("truncated Bloom filter header")
        bits, hashes = _HEADER.unpack_from(data)
        bloom = cls(bits, hashes)
        body = data[_HEADER.size:]
        if len(body) != len(bloom._array):
            raise ValueError(f"a {bits}-bit filter needs {len(bloom._array)} bytes, got {len(body)}")
        bloom._array[:] = body
        return bloom


def group_size_for(servers: int) -> int:
    """The group size M for N servers: the largest M with M² < N, i.e. just under √N.

    The paper gives no closed form: it picks M by maximising normalised
    throughput, Γ = 1 / (latency × space) (Section 3.3, Eq. 2-4), with hit
    rates measured in simulation. Space per member falls as (N - M)/M while
    the L3 multicast fans out to M - 1 members, and N/M + M is least at
    M = √N. The optima the paper reports sit just below that and this rule
    reproduces them: M = 5 at N = 30 (Section 4.1, RES; 6 for HP/INS), M = 9
    at N = 100 (Section 4.1) and M = 7 for the 60-node prototype (Section 5).
    Clamped to [1, N].
    """
    if servers < 1:
        raise ValueError(f"need at least one server, got {servers}")
    return max(1, math.isqrt(servers - 1))


@dataclass(frozen=True)
class GhbaLayout:
    """Who is grouped with whom, and whose filter each member holds."""

    servers: tuple[str, ...]
    group_size: int

    def __post_init__(self) -> None:
        if len(set(self.servers)) != len(self.servers) or not self.servers:
            raise ValueError("servers must be a non-empty tuple of distinct names")
        if not 1 <= self.group_size <= len(self.servers):
            raise ValueError(f"group_size must be in [1, {len(self.servers)}], got {self.group_size}")

    def groups(self) -> list[tuple[str, ...]]:
        """Consecutive chunks of `group_size`; the last may be smaller (the
        paper merges groups only when two together fit in M, Section 3.2)."""
        return [self.servers[i:i + self.group_size] for i in range(0, len(self.servers), self.group_size)]

    def group_of(self, server: str) -> tuple[str, ...]:
        start = self.servers.index(server) // self.group_size * self.group_size
        return self.servers[start:start + self.group_size]

    def replicas_held_by(self, server: str) -> tuple[str, ...]:
        """The servers whose filters `server` holds: itself first, then every
        |group|-th server outside its group, so each member holds about
        (N - M')/M' replicas (Section 2.1) and the group's members together
        hold every server's filter exactly once."""
        group = self.group_of(server)
        outsiders = tuple(s for s in self.servers if s not in group)
        return (server,) + outsiders[group.index(server)::len(group)]


class GhbaNode:
    """One server's lookup state: its own keys and filter, the replicas of its
    segment, and an LRU of recently resolved keys (level L1).

    L1 is an exact, bounded LRU map rather than the paper's LRU Bloom-filter
    array: those filters are a compact encoding of the same recent set, and
    this benchmark counts RPCs, not memory.
    """

    _INITIAL_CAPACITY = 1024

    def __init__(self, name: str, layout: GhbaLayout, lru_capacity: int = 4096,
                 fp_rate: float = 0.01) -> None:
        if lru_capacity < 0:
            raise ValueError(f"lru_capacity must be >= 0, got {lru_capacity}")
        self.name = name
        self.layout = layout
        self.held = layout.replicas_held_by(name)
        self.fp_rate = fp_rate
        self._keys: set[bytes] = set()
        self._capacity = self._INITIAL_CAPACITY
        self._bloom = BloomFilter.for_items(self._capacity, fp_rate)
        self._replicas: dict[str, BloomFilter] = {}
        self._lru: OrderedDict[bytes, str] = OrderedDict()
        self._lru_capacity = lru_capacity

    def add_own(self, key: bytes) -> None:
        """Store `key` here. The filter is rebuilt at twice the size whenever
        the key count outgrows it, so its false-positive rate stays at or
        under `fp_rate` (amortised O(1) per key)."""
        if key in self._keys:
            return
        self._keys.add(key)
        if len(self._keys) <= self._capacity:
            self._bloom.add(key)
            return
        self._capacity *= 2
        self._bloom = BloomFilter.for_items(self._capacity, self.fp_rate)
        for k in self._keys:
            self._bloom.add(k)

    def own_filter(self) -> BloomFilter:
        """A snapshot of this server's filter: a replica elsewhere goes stale,
        as in the paper, until the server ships it again."""
        return BloomFilter.from_bytes(self._bloom.to_bytes())

    def set_replica(self, server: str, bloom: BloomFilter) -> None:
        if server == self.name or server not in self.held:
            raise ValueError(f"{self.name} does not replicate {server}'s filter")
        self._replicas[server] = bloom

    def lru_lookup(self, key: bytes) -> str | None:
        owner = self._lru.get(key)
        if owner is not None:
            self._lru.move_to_end(key)
        return owner

    def remember(self, key: bytes, owner: str) -> None:
        self._lru[key] = owner
        self._lru.move_to_end(key)
        while len(self._lru) > self._lru_capacity:
            self._lru.popitem(last=False)

    def forget(self, key: bytes) -> None:
        """Drop an L1 entry found wrong, so it stops costing a wasted RPC."""
        self._lru.pop(key, None)

    def segment_hits(self, key: bytes) -> list[str]:
        """Servers in this segment that may hold `key`. A replica not yet
        received claims nothing; the own entry is answered from the exact set,
        since the server knows its own keys."""
        return [s for s in self.held if self._claims(s, key)]

    def _claims(self, server: str, key: bytes) -> bool:
        if server == self.name:
            return self.has(key)
        return server in self._replicas and key in self._replicas[server]

    def has(self, key: bytes) -> bool:
        return key in self._keys


@dataclass(frozen=True)
class Probe:
    """A multicast the home server sends: "group" asks each target for its
    `segment_hits(key)`, "global" asks each target `has(key)`."""

    kind: str
    targets: tuple[str, ...]


@dataclass(frozen=True)
class Resolution:
    owner: str | None        # None: nobody has the key (a create of a new file)
    level: str               # "lru" | "segment" | "group" | "global" | "miss"
    rpcs: int                # server-to-server RPCs the home spent (probe targets asked)


def _unique(hits: Iterable[str], exclude: frozenset[str]) -> str | None:
    """The one candidate left once known-wrong servers are dropped, if exactly one."""
    candidates = set(hits) - exclude
    return next(iter(candidates)) if len(candidates) == 1 else None


def _resolved(node: GhbaNode, key: bytes, owner: str, level: str, rpcs: int) -> Resolution:
    node.remember(key, owner)
    return Resolution(owner, level, rpcs)


def resolve(node: GhbaNode, key: bytes,
            exclude: frozenset[str] = frozenset()) -> Generator[Probe, list, Resolution]:
    """Find which server holds `key`, starting at `node` (the home server).

    Yields each multicast as a `Probe` and receives the answers in target
    order; returns the `Resolution`. `exclude` names servers already found
    not to hold the key (a Bloom-filter false positive: the client sent the
    request there and got MOVED), so a retry skips them.
    """
    cached = node.lru_lookup(key)
    if cached is not None and cached not in exclude:
        return _resolved(node, key, cached, "lru", 0)
    if cached is not None:
        node.forget(key)

    local = node.segment_hits(key)
    owner = _unique(local, exclude)
    if owner is not None:
        return _resolved(node, key, owner, "segment", 0)

    members = tuple(s for s in node.layout.group_of(node.name) if s != node.name)
    rpcs = len(members)
    if members:
        answers: list[list[str]] = yield Probe("group", members)
        owner = _unique(local + [s for hits in answers for s in hits], exclude)
        if owner is not None:
            return _resolved(node, key, owner, "group", rpcs)

    others = tuple(s for s in node.layout.servers if s != node.name)
    rpcs += len(others)
    found: list[bool] = (yield Probe("global", others)) if others else []
    holders = [s for s, has in zip(others, found, strict=True) if has]
    holders += [node.name] if node.has(key) else []
    holders = [s for s in holders if s not in exclude]
    if not holders:
        return Resolution(None, "miss", rpcs)
    return _resolved(node, key, holders[0], "global", rpcs)


class Ghba:
    """The whole scheme in one process: one `GhbaNode` per server, probes
    answered by direct calls. For tests and the simulator."""

    name = "ghba"

    def __init__(self, servers: Sequence[str], owner_of: Callable[[bytes], str], keys: Iterable[bytes],
                 group_size: int | None = None, lru_capacity: int = 4096, fp_rate: float = 0.01) -> None:
        self.servers = list(servers)
        self.owner_of = owner_of
        size = group_size_for(len(self.servers)) if group_size is None else group_size
        self.layout = GhbaLayout(tuple(self.servers), size)
        self.nodes = {s: GhbaNode(s, self.layout, lru_capacity, fp_rate) for s in self.servers}
        for key in keys:
            self.nodes[owner_of(key)].add_own(key)
        self.distribute_replicas()
        self._levels: Counter[str] = Counter()

    def distribute_replicas(self) -> None:
        """Ship every server's current filter to the member of each group that holds it."""
        filters = {s: node.own_filter() for s, node in self.nodes.items()}
        for node in self.nodes.values():
            for server in node.held[1:]:
                node.set_replica(server, filters[server])

    def owner(self, key: bytes) -> str:
        return self.owner_of(key)

    def _answer(self, probe: Probe, key: bytes) -> list:
        if probe.kind == "group":
            return [self.nodes[t].segment_hits(key) for t in probe.targets]
        return [self.nodes[t].has(key) for t in probe.targets]

    def _drive(self, home: str, key: bytes, exclude: frozenset[str], visited: list[str]) -> Resolution:
        """Run `resolve` at `home`, recording every probe target as visited."""
        procedure = resolve(self.nodes[home], key, exclude)
        try:
            probe = next(procedure)
            while True:
                visited.extend(probe.targets)
                probe = procedure.send(self._answer(probe, key))
        except StopIteration as done:
            return done.value

    def lookup(self, key: bytes, rng: random.Random) -> Lookup:
        """Ask a random home server; if the server it names does not hold the
        key (a false positive), the client has spent one more RPC there and
        asks the home again excluding it. Terminates: every retry excludes one
        more server and the global level is exact."""
        home = rng.choice(self.servers)
        visited = [home]
        exclude: frozenset[str] = frozenset()
        while True:
            found = self._drive(home, key, exclude, visited)
            if found.owner is None or self.nodes[found.owner].has(key):
                break
            visited.append(found.owner)
            exclude |= {found.owner}
        self._levels[found.level] += 1
        return Lookup(found.owner or self.owner_of(key), tuple(visited))

    def levels(self) -> dict[str, int]:
        return dict(self._levels)
