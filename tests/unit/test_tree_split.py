"""Tests for btree.tree (LogicalBTree) and btree.split (plan_split / apply_split).

Shapes: a small hand-built tree and the trees map_topology makes of the
builders' fat-trees, three-tier and two-tier graphs. Invariants are checked
after every step of random sequences of inserts, capacity-driven splits (both
methods), joins and failures, against independent re-computations (partition
contiguity, owners, nearest idle leaf by lowest common ancestor).
"""

from __future__ import annotations

import random
from collections import defaultdict
from functools import cache

import networkx as nx
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from sortedcontainers import SortedList

from btree.bootstrap import Bootstrap
from btree.flows import FlowPlanner
from btree.split import SplitBounds, SplitPlan, apply_split, plan_split
from btree.tree import LogicalBTree, Move, State, TreeError
from client_lib.cidr import Block
from topology.builders import fat_tree, switches, three_tier, two_tier
from topology.classify import build_fabric, build_tree, classify, map_topology

SPACE = Block.parse("100.64.0.0/10")
SPACE6 = Block.parse("2001:db8::/32")
SHAPE = {"root": ["e1", "e2"], "e1": ["a", "b", "c"], "e2": ["d", "e"]}
BOUNDS = SplitBounds(0.4, 0.6)

TOPOLOGIES = {
    "fat4": lambda: fat_tree(4),
    "fat6": lambda: fat_tree(6),
    "fat8": lambda: fat_tree(8),
    "three": lambda: three_tier(),
    "three_up2": lambda: three_tier(agg=4, edges=8, servers_per_edge=4, edge_uplinks=2),
    "three_small": lambda: three_tier(core=2, agg=2, edges=4, servers_per_edge=3),
    "two": lambda: two_tier(),
}


def hand_tree(space: Block = SPACE) -> LogicalBTree:
    return LogicalBTree(space, "root", SHAPE)


@cache
def _classified(name: str):
    c = classify(TOPOLOGIES[name]())
    return c, build_fabric(c)


def topo_tree(name: str, space: Block = SPACE) -> LogicalBTree:
    c, _ = _classified(name)
    return build_tree(c, space)


def topo_fabric(name: str):
    return _classified(name)[1]


# -- independent checks ------------------------------------------------------------------


def common_depth(tree: LogicalBTree, a: str, b: str) -> int:
    pa, pb = tree.path(a), tree.path(b)
    d = 0
    while d < min(len(pa), len(pb)) and pa[d] == pb[d]:
        d += 1
    return d


def tree_order(tree: LogicalBTree, node: str | None = None) -> list[str]:
    """Leaves in depth-first order of `children` (the order the shape was given in)."""
    node = tree.root if node is None else node
    if tree.is_leaf(node):
        return [node]
    return [leaf for child in tree.children(node) for leaf in tree_order(tree, child)]


def expected_nearest(tree: LogicalBTree, leaf: str, state: State = State.IDLE) -> list[str]:
    """Leaves in `state` whose lowest common ancestor with `leaf` is deepest, in tree order."""
    cands = [x for x in tree_order(tree) if x != leaf and tree.state(x) is state]
    if not cands:
        return []
    best = max(common_depth(tree, leaf, x) for x in cands)
    return [x for x in cands if common_depth(tree, leaf, x) == best]


def check_invariants(tree: LogicalBTree, keys=()) -> None:
    tree.check()
    part = tree.partition()
    space = tree.space
    assert part, "the space must always have owners"
    assert part[0][0].first == space.first and part[-1][0].last == space.last
    for (a, _), (b, _) in zip(part, part[1:]):
        assert a.last + 1 == b.first, f"gap or overlap between {a} and {b}"
    assert all(space.covers(b) for b, _ in part)
    held = defaultdict(list)
    for block, leaf in part:
        held[leaf].append(block)
    for leaf in tree.leaves():
        assert tree.blocks(leaf) == held.get(leaf, []), leaf
        if tree.state(leaf) is State.BUSY:
            assert held.get(leaf), f"busy leaf {leaf} owns nothing"
        else:
            assert not held.get(leaf), f"{tree.state(leaf).value} leaf {leaf} owns blocks"
    for group in tree.inner_nodes():
        below = [(b, owner) for b, owner in part if group in tree.path(owner)]
        assert list(tree.group_blocks(group)) == below
    for key in keys:
        owner = tree.owner(key)
        assert tree.state(owner) is State.BUSY
        assert any(b.contains(key) for b in tree.blocks(owner))


