"""A split as a saga: plan, copy, assign, flows, commit, serve, each with its
compensation. The moving blocks go to a whole new replica set (the target,
an idle leaf, and r-1 backups placed across racks), which holds every
record before the target serves.

Order (ARCHITECTURE.md, "Migration without loss"):

1. plan, with the source agent's key counts as the oracle;
2. copy: the source freezes the moving blocks (writes answer TRYAGAIN) and
   copies them to every member of the new set, which hold them unserved;
   undone by: abort the migration (the source unfreezes, the members discard);
3. assign: the tree hands the blocks to the target and the new set gets its
   roles under a new epoch (the target not serving yet), the import kept;
   undone by: the tree and the sets go back, the new members drop the blocks;
4. flows: every switch whose table changes gets its diff, confirmed by a
   barrier; undone by: 3's undo, and those switches re-synced to the tree;
5. commit: the source stops serving the blocks and deletes them (from here
   on, only forward);
6. serve: the target serves; the source's old backups drop the blocks.

If a server of the split fails meanwhile, the operation is cancelled at its
current step: before the commit it is undone (the blocks stay with the
source's set, which still has them, frozen until the abort), after it, it
is finished (the switches re-synced to the tree, the target told to serve).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from btree.replicas import ReplicaSet
from btree.split import SplitPlan, apply_split, plan_split
from btree.tree import Move
from client_lib.api.admin import ADMIN, CountRequest, MigrationReport
from client_lib.cidr import Block
from controller import migrations
from controller.saga import Cancelled, Operation, Saga, StepError
from controller.steps import CallAgent

if TYPE_CHECKING:
    from controller.core import MetaFlowCore


def split_saga(core: MetaFlowCore, op: Operation, name: str) -> Saga:
    started = core.clock()
    op.step = "plan"
    try:
        plan = yield from _plan(core, op, name)
    except StepError as failed:
        return core.outcome_event("split-failed", server=name, reason=f"counting keys: {failed}")
    except Cancelled as why:
        return core.outcome_event("split-cancelled", server=name, reason=str(why))
    if not plan.ok or plan.target is None:
        return core.outcome_event("split-refused", server=name, reason=plan.reason)
    replicas = core.replicas_or_raise()
    blocks = list(plan.move)
    placement = core.place(blocks, [plan.target], replicas.r - 1, avoid={name})
    members = [plan.target, *placement.backups]
    op.involves |= set(members)
    old = {b: _covering(replicas.sets, b) for b in blocks}

    op.step = "copy"
    try:
        migration = yield from migrations.copy(core, name, blocks, members)
    except Cancelled as why:
        yield from migrations.abort_unknown(core, name, members, blocks)
        return core.outcome_event("split-cancelled", server=name, target=plan.target, reason=str(why))
    if migration is None:
        return core.outcome_event("split-aborted", server=name, target=plan.target, reason="copy failed")
    copied = core.clock()

    op.step = "assign"
    moves = apply_split(core.tree_or_raise(), plan)
    diff = core.planner_or_raise().update(moves)
    for block in blocks:
        replicas.assign(block, members)
    replicas.realign()
    core.not_serving.update(blocks)
    committed = False
    try:
        try:
            yield core.assign_steps(blocks, migration=migration.id)
        except StepError as failed:
            yield from _undo(core, op, name, moves, old, members, migration, [])
            return core.outcome_event("split-aborted", server=name, target=plan.target,
                                      reason=f"assign: {failed}")
        op.step = "flows"
        try:
            yield core.send_diff(diff)
        except StepError as failed:
            yield from _undo(core, op, name, moves, old, members, migration, list(diff))
            return core.outcome_event("split-aborted", server=name, target=plan.target,
                                      reason=f"flows: {failed}")
        flows_done = core.clock()
        op.step = "commit"
        committed = True   # from here on only forward: the new set holds every record
        if not (yield from migrations.commit(core, name, migration)):
            core.event("commit-unconfirmed", server=name, migration=migration.id,
                       note="the source's copy is stale (older epoch): a rebuild drops it")
        op.step = "serve"
        yield from core.activate(blocks)
        yield from _drop_old_backups(core, name, blocks, old, members)
    except Cancelled as why:
        if committed:
            yield from core.resync(list(diff))
            yield from core.activate(blocks)
        else:
            yield from _undo(core, op, name, moves, old, members, migration, list(diff))
        return core.outcome_event("split-cancelled", server=name, target=plan.target, reason=str(why))
    finished = core.clock()
    record = {"server": name, "target": plan.target, "backups": list(placement.backups),
              "blocks": [str(b) for b in blocks], "keys_moved": migration.keys,
              "keys_total": plan.keys_total, "switches": len(diff),
              "flow_mods": sum(len(d) for d in diff.values()),
              "copy_s": round(copied - started, 4), "flows_s": round(flows_done - copied, 4),
              "total_s": round(finished - started, 4)}
    core.splits.append(record)
    return core.outcome_event("split", ok=True, **record)


def _covering(sets: dict[Block, ReplicaSet], block: Block) -> ReplicaSet:
    return next(s for b, s in sets.items() if b.covers(block))


def _undo(core: MetaFlowCore, op: Operation, source: str, moves: list[Move], old: dict[Block, ReplicaSet],
          members: list[str], migration: MigrationReport, dpids: list[int]) -> Saga:
    """Give the blocks back to the source's set in the tree (the source still
    holds them, frozen) and re-sync the switches that may hold part of the
    diff; the new members drop them, and the migration is aborted."""
    op.step = "undo"
    replicas = core.replicas_or_raise()
    core.revert(moves)
    for block, s in old.items():
        replicas.sets[block] = s
        core.not_serving.discard(block)
    replicas.realign()
    yield from core.resync(dpids)
    for member in members:
        yield from migrations.drop(core, member, list(old), "split undone")
    if not core.registry[source].failed:
        yield from migrations.abort(core, source, migration)


def _drop_old_backups(core: MetaFlowCore, source: str, blocks: list[Block], old: dict[Block, ReplicaSet],
                      members: list[str]) -> Saga:
    gone = {m for s in old.values() for m in s.members} - {source} - set(members)
    for member in sorted(gone):
        yield from migrations.drop(core, member, blocks, "moved by a split")


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
            planner = core.planner_or_raise()
            plan: SplitPlan = plan_split(tree, name, oracle, core.settings.bounds, method="aligned",
                                         cost=planner.cost_of,
                                         avoid=core.operations.reserved() - op.involves,
                                         fits=planner.keeps(core.settings.table_budget))
        except _NeedCounts:
            wanted = missing
            continue
        return plan
