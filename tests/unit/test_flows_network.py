"""The headline property: the MetaFlow tables the planner keeps, change by change,
deliver every MetaDataID to its owner from every host, over every builder topology.

Each run maps a topology, bootstraps the tree, then applies a random sequence
of key inserts (capacity-driven splits), explicit splits, failures and joins.
Every change goes through `FlowPlanner.update(moves)`, and after it:

  (a) packets (FakeNetwork.forward) from hosts to sampled keys, every block
      boundary and boundary +-1 reach tree.owner(id) with the owner's MAC;
  (b) FakeNetwork.resolve from every switch equals expected_intervals of the
      partition, over the whole address width (nothing outside the space);
  (c) other destination ports and ICMP never match a MetaFlow entry;
  (d) the incremental tables equal a FlowPlanner rebuilt from scratch;
  (e) the returned diff turns the previous tables into the new ones;
  (f) minimized groups never have more entries than the plain form;
  (g) priorities, up-rules and dl_dst rewriting follow the table layout.
"""

from __future__ import annotations

import random
from collections import defaultdict
from functools import cache

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from sortedcontainers import SortedList

from btree.fake_network import FakeNetwork, expected_intervals, misdelivered
from btree.flows import (
    UP,
    FlowEntry,
    FlowPlanner,
    SwitchDiff,
    Table,
    as_now,
    diff_networks,
    diff_tables,
    spread,
    uprules,
)
from btree.split import SplitBounds, apply_split, plan_split
from btree.tree import LogicalBTree, State, TreeError
from client_lib.cidr import Block, cover
from client_lib.constants import METAFLOW_BASE_PRIORITY, UPRULE_PRIORITY
from topology.builders import attach_app_cluster, fat_tree, three_tier, two_tier
from topology.classify import build_fabric, build_tree, classify

SPACE = Block.parse("100.64.0.0/10")
WHOLE = Block.parse("0.0.0.0/0")
SPACE6 = Block.parse("2001:db8::/64")   # 128-bit IDs; /64 keeps the tries 64 levels deep

TOPOLOGIES = {
    "fat4": lambda: fat_tree(4),
    "fat6": lambda: fat_tree(6),
    "fat8": lambda: fat_tree(8),
    "three": lambda: three_tier(clients_per_edge=1),
    "three_up2": lambda: three_tier(edge_uplinks=2, servers_per_edge=6),
    "three_2blocks": lambda: three_tier(core=2, agg=4, edges=6, servers_per_edge=4, edge_uplinks=2),
    "two": lambda: two_tier(clients_per_edge=1),
    "fat4_app": lambda: attach_app_cluster(fat_tree(4, servers=12, placement="spread"), switches=2,
                                           hosts_per_switch=2),
    "three_app_edge": lambda: attach_app_cluster(three_tier(core=2, agg=2, edges=4, servers_per_edge=4),
                                                 switches=1, hosts_per_switch=2, attach_to="edge"),
}


@cache
def classified(name: str):
    c = classify(TOPOLOGIES[name]())
    return c, build_fabric(c)


# -- checks ----------------------------------------------------------------------------------


def apply_diff(tables, diff):
    out = {dpid: dict(t) for dpid, t in tables.items()}
    for dpid, changes in diff.items():
        table = out[dpid]
        for e in changes.delete:
            assert table.get(e.match) == e, f"delete of an entry that is not installed: {e}"
            del table[e.match]
        for e in changes.add:
            assert e.match not in table, f"add of an installed match: {e}"
            table[e.match] = e
        for e in changes.modify:
            assert e.match in table and table[e.match] != e, f"modify of a missing or equal entry: {e}"
            table[e.match] = e
    return out


def check_diff(prev, diff, new) -> None:
    """(e) the diff applied to the previous tables gives the new ones; nothing else changed."""
    assert apply_diff(prev, diff) == new
    for dpid in new.keys() - diff.keys():
        assert prev[dpid] == new[dpid], f"switch {dpid} changed but is absent from the diff"
    for changes in diff.values():
        assert len(changes) > 0, "switches without changes must be absent"
    # and it is the minimal diff: exactly what diff_tables would say
    assert {d: (sorted(c.add), sorted(c.modify), sorted(c.delete)) for d, c in diff.items()} == {
        d: (c.add, c.modify, c.delete) for d, c in diff_networks(prev, new).items()}


