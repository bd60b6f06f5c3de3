"""A split as a saga: plan, then the move of the planned half
(`controller.move`: copy, assign, flows, commit, serve, each with its
compensation) to an idle leaf and r-1 backups placed across racks.

The plan counts keys with the source agent's counts as the oracle
(`controller.oracles`). A plan that wants room (no idle leaf near) first
frees one with a merge (`controller.move.merge`): the coldest busy server
that fits into a neighbour gives it all its blocks, and the split is
planned again.
"""

from __future__ import annotations

from collections.abc import Mapping

from btree.merge import plan_merge
from btree.split import SplitPlan, plan_split
from client_lib.api.rest import Outcome
from controller.move import merge, move_blocks
from controller.oracles import KEYS, Ask, answered
from controller.saga import Cancelled, Operation, Saga, StepError
from controller.world import SagaWorld


def split_saga(world: SagaWorld, op: Operation, name: str) -> Saga:
    started = world.clock()
    plan = yield from _planned(world, op, name)
    if isinstance(plan, SplitPlan) and plan.wants_room and world.settings.merge:
        merged = yield from _merge_for(world, op, name)
        if merged is not None:
            return merged   # the merge did not end well: its outcome is the split's
        plan = yield from _planned(world, op, name)
    if isinstance(plan, Outcome):
        return plan
    if not plan.ok or plan.target is None:
        return world.outcome_event("split-refused", server=name, reason=plan.reason)
    moved = yield from move_blocks(world, op, "split", name, list(plan.move), plan.target)
    if isinstance(moved, Outcome):
        return moved
    record = {**moved, "keys_total": plan.keys_total, "total_s": round(world.clock() - started, 4)}
    world.record_split(record)
    return world.outcome_event("split", ok=True, **record)


def _planned(world: SagaWorld, op: Operation, name: str) -> Saga:
    """The split's plan, or the outcome that ends it (counting failed, or cancelled)."""
    op.step = "plan"
    try:
        return (yield from _plan(world, op, name))
    except StepError as failed:
        return world.outcome_event("split-failed", server=name, reason=f"counting keys: {failed}")
    except Cancelled as why:
        return world.outcome_event("split-cancelled", server=name, reason=str(why))


def _merge_for(world: SagaWorld, op: Operation, name: str) -> Saga:
    """Free a busy server near `name` for its split (`btree.merge`): the
    coldest one that fits into a neighbour moves all its blocks there, as a
    split moves its half. None once it has (or when no merge fits: the split
    is then refused as planned); else the outcome that ends the split."""
    room = plan_merge(world.tree_or_raise(), name,
                      lambda leaf: world.registry[leaf].keys if leaf in world.registry else 0,
                      world.capacity(world.registry[name]), avoid=world.reserved() - op.involves,
                      fits=world.planner_or_raise().keeps(world.settings.table_budget))
    if not room.ok:
        world.event("merge-refused", server=name, reason=room.reason)
        return None
    moved = yield from merge(world, op, room)
    if isinstance(moved, Outcome):
        return moved
    world.outcome_event("merge", ok=True, **moved, freed_for=name)
    return None


def _plan(world: SagaWorld, op: Operation, name: str) -> Saga:
    """The planner on the agent's key counts (`controller.oracles`), its
    blocks' own counts fetched first."""
    tree = world.tree_or_raise()
    planner = world.planner_or_raise()

    def decide(asks: Mapping[str, Ask]) -> SplitPlan:
        keys = asks[KEYS]
        return plan_split(tree, name, lambda _leaf, first, last: keys(first, last), world.settings.bounds,
                          method="aligned", cost=planner.cost_of,
                          avoid=world.reserved() - op.involves,
                          fits=planner.keeps(world.settings.table_budget))

    return (yield from answered(world, name, decide, {KEYS: [(b.first, b.last) for b in tree.blocks(name)]}))
