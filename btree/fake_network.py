"""A network of fake OpenFlow 1.0 tables that forwards packets using only the
generated MetaFlow entries (in the spirit of faucet's FakeOFTable).

Two questions: where does one packet end up (`forward`, hop by hop, exactly as
a switch would match it), and where does every MetaDataID end up from a given
switch (`resolve`, the same matching done on whole address intervals at once,
so a planner can check every ID of the space, not a sample).
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from functools import partial
from itertools import pairwise
from typing import Generic, Protocol, TypeVar

from client_lib.cidr import Block
from client_lib.constants import METAFLOW_BASE_PRIORITY, METAFLOW_PORT

from .fabric import Fabric
from .flows import FlowEntry, FlowPlanner, Table, uprules

Interval = tuple[int, int, str | None]
"""(first, last, where): where is a host id (or "loop", "<host> (wrong dl_dst)"), or
None for a drop / no MetaFlow match."""
Payload = TypeVar("Payload")


@dataclass(frozen=True, slots=True)
class Delivery:
    host: str | None          # where the packet left the fabric; None: dropped or unmatched
    hops: tuple[int, ...]     # dpids traversed
    dl_dst: str | None        # destination MAC as rewritten on the last hop
    reason: str               # "delivered", "no MetaFlow entry", "loop", "dead port"


class FakeNetwork:
    def __init__(self, fabric: Fabric, tables: Mapping[int, Table], width: int = 32) -> None:
        """A network of explicit per-switch tables (what a controller would install)."""
        self.fabric, self.width = fabric, width
        self._tables: dict[int, _Lookup] = {
            dpid: _Lookup([_explicit(table.values())])
            for dpid, table in tables.items()}
        self._whole: dict[int, list[Interval]] = {}
        self._partial: dict[tuple[int, int, int], list[Interval]] = {}

    @classmethod
    def from_planner(cls, planner: FlowPlanner) -> FakeNetwork:
        """The same network without writing out every switch's table: members of a
        group share one index of the group's entries and turn a match into their
        own FlowEntry (ports) only when it is used. For the paper-scale tables of
        `metaflowctl plan` (hundreds of switches carrying thousands of entries)."""
        net = cls(planner.fabric, {}, planner.space.width)
        shared = {group: _Prefixes([(METAFLOW_BASE_PRIORITY + b.plen, b, v)
                                    for b, v in planner.group_entries(group)])
                  for group in planner.groups()}
        for dpid, switch in planner.fabric.switches.items():
            parts: list[_Matcher] = [_explicit(uprules(switch, planner.space))]
            if switch.group is not None:
                parts.insert(0, _Index(shared[switch.group], partial(planner.entry, switch)))
            net._tables[dpid] = _Lookup(parts)
        return net

    def forward(self, src_host: str, dst: int, dst_port: int = METAFLOW_PORT,
                proto: str = "tcp", max_hops: int = 64) -> Delivery:
        """Send one packet from a host and follow it through the MetaFlow entries."""
        dpid, _ = self.fabric.hosts[src_host]
        hops: list[int] = []
        dl_dst: str | None = None
        while len(hops) < max_hops:
            hops.append(dpid)
            entry = None
            if proto in ("tcp", "udp") and dst_port == METAFLOW_PORT:
                entry = self._tables[dpid].match(dst)
            if entry is None:
                return Delivery(None, tuple(hops), dl_dst, "no MetaFlow entry")
            dl_dst = entry.set_dl_dst or dl_dst
            peer = self.fabric.peer(dpid, entry.out_port)
            if peer is None:
                return Delivery(None, tuple(hops), dl_dst, "dead port")
            if peer[0] == "host":
                return Delivery(peer[1], tuple(hops), dl_dst, "delivered")
            dpid = peer[1][0]
        return Delivery(None, tuple(hops), dl_dst, "loop")

    def resolve(self, dpid: int) -> list[Interval]:
        """Every address's fate when a MetaFlow packet enters `dpid`, as sorted,
        disjoint intervals covering the whole address width (adjacent equal
        fates merged): the switch matching of `forward`, done on whole intervals."""
        return self._resolve(dpid, 0, (1 << self.width) - 1, set())

    def _resolve(self, dpid: int, lo: int, hi: int, on_path: set[int]) -> list[Interval]:
        """Fates of [lo, hi] entering `dpid`. Forwarding never depends on the input
        port, and a caller's range always lies inside its own caller's, so a switch
        already on the path means those addresses come back to it: a loop. Results
        are kept per (switch, range): switches of one group ask their neighbours the
        same questions."""
        if dpid in self._whole:
            return _slice(self._whole[dpid], lo, hi)
        key = (dpid, lo, hi)
        if key in self._partial:
            return self._partial[key]
        if dpid in on_path:
            return [(lo, hi, "loop")]
        on_path.add(dpid)
        out: list[Interval] = []
        for first, last, entry in self._tables[dpid].intervals(lo, hi):
            peer = None if entry is None else self.fabric.peer(dpid, entry.out_port)
            if entry is None or peer is None:
                out.append((first, last, None))
            elif peer[0] == "host":
                host = peer[1]
                right_mac = entry.set_dl_dst == self.fabric.host_mac.get(host)
                out.append((first, last, host if right_mac else f"{host} (wrong dl_dst)"))
            else:
                out.extend(self._resolve(peer[1][0], first, last, on_path))
        on_path.discard(dpid)
        result = _merge(out)
        if lo == 0 and hi == (1 << self.width) - 1:
            self._whole[dpid] = result
        else:
            self._partial[key] = result
        return result


class _Prefixes(Generic[Payload]):
    """Prefix entries indexed by priority and masked address, for matching and for
    listing the entries that overlap a range. Members of a switch group share one."""

    def __init__(self, items: Sequence[tuple[int, Block, Payload]]) -> None:
        levels: dict[tuple[int, int], dict[int, tuple[Block, Payload]]] = {}
        for priority, prefix, payload in items:
            shift = prefix.width - prefix.plen
            levels.setdefault((priority, shift), {})[prefix.first >> shift] = (prefix, payload)
        self.levels = [(p, shift, d) for (p, shift), d in sorted(levels.items(), key=lambda x: -x[0][0])]
        self.sorted = sorted((prefix.first, prefix.last) for _, prefix, _ in items)
        self.firsts = [first for first, _ in self.sorted]


class _Matcher(Protocol):
    def match(self, addr: int) -> tuple[int, FlowEntry] | None: ...

    def boundaries(self, lo: int, hi: int) -> set[int]: ...


class _Index(Generic[Payload]):
    """Shared prefixes as one switch's entries: `make` turns a stored payload into
    the FlowEntry of the switch asking."""

    def __init__(self, prefixes: _Prefixes[Payload], make: Callable[[Block, Payload], FlowEntry]) -> None:
        self._prefixes = prefixes
        self._make = make

    def match(self, addr: int) -> tuple[int, FlowEntry] | None:
        for priority, shift, entries in self._prefixes.levels:
            hit = entries.get(addr >> shift)
            if hit is not None:
                return priority, self._make(*hit)
        return None

    def boundaries(self, lo: int, hi: int) -> set[int]:
        """Points in (lo, hi] where some entry starts or ends+1."""
        points = set()
        for _, shift, entries in self._prefixes.levels:       # entries that contain lo
            hit = entries.get(lo >> shift)
            if hit is not None and hit[0].last < hi:
                points.add(hit[0].last + 1)
        firsts = self._prefixes.firsts
        for first, last in self._prefixes.sorted[bisect_left(firsts, lo + 1):bisect_right(firsts, hi)]:
            points.add(first)
            if last < hi:
                points.add(last + 1)
        return points


def _explicit(entries: Iterable[FlowEntry]) -> _Index[FlowEntry]:
    """A switch's own entries (an explicit table, or its up-rules)."""
    return _Index(_Prefixes([(e.priority, e.prefix, e) for e in entries]), lambda _prefix, entry: entry)