def check_layout(tree: LogicalBTree, fabric, planner: FlowPlanner, tables) -> None:
    """(g) priorities, up-rules, dl_dst, group members identical modulo ports."""
    space = tree.space
    by_group = defaultdict(list)
    for dpid, table in tables.items():
        sw = fabric.switches[dpid]
        down_ports = {p: child for child, ports in sw.down.items() for p in ports}
        ups = []
        for match, e in table.items():
            assert match == e.match
            assert space.covers(e.prefix), e
            if e.priority == UPRULE_PRIORITY:
                assert e.is_uprule and e.set_dl_dst is None and e.out_port in sw.up
                ups.append(e)
                continue
            assert e.priority == METAFLOW_BASE_PRIORITY + e.prefix.plen, e
            assert sw.group is not None, "client switches carry only up-rules"
            if e.out_port in sw.up:
                assert e.set_dl_dst is None
            else:
                child = down_ports[e.out_port]
                if tree.is_leaf(child):
                    assert e.set_dl_dst == fabric.leaf_mac[child], "last hop must set dl_dst"
                else:
                    assert e.set_dl_dst is None, "only the last hop sets dl_dst"
        if sw.up:
            ups.sort(key=lambda e: e.prefix)
            assert ups, f"switch {dpid} has uplinks but no up-rules"
            assert ups[0].prefix.first == space.first and ups[-1].prefix.last == space.last
            for a, b in zip(ups, ups[1:]):
                assert a.prefix.last + 1 == b.prefix.first
            if (len(sw.up) - 1).bit_length() <= space.width - space.plen:
                assert {e.out_port for e in ups} == set(sw.up), "up-rules spread over every uplink"
        else:
            assert not ups
            assert sw.group == tree.root, "only the root layer has no uplinks"
        if sw.group is not None:
            by_group[sw.group].append(sorted((e.priority, e.prefix, e.set_dl_dst) for e in table.values()
                                             if not e.is_uprule))
            assert len(by_group[sw.group][-1]) == len(planner.group_entries(sw.group))
    for group, tables_of_members in by_group.items():
        assert all(t == tables_of_members[0] for t in tables_of_members), group


def check_minimal_vs_plain(tree, fabric, planner) -> None:
    """(f) minimized (ORTC) entries never outnumber the plain form, group by group."""
    plain = FlowPlanner(tree, fabric, minimize=False)
    check_plain(tree, fabric, plain)
    for group in fabric.members():
        assert len(planner.group_entries(group)) <= len(plain.group_entries(group)), group
    assert planner.total_entries() <= plain.total_entries()


def plain_reference(tree: LogicalBTree, group: str) -> list[tuple[Block, str | None]]:
    """The paper's form, computed independently: maximal runs of consecutive blocks
    toward the same child, each covered by its minimal CIDR list."""
    out: list[tuple[Block, str | None]] = []
    run: tuple[int, int, str | None] | None = None   # (first, last, child) of the current run
    for block, leaf in tree.group_blocks(group):
        child = tree.child_toward(group, leaf)
        if run and run[2] == child and run[1] + 1 == block.first:
            run = (run[0], block.last, child)
            continue
        if run:
            out.extend((b, run[2]) for b in cover(run[0], run[1], tree.space.width))
        run = (block.first, block.last, child)
    if run:
        out.extend((b, run[2]) for b in cover(run[0], run[1], tree.space.width))
    return out


def check_plain(tree, fabric, planner) -> None:
    for group in fabric.members():
        assert planner.group_entries(group) == plain_reference(tree, group), group


def boundary_ids(tree: LogicalBTree) -> list[int]:
    space = tree.space
    out = set()
    for block, _ in tree.partition():
        for x in (block.first - 1, block.first, block.first + 1, block.last - 1, block.last, block.last + 1):
            if space.contains(x):
                out.add(x)
    return sorted(out)


def check_resolve(net: FakeNetwork, tree: LogicalBTree, fabric) -> None:
    """(b) every ID of the whole width, from every switch."""
    want = expected_intervals(tree.partition(), tree.space.width)
    for dpid in fabric.switches:
        assert net.resolve(dpid) == want, f"switch {dpid} resolves differently"