class Sim:
    """Keys in a SortedList (duplicates allowed: many paths may hash to one ID)."""

    def __init__(self, tree: LogicalBTree, method: str, bounds: SplitBounds = BOUNDS, cap: int = 40,
                 cost=None):
        self.tree, self.method, self.bounds, self.cap, self.cost = tree, method, bounds, cap, cost
        self.keys: SortedList[int] = SortedList()
        self.plans: list[SplitPlan] = []

    def oracle(self, leaf: str, first: int, last: int) -> int:
        return self.keys.bisect_right(last) - self.keys.bisect_left(first)

    def single_id(self, leaf: str) -> bool:
        """All of the leaf's keys sit on one ID."""
        ids = {k for b in self.tree.blocks(leaf) for k in self.keys.irange(b.first, b.last)}
        return len(ids) <= 1

    def count(self, leaf: str) -> int:
        return sum(self.oracle(leaf, b.first, b.last) for b in self.tree.blocks(leaf))

    def insert(self, key: int) -> list[Move]:
        """Insert; split the owner if it reaches capacity. Returns the moves applied."""
        self.keys.add(key)
        owner = self.tree.owner(key)
        if self.count(owner) >= self.cap:
            return self.split(owner)
        return []

    def split(self, leaf: str) -> list[Move]:
        tree = self.tree
        total = self.count(leaf)
        idle = expected_nearest(tree, leaf, State.IDLE)
        siblings = [x for x in idle if tree.parent(x) == tree.parent(leaf)]
        before = {name: tree.blocks(name) for name in tree.leaves()}
        plan = plan_split(tree, leaf, self.oracle, self.bounds, method=self.method, cost=self.cost)
        self.plans.append(plan)
        assert plan.leaf == leaf and plan.keys_total == total
        after = {name: tree.blocks(name) for name in tree.leaves()}
        assert after == before, "plan_split must not change the tree"
        check_plan(tree, plan, self.method, self.bounds, self.oracle)
        if plan.target is None:
            assert not plan.ok and plan.reason
            if idle:
                # Known bug (test_aligned_split_reason_blames_missing_idle_leaf): when no cut
                # separates the keys, 'aligned' reports "no idle leaf" although there is one.
                assert self.method == "aligned" and self.single_id(leaf), plan
            else:
                assert "no idle leaf" in plan.reason
            return []
        assert plan.target in idle, "target must be a nearest idle leaf"
        if siblings:
            assert tree.parent(plan.target) == tree.parent(leaf)
        if self.method == "traversal":
            assert plan.target == tree.nearest_leaves(leaf, State.IDLE)[0]
        if not plan.ok:
            assert plan.reason
            return []
        moves = apply_split(tree, plan)
        assert all(m.source == leaf and m.target == plan.target for m in moves)
        assert sorted(m.block for m in moves) == sorted(plan.move)
        assert tree.state(plan.target) is State.BUSY
        assert self.count(plan.target) == plan.keys_moved
        assert self.count(leaf) == total - plan.keys_moved
        return moves

    def fail(self, leaf: str):
        tree = self.tree
        state = tree.state(leaf)
        old = tree.blocks(leaf)
        idle = expected_nearest(tree, leaf, State.IDLE)
        busy = expected_nearest(tree, leaf, State.BUSY)
        live = [x for x in tree.leaves() if x != leaf and tree.state(x) is not State.FAILED]
        if state is State.BUSY and not idle and not busy:
            with pytest.raises(TreeError):
                tree.fail(leaf)
            assert tree.state(leaf) is State.BUSY and tree.blocks(leaf) == old
            return None
        result = tree.fail(leaf)
        assert result.failed == leaf and tree.state(leaf) is State.FAILED
        assert tree.blocks(leaf) == []
        if state is State.IDLE:
            assert result.successor is None and result.moves == ()
            return result
        assert live
        want = idle or busy
        assert result.successor in want
        assert result.successor == want[0], "within one distance, tree order"
        assert result.same_parent == (tree.parent(result.successor) == tree.parent(leaf))
        if any(tree.parent(x) == tree.parent(leaf) for x in idle):
            assert result.same_parent
        if not idle:
            assert "no idle leaf" in result.reason
        assert sorted(m.block for m in result.moves) == sorted(old)
        assert all(m.source == leaf and m.target == result.successor for m in result.moves)
        assert set(old) <= set(tree.blocks(result.successor))
        assert tree.state(result.successor) is State.BUSY
        return result


