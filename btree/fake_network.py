"""A network of fake OpenFlow 1.0 tables that forwards packets using only the
generated MetaFlow entries (in the spirit of faucet's FakeOFTable).

Two questions: where does one packet end up (`forward`, hop by hop, exactly as
a switch would match it), and where does every MetaDataID end up from a given
switch (`resolve`, the same matching done on whole address intervals at once,
so a planner can check every ID of the space, not a sample).
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right
from dataclasses import dataclass
from typing import Mapping

from .cidr import Block
from .fabric import Fabric
from .flows import METAFLOW_PORT, FlowEntry, Table

Interval = tuple[int, int, object]
"""(first, last, where): where is a host id, or None for a drop / no MetaFlow match."""


@dataclass(frozen=True, slots=True)
class Delivery:
    host: str | None          # where the packet left the fabric; None: dropped or unmatched
    hops: tuple[int, ...]     # dpids traversed
    dl_dst: str | None        # destination MAC as rewritten on the last hop
    reason: str               # "delivered", "no MetaFlow entry", "loop", "dead port"


class FakeNetwork:
    def __init__(self, fabric: Fabric, tables: Mapping[int, Table], width: int = 32):
        self.fabric, self.width = fabric, width
        self._tables = {dpid: _Lookup(table) for dpid, table in tables.items()}
        self._whole: dict[int, list[Interval]] = {}
        self._partial: dict[tuple[int, int, int], list[Interval]] = {}

    def forward(self, src_host: str, dst: int, dst_port: int = METAFLOW_PORT,
                proto: str = "tcp", max_hops: int = 64) -> Delivery:
        """Send one packet from a host and follow it through the MetaFlow entries."""
        dpid, _ = self.fabric.hosts[src_host]
        hops: list[int] = []
        dl_dst = None
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
            kind, where = peer
            if kind == "host":
                return Delivery(where, tuple(hops), dl_dst, "delivered")
            dpid = where[0]
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
        for first, last, entry in _slice(self._tables[dpid].intervals(self.width), lo, hi):
            peer = None if entry is None else self.fabric.peer(dpid, entry.out_port)
            if peer is None:
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


class _Lookup:
    """One switch's MetaFlow entries indexed by priority and masked address."""

    def __init__(self, table: Table):
        self.entries = list(table.values())
        levels: dict[tuple[int, int], dict[int, FlowEntry]] = {}
        for entry in self.entries:
            shift = entry.prefix.width - entry.prefix.plen
            levels.setdefault((entry.priority, shift), {})[entry.prefix.first >> shift] = entry
        self._order = [(shift, entries) for (_, shift), entries
                       in sorted(levels.items(), key=lambda item: -item[0][0])]
        self._flat: list[tuple[int, int, FlowEntry | None]] | None = None

    def match(self, addr: int) -> FlowEntry | None:
        for shift, entries in self._order:
            entry = entries.get(addr >> shift)
            if entry is not None:
                return entry
        return None

    def intervals(self, width: int) -> list[tuple[int, int, FlowEntry | None]]:
        """The table flattened: which entry wins on each interval of the address space."""
        if self._flat is None:
            self._flat = self._flatten(width)
        return self._flat

    def _flatten(self, width: int) -> list[tuple[int, int, FlowEntry | None]]:
        points = {0, 1 << width}
        for entry in self.entries:
            points.add(entry.prefix.first)
            points.add(entry.prefix.last + 1)
        bounds = sorted(points)
        return [(a, b - 1, self.match(a)) for a, b in zip(bounds, bounds[1:])]


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


def expected_intervals(partition: list[tuple[Block, str]], width: int) -> list[Interval]:
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
