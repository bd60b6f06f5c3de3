"""From block ownership to abstract MetaFlow entries per switch, and their diffs.

Each switch group's table realises one function: MetaDataID -> child of the
group (down) or UP. Two ways to write it as prefixes:

- `minimize=True`: the fewest longest-prefix-match entries (ORTC, kept
  incrementally per group in an `LpmTrie`), counting the default up-rules as
  free. Entries may nest: a short prefix to one child with a longer one carved
  out for another, or carved out UP.
- `minimize=False`: the paper's plain form: every maximal run of consecutive
  blocks toward the same child, covered by its minimal CIDR list; entries never
  nest.

Switches of a group share the group's entries and differ only in port numbers.
The controller translates `FlowEntry` into OpenFlow 1.0 flow mods; nothing here
knows about OpenFlow messages.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Iterable, Sequence

from .cidr import Block, cover
from .fabric import Fabric, SwitchPorts
from .ortc import LpmTrie
from .tree import LogicalBTree, Move

METAFLOW_PORT = 9000
METAFLOW_BASE_PRIORITY = 2000
UPRULE_PRIORITY = 1999
UP = "^up"   # the next hop "toward the root"; not a valid node id (ids come from the mapper)


@dataclass(frozen=True, slots=True, order=True)
class FlowEntry:
    """Match: ip, tcp or udp, tp_dst=9000, nw_dst=prefix. Action: [set dl_dst], output."""

    priority: int
    prefix: Block
    out_port: int
    set_dl_dst: str | None = None

    @property
    def match(self) -> tuple[int, Block]:
        return self.priority, self.prefix

    @property
    def is_uprule(self) -> bool:
        return self.priority == UPRULE_PRIORITY


Table = dict[tuple[int, Block], FlowEntry]


@dataclass
class SwitchDiff:
    add: list[FlowEntry] = field(default_factory=list)
    modify: list[FlowEntry] = field(default_factory=list)
    delete: list[FlowEntry] = field(default_factory=list)

    def __len__(self) -> int:
        return len(self.add) + len(self.modify) + len(self.delete)


FlowDiff = dict[int, SwitchDiff]
"""dpid -> changes; switches without changes are absent."""


def diff_tables(old: Table, new: Table) -> SwitchDiff:
    out = SwitchDiff()
    for match, entry in new.items():
        before = old.get(match)
        if before is None:
            out.add.append(entry)
        elif before != entry:
            out.modify.append(entry)
    out.delete.extend(entry for match, entry in old.items() if match not in new)
    for part in (out.add, out.modify, out.delete):
        part.sort()
    return out


def diff_networks(old: dict[int, Table], new: dict[int, Table]) -> FlowDiff:
    out: FlowDiff = {}
    for dpid in old.keys() | new.keys():
        changes = diff_tables(old.get(dpid, {}), new.get(dpid, {}))
        if changes:
            out[dpid] = changes
    return out


def spread(ports: Sequence[int], block: Block, space: Block) -> int:
    """Pick one of several equal ports for a prefix by the ID bits just below the
    space's prefix, so that traffic to different parts of the space takes
    different paths (OpenFlow 1.0 has no select groups)."""
    if len(ports) == 1:
        return ports[0]
    bits = min((len(ports) - 1).bit_length(), space.width - space.plen)
    shift = space.width - space.plen - bits
    return ports[((block.first - space.first) >> shift) % len(ports)]


def uprules(switch: SwitchPorts, space: Block) -> list[FlowEntry]:
    """The default MetaFlow rule, one entry per slice of the space, over the uplinks."""
    if not switch.up:
        return []
    bits = min((len(switch.up) - 1).bit_length(), space.width - space.plen)
    size = space.size >> bits
    slices = [Block(space.first + i * size, space.plen + bits, space.width) for i in range(1 << bits)]
    return [FlowEntry(UPRULE_PRIORITY, s, spread(switch.up, s, space)) for s in slices]


def plain_entries(items: Iterable[tuple[Block, str]], width: int) -> list[tuple[Block, str]]:
    """The paper's form: merge consecutive blocks with the same next hop, cover each run."""
    out: list[tuple[Block, str]] = []
    run: tuple[int, int, str] | None = None
    for block, value in items:
        if run and run[2] == value and run[1] + 1 == block.first:
            run = (run[0], block.last, value)
            continue
        if run:
            out.extend((b, run[2]) for b in cover(run[0], run[1], width))
        run = (block.first, block.last, value)
    if run:
        out.extend((b, run[2]) for b in cover(run[0], run[1], width))
    return out


