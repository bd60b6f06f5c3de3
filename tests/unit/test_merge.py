"""btree.merge: freeing a cold busy leaf for a split that has no idle one.

Pure: random trees from the builders, random keys and capacities; after any
sequence of inserts, merges and splits the partition stays exact, every
merge respects its fill limit and frees the nearest leaf it can, and the
flow tables (`FakeNetwork`) route every ID to its owner.
"""

from __future__ import annotations

import random

import pytest
from hypothesis import event, given, settings
from hypothesis import strategies as st
from sortedcontainers import SortedList

from btree.fake_network import FakeNetwork, misdelivered
from btree.flows import FlowPlanner
from btree.merge import MergePlan, apply_merge, plan_merge
from btree.split import SplitBounds, apply_split, plan_split
from btree.tree import LogicalBTree, State
from tests.unit.test_tree_split import (
    SPACE,
    check_invariants,
    common_depth,
    hand_tree,
    topo_fabric,
    topo_tree,
)


def counted(tree: LogicalBTree, keys: SortedList) -> dict[str, int]:
    return {leaf: sum(keys.bisect_right(b.last) - keys.bisect_left(b.first) for b in tree.blocks(leaf))
            for leaf in tree.leaves()}


def test_the_coldest_sibling_is_freed_into_its_coldest_sibling_that_fits() -> None:
    tree = hand_tree()   # root: e1 (a b c), e2 (d e)
    tree.bootstrap_preallocate(5)
    held = {"a": 90, "b": 30, "c": 20, "d": 1, "e": 2}
    plan = plan_merge(tree, "a", held.__getitem__, capacity=100)
    # b and c sit beside a: c (20) is colder; it goes into b (30 + 20 <= 80), never into full a
    assert plan == MergePlan("c", "b", 20, "")
    moves = apply_merge(tree, plan)
    assert tree.state("c") is State.IDLE and {m.target for m in moves} == {"b"}
    check_invariants(tree)


def test_the_freed_leaf_stays_near_even_if_its_keys_go_further() -> None:
    tree = hand_tree()
    tree.bootstrap_preallocate(5)
    held = {"a": 90, "b": 60, "c": 50, "d": 10, "e": 5}
    # c is freed (beside a, where the split will go); b cannot take it (110), e can
    assert plan_merge(tree, "a", held.__getitem__, capacity=100) == MergePlan("c", "e", 50, "")


def test_a_merge_frees_a_leaf_further_up_only_when_none_near_can_be() -> None:
    tree = hand_tree()
    tree.bootstrap_preallocate(5)
    held = {"a": 90, "b": 79, "c": 79, "d": 10, "e": 5}
    assert plan_merge(tree, "a", held.__getitem__, capacity=100) == MergePlan("e", "d", 5, "")


def test_nothing_fits_within_the_fill_limit() -> None:
    tree = hand_tree()
    tree.bootstrap_preallocate(5)
    held = {"a": 90, "b": 45, "c": 45, "d": 45, "e": 45}
    plan = plan_merge(tree, "a", held.__getitem__, capacity=100)
    assert not plan.ok and "80%" in plan.reason
    with pytest.raises(ValueError):
        apply_merge(tree, plan)
    with pytest.raises(ValueError):
        plan_merge(tree, "a", held.__getitem__, capacity=100, fill=0)


def test_leaves_promised_elsewhere_are_neither_freed_nor_filled() -> None:
    tree = hand_tree()
    tree.bootstrap_preallocate(5)
    held = {"a": 90, "b": 30, "c": 20, "d": 1, "e": 2}
    plan = plan_merge(tree, "a", held.__getitem__, capacity=100, avoid={"c"})
    assert plan.source not in ("a", "c") and plan.target not in ("a", "c")
    assert plan == MergePlan("b", "d", 30, "")   # b is freed beside a; its keys go to the coldest that fits