def check_plan(tree, plan, method, bounds, oracle) -> None:
    leaf = plan.leaf
    if not plan.ok:
        assert plan.reason, "a refused plan must say why"
    if plan.move:
        # the moved blocks are disjoint pieces of the leaf's blocks
        moved = sorted(plan.move)
        for a, b in zip(moved, moved[1:]):
            assert a.last < b.first
        held = tree.blocks(leaf)
        for b in moved:
            assert any(h.covers(b) for h in held), f"{b} is not inside a block of {leaf}"
        assert sum(oracle(leaf, b.first, b.last) for b in moved) == plan.keys_moved
    if not plan.within_bounds:
        assert plan.reason, "out-of-bounds plans must say why"
    elif plan.ok:
        total, moved = plan.keys_total, plan.keys_moved
        # Both methods round the window outwards to whole keys (SplitBounds.kept_range), and
        # 'aligned' may move either side: so within one key of [1-high, 1-low] (or of
        # [low, high]). The strict form is test_within_bounds_means_moved_fraction_within_bounds.
        lo = min(bounds.low, 1 - bounds.high) * total - 1
        hi = max(bounds.high, 1 - bounds.low) * total + 1
        assert lo < moved < hi, plan
        kept_lo, kept_hi = bounds.kept_range(total)
        assert kept_lo <= total - moved <= kept_hi or (method == "aligned" and kept_lo <= moved <= kept_hi)


# -- shape ---------------------------------------------------------------------------------


def test_hand_tree_shape():
    t = hand_tree()
    assert t.root == "root"
    assert set(t.leaves()) == set("abcde") and set(t.inner_nodes()) == {"root", "e1", "e2"}
    assert t.children("root") == ["e1", "e2"] and t.children("e1") == ["a", "b", "c"]
    assert t.parent("a") == "e1" and t.parent("e1") == "root" and t.parent("root") is None
    assert t.path("d") == ("root", "e2", "d") and t.depth("d") == 2 and t.depth("root") == 0
    assert t.child_toward("root", "d") == "e2" and t.child_toward("e2", "d") == "d"
    assert t.child_toward("e1", "d") is None
    assert t.lca("a", "b") == "e1" and t.lca("a", "d") == "root"
    assert all(t.state(x) is State.IDLE for x in t.leaves())
    assert t.is_leaf("a") and not t.is_leaf("e1")
    with pytest.raises(TreeError):
        t.owner(SPACE.first)


def test_shape_errors():
    with pytest.raises(TreeError):
        LogicalBTree(SPACE, "root", {"root": ["e1", "e2"], "e1": ["a"], "e2": ["a"]})
    with pytest.raises(TreeError):
        LogicalBTree(SPACE, "root", {"root": ["e1"], "e1": ["a"], "orphan": ["b"]})


# -- bootstrap -------------------------------------------------------------------------------


def test_bootstrap_organic_hand_tree():
    t = hand_tree()
    first_idle = t.leaves_in(State.IDLE)[0]
    moves = t.bootstrap_organic()
    assert moves == [Move(SPACE, None, first_idle)]
    assert t.blocks(first_idle) == [SPACE] and t.state(first_idle) is State.BUSY
    check_invariants(t, [SPACE.first, SPACE.last])
    with pytest.raises(TreeError):
        t.bootstrap_organic()
    with pytest.raises(TreeError):
        t.bootstrap_preallocate(2)
    t2 = hand_tree()
    assert t2.bootstrap_organic("d") == [Move(SPACE, None, "d")]
    assert t2.owner(SPACE.last) == "d"


def sizes_by_leaf(tree):
    return {leaf: sum(b.size for b in tree.blocks(leaf)) for leaf in tree.leaves_in(State.BUSY)}


