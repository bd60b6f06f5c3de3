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

from collections.abc import Mapping
from typing import TYPE_CHECKING

from btree.merge import plan_merge
from btree.replicas import ReplicaSet
from btree.split import SplitPlan, plan_split
from btree.tree import Move
from client_lib.api.admin import MigrationReport
from client_lib.api.rest import Outcome
from client_lib.cidr import Block
from controller import migrations
from controller.oracles import KEYS, Ask, answered
from controller.saga import Cancelled, Operation, Saga, StepError

if TYPE_CHECKING:
    from controller.core import MetaFlowCore


def split_saga(core: MetaFlowCore, op: Operation, name: str) -> Saga:
    started = core.clock()
    plan = yield from _planned(core, op, name)
    if isinstance(plan, SplitPlan) and plan.wants_room and core.settings.merge:
        merged = yield from _merge_for(core, op, name)
        if merged is not None:
            return merged   # the merge did not end well: its outcome is the split's
        plan = yield from _planned(core, op, name)
    if isinstance(plan, Outcome):
        return plan
    if not plan.ok or plan.target is None:
        return core.outcome_event("split-refused", server=name, reason=plan.reason)
    moved = yield from move_blocks(core, op, "split", name, list(plan.move), plan.target)
    if isinstance(moved, Outcome):
        return moved
    record = {**moved, "keys_total": plan.keys_total, "total_s": round(core.clock() - started, 4)}
    core.splits.append(record)
    return core.outcome_event("split", ok=True, **record)


def _planned(core: MetaFlowCore, op: Operation, name: str) -> Saga:
    """The split's plan, or the outcome that ends it (counting failed, or cancelled)."""
    op.step = "plan"
    try:
        return (yield from _plan(core, op, name))
    except StepError as failed:
        return core.outcome_event("split-failed", server=name, reason=f"counting keys: {failed}")
    except Cancelled as why:
        return core.outcome_event("split-cancelled", server=name, reason=str(why))


def _merge_for(core: MetaFlowCore, op: Operation, name: str) -> Saga:
    """Free a busy server near `name` for its split (`btree.merge`): the
    coldest one that fits into a neighbour moves all its blocks there, as a
    split moves its half. None once it has (or when no merge fits: the split
    is then refused as planned); else the outcome that ends the split."""
    tree = core.tree_or_raise()
    merge = plan_merge(tree, name, lambda leaf: core.registry[leaf].keys if leaf in core.registry else 0,
                       core.capacity(core.registry[name]), avoid=core.operations.reserved() - op.involves,
                       fits=core.planner_or_raise().keeps(core.settings.table_budget))
    if not merge.ok or merge.source is None or merge.target is None:
        core.event("merge-refused", server=name, reason=merge.reason)
        return None
    op.involves |= {merge.source, merge.target}
    moved = yield from move_blocks(core, op, "merge", merge.source, tree.blocks(merge.source), merge.target)
    if isinstance(moved, Outcome):
        return moved
    core.registry[merge.target].keys += merge.keys   # until its next heartbeat says
    core.registry[merge.source].keys = 0
    core.outcome_event("merge", ok=True, **moved, freed_for=name)
    return None