def check_routed(planner: FlowPlanner) -> None:
    """The planner's tables (`FakeNetwork`) deliver every ID of the space, from
    every switch with hosts, to the owner the tree says."""
    ingress = sorted({d for d, _ in planner.fabric.hosts.values()})
    assert misdelivered(FakeNetwork.from_planner(planner), planner.tree.partition(), SPACE, ingress) == []


def largest(planner: FlowPlanner) -> int:
    return max(len(planner.group_entries(group)) for group in planner.groups())


@settings(max_examples=40, deadline=None)
@given(name=st.sampled_from(["fat4", "three_small", "three_up2"]), seed=st.integers(0, 2**32 - 1),
       capacity=st.integers(20, 80), skew=st.integers(1, 6), slack=st.one_of(st.none(), st.integers(0, 6)))
def test_merges_and_splits_keep_the_partition_exact_every_table_in_budget_and_every_id_routed(
        name: str, seed: int, capacity: int, skew: int, slack: int | None) -> None:
    """Skewed inserts into a pre-allocated tree; whenever a full leaf finds no
    idle leaf, a merge frees one first; with a table budget (`slack` entries
    above the bootstrap's largest table), both keep to it. After every step:
    the partition is exact, a merge left its receiver within the fill limit,
    the freed leaf was the nearest that could be (without a budget), every
    table is within the budget, and the tables deliver every ID to its owner."""
    rng = random.Random(seed)
    tree = topo_tree(name)
    fabric = topo_fabric(name)
    tree.bootstrap_preallocate(max(1, len(tree.leaves()) // 2))
    planner = FlowPlanner(tree, fabric, minimize=True)
    budget = None if slack is None else largest(planner) + slack
    fits = planner.keeps(budget)

    keys: SortedList[int] = SortedList()
    centre = rng.randrange(SPACE.first, SPACE.last)
    width = SPACE.size >> skew * 3

    def oracle(_leaf: str, first: int, last: int) -> int:
        return keys.bisect_right(last) - keys.bisect_left(first)

    merges = 0
    for _ in range(capacity * len(tree.leaves()) * 6 // 10):
        ident = min(SPACE.last, max(SPACE.first, int(rng.gauss(centre, width))))
        keys.add(ident)
        owner = tree.owner(ident)
        if sum(oracle(owner, b.first, b.last) for b in tree.blocks(owner)) < capacity:
            continue
        held = counted(tree, keys)
        if not tree.nearest_leaves(owner, State.IDLE):
            plan = plan_merge(tree, owner, held.__getitem__, capacity, fits=fits)
            if not plan.ok and "budget" in plan.reason:
                event("a merge refused by the budget")
            if plan.ok:
                assert plan.source is not None and plan.target is not None
                assert held[plan.source] + held[plan.target] <= 0.8 * capacity
                busy = [x for x in tree.leaves() if x != owner and tree.state(x) is State.BUSY]
                for leaf in busy if budget is None else []:   # nothing nearer could have been freed
                    if common_depth(tree, owner, leaf) > common_depth(tree, owner, plan.source):
                        assert all(held[leaf] + held[other] > 0.8 * capacity
                                   for other in busy if other != leaf)
                planner.update(apply_merge(tree, plan))
                assert budget is None or largest(planner) <= budget
                merges += 1
                assert tree.state(plan.source) is State.IDLE
                check_invariants(tree, keys)
        split = plan_split(tree, owner, oracle, SplitBounds(), "aligned", planner.cost_of, fits=fits)
        if split.ok:
            planner.update(apply_split(tree, split))
            assert budget is None or largest(planner) <= budget
        elif "table budget" in split.reason:
            assert split.reason.startswith("switch ") and f"budget of {budget}" in split.reason
            event("a split refused by the budget")
    check_invariants(tree, keys)
    event(f"merges: {min(merges, 3)}+" if merges >= 3 else f"merges: {merges}")
    check_routed(planner)

