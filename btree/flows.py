"""From block ownership to abstract MetaFlow entries per switch, and their diffs.

Each switch group's table realises one function: MetaDataID -> child of the
group (down) or UP. Two ways to write it as prefixes:

- `minimize=True`: the fewest longest-prefix-match entries (ORTC), counting
  the default up-rules as free. Entries may nest: a short prefix to one child
  with a longer one carved out for another, or carved out UP.
- `minimize=False`: the paper's plain form: every maximal run of consecutive
  blocks toward the same child, covered by its minimal CIDR list; entries never
  nest.

Both are kept incrementally per group by `ortc.LpmTrie`.

Switches of a group share the group's entries and differ only in port numbers.
The controller translates `FlowEntry` into OpenFlow 1.0 flow mods; nothing here
knows about OpenFlow messages.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from client_lib.cidr import Block
from client_lib.constants import METAFLOW_BASE_PRIORITY, UPRULE_PRIORITY

from .fabric import Fabric, SwitchPorts
from .ortc import LpmTrie
from .tree import LogicalBTree, Move

DEFAULT_TABLE_BUDGET = 960
"""MetaFlow prefixes one switch may hold: the paper's switches have 2,048
flow entries, a prefix takes two (tcp and udp), and 128 are kept for the
rest (up-rules, host routes, ARP and LLDP, the table-miss entry)."""

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


def as_now(change: SwitchDiff, table: Table) -> SwitchDiff:
    """`change`, computed earlier, brought up to `table` as it is now: each
    entry it touches as the table now has it (added or modified if there,
    deleted if not). Two operations' diffs for one switch can be sent in
    either order, since each waits on agents between computing its diff and
    sending it; sent as computed, the older one undid the newer (a rack of
    servers failing over at once left stale entries behind)."""
    out = SwitchDiff()
    for part, kept in ((change.add, out.add), (change.modify, out.modify), (change.delete, out.add)):
        for entry in part:
            now = table.get(entry.match)
            if now is None:
                out.delete.append(entry)
            else:
                kept.append(now)
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


class FlowPlanner:
    """Keeps every switch group's MetaFlow table in step with the tree, change by change.

    Tables are held once per group (all members carry the same entries and
    differ only in ports); a switch's concrete table is produced on demand, and
    `update` turns the group-level change into per-switch diffs.
    """

    def __init__(self, tree: LogicalBTree, fabric: Fabric, minimize: bool = True):
        self.tree, self.fabric, self.minimize = tree, fabric, minimize
        self.space = tree.space
        self._members = self._checked_members(fabric)
        self._tries: dict[str, LpmTrie[str | None]] = {}
        self.rebuild()

    def _checked_members(self, fabric: Fabric) -> dict[str, list[int]]:
        members = fabric.members()
        missing = set(members) - set(self.tree.inner_nodes())
        if missing:
            raise ValueError(f"switch groups {sorted(missing)} are not nodes of the tree")
        return members

    def extend(self, fabric: Fabric) -> list[int]:
        """Take a fabric grown by switch groups the tree has just gained (a new
        rack: `topology.grow`); the groups already planned keep their tables.
        Returns the switches new to the fabric or carrying a new group's
        table: the only ones whose tables change (what a new group forwards
        down goes to leaves that own nothing yet, so every other table reads
        the same)."""
        members = self._checked_members(fabric)
        moved = [g for g in self._members if members.get(g) != self._members[g]]
        if moved:
            raise ValueError(f"switch groups {sorted(moved)} changed members: not a growth")
        before = self.fabric.switches
        self.fabric, self._members = fabric, members
        new = [g for g in members if g not in self._tries]
        for group in new:
            self._tries[group] = self._trie(group)
        return sorted(d for d, sw in fabric.switches.items() if d not in before or sw.group in new)

    def _trie(self, group: str) -> LpmTrie[str | None]:
        items = [(block, self._value(group, leaf)) for block, leaf in self.tree.group_blocks(group)]
        outside = self._outside(group)
        return LpmTrie.from_partition(self.space, items, outside, outside, self.minimize)

    # -- group level ----------------------------------------------------------------

    def _outside(self, group: str) -> str | None:
        """Where IDs that no leaf below `group` owns go: UP, or nowhere at the root
        (before bootstrap, or with blocks unowned, the root simply has no entry)."""
        return None if group == self.tree.root else UP

    def _value(self, group: str, leaf: str | None) -> str | None:
        if leaf is None:
            return self._outside(group)
        return self.tree.child_toward(group, leaf) or UP

    def rebuild(self) -> None:
        """Recompute every group's table from the tree."""
        for group in self._members:
            self._tries[group] = self._trie(group)

    def group_entries(self, group: str) -> list[tuple[Block, str | None]]:
        """The group's table as (prefix, next hop), next hop a child id or UP."""
        return self._tries[group].entries()

    def groups(self) -> dict[str, list[int]]:
        """Group id -> member dpids."""
        return {g: list(m) for g, m in self._members.items()}

    # -- switch level ---------------------------------------------------------------

    def table(self, dpid: int) -> Table:
        """The concrete table of one switch: its group's entries on its ports, plus up-rules."""
        switch = self.fabric.switches[dpid]
        entries = uprules(switch, self.space)
        if switch.group is not None:
            entries.extend(self.entry(switch, b, v) for b, v in self._tries[switch.group].entries())
        return {e.match: e for e in entries}

    def tables(self) -> dict[int, Table]:
        return {dpid: self.table(dpid) for dpid in self.fabric.switches}

    def entry(self, switch: SwitchPorts, block: Block, value: str | None) -> FlowEntry:
        """One group entry on one member switch's ports."""
        priority = METAFLOW_BASE_PRIORITY + block.plen
        if value is None:
            raise ValueError(f"switch {switch.dpid}: {block} has no owner inside a block that has "
                             f"one; the tree's blocks do not partition the space")
        if value == UP:
            if not switch.up:
                raise ValueError(f"switch {switch.dpid} of group {switch.group!r} has no uplink "
                                 f"for {block}")
            return FlowEntry(priority, block, spread(switch.up, block, self.space))
        ports = switch.down.get(value)
        if not ports:
            raise ValueError(f"switch {switch.dpid} has no port toward {value!r}")
        mac = self.fabric.leaf_mac.get(value) if self.tree.is_leaf(value) else None
        return FlowEntry(priority, block, spread(ports, block, self.space), mac)

    # -- changes ----------------------------------------------------------------------

    def _changed_groups(self, moves: Sequence[Move]) -> dict[str, list[tuple[Block, str | None]]]:
        """Groups whose function changes, with the new value on each moved block."""
        out: dict[str, list[tuple[Block, str | None]]] = {}
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
        """Bring tables in line with moves the tree has applied; returns only what changed.

        Work is proportional to the entries that changed in the touched groups,
        times their member switches: a root-level change on a k=32 fat-tree
        rewrites the same few entries on all 256 core switches, not their tables.
        """
        out: FlowDiff = {}
        for group, assignments in self._changed_groups(moves).items():
            trie = self._tries[group]
            for block, value in assignments:
                trie.assign(block, value)
            change = trie.refresh()
            if not change:
                continue
            for dpid in self._members[group]:
                switch = self.fabric.switches[dpid]
                out[dpid] = SwitchDiff(
                    add=[self.entry(switch, b, v) for b, v in change.added],
                    modify=[self.entry(switch, b, v) for b, v in change.modified],
                    delete=[self.entry(switch, b, v) for b, v in change.removed])
        return out

    def cost_of(self, moves: Sequence[Move]) -> int:
        """Total MetaFlow entries in the network if `moves` were applied (tree untouched).

        Only the groups the moves touch are re-evaluated, by pass 2 on their
        tries, and restored afterwards: this is what lets a split compare many
        candidates cheaply.
        """
        if not self.minimize:
            raise ValueError("cost_of needs the minimized (ORTC) tables")
        return self.total_entries() + sum((after - before) * len(self._members[group])
                                          for group, before, after in self._trial(moves))

    def over_budget(self, moves: Sequence[Move], budget: int | None) -> str | None:
        """Why `moves` would break the per-switch table budget (MetaFlow
        entries on any one switch), or None if they keep it. A table that is
        already over (a bootstrap, a budget lowered later) may still shrink or
        stay as it is; it may not grow."""
        if budget is None:
            return None
        for group, before, after in self._trial(moves):
            if after > budget and after > before:
                members = self._members[group]
                more = (f" and the {len(members) - 1} other switches of group {group}"
                        if len(members) > 1 else "")
                return (f"switch {members[0]}{more} would hold {after} MetaFlow entries, over the table "
                        f"budget of {budget}")
        return None

    def keeps(self, budget: int | None) -> Callable[[Sequence[Move]], str | None]:
        """`over_budget` with the budget bound: the `fits` of a split or a merge."""
        return lambda moves: self.over_budget(moves, budget)

    def _trial(self, moves: Sequence[Move]) -> list[tuple[str, int, int]]:
        """Each group the moves touch, with its entries now and after them;
        the tries are restored before this returns."""
        out = []
        for group, assignments in self._changed_groups(moves).items():
            trie = self._tries[group]
            before = trie.cost()
            undo = [(block, trie.value(block.first)) for block, _ in assignments]
            for block, value in assignments:
                trie.assign(block, value)
            out.append((group, before, trie.cost()))
            for block, value in reversed(undo):
                trie.assign(block, value)
        return out

    def total_entries(self) -> int:
        """MetaFlow entries (not up-rules) summed over all switches."""
        return sum(len(self._tries[g]) * len(m) for g, m in self._members.items())

    def layer_stats(self) -> dict[str, dict[str, float]]:
        """Per layer: switches, mean and max MetaFlow entries, mean up-rules."""
        sizes: dict[str, list[int]] = {}
        ups: Counter[str] = Counter()
        for switch in self.fabric.switches.values():
            n = len(self._tries[switch.group]) if switch.group is not None else 0
            sizes.setdefault(switch.layer, []).append(n)
            ups[switch.layer] += len(uprules(switch, self.space))
        return {layer: {"switches": len(v), "mean": sum(v) / len(v), "max": max(v),
                        "uprules_mean": ups[layer] / len(v)}
                for layer, v in sizes.items()}