def move_blocks(core: MetaFlowCore, op: Operation, kind: str, name: str, blocks: list[Block],
          target: str) -> Saga:
    """Move `blocks` from `name` to `target`, which gets them with a whole new
    replica set (copy, assign, flows, commit, serve); the record of the move,
    or the outcome (`kind`-aborted, -cancelled) if it was undone."""
    started = core.clock()
    phase = "" if kind == "split" else f"{kind} "   # a split's own steps keep their plain names
    replicas = core.replicas_or_raise()
    placement = core.place(blocks, [target], replicas.r - 1, avoid={name})
    members = [target, *placement.backups]
    op.involves |= set(members)
    old = {b: _covering(replicas.sets, b) for b in blocks}

    op.step = f"{phase}copy"
    try:
        migration = yield from migrations.copy(core, name, blocks, members)
    except Cancelled as why:
        yield from migrations.abort_unknown(core, name, members, blocks)
        return core.outcome_event(f"{kind}-cancelled", server=name, target=target, reason=str(why))
    if migration is None:
        return core.outcome_event(f"{kind}-aborted", server=name, target=target, reason="copy failed")
    copied = core.clock()

    op.step = f"{phase}assign"
    moves = core.tree_or_raise().transfer(blocks, target)
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
            return core.outcome_event(f"{kind}-aborted", server=name, target=target,
                                      reason=f"assign: {failed}")
        op.step = f"{phase}flows"
        try:
            yield core.send_diff(diff)
        except StepError as failed:
            yield from _undo(core, op, name, moves, old, members, migration, list(diff))
            return core.outcome_event(f"{kind}-aborted", server=name, target=target,
                                      reason=f"flows: {failed}")
        flows_done = core.clock()
        op.step = f"{phase}commit"
        committed = True   # from here on only forward: the new set holds every record
        if not (yield from migrations.commit(core, name, migration)):
            core.event("commit-unconfirmed", server=name, migration=migration.id,
                       note="the source's copy is stale (older epoch): a rebuild drops it")
        op.step = f"{phase}serve"
        yield from core.activate(blocks)
        yield from _drop_old_backups(core, name, blocks, old, members)
    except Cancelled as why:
        if committed:
            yield from core.resync(list(diff))
            yield from core.activate(blocks)
        else:
            yield from _undo(core, op, name, moves, old, members, migration, list(diff))
        return core.outcome_event(f"{kind}-cancelled", server=name, target=target, reason=str(why))
    return {"server": name, "target": target, "backups": list(placement.backups),
            "blocks": [str(b) for b in blocks], "keys_moved": migration.keys, "switches": len(diff),
            "flow_mods": sum(len(d) for d in diff.values()),
            "copy_s": round(copied - started, 4), "flows_s": round(flows_done - copied, 4)}


def _covering(sets: dict[Block, ReplicaSet], block: Block) -> ReplicaSet:
    return next(s for b, s in sets.items() if b.covers(block))


def _undo(core: MetaFlowCore, op: Operation, source: str, moves: list[Move], old: dict[Block, ReplicaSet],
          members: list[str], migration: MigrationReport, dpids: list[int]) -> Saga:
    """Give the blocks back to the source's set in the tree (the source still
    holds them, frozen) and re-sync the switches that may hold part of the
    diff; the new members drop them, and the migration is aborted.

    A new member that is also in the old set (the source's backup chosen as
    the target, or as a new backup) keeps them: it holds the old set's
    records (an import keeps a backup's). It may hold its role in the new
    set, at an epoch newer than the old set's, and epochs never go back: the
    old set then comes back at a new epoch (at once, so that a fail-over
    that overtakes this sees it), its members told before the source is
    unfrozen."""
    op.step = "undo"
    replicas = core.replicas_or_raise()
    core.revert(moves)
    holders = {m for s in old.values() for m in s.members}
    renewed: dict[Block, ReplicaSet] = {}
    for block, s in old.items():
        if holders & set(members):
            renewed[block] = replicas.assign(block, s.members, s.unsynced)
        else:
            replicas.sets[block] = s
        core.not_serving.discard(block)
    replicas.realign()
    yield from core.resync(dpids)
    for member in members:
        if member not in holders:
            yield from migrations.drop(core, member, list(old), "split undone")
    unchanged = [b for b, s in renewed.items() if replicas.sets.get(b) is s]   # no fail-over took them
    try:
        yield from core.reassign(unchanged)
    except StepError as failed:
        core.event("assign-unconfirmed", blocks=[str(b) for b in unchanged], reason=str(failed),
                   note="a member left at the undone epoch fences the primary; a repair follows")
    if not core.registry[source].failed:
        yield from migrations.abort(core, source, migration)


def _drop_old_backups(core: MetaFlowCore, source: str, blocks: list[Block], old: dict[Block, ReplicaSet],
                      members: list[str]) -> Saga:
    gone = {m for s in old.values() for m in s.members} - {source} - set(members)
    for member in sorted(gone):
        yield from migrations.drop(core, member, blocks, "moved by a split")


def _plan(core: MetaFlowCore, op: Operation, name: str) -> Saga:
    """The planner on the agent's key counts (`controller.oracles`), its
    blocks' own counts fetched first."""
    tree = core.tree_or_raise()
    planner = core.planner_or_raise()

    def decide(asks: Mapping[str, Ask]) -> SplitPlan:
        keys = asks[KEYS]
        return plan_split(tree, name, lambda _leaf, first, last: keys(first, last), core.settings.bounds,
                          method="aligned", cost=planner.cost_of,
                          avoid=core.operations.reserved() - op.involves,
                          fits=planner.keeps(core.settings.table_budget))

    return (yield from answered(core, name, decide, {KEYS: [(b.first, b.last) for b in tree.blocks(name)]}))