class _Lookup:
    """One switch's table: one or more indexes, highest priority wins."""

    def __init__(self, parts: list[_Matcher]) -> None:
        self.parts = parts

    def match(self, addr: int) -> FlowEntry | None:
        best = None
        for part in self.parts:
            hit = part.match(addr)
            if hit is not None and (best is None or hit[0] > best[0]):
                best = hit
        return None if best is None else best[1]

    def intervals(self, lo: int, hi: int) -> list[tuple[int, int, FlowEntry | None]]:
        """The table flattened over [lo, hi]: which entry wins on each piece."""
        points = {lo, hi + 1}
        for part in self.parts:
            points |= part.boundaries(lo, hi)
        bounds = sorted(points)
        return [(a, b - 1, self.match(a)) for a, b in pairwise(bounds)]


def _slice(intervals: list[Interval], first: int, last: int) -> list[Interval]:
    """The part of a sorted interval list that lies in [first, last]."""
    firsts = [i[0] for i in intervals]
    lo = max(bisect_right(firsts, first) - 1, 0)
    hi = bisect_left(firsts, last + 1)
    part = intervals[lo:hi]
    if not part:
        return []
    a, b, w = part[0]
    part[0] = (max(a, first), b, w)
    a, b, w = part[-1]
    part[-1] = (a, min(b, last), w)
    return part


def _merge(intervals: list[Interval]) -> list[Interval]:
    out: list[Interval] = []
    for first, last, where in intervals:
        if out and out[-1][2] == where and out[-1][1] + 1 == first:
            out[-1] = (out[-1][0], last, where)
        else:
            out.append((first, last, where))
    return out


def misdelivered(network: FakeNetwork, partition: Sequence[tuple[Block, str]], space: Block,
                 ingress: Iterable[int]) -> list[tuple[int, list[Interval]]]:
    """Every ID of `space`, entering at each switch of `ingress`, should reach
    exactly the owner of its block in `partition` (sorted, disjoint); the
    switches where some do not, each with the fates its IDs met. Empty: all do."""
    expected = [i for i in expected_intervals(partition, space.width) if i[2] is not None]
    wrong = []
    for dpid in ingress:
        got = [(max(a, space.first), min(b, space.last), where)
               for a, b, where in network.resolve(dpid) if b >= space.first and a <= space.last]
        if got != expected:
            wrong.append((dpid, got))
    return wrong


def expected_intervals(partition: Sequence[tuple[Block, str]], width: int) -> list[Interval]:
    """The ideal fate of every address: the owner inside owned blocks, a drop elsewhere."""
    out: list[Interval] = []
    cursor = 0
    for block, leaf in partition:
        if block.first > cursor:
            out.append((cursor, block.first - 1, None))
        out.append((block.first, block.last, leaf))
        cursor = block.last + 1
    if cursor < 1 << width:
        out.append((cursor, (1 << width) - 1, None))
    return _merge(out)