def check_preallocation(tree: LogicalBTree, count: int, tolerance: float, moves) -> None:
    check_invariants(tree)
    assert all(m.source is None for m in moves)
    assert sorted((m.block, m.target) for m in moves) == sorted(tree.partition())
    busy = tree.leaves_in(State.BUSY)
    assert len(busy) == count
    # shares follow usable leaves (largest remainder): every subtree gets floor or ceil
    chosen = set(busy)

    def below(node):
        return [leaf for leaf in tree.leaves() if node in tree.path(leaf)]

    for node in tree.inner_nodes():
        n_node = sum(1 for leaf in below(node) if leaf in chosen)
        usable_node = len(below(node))
        for child in tree.children(node):
            leaves = [child] if tree.is_leaf(child) else below(child)
            got = sum(1 for leaf in leaves if leaf in chosen)
            floor = n_node * len(leaves) // usable_node
            ceil = -(-n_node * len(leaves) // usable_node)
            assert floor <= got <= ceil, (node, child, got, n_node, len(leaves), usable_node)
    # loads: each leaf within (1 +- 2*tolerance) per level of the exact share
    levels = max(tree.depth(leaf) for leaf in tree.leaves())
    share = tree.space.size / count
    for leaf, size in sizes_by_leaf(tree).items():
        if tolerance == 0:
            assert abs(size - share) <= levels + 1, (leaf, size, share)
        else:
            low, high = (1 - 2 * tolerance) ** levels - 1e-9, (1 + 2 * tolerance) ** levels + 1e-9
            assert low <= size / share <= high, (leaf, size / share)


@pytest.mark.parametrize("count", [1, 2, 3, 4, 5])
def test_bootstrap_preallocate_hand_tree(count):
    for tolerance in (0.0, 0.1, 0.2):
        t = hand_tree()
        moves = t.bootstrap_preallocate(count, tolerance)
        check_preallocation(t, count, tolerance, moves)


def test_bootstrap_preallocate_errors():
    for bad in (0, 6, -1):
        with pytest.raises(TreeError):
            hand_tree().bootstrap_preallocate(bad)
    tiny = hand_tree(Block.parse("10.0.0.0/31"))  # 2 IDs
    with pytest.raises(TreeError):
        tiny.bootstrap_preallocate(3)
    tiny.bootstrap_preallocate(2)
    check_invariants(tiny)
    assert sorted(sizes_by_leaf(tiny).values()) == [1, 1]


@pytest.mark.parametrize("plen", [27, 29, 30, 31, 32])
def test_bootstrap_preallocate_tiny_spaces(plen):
    space = Block(0x0A000000, plen)
    for count in range(1, min(5, space.size) + 1):
        t = hand_tree(space)
        moves = t.bootstrap_preallocate(count)
        check_invariants(t)
        assert len(t.leaves_in(State.BUSY)) == count
        assert sorted(m.block for m in moves) == [b for b, _ in t.partition()]


def test_bootstrap_preallocate_skips_failed_leaves():
    t = hand_tree()
    t.fail("a")
    t.fail("d")
    t.bootstrap_preallocate(3)
    check_invariants(t)
    assert set(t.leaves_in(State.BUSY)) == {"b", "c", "e"}
    t2 = hand_tree()
    t2.fail("a")
    with pytest.raises(TreeError):
        t2.bootstrap_preallocate(5)


@pytest.mark.parametrize("policy", ["preallocate:5", "preallocate:4", "preallocate"])
def test_the_policy_spreads_over_the_usable_leaves_when_fewer_are_left_than_it_wants(policy):
    """A controller whose servers failed before the first build builds on the
    others (the tree alone refuses: above) instead of failing every tick."""
    t = hand_tree()
    for leaf in "abc":
        t.fail(leaf)
    bootstrap = Bootstrap.parse(policy)
    bootstrap.apply(t)
    check_invariants(t)
    assert set(t.leaves_in(State.BUSY)) == {"d", "e"}
    assert bootstrap.wanted(t) == {"preallocate:5": 5, "preallocate:4": 4, "preallocate": 2}[policy]


@pytest.mark.parametrize("count", [1, 2, 3])
def test_bootstrap_preallocate_with_a_fully_failed_subtree(count):
    t = hand_tree()
    t.fail("d")
    t.fail("e")
    t.bootstrap_preallocate(count)
    check_invariants(t)
    assert len(t.leaves_in(State.BUSY)) == count
    assert not set(t.leaves_in(State.BUSY)) & {"d", "e"}


@pytest.mark.parametrize("name", ["fat4", "fat6", "fat8", "three", "three_up2", "two"])
@pytest.mark.parametrize("space", [SPACE, SPACE6], ids=["v4", "v6"])
def test_bootstrap_on_topologies(name, space):
    tree = topo_tree(name, space)
    tree.bootstrap_organic()
    check_invariants(tree, [space.first, space.last])
    n = len(tree.leaves())
    for count in sorted({1, 2, 3, 7, n // 3, n // 2 + 1, n}):
        for tolerance in (0.1, 0.05, 0.0):
            tree = topo_tree(name, space)
            moves = tree.bootstrap_preallocate(count, tolerance)
            check_preallocation(tree, count, tolerance, moves)
        tree = topo_tree(name, space)
        tree.bootstrap_preallocate(count)          # the default tolerance: loads within 2x
        check_invariants(tree)
        sizes = sizes_by_leaf(tree)
        assert len(sizes) == count and max(sizes.values()) <= 2 * min(sizes.values())


# -- splits: targeted cases ---------------------------------------------------------------------


def make_sim(method, keys, tree=None, leaf="a", cap=10**9, bounds=BOUNDS):
    tree = tree or hand_tree()
    tree.bootstrap_organic(leaf)
    sim = Sim(tree, method, bounds, cap)
    for k in keys:
        sim.keys.add(k)
    return sim


METHODS = ["traversal", "aligned"]


@pytest.mark.parametrize("method", METHODS)
def test_split_goes_to_idle_sibling_first_then_nearest(method):
    rng = random.Random(7)
    sim = make_sim(method, [SPACE.first + rng.randrange(SPACE.size) for _ in range(200)])
    t = sim.tree
    sim.split("a")                      # idle siblings b, c exist
    assert sim.plans[-1].target in ("b", "c")
    busy = [leaf for leaf in "abc" if t.state(leaf) is State.BUSY]
    assert len(busy) == 2
    sim.split(busy[0])                  # one sibling left
    assert {t.state(leaf) for leaf in "abc"} == {State.BUSY}
    sim.split("a")                      # e1 is full: the nearest idle leaf is under e2
    assert sim.plans[-1].target in ("d", "e")
    check_invariants(t, sim.keys)


@pytest.mark.parametrize("method", METHODS)
def test_split_with_no_idle_leaf_returns_a_refusal(method):
    t = hand_tree()
    t.bootstrap_preallocate(5)
    sim = Sim(t, method)
    for i in range(100):
        sim.keys.add(t.blocks("a")[0].first + i * 3)
    plan = plan_split(t, "a", sim.oracle, method=method)
    assert not plan.ok and plan.target is None
    assert "no idle leaf" in plan.reason
    with pytest.raises(ValueError):
        apply_split(t, plan)
    check_invariants(t)


@pytest.mark.parametrize("method", METHODS)
def test_split_refusals(method):
    t = hand_tree()
    t.bootstrap_organic("a")
    sim = Sim(t, method)
    plan = plan_split(t, "b", sim.oracle, method=method)   # idle leaf
    assert not plan.ok and "idle" in plan.reason
    plan = plan_split(t, "a", sim.oracle, method=method)   # no keys
    assert not plan.ok and plan.reason
    sim.keys.add(SPACE.first + 5)
    plan = plan_split(t, "a", sim.oracle, method=method)   # one key
    assert not plan.ok and plan.reason
    sim.keys.add(SPACE.first + 500)
    with pytest.raises(ValueError):
        plan_split(t, "a", sim.oracle, method="bogus")


@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize("heavy_at", ["start", "middle", "end"])
def test_heavy_single_id_gives_out_of_bounds_plan_with_reason(method, heavy_at):
    where = {"start": SPACE.first, "middle": SPACE.first + SPACE.size // 2 + 12345,
             "end": SPACE.last}[heavy_at]
    keys = ([where] * 70 + [SPACE.first + 1000 + 7919 * i for i in range(15)]
            + [SPACE.last - 7919 * i - 3 for i in range(15)])
    sim = make_sim(method, keys)
    plan = plan_split(sim.tree, "a", sim.oracle, method=method)
    assert not plan.within_bounds
    assert plan.reason
    check_plan(sim.tree, plan, method, BOUNDS, sim.oracle)
    if plan.ok:
        moves = apply_split(sim.tree, plan)
        assert moves
        check_invariants(sim.tree, sim.keys)


@pytest.mark.parametrize("method", METHODS)
def test_all_keys_on_one_id(method):
    sim = make_sim(method, [SPACE.first + 99] * 50)
    plan = plan_split(sim.tree, "a", sim.oracle, method=method)
    assert not plan.within_bounds and plan.reason
    check_plan(sim.tree, plan, method, BOUNDS, sim.oracle)


@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize("total", [10, 20, 40, 100, 1000])
def test_even_keys_split_within_bounds(method, total):
    step = SPACE.size // total
    sim = make_sim(method, [SPACE.first + 17 + step * i for i in range(total)])
    moves = sim.split("a")
    plan = sim.plans[-1]
    assert plan.ok and plan.within_bounds and moves
    assert 0.4 <= plan.moved_fraction <= 0.6
    check_invariants(sim.tree, sim.keys)


EVEN = {n: [SPACE.first + 3 * i for i in range(n)] for n in (2, 3)}
HEAVY18 = [SPACE.first + 3 * i for i in range(7)] + [SPACE.first + 1000] * 11   # 7 light + 11 on one ID


@pytest.mark.parametrize("method, keys", [("aligned", EVEN[2]), ("aligned", EVEN[3]), ("traversal", EVEN[3]),
                                          ("traversal", HEAVY18)],
                         ids=["aligned-2", "aligned-3", "traversal-3", "traversal-heavy18"])
def test_within_bounds_means_moved_fraction_within_bounds(method, keys):
    sim = make_sim(method, keys)
    plan = plan_split(sim.tree, "a", sim.oracle, method=method)
    assert plan.ok
    if plan.within_bounds:
        assert 0.4 <= plan.moved_fraction <= 0.6, (plan.keys_moved, plan.keys_total)


def test_unsplittable_leaf_reason_does_not_blame_idle_leaves():
    t = hand_tree()
    t.bootstrap_organic("a")
    hot = Block(SPACE.first + 7, 32)
    t.transfer([hot], "b")                    # b owns exactly one ID
    keys = SortedList([hot.first] * 10)
    plan = plan_split(t, "b", lambda leaf, a, z: keys.bisect_right(z) - keys.bisect_left(a), method="aligned")
    assert not plan.ok and plan.reason
    assert t.leaves_in(State.IDLE), "c, d and e are idle"
    assert "no idle leaf" not in plan.reason, plan.reason


@pytest.mark.parametrize("where", [SPACE.first, SPACE.first + 5, SPACE.last])
def test_split_never_moves_every_key(where):
    sim = make_sim("aligned", [where] * 50)
    plan = plan_split(sim.tree, "a", sim.oracle, method="aligned")
    assert plan.keys_moved < plan.keys_total, plan


def test_split_bounds_parse_and_validate():
    assert SplitBounds.parse("0.4,0.6") == SplitBounds(0.4, 0.6)
    assert SplitBounds.parse("40,60") == SplitBounds(0.4, 0.6)
    assert SplitBounds.parse("0.5,0.5") == SplitBounds(0.5, 0.5)
    for bad in ("0.6,0.4", "0,0.5", "0.5,1", "x,y", "0.5"):
        with pytest.raises(ValueError):
            SplitBounds.parse(bad)
    assert SplitBounds().kept_range(100) == (40, 60)


# -- failures, joins --------------------------------------------------------------------------------


def test_fail_prefers_idle_sibling_then_nearest_then_busy():
    t = hand_tree()
    t.bootstrap_organic("a")
    r = t.fail("a")
    assert r.successor == "b" and r.same_parent and r.reason
    assert r.moves == (Move(SPACE, "a", "b"),)
    check_invariants(t)
    r = t.fail("b")
    assert r.successor == "c" and r.same_parent
    r = t.fail("c")                      # no idle leaf under e1: nearest idle is under e2
    assert r.successor == "d" and not r.same_parent
    check_invariants(t)
    r = t.fail("e")                      # idle leaf fails: nothing moves
    assert r.successor is None and r.moves == () and not r.same_parent
    with pytest.raises(TreeError):       # d is the last live leaf
        t.fail("d")
    assert t.state("d") is State.BUSY and t.blocks("d") == [SPACE]
    check_invariants(t)


def test_fail_last_live_leaf_raises_and_keeps_state():
    t = hand_tree()
    t.bootstrap_organic("a")
    for x in "bcde":
        t.fail(x)
    with pytest.raises(TreeError):
        t.fail("a")
    assert t.state("a") is State.BUSY and t.blocks("a") == [SPACE]
    check_invariants(t)
    with pytest.raises(TreeError):
        t.fail("b")  # already failed


def test_fail_without_idle_leaf_busy_neighbour_adopts():
    t = hand_tree()
    t.bootstrap_preallocate(5)
    before_c = t.blocks("c")
    r = t.fail("a")
    assert r.successor == "b" and r.same_parent
    assert "no idle leaf" in r.reason
    check_invariants(t)
    r = t.fail("d")
    assert r.successor == "e" and r.same_parent
    r = t.fail("e")                      # e2 empty: nearest busy is under e1
    assert r.successor in ("b", "c") and not r.same_parent
    assert set(before_c) <= set(t.blocks("c"))
    check_invariants(t)


def test_join_and_revive_and_remove():
    t = hand_tree()
    t.bootstrap_organic("a")
    t.join("f", "e2")
    assert t.state("f") is State.IDLE and t.parent("f") == "e2" and t.path("f") == ("root", "e2", "f")
    with pytest.raises(TreeError):
        t.join("f", "e2")
    with pytest.raises(TreeError):
        t.join("g", "root")           # groups below: servers join at the bottom
    with pytest.raises(TreeError):
        t.join("g", "nope")
    with pytest.raises(TreeError):
        t.join("g", "a")              # a leaf is not an inner node
    t.fail("b")
    with pytest.raises(TreeError):
        t.join("b", "e2")             # a failed leaf rejoins where it was
    t.join("b", "e1")
    assert t.state("b") is State.IDLE
    t.join_group("e3", "root")
    t.join("x", "e3")
    assert t.path("x") == ("root", "e3", "x")
    with pytest.raises(TreeError):
        t.join_group("e3", "root")
    with pytest.raises(TreeError):
        t.remove("c")                 # not failed
    t.fail("c")
    t.remove("c")
    assert "c" not in t.leaves() and t.children("e1") == ["a", "b"]
    check_invariants(t)
    r = t.leave("a")
    assert r.successor == "b" and r.same_parent and t.state("a") is State.FAILED
    t.remove("a")
    check_invariants(t)


def test_transfer_errors_and_sub_blocks():
    t = hand_tree()
    t.bootstrap_preallocate(2)
    owner = t.owner(SPACE.first)
    t.fail("c")
    with pytest.raises(TreeError):
        t.transfer([SPACE], "b")       # spans more than one block
    with pytest.raises(TreeError):
        t.transfer([Block(SPACE.first, 32)], "e1")   # not a leaf
    with pytest.raises(TreeError):
        t.transfer([Block(SPACE.first, 32)], "c")    # failed
    # a sub-block: the owner keeps the rest, re-covered
    idle = t.leaves_in(State.IDLE)[0]
    part = Block(SPACE.first + 4, 30)
    assert t.transfer([part], idle) == [Move(part, owner, idle)]
    check_invariants(t)
    assert t.owner(SPACE.first + 3) == owner and t.owner(SPACE.first + 4) == idle
    assert t.owner(SPACE.first + 8) == owner
    assert t.transfer([part], idle) == []   # already there


def test_carve_splits_a_block_in_place_without_moving_it():
    t = hand_tree()
    t.bootstrap_organic("a")
    part = Block(SPACE.first + 4, 30)
    t.carve(part)
    check_invariants(t)
    assert part in t.blocks("a") and len(t.blocks("a")) > 1
    assert {leaf for _, leaf in t.partition()} == {"a"}
    t.carve(part)   # already on its own
    assert t.blocks("a").count(part) == 1
    t.transfer([Block(SPACE.first, 30)], "b")
    with pytest.raises(TreeError):
        t.carve(Block(SPACE.first, 29))   # spans a's and b's blocks


def _graph_with_new_host(g: nx.Graph, edge: str, name: str) -> nx.Graph:
    g = g.copy()
    for _, _, d in g.edges(data=True):
        d["ports"] = dict(d["ports"])
    port = 1 + max(d["ports"][edge] for _, _, d in g.edges(edge, data=True))
    g.add_node(name, kind="host", role="storage", ip="10.250.0.1", mac="02:00:00:00:00:99")
    g.add_edge(edge, name, ports={edge: port, name: 0})
    return g


@pytest.mark.parametrize("name", ["fat4", "three_small", "two"])
@pytest.mark.parametrize("minimize", [True, False])
def test_join_changes_no_table(name, minimize):
    g = TOPOLOGIES[name]()
    c, tree, fabric = map_topology(g, SPACE)
    tree.bootstrap_preallocate(max(2, len(tree.leaves()) // 2))
    planner = FlowPlanner(tree, fabric, minimize=minimize)
    before = planner.tables()
    edge = [s for s in switches(g) if g.nodes[s]["layer"] == "edge"][-1]
    g2 = _graph_with_new_host(g, edge, "newhost")
    c2, _, fabric2 = map_topology(g2, SPACE)
    parent = c2.parent["newhost"]
    assert parent == c.group_of[edge]
    tree.join("newhost", parent)
    assert tree.state("newhost") is State.IDLE
    check_invariants(tree)
    assert planner.update([]) == {}
    assert planner.tables() == before
    assert FlowPlanner(tree, fabric2, minimize=minimize).tables() == before
    assert FlowPlanner(tree, fabric, minimize=minimize).tables() == before
    # revive-style join of a failed idle leaf changes nothing either
    idle = tree.leaves_in(State.IDLE)[0]
    tree.fail(idle)
    assert planner.update([]) == {}
    tree.join(idle, tree.parent(idle))
    assert FlowPlanner(tree, fabric2, minimize=minimize).tables() == before


# -- random sequences -------------------------------------------------------------------------------


def random_key(rng: random.Random, space: Block, clusters) -> int:
    if clusters and rng.random() < 0.8:
        lo, width = rng.choice(clusters)
        return lo + rng.randrange(width)
    return space.first + rng.randrange(space.size)


def run_sequence(tree: LogicalBTree, method: str, seed: int, steps: int, cap: int,
                 skewed: bool, bounds: SplitBounds = BOUNDS, cost=None, on_moves=None) -> Sim:
    rng = random.Random(seed)
    space = tree.space
    sim = Sim(tree, method, bounds, cap, cost)
    clusters = []
    if skewed:
        for _ in range(rng.randint(1, 3)):
            width = rng.choice([1, 3, 50, 1000, 77777])
            clusters.append((space.first + rng.randrange(space.size - width), width))
    if rng.random() < 0.5:
        moves = tree.bootstrap_organic(rng.choice(tree.leaves()))
    else:
        moves = tree.bootstrap_preallocate(rng.randint(1, max(1, len(tree.leaves()) // 2)))
    on_moves and on_moves(moves)
    check_invariants(tree)
    new_leaves = 0
    for _ in range(steps):
        op = rng.random()
        if op < 0.80:
            moves = []
            for _ in range(rng.randint(1, 20)):
                moves += sim.insert(random_key(rng, space, clusters))
        elif op < 0.88:
            busy = tree.leaves_in(State.BUSY)
            leaf = rng.choice(busy)
            moves = sim.split(leaf) if sim.count(leaf) >= 2 else []
        elif op < 0.95:
            live = [leaf for leaf in tree.leaves() if tree.state(leaf) is not State.FAILED]
            result = sim.fail(rng.choice(live))
            moves = list(result.moves) if result else []
        else:
            failed = tree.leaves_in(State.FAILED)
            if failed and rng.random() < 0.7:
                leaf = rng.choice(failed)
                parent = tree.parent(leaf)
                assert parent is not None, f"failed leaf {leaf} has no parent"
                tree.join(leaf, parent)
                assert tree.state(leaf) is State.IDLE
            elif on_moves is None:  # brand-new servers only when no fabric has to know them
                bottoms = [g for g in tree.inner_nodes()
                           if tree.children(g) and all(tree.is_leaf(c) for c in tree.children(g))]
                new_leaves += 1
                tree.join(f"new{new_leaves}", rng.choice(bottoms))
            moves = []
        on_moves and on_moves(moves)
        sample = sim.keys if len(sim.keys) < 300 else rng.sample(list(sim.keys), 300)
        check_invariants(tree, sample)
    check_invariants(tree, sim.keys)
    return sim


@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), method=st.sampled_from(METHODS), skewed=st.booleans(),
       bounds=st.sampled_from([BOUNDS, SplitBounds(0.3, 0.7), SplitBounds(0.5, 0.5)]))
def test_random_sequences_hand_tree(seed, method, skewed, bounds):
    run_sequence(hand_tree(), method, seed, steps=40, cap=30, skewed=skewed, bounds=bounds)


@settings(max_examples=12, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), name=st.sampled_from(["fat4", "three_small", "two", "three_up2"]),
       method=st.sampled_from(METHODS), skewed=st.booleans(), v6=st.booleans())
def test_random_sequences_topologies(seed, name, method, skewed, v6):
    tree = topo_tree(name, SPACE6 if v6 else SPACE)
    run_sequence(tree, method, seed, steps=50, cap=40, skewed=skewed)


@settings(max_examples=8, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), name=st.sampled_from(["fat4", "two", "three_small"]),
       skewed=st.booleans())
def test_random_sequences_aligned_with_planner_cost(seed, name, skewed):
    """'aligned' driven by the flow planner's cost; the planner follows every change
    and always equals a planner rebuilt from scratch."""
    tree = topo_tree(name)
    fabric = topo_fabric(name)
    rng = random.Random(seed)
    tree.bootstrap_organic()
    planner = FlowPlanner(tree, fabric)
    sim = Sim(tree, "aligned", BOUNDS, 40, cost=planner.cost_of)
    clusters = [(SPACE.first + 12345, 999)] if skewed else []
    for _ in range(400):
        moves = sim.insert(random_key(rng, SPACE, clusters))
        if moves:
            planner.update(moves)
            assert planner.tables() == FlowPlanner(tree, fabric).tables()
    check_invariants(tree, sim.keys)


@pytest.mark.parametrize("name", ["fat4", "two", "three_small"])
def test_cost_of_predicts_total_entries_and_leaves_planner_untouched(name):
    rng = random.Random(3)
    tree = topo_tree(name)
    fabric = topo_fabric(name)
    tree.bootstrap_organic()
    planner = FlowPlanner(tree, fabric)
    sim = Sim(tree, "aligned", cap=10**9, cost=planner.cost_of)
    for _ in range(600):
        sim.keys.add(random_key(rng, SPACE, []))
    for _ in range(12):
        leaf = max(tree.leaves_in(State.BUSY), key=sim.count)
        plan = plan_split(tree, leaf, sim.oracle, method="aligned", cost=planner.cost_of)
        if not plan.ok:
            break
        tables = planner.tables()
        predicted = planner.cost_of([Move(b, leaf, plan.target) for b in plan.move])
        assert planner.tables() == tables, "cost_of must not change the tables"
        assert FlowPlanner(tree, fabric).tables() == tables, "cost_of must restore the tries"
        planner.update(apply_split(tree, plan))
        assert planner.total_entries() == predicted
        check_invariants(tree, sim.keys)
