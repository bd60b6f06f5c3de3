"""btree.rebalance: moving a hot range off a busy leaf, within churn and table budgets.

Pure: random trees, random keys and random per-ID request loads (a hot spot
of a random width and place, over a background); after any sequence of
moves by load, splits by key count and merges, the partition stays exact,
each move kept to the churn limit and the table budget and shipped no more
load than its receiver could take, and the flow tables (`FakeNetwork`)
route every ID to its owner.
"""

from __future__ import annotations

import random

import pytest
from hypothesis import event, given, settings
from hypothesis import strategies as st
from sortedcontainers import SortedList

from btree.balance import transfers
from btree.flows import FlowPlanner
from btree.merge import apply_merge, plan_merge
from btree.rebalance import LOAD_WINDOW, ChurnLimit, RangeCount, plan_relief, plan_retire
from btree.split import SplitBounds, apply_split, plan_split
from btree.tree import LogicalBTree, State
from tests.unit.test_merge import check_routed, counted, largest
from tests.unit.test_tree_split import SPACE, check_invariants, hand_tree, topo_fabric, topo_tree


class Requests:
    """Requests per ID (a sorted list of IDs with repeats): the agent's `/ops`."""

    def __init__(self) -> None:
        self.ids: SortedList[int] = SortedList()

    def __call__(self, first: int, last: int) -> float:
        return float(self.ids.bisect_right(last) - self.ids.bisect_left(first))

    def on(self, tree: LogicalBTree) -> dict[str, float]:
        return {leaf: sum(self(b.first, b.last) for b in tree.blocks(leaf))
                for leaf in tree.leaves_in(State.BUSY)}


def keys_counter(keys: SortedList) -> RangeCount:
    return lambda first, last: keys.bisect_right(last) - keys.bisect_left(first)