def check_forward(net, tree, fabric, c, hosts, ids) -> None:
    """(a) packets to ids from hosts reach tree.owner(id) with the owner's MAC."""
    for h in hosts:
        first_switch = fabric.hosts[h][0]
        for x in ids:
            d = net.forward(h, x)
            owner = tree.owner(x)
            assert d.reason == "delivered" and d.host == owner, (h, tree.space.address(x), d, owner)
            assert d.dl_dst == fabric.leaf_mac[owner]
            assert d.hops[0] == first_switch
            levels = [c.level[dpid_name(c, dp)] for dp in d.hops]
            assert len(levels) <= levels[0] + c.edge_level + 1
            turn = levels.index(min(levels))
            assert all(a - b == 1 for a, b in zip(levels[:turn], levels[1:turn + 1])), levels
            assert all(b - a == 1 for a, b in zip(levels[turn:], levels[turn + 1:])), levels


_DPID_NAMES: dict[int, dict[int, str]] = {}


def dpid_name(c, dpid):
    names = _DPID_NAMES.get(id(c))
    if names is None:
        names = _DPID_NAMES[id(c)] = {c.graph.nodes[s]["dpid"]: s for s in c.level}
    return names[dpid]


def check_other_traffic(net, tree, fabric, hosts, ids) -> None:
    """(c) only tcp/udp to port 9000 matches MetaFlow entries."""
    space = tree.space
    outside = [x for x in (space.first - 1, space.last + 1) if 0 <= x < 1 << space.width]
    for h in hosts:
        first = fabric.hosts[h][0]
        for x in ids:
            for port, proto in ((80, "tcp"), (9001, "tcp"), (8999, "udp"), (9000, "icmp"), (9000, "arp")):
                d = net.forward(h, x, dst_port=port, proto=proto)
                assert d.host is None and d.reason == "no MetaFlow entry" and d.hops == (first,), d
            d = net.forward(h, x, proto="udp")
            assert d.host == tree.owner(x)
        for x in outside:
            d = net.forward(h, x)
            assert d.host is None and d.reason == "no MetaFlow entry" and d.hops == (first,), d


# -- the run ---------------------------------------------------------------------------------


