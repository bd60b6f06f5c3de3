"""A rebalance as a saga: moves of hot ranges off one server, each through
the move a split uses (`controller.move`: copy, assign, flows, commit,
serve), so that a move is as loss-free as a split and is undone or
finished the same way when a server fails in its middle. A cold busy
server is first retired with a merge (`controller.move.merge`).

When: the core starts one after a complete poll of the switches' counters
once the imbalance model (`btree.balance.ImbalanceModel`) has seen `hold`
harmful polls in a row; the switches are the trigger because watching them
costs the servers nothing. Then the busy servers' agents are asked once for
the requests they served (`ADMIN.ops`): the plan is made in requests, the
unit the balance is about, and a spread in them (CoV/sqrt(n), the factor
without its urgency, which the packets already showed) not above the
threshold ends it there. What: `btree.rebalance.plan_relief` for the
busiest server, on its agent's per-range request and key counts, for up to
`MOVES_PER_REBALANCE` moves, re-planned after each with the load it shifted;
every move within the churn allowance (`ChurnLimit`) and the table budget.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from btree.balance import spread
from btree.rebalance import RelievePlan, plan_relief, plan_retire
from btree.tree import State
from client_lib.api.admin import ADMIN, CountRequest, ops_resolution
from client_lib.api.rest import Outcome
from controller.move import merge, move_blocks
from controller.oracles import KEYS, REQUESTS, Ask, answered
from controller.saga import Cancelled, Operation, Saga, StepError
from controller.steps import CallAgent
from controller.world import SagaWorld

MOVES_PER_REBALANCE = 4
"""Moves one rebalance makes at most: a hot server sheds its excess to a few
receivers, each taking at most its own deficit."""


def rebalance_saga(world: SagaWorld, op: Operation, source: str, packets: Mapping[str, float]) -> Saga:
    """Move load off the busiest server; `source` is the busiest by `packets`
    (the switches' count a second, which started this), the one relieved
    unless the agents' request counts name another."""
    started = world.clock()
    stored = world.stored_keys()   # before any move: a copy in flight counts twice in the heartbeats
    op.step = "plan"
    try:
        loads = yield from _measured(world, packets)
    except Cancelled as why:
        return world.outcome_event("rebalance-cancelled", server=source, reason=str(why))
    uneven = spread(list(loads.values()))
    if uneven <= world.settings.imbalance_threshold:
        return world.outcome_event("rebalance-refused", server=source, reason=(
            f"balanced in requests: their imbalance (CoV/sqrt(n)) is {uneven:.3f}, not above "
            f"{world.settings.imbalance_threshold}"))
    done: list[dict[str, Any]] = []
    retired = yield from _retire(world, op, loads, stored, done)
    if isinstance(retired, Outcome):
        return retired
    free = set(loads) - (world.reserved() - op.involves)
    if free:
        source = max(sorted(free), key=loads.__getitem__)
        op.involves.add(source)
    reason = ""
    for _ in range(MOVES_PER_REBALANCE):
        allowance = world.churn.allowance(stored, sum(int(m["keys_moved"]) for m in done))
        op.step = "plan"
        try:
            plan = yield from _planned(world, op, source, loads, packets, allowance)
        except StepError as failed:
            reason = f"counting: {failed}"
            break
        except Cancelled as why:
            if not done:
                return world.outcome_event("rebalance-cancelled", server=source, reason=str(why))
            reason = f"cancelled: {why}"
            break
        if not plan.ok or plan.target is None:
            reason = plan.reason
            break
        op.involves.add(plan.target)
        moved = yield from move_blocks(world, op, "rebalance", source, list(plan.move), plan.target)
        if isinstance(moved, Outcome):   # undone: the moves before it stand
            if not done:
                return moved
            reason = f"{moved.operation} (to {plan.target}): {moved.detail.get('reason', '')}"
            break
        keys = int(moved["keys_moved"])
        world.churn.spend(keys)
        world.moved_keys(source, plan.target, keys)
        shifted = plan.load_share * loads[source]
        loads[source] -= shifted
        loads[plan.target] = loads.get(plan.target, 0.0) + shifted
        done.append({**moved, "load_share": round(plan.load_share, 4), "to_idle": plan.to_idle})
    if not done:
        return world.outcome_event("rebalance-refused", server=source, reason=reason)
    return world.outcome_event("rebalance", ok=True, server=source, moves=done,
                               keys_moved=sum(int(m["keys_moved"]) for m in done),
                               total_s=round(world.clock() - started, 4), stopped=reason)


def _retire(world: SagaWorld, op: Operation, loads: dict[str, float], stored: int,
            done: list[dict[str, Any]]) -> Saga:
    """First, a cold busy server goes idle (`plan_retire`): its blocks move to
    a neighbour (`controller.move.merge`), and `loads` and `done` say so.
    None, or the outcome that ends the rebalance (the move was undone)."""
    retire = plan_retire(world.tree_or_raise(), loads,
                         lambda leaf: world.registry[leaf].keys // world.settings.replicas,
                         max_keys=world.churn.allowance(stored), avoid=world.reserved() - op.involves,
                         fits=world.planner_or_raise().keeps(world.settings.table_budget))
    if not retire.ok or retire.source is None or retire.target is None:
        return None
    moved = yield from merge(world, op, retire)
    if isinstance(moved, Outcome):
        return moved
    world.churn.spend(int(moved["keys_moved"]))
    loads[retire.target] += loads.pop(retire.source)
    done.append({**moved, "to_idle": False, "retired": retire.source})
    return None


def _measured(world: SagaWorld, packets: Mapping[str, float]) -> Saga:
    """Requests a second per busy server, each from its agent's `/ops` over the
    whole space. Why not the packets: a busy server's clients pipeline their
    requests, so it gets more of them per packet, and packets understate its
    share (the hot-spot run: 1.4x the mean in packets was 2x in requests).
    The packets, as they are, if any agent does not answer (units are not mixed)."""
    names = sorted(packets)
    space = world.settings.space
    try:
        reports = yield [CallAgent(server=name, url=world.registry[name].admin_url, route=ADMIN.ops,
                                   body=CountRequest([(space.first, space.last)])) for name in names]
    except StepError as failed:
        world.event("rebalance-on-packets", reason=str(failed))
        return dict(packets)
    return {name: report.rates()[0] for name, report in zip(names, reports, strict=True)}


def _planned(world: SagaWorld, op: Operation, source: str, loads: Mapping[str, float],
             packets: Mapping[str, float], allowance: int) -> Saga:
    """One move's plan; an idle server may receive only if `source` is over
    `--load-capacity` by the switches' count."""
    tree = world.tree_or_raise()
    planner = world.planner_or_raise()
    busy = {leaf: load for leaf, load in loads.items() if tree.state(leaf) is State.BUSY}

    def decide(asks: Mapping[str, Ask]) -> RelievePlan:
        return plan_relief(tree, source, busy, asks[REQUESTS], asks[KEYS], max_keys=allowance,
                           limit=math.inf,
                           avoid=world.reserved() - op.involves | world.out_of_service(),
                           fits=planner.keeps(world.settings.table_budget), cost=planner.cost_of,
                           finest=ops_resolution(world.settings.space),
                           with_idle=packets.get(source, 0.0) >= world.settings.load_capacity)

    return (yield from answered(world, source, decide,
                                {REQUESTS: [(b.first, b.last) for b in tree.blocks(source)]}))