def spread(tree: LogicalBTree) -> tuple[Requests, SortedList]:
    """64 keys on every busy leaf, evenly over its blocks, one request each."""
    requests, keys = Requests(), SortedList[int]()
    for leaf in tree.leaves_in(State.BUSY):
        ids = [i for b in tree.blocks(leaf) for i in range(b.first, b.last + 1, b.size // 64)]
        picked = ids[::max(1, len(ids) // 64)][:64]
        requests.ids.update(picked)
        keys.update(picked)
    return requests, keys


def test_a_hot_range_goes_to_the_coolest_neighbour_with_its_few_keys() -> None:
    tree = hand_tree()   # root: e1 (a b c), e2 (d e)
    tree.bootstrap_preallocate(5)
    requests, keys = spread(tree)
    hot = tree.blocks("a")[0]
    burst = range(hot.first + 5, hot.first + 5 + 40 * 1024, 1024)
    requests.ids.update([*burst, *burst, *burst])   # a narrow, hot range on a: 40 IDs, 3 requests each
    loads = requests.on(tree)
    plan = plan_relief(tree, "a", loads, requests, keys_counter(keys), max_keys=1_000, limit=1e9)
    assert plan.ok and plan.target in ("b", "c") and not plan.to_idle   # next door, not across the root
    (moved,) = plan.move
    assert burst[0] <= moved.first and moved.last <= burst[-1] + 1024   # a piece of the hot range
    mean = sum(loads.values()) / len(loads)
    should = min(loads["a"] - mean, mean - loads[plan.target])
    assert LOAD_WINDOW[0] * should <= plan.load_share * loads["a"] <= LOAD_WINDOW[1] * should
    assert plan.keys < 8   # a slice of a's keys, not half of them
    moves = tree.transfer(plan.move, plan.target)
    assert {m.target for m in moves} == {plan.target}
    check_invariants(tree)


def test_a_single_hot_id_is_named_and_not_moved() -> None:
    tree = hand_tree()
    tree.bootstrap_preallocate(5)
    requests, keys = spread(tree)
    hot = tree.blocks("a")[0].first + 7
    requests.ids.update([hot] * 5_000)
    plan = plan_relief(tree, "a", requests.on(tree), requests, keys_counter(keys), max_keys=1_000, limit=1e9)
    assert not plan.ok
    assert "single ID cannot be split" in plan.reason and SPACE.address(hot) in plan.reason


def test_the_churn_limit_refuses_a_range_with_too_many_keys() -> None:
    tree = hand_tree()
    tree.bootstrap_preallocate(5)
    requests, keys = spread(tree)
    for block in tree.blocks("a"):
        requests.ids.update(range(block.first, block.last, block.size // 64))   # a hot as a whole
    plan = plan_relief(tree, "a", requests.on(tree), requests, keys_counter(keys), max_keys=3, limit=1e9)
    assert not plan.ok and "churn limit" in plan.reason
    assert plan_relief(tree, "a", requests.on(tree), requests, keys_counter(keys), max_keys=64, limit=1e9).ok


def test_a_leaf_at_or_below_the_mean_is_not_relieved() -> None:
    tree = hand_tree()
    tree.bootstrap_preallocate(5)
    requests, keys = spread(tree)
    loads = requests.on(tree)
    plan = plan_relief(tree, "a", loads, requests, keys_counter(keys), max_keys=100, limit=1e9)
    assert not plan.ok and "not above the mean" in plan.reason


def test_an_idle_leaf_takes_the_load_only_when_no_busy_one_can() -> None:
    tree = hand_tree()
    tree.bootstrap_preallocate(3)    # two idle leaves
    requests, keys = spread(tree)
    busy = tree.leaves_in(State.BUSY)
    hot = tree.blocks(busy[0])[0]
    requests.ids.update(range(hot.first, hot.first + hot.size // 4, hot.size // 256))
    loads = requests.on(tree)
    near = plan_relief(tree, busy[0], loads, requests, keys_counter(keys), max_keys=1_000, limit=1e9)
    assert near.target is not None and not near.to_idle and tree.state(near.target) is State.BUSY
    # the cooler busy leaves promised to other operations: a split by load
    plan = plan_relief(tree, busy[0], loads, requests, keys_counter(keys), max_keys=1_000, limit=1e9,
                       avoid=busy[1:])
    assert plan.target is not None and plan.to_idle and tree.state(plan.target) is State.IDLE
    assert plan.target in tree.nearest_leaves(busy[0], State.IDLE)
    kept = plan_relief(tree, busy[0], loads, requests, keys_counter(keys), max_keys=1_000, limit=1e9,
                       avoid=busy[1:], with_idle=False)   # the idle pool kept for splits and fail-over
    assert not kept.ok and "no idle leaf" in kept.reason


def test_churn_limit_per_rebalance_and_per_minute() -> None:
    now = [0.0]
    churn = ChurnLimit(per_rebalance=0.1, per_minute=0.25, clock=lambda: now[0])
    assert churn.allowance(1_000) == 100
    churn.spend(60)
    assert churn.allowance(1_000, this_rebalance=60) == 40   # the rest of this rebalance's share
    churn.spend(40)
    churn.spend(100)
    assert churn.allowance(1_000) == 50
    now[0] = 59.9
    churn.spend(50)
    assert churn.allowance(1_000) == 0
    now[0] = 60.0   # the first three have left the minute
    assert churn.allowance(1_000) == 100
    with pytest.raises(ValueError):
        ChurnLimit(per_rebalance=5, per_minute=0.2)


@settings(max_examples=40, deadline=None)
@given(name=st.sampled_from(["fat4", "three_small", "three_up2"]), seed=st.integers(0, 2**32 - 1),
       rounds=st.integers(1, 12), churn=st.floats(0.01, 0.2), slack=st.one_of(st.none(), st.integers(0, 4)))
def test_moves_by_load_keep_the_partition_exact_the_budgets_and_every_id_routed(
        name: str, seed: int, rounds: int, churn: float, slack: int | None) -> None:
    """Rounds of: a hot spot somewhere, the greedy transfers, one move by
    load off the hottest leaf (through `ChurnLimit`), and now and then a
    split by key count or a merge. After each step the partition is exact;
    each move kept its keys within the allowance, its table changes within
    the budget, and shipped at most LOAD_WINDOW[1] of what its receiver
    could take; at the end the tables deliver every ID to its owner."""
    rng = random.Random(seed)
    tree = topo_tree(name)
    fabric = topo_fabric(name)
    tree.bootstrap_preallocate(max(2, len(tree.leaves()) * 2 // 3))
    planner = FlowPlanner(tree, fabric, minimize=True)
    budget = None if slack is None else largest(planner) + slack
    keys: SortedList[int] = SortedList(rng.randrange(SPACE.first, SPACE.last + 1) for _ in range(400))
    now = [0.0]
    limit = ChurnLimit(per_rebalance=churn, per_minute=min(1.0, 3 * churn), clock=lambda: now[0])
    moved = 0
    for _ in range(rounds):
        now[0] += rng.uniform(0, 40)
        requests = Requests()
        requests.ids.update(keys)
        centre, width = rng.randrange(SPACE.first, SPACE.last), SPACE.size >> rng.randint(3, 20)
        requests.ids.update(min(SPACE.last, max(SPACE.first, int(rng.gauss(centre, width))))
                            for _ in range(rng.randint(0, 2_000)))
        loads = requests.on(tree)
        if len(loads) < 2:
            break
        plan_of = transfers(loads, limit=float("inf"))
        if not plan_of:
            continue
        source = plan_of[0].source
        allowance = limit.allowance(len(keys))
        plan = plan_relief(tree, source, loads, requests, keys_counter(keys), max_keys=allowance,
                           limit=float("inf"), fits=planner.keeps(budget), cost=planner.cost_of)
        if plan.ok:
            assert plan.target is not None and plan.target != source
            assert plan.keys <= allowance
            mean = sum(loads.values()) / len(loads)
            room = mean - loads[plan.target] if tree.state(plan.target) is State.BUSY else mean
            assert plan.load_share * loads[source] <= LOAD_WINDOW[1] * min(loads[source] - mean, room) + 1e-6
            planner.update(tree.transfer(plan.move, plan.target))
            limit.spend(plan.keys)
            moved += 1
        else:
            event(plan.reason.split(":")[0][:40])
        assert budget is None or largest(planner) <= budget
        check_invariants(tree, keys)
        if rng.random() < 0.3:
            held = counted(tree, keys)
            full = max(held, key=held.__getitem__)
            merge = plan_merge(tree, full, held.__getitem__, capacity=max(held.values()) * 2,
                               fits=planner.keeps(budget))
            if merge.ok:
                planner.update(apply_merge(tree, merge))
            split = plan_split(tree, full, lambda _l, a, b: keys.bisect_right(b) - keys.bisect_left(a),
                               SplitBounds(), "aligned", planner.cost_of, fits=planner.keeps(budget))
            if split.ok:
                planner.update(apply_split(tree, split))
            assert budget is None or largest(planner) <= budget
            check_invariants(tree, keys)
    event(f"moves: {min(moved, 3)}{'+' if moved >= 3 else ''}")
    check_routed(planner)


def test_plan_relief_refuses_an_idle_or_unmeasured_leaf() -> None:
    tree = hand_tree()
    tree.bootstrap_preallocate(3)
    idle = tree.leaves_in(State.IDLE)[0]
    plan = plan_relief(tree, idle, {}, lambda a, b: 0.0, lambda a, b: 0, max_keys=1, limit=1.0)
    assert not plan.ok and "not a busy leaf" in plan.reason


def test_a_cold_busy_leaf_is_retired_into_its_least_loaded_nearest_neighbour() -> None:
    tree = hand_tree()   # root: e1 (a b c), e2 (d e)
    tree.bootstrap_preallocate(5)
    loads = {"a": 900.0, "b": 300.0, "c": 5.0, "d": 250.0, "e": 400.0}
    keys = {"a": 50, "b": 40, "c": 3, "d": 30, "e": 30}
    assert not plan_retire(tree, loads, keys.__getitem__, max_keys=2).ok   # the churn limit
    plan = plan_retire(tree, loads, keys.__getitem__, max_keys=10)
    assert (plan.source, plan.target, plan.keys) == ("c", "b", 3)   # b: beside c and cooler than a
    tree.transfer(tree.blocks("c"), "b")
    assert tree.state("c") is State.IDLE
    check_invariants(tree)
    assert not plan_retire(tree, {**loads, "c": 40.0}, keys.__getitem__,
                           max_keys=10).ok   # nobody busy under a tenth of the median