class Run:
    def __init__(self, name: str, space: Block, method: str, minimize: bool, seed: int, skewed: bool,
                 cap: int) -> None:
        self.c, self.fabric = classified(name)
        self.tree = build_tree(self.c, space)
        self.space, self.method, self.minimize, self.cap = space, method, minimize, cap
        self.rng = random.Random(seed)
        self.keys: SortedList[int] = SortedList()
        self.clusters: list[tuple[int, int]] = []   # (first ID, width) of each hot range
        if skewed:
            for _ in range(self.rng.randint(1, 3)):
                width = min(self.rng.choice([1, 37, 1000, 50021, 999983]), max(1, space.size // 8))
                self.clusters.append((space.first + 1 + self.rng.randrange(space.size - width - 1), width))
        self.hosts = sorted(self.fabric.hosts)
        self.changes = 0
        self.planner: FlowPlanner | None = None

    def oracle(self, leaf, first, last):
        return self.keys.bisect_right(last) - self.keys.bisect_left(first)

    def count(self, leaf):
        return sum(self.oracle(leaf, b.first, b.last) for b in self.tree.blocks(leaf))

    def key(self):
        if self.clusters and self.rng.random() < 0.85:
            lo, width = self.rng.choice(self.clusters)
            return lo + self.rng.randrange(width)
        return self.space.first + self.rng.randrange(self.space.size)

    def bootstrap(self):
        tree = self.tree
        # some servers start absent (failed) and join later; every edge keeps one
        # (a fully failed subtree crashes bootstrap_preallocate: see test_tree_split)
        for group in tree.inner_nodes():
            kids = tree.children(group)
            if kids and all(tree.is_leaf(k) for k in kids):
                for leaf in self.rng.sample(kids, self.rng.randint(0, len(kids) // 3)):
                    tree.fail(leaf)
        if self.rng.random() < 0.5:
            moves = tree.bootstrap_organic(self.rng.choice(tree.leaves_in(State.IDLE)))
        else:
            most = min(self.space.size, max(1, len(tree.leaves_in(State.IDLE)) // 3))
            moves = tree.bootstrap_preallocate(self.rng.randint(1, most))
        assert moves
        # a planner cannot start before the bootstrap: test_planner_on_unbootstrapped_tree
        self.planner = FlowPlanner(tree, self.fabric, minimize=self.minimize)
        self.check(full=False)

    def split(self, leaf):
        cost = self.planner.cost_of if self.minimize and self.method == "aligned" else None
        plan = plan_split(self.tree, leaf, self.oracle, SplitBounds(0.4, 0.6), method=self.method, cost=cost)
        if not plan.ok:
            assert plan.reason
            return
        self.commit(apply_split(self.tree, plan))

    def commit(self, moves):
        prev = self.planner.tables()
        diff = self.planner.update(moves)
        new = self.planner.tables()
        check_diff(prev, diff, new)                                          # (e)
        fresh = FlowPlanner(self.tree, self.fabric, minimize=self.minimize)
        assert new == fresh.tables(), "incremental tables differ from a rebuild"   # (d)
        self.changes += 1
        self.check(full=False)

    def check(self, full: bool):
        tree, fabric, c, planner = self.tree, self.fabric, self.c, self.planner
        assert planner is not None, "bootstrap() builds the planner"
        tree.check()
        tables = planner.tables()
        net = FakeNetwork(fabric, tables, width=self.space.width)
        check_resolve(net, tree, fabric)                                         # (b)
        if full:  # the shared-index network of the planner answers the same
            shared = FakeNetwork.from_planner(planner)
            check_resolve(shared, tree, fabric)
            for h in self.rng.sample(self.hosts, min(3, len(self.hosts))):
                for x in boundary_ids(tree)[:50]:
                    assert shared.forward(h, x) == net.forward(h, x)
        ids = boundary_ids(tree)
        sample = list(self.keys) if len(self.keys) <= 60 else self.rng.sample(list(self.keys), 60)
        if full:
            check_layout(tree, fabric, planner, tables)                          # (g)
            if self.minimize:
                check_minimal_vs_plain(tree, fabric, planner)                    # (f)
            else:
                check_plain(tree, fabric, planner)
            check_forward(net, tree, fabric, c, self.hosts, sorted(set(ids + sample)))   # (a)
            check_other_traffic(net, tree, fabric, self.hosts, ids[:4] + sample[:4])     # (c)
        else:
            hosts = self.rng.sample(self.hosts, min(3, len(self.hosts)))
            some = ids if len(ids) <= 120 else self.rng.sample(ids, 120)
            check_forward(net, tree, fabric, c, hosts, some + sample[:20])

    def step(self):
        tree, rng = self.tree, self.rng
        op = rng.random()
        if op < 0.75:
            for _ in range(rng.randint(1, 40)):
                k = self.key()
                self.keys.add(k)
                owner = tree.owner(k)
                if self.count(owner) >= self.cap:
                    self.split(owner)
        elif op < 0.85:
            leaf = rng.choice(tree.leaves_in(State.BUSY))
            if self.count(leaf) >= 2:
                self.split(leaf)
        elif op < 0.93:
            live = [leaf for leaf in tree.leaves() if tree.state(leaf) is not State.FAILED]
            leaf = rng.choice(live)
            try:
                result = tree.fail(leaf)
            except TreeError:
                assert len([other for other in live if tree.state(other) is State.BUSY]) == 1
                return
            self.commit(list(result.moves))
        else:
            failed = tree.leaves_in(State.FAILED)
            if failed:
                leaf = rng.choice(failed)
                tree.join(leaf, tree.parent(leaf))
                prev = self.planner.tables()
                assert self.planner.update([]) == {}
                assert self.planner.tables() == prev
                assert FlowPlanner(tree, self.fabric, minimize=self.minimize).tables() == prev


def run(name, space, method, minimize, seed, skewed, steps=30, cap=30):
    r = Run(name, space, method, minimize, seed, skewed, cap)
    r.bootstrap()
    for _ in range(steps):
        r.step()
    r.check(full=True)
    return r


COMBOS = [("aligned", True), ("traversal", False)]
BIG = ("fat8", "three")


@pytest.mark.parametrize("method, minimize", COMBOS, ids=["aligned-min", "traversal-plain"])
@pytest.mark.parametrize("name", sorted(set(TOPOLOGIES) - set(BIG)))
@settings(max_examples=2, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), skewed=st.booleans())
def test_tables_deliver_every_id_to_its_owner(name, method, minimize, seed, skewed):
    r = run(name, SPACE, method, minimize, seed, skewed)
    assert r.changes > 0


@pytest.mark.parametrize("method, minimize", COMBOS, ids=["aligned-min", "traversal-plain"])
@pytest.mark.parametrize("name", BIG)
@settings(max_examples=1, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), skewed=st.booleans())
def test_tables_deliver_every_id_to_its_owner_big(name, method, minimize, seed, skewed):
    r = run(name, SPACE, method, minimize, seed, skewed)
    assert r.changes > 0


@pytest.mark.parametrize("method, minimize", COMBOS + [("traversal", True), ("aligned", False)],
                         ids=["aligned-min", "traversal-plain", "traversal-min", "aligned-plain"])
@pytest.mark.parametrize("space", [WHOLE, SPACE6, Block.parse("10.1.2.0/24")],
                         ids=["whole-v4", "v6", "slash24"])
@settings(max_examples=2, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), skewed=st.booleans())
def test_other_spaces(space, method, minimize, seed, skewed):
    run("fat4", space, method, minimize, seed, skewed, steps=20, cap=25)


@pytest.mark.parametrize("name", ["fat4", "two", "three_up2", "fat4_app"])
def test_skewed_clusters_force_many_unaligned_cuts(name):
    """Long runs into narrow clusters: many splits inside clusters, many nested entries."""
    r = Run(name, SPACE, "aligned", True, seed=12345, skewed=False, cap=25)
    r.clusters = [(SPACE.first + 0x123457, 401), (SPACE.first + 0x2F0001, 9), (SPACE.first + 0x3ABCDE, 5003)]
    r.bootstrap()
    for _ in range(40):
        r.step()
    r.check(full=True)
    assert r.changes >= 10


# -- targeted ---------------------------------------------------------------------------------


def test_fat_tree_example_routes_and_ports():
    """A hand-checked case: 2 leaves on different pods of fat_tree(4)."""
    c, fabric = classified("fat4")
    tree = build_tree(c, SPACE)
    tree.bootstrap_preallocate(2)
    busy = tree.leaves_in(State.BUSY)
    assert len(busy) == 2 and tree.lca(*busy) == tree.root
    planner = FlowPlanner(tree, fabric)
    root_entries = planner.group_entries(tree.root)
    assert len(root_entries) == 2, root_entries   # two halves, one /11 each
    values = {v for _, v in root_entries}
    assert values <= set(tree.children(tree.root)) and UP not in values
    net = FakeNetwork(fabric, planner.tables())
    for h in fabric.hosts:
        for x in (SPACE.first, SPACE.last, SPACE.first + SPACE.size // 2):
            d = net.forward(h, x)
            assert d.host == tree.owner(x) and d.dl_dst == fabric.leaf_mac[d.host]
            assert len(d.hops) in (1, 3, 5)



def test_misdelivered_names_the_switches_where_an_id_misses_its_one_owner():
    """What the rolling restart's table reads are checked with: nothing for the
    tables of the partition itself; every ingress switch for a partition that
    gives a block to another owner, or to two owners at once."""
    c, fabric = classified("fat4")
    tree = build_tree(c, SPACE)
    tree.bootstrap_preallocate(2)
    net = FakeNetwork(fabric, FlowPlanner(tree, fabric).tables())
    partition = tree.partition()
    ingress = sorted({dpid for dpid, _ in fabric.hosts.values()})
    assert misdelivered(net, partition, SPACE, ingress) == []
    (first, owner), (second, other) = partition
    for wrong in ([(first, other), (second, other)], sorted([*partition, (first, other)])):
        assert [dpid for dpid, _ in misdelivered(net, wrong, SPACE, ingress)] == ingress

def test_uprules_and_spread():
    from btree.fabric import SwitchPorts

    for space in (SPACE, WHOLE, SPACE6, Block.parse("10.0.0.0/31"), Block.parse("10.0.0.7/32")):
        for n in range(1, 9):
            sw = SwitchPorts(1, "agg", "g", {}, tuple(range(10, 10 + n)))
            rules = uprules(sw, space)
            assert all(r.priority == UPRULE_PRIORITY and r.set_dl_dst is None for r in rules)
            assert rules[0].prefix.first == space.first and rules[-1].prefix.last == space.last
            for a, b in zip(rules, rules[1:]):
                assert a.prefix.last + 1 == b.prefix.first and a.prefix.plen == b.prefix.plen
            if (n - 1).bit_length() <= space.width - space.plen:
                assert {r.out_port for r in rules} == set(sw.up)
            for r in rules:
                assert r.out_port == spread(sw.up, r.prefix, space)
        assert uprules(SwitchPorts(1, "core", "root", {}, ()), space) == []


def test_diff_tables():
    a = FlowEntry(2024, Block.parse("10.0.0.0/24"), 1)
    b = FlowEntry(2025, Block.parse("10.0.0.0/25"), 2, "00:00:00:00:00:01")
    b2 = FlowEntry(2025, Block.parse("10.0.0.0/25"), 3, "00:00:00:00:00:01")
    c_ = FlowEntry(UPRULE_PRIORITY, Block.parse("10.0.0.0/24"), 4)
    d = diff_tables({a.match: a, b.match: b}, {b2.match: b2, c_.match: c_})
    assert d.add == [c_] and d.modify == [b2] and d.delete == [a] and len(d) == 3
    assert len(diff_tables({a.match: a}, {a.match: a})) == 0
    assert diff_networks({1: {a.match: a}, 2: {}}, {1: {a.match: a}, 2: {b.match: b}}).keys() == {2}


@pytest.mark.parametrize("minimize", [True, False], ids=["min", "plain"])
def test_planner_on_unbootstrapped_tree(minimize):
    c, fabric = classified("fat4")
    tree = build_tree(c, SPACE)
    planner = FlowPlanner(tree, fabric, minimize=minimize)
    tables = planner.tables()
    assert all(e.is_uprule for t in tables.values() for e in t.values())
    moves = tree.bootstrap_preallocate(4)
    diff = planner.update(moves)
    check_diff(tables, diff, planner.tables())
    assert planner.tables() == FlowPlanner(tree, fabric, minimize=minimize).tables()


def test_planner_rejects_unknown_groups():
    c, fabric = classified("fat4")
    other = LogicalBTree(SPACE, "root", {"root": ["x"]})
    with pytest.raises(ValueError):
        FlowPlanner(other, fabric)


def test_cost_of_needs_minimize():
    c, fabric = classified("two")
    tree = build_tree(c, SPACE)
    tree.bootstrap_organic()
    with pytest.raises(ValueError):
        FlowPlanner(tree, fabric, minimize=False).cost_of([])


def _applied(table: Table, change: SwitchDiff) -> Table:
    """A switch's table after `change`, as OpenFlow applies it."""
    out = dict(table)
    for entry in [*change.add, *change.modify]:
        out[entry.match] = entry
    for entry in change.delete:
        out.pop(entry.match, None)
    return out


def test_two_diffs_sent_in_the_other_order_end_as_the_planner_is_when_brought_up_to_date():
    """Two operations' diffs for the same switches, the older sent last (each
    waits on agents between computing and sending): sent as computed, the
    older one undoes the newer; brought up to date (`as_now`) they leave
    every switch with the planner's table."""
    c, fabric = classified("fat4")
    tree = build_tree(c, SPACE)
    tree.bootstrap_preallocate(4)
    planner = FlowPlanner(tree, fabric)
    held = planner.tables()
    first, second = tree.leaves_in(State.BUSY)[:2]
    idle = tree.leaves_in(State.IDLE)
    older = planner.update(tree.transfer(tree.blocks(first), idle[0]))
    newer = planner.update(tree.transfer(tree.blocks(idle[0]) + tree.blocks(second), idle[1]))
    assert older.keys() & newer.keys()
    raw, fixed = dict(held), dict(held)
    for diff in (newer, older):
        for dpid, change in diff.items():
            raw[dpid] = _applied(raw[dpid], change)
            fixed[dpid] = _applied(fixed[dpid], as_now(change, planner.table(dpid)))
    assert raw != planner.tables()   # the older diff undid part of the newer
    assert fixed == planner.tables()
    assert as_now(SwitchDiff(), planner.table(next(iter(older)))) == SwitchDiff()