class FlowPlanner:
    """Keeps every switch's MetaFlow table in step with the tree, change by change."""

    def __init__(self, tree: LogicalBTree, fabric: Fabric, minimize: bool = True):
        self.tree, self.fabric, self.minimize = tree, fabric, minimize
        self.space = tree.space
        self._members = fabric.members()
        missing = set(self._members) - set(tree.inner_nodes())
        if missing:
            raise ValueError(f"switch groups {sorted(missing)} are not nodes of the tree")
        self._group_entries: dict[str, list[tuple[Block, str]]] = {}
        self._tries: dict[str, LpmTrie] = {}
        self._tables: dict[int, Table] = {}
        self.rebuild()

    # -- group level ----------------------------------------------------------------

    def _value(self, group: str, leaf: str | None) -> str:
        if leaf is None:
            return UP
        return self.tree.child_toward(group, leaf) or UP

    def _group_items(self, group: str) -> list[tuple[Block, str]]:
        return [(block, self._value(group, leaf)) for block, leaf in self.tree.group_blocks(group)]

    def _default(self, group: str) -> str | None:
        return None if group == self.tree.root else UP

    def _compute_group(self, group: str) -> list[tuple[Block, str]]:
        if self.minimize:
            return self._tries[group].entries(self._default(group))
        return plain_entries(self._group_items(group), self.space.width)

    def group_entries(self, group: str) -> list[tuple[Block, str]]:
        """The group's table as (prefix, next hop), next hop a child id or UP."""
        return list(self._group_entries[group])

    # -- switch level ---------------------------------------------------------------

    def _switch_table(self, switch: SwitchPorts) -> Table:
        entries = uprules(switch, self.space)
        for block, value in self._group_entries.get(switch.group, ()):
            entries.append(self._entry(switch, block, value))
        return {e.match: e for e in entries}

    def _entry(self, switch: SwitchPorts, block: Block, value: str) -> FlowEntry:
        priority = METAFLOW_BASE_PRIORITY + block.plen
        if value == UP:
            if not switch.up:
                raise ValueError(f"switch {switch.dpid} of root group {switch.group!r} has no owner "
                                 f"for {block}: the blocks do not cover the space")
            return FlowEntry(priority, block, spread(switch.up, block, self.space))
        ports = switch.down.get(value)
        if not ports:
            raise ValueError(f"switch {switch.dpid} has no port toward {value!r}")
        mac = self.fabric.leaf_mac.get(value) if self.tree.is_leaf(value) else None
        return FlowEntry(priority, block, spread(ports, block, self.space), mac)

    def rebuild(self) -> dict[int, Table]:
        """Recompute everything from the tree; returns the tables."""
        for group in self._members:
            if self.minimize:
                self._tries[group] = LpmTrie.from_partition(
                    self.space, self._group_items(group), UP)
            self._group_entries[group] = self._compute_group(group)
        self._tables = {dpid: self._switch_table(sw) for dpid, sw in self.fabric.switches.items()}
        return self.tables()

    def tables(self) -> dict[int, Table]:
        return {dpid: dict(table) for dpid, table in self._tables.items()}

    def table(self, dpid: int) -> Table:
        return dict(self._tables[dpid])

    # -- changes ----------------------------------------------------------------------

    def _changed_groups(self, moves: Sequence[Move]) -> dict[str, list[tuple[Block, str]]]:
        """Groups whose function changes, with the new value on each moved block."""
        out: dict[str, list[tuple[Block, str]]] = {}
        for move in moves:
            path_nodes = set(self.tree.path(move.target)[:-1])
            if move.source is not None:
                path_nodes.update(self.tree.path(move.source)[:-1])
            for group in path_nodes:
                if group not in self._members:
                    continue
                new = self._value(group, move.target)
                if new != self._value(group, move.source):
                    out.setdefault(group, []).append((move.block, new))
        return out

    def update(self, moves: Sequence[Move]) -> FlowDiff:
        """Bring tables in line with moves the tree has applied; returns only what changed."""
        changed = self._changed_groups(moves)
        for group, assignments in changed.items():
            if self.minimize:
                for block, value in assignments:
                    self._tries[group].assign(block, value)
            self._group_entries[group] = self._compute_group(group)
        out: FlowDiff = {}
        for group in changed:
            for dpid in self._members[group]:
                new = self._switch_table(self.fabric.switches[dpid])
                changes = diff_tables(self._tables[dpid], new)
                self._tables[dpid] = new
                if changes:
                    out[dpid] = changes
        return out

    def cost_of(self, moves: Sequence[Move]) -> int:
        """Total MetaFlow entries in the network if `moves` were applied (tree untouched).

        Only the groups the moves touch are re-evaluated, on their tries, and
        restored afterwards: this is what lets a split compare many candidates.
        """
        if not self.minimize:
            raise ValueError("cost_of needs the minimized (ORTC) tables")
        total = self.total_entries()
        for group, assignments in self._changed_groups(moves).items():
            trie, default = self._tries[group], self._default(group)
            weight = len(self._members[group])
            before = trie.cost(default)
            undo = [(block, trie.value(block.first)) for block, _ in assignments]
            for block, value in assignments:
                trie.assign(block, value)
            total += (trie.cost(default) - before) * weight
            for block, value in reversed(undo):
                trie.assign(block, value)
        return total

    def total_entries(self) -> int:
        """MetaFlow entries (not up-rules) summed over all switches."""
        return sum(len(entries) * len(self._members[g]) for g, entries in self._group_entries.items())

    def layer_stats(self) -> dict[str, dict[str, float]]:
        """Per layer: switches, mean and max MetaFlow entries, mean up-rules."""
        sizes: dict[str, list[int]] = {}
        ups: Counter[str] = Counter()
        for dpid, table in self._tables.items():
            layer = self.fabric.switches[dpid].layer
            up = sum(1 for e in table.values() if e.is_uprule)
            sizes.setdefault(layer, []).append(len(table) - up)
            ups[layer] += up
        return {layer: {"switches": len(v), "mean": sum(v) / len(v), "max": max(v),
                        "uprules_mean": ups[layer] / len(v)}
                for layer, v in sizes.items()}
