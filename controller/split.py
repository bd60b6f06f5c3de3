"""A split as a saga: plan, copy, flows, commit, each with its compensation.

Order (ARCHITECTURE.md, "Migration without loss"):

1. plan, with the source agent's key counts as the oracle;
2. copy: the source freezes the moving blocks (writes answer TRYAGAIN) and
   copies them to the target, which holds them unserved;
   undone by: abort the migration (the source unfreezes, the target discards);
3. flows: the tree hands the blocks to the target and every switch whose
   table changes gets its diff, confirmed by a barrier;
   undone by: the tree takes them back and those switches are re-synced to it;
4. commit: the target serves, the source deletes.
   If the answer is lost, the source's own record of the migration says
   which way it went; if the source cannot be asked, the target's ownership
   does. A commit that did not happen undoes 3 and 2.

If the source or the target fails meanwhile, the operation is cancelled at
its current step and leaves the blocks with whoever can serve them: before
3 with the source; after it, with the target if the source died (empty, and
said loudly: there is no replication yet), or back with the source if the
target died.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from btree.split import SplitPlan, apply_split, plan_split
from btree.tree import Move
from client_lib.api.admin import ADMIN, CountRequest, MigrateRequest, MigrationReport
from controller import migrations
from controller.saga import Cancelled, Operation, Saga, StepError
from controller.steps import CallAgent

if TYPE_CHECKING:
    from controller.core import MetaFlowCore

class _NeedCounts(Exception):
    """The planner asked for a count not fetched yet."""


def _oracle(counts: dict[tuple[int, int], int],
            missing: list[tuple[int, int]]) -> Callable[[str, int, int], int]:
    """Counts as the planner asks for them; one not fetched yet is noted in
    `missing` and stops this replay of the planner."""
    def oracle(_leaf: str, first: int, last: int) -> int:
        if (first, last) not in counts:
            missing.append((first, last))
            raise _NeedCounts
        return counts[(first, last)]
    return oracle


@dataclass(frozen=True)
class SplitResult:
    ok: bool
    detail: dict[str, Any]


def split_saga(core: MetaFlowCore, op: Operation, name: str) -> Saga:
    started = core.clock()
    source = core.registry[name]
    op.step = "plan"
    try:
        plan = yield from _plan(core, op, name)
    except StepError as failed:
        return core.outcome_event("split-failed", server=name, reason=f"counting keys: {failed}")
    except Cancelled as why:
        return core.outcome_event("split-cancelled", server=name, reason=str(why))
    if not plan.ok or plan.target is None:
        return core.outcome_event("split-refused", server=name, reason=plan.reason)
    target = core.registry[plan.target]
    op.involves.add(target.name)
    blocks = list(plan.move)

    op.step = "copy"
    copy = CallAgent(server=name, url=source.admin_url, route=ADMIN.migrate,
                     body=MigrateRequest(blocks, target.admin_url, core.settings.migration_lease_s))
    try:
        migration: MigrationReport = yield copy
    except (StepError, Cancelled) as failed:
        yield from migrations.abort_unknown(core, name, target.name, blocks)
        return core.outcome_event("split-aborted", server=name, target=target.name,
                                  reason=f"copy: {failed}")
    copied = core.clock()

    op.step = "flows"
    moves = apply_split(core.tree_or_raise(), plan)
    diff = core.planner_or_raise().update(moves)
    try:
        yield core.send_diff(diff)
    except StepError as failed:
        yield from _undo_flows(core, op, moves, list(diff))
        yield from migrations.abort(core, name, migration)
        return core.outcome_event("split-aborted", server=name, target=target.name,
                                  reason=f"flows: {failed}")
    except Cancelled as why:
        yield from _overtaken(core, op, name, target.name, moves, list(diff), migration, str(why))
        return core.outcome_event("split-cancelled", server=name, target=target.name, reason=str(why))
    flows_done = core.clock()

    op.step = "commit"
    try:
        committed = yield from migrations.commit(core, name, target.name, migration)
    except Cancelled as why:
        yield from _overtaken(core, op, name, target.name, moves, list(diff), migration, str(why))
        return core.outcome_event("split-cancelled", server=name, target=target.name, reason=str(why))
    if not committed:
        yield from _undo_flows(core, op, moves, list(diff))
        yield from migrations.abort(core, name, migration)
        return core.outcome_event("split-aborted", server=name, target=target.name,
                                  reason="the commit did not happen")
    finished = core.clock()
    record = {"server": name, "target": target.name, "blocks": [str(b) for b in blocks],
              "keys_moved": migration.keys, "keys_total": plan.keys_total,
              "switches": len(diff), "flow_mods": sum(len(d) for d in diff.values()),
              "copy_s": round(copied - started, 4), "flows_s": round(flows_done - copied, 4),
              "total_s": round(finished - started, 4)}
    core.splits.append(record)
    return core.outcome_event("split", ok=True, **record)


def _plan(core: MetaFlowCore, op: Operation, name: str) -> Any:
    """Replay the planner until every count it asks for is known, fetching
    the missing ones from the agent: the planner stays a plain function of
    an oracle, and the core never waits for a count."""
    source = core.registry[name]
    tree = core.tree_or_raise()
    counts: dict[tuple[int, int], int] = {}
    wanted = [(b.first, b.last) for b in tree.blocks(name)]
    while True:
        if wanted:
            reply = yield CallAgent(server=name, url=source.admin_url, route=ADMIN.count,
                                    body=CountRequest(wanted))
            counts.update(zip(wanted, reply.counts, strict=True))
        missing: list[tuple[int, int]] = []
        oracle = _oracle(counts, missing)
        try:
            plan: SplitPlan = plan_split(tree, name, oracle, core.settings.bounds, method="aligned",
                                         cost=core.planner_or_raise().cost_of,
                                         avoid=core.operations.reserved() - op.involves)
        except _NeedCounts:
            wanted = missing
            continue
        return plan


def _undo_flows(core: MetaFlowCore, op: Operation, moves: list[Move], dpids: list[int]) -> Any:
    """Give the blocks back in the tree and re-sync the switches that may hold
    part of the diff: how much of it they applied is unknown."""
    core.revert(moves)
    op.step = "restoring flows"
    yield from core.resync(dpids)


def _overtaken(core: MetaFlowCore, op: Operation, source: str, target: str, moves: list[Move],
               dpids: list[int], migration: MigrationReport, why: str) -> Any:
    """A server of this split failed after the tree changed. If the target
    died, the blocks go back to the source (which still has them, frozen)
    before anyone plans the target's take-over; if the source died, the
    target keeps them and serves them: committed if the source got that
    far, else empty (the data died with the source)."""
    if core.registry[target].failed:
        yield from _undo_flows(core, op, moves, dpids)
        if not core.registry[source].failed:
            yield from migrations.abort(core, source, migration)
        return
    if not (yield from migrations.target_serves(core, target, migration.blocks)):
        yield from core.own_empty(target, migration.blocks, lost_with=source, reason=why)
