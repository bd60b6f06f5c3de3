"""The move of blocks every operation that moves data shares: a split's
half, a merge's whole server, a rebalance's hot range. The blocks go to a
whole new replica set (the target and r-1 backups placed across racks),
which holds every record before the target serves.

Order (ARCHITECTURE.md, "Migration without loss"):

1. copy: the source freezes the moving blocks (writes answer TRYAGAIN) and
   copies them to every member of the new set, which hold them unserved;
   undone by: abort the migration (the source unfreezes, the members discard);
2. assign: the tree hands the blocks to the target and the new set gets its
   roles under a new epoch (the target not serving yet), the import kept;
   undone by: the tree and the sets go back, the new members drop the blocks;
3. flows: every switch whose table changes gets its diff, confirmed by a
   barrier; undone by: 2's undo, and those switches re-synced to the tree;
4. commit: the source stops serving the blocks and deletes them (from here
   on, only forward);
5. serve: the target serves; the source's old backups drop the blocks.

If a server of the move fails meanwhile, the operation is cancelled at its
current step: before the commit it is undone (the blocks stay with the
source's set, which still has them, frozen until the abort), after it, it
is finished (the switches re-synced to the tree, the target told to serve).

A merge (`merge`) is such a move of every block a busy server owns, which
leaves it idle: a split makes room with one, a rebalance retires a cold
server with one.
"""

from __future__ import annotations

from btree.merge import MergePlan
from btree.replicas import ReplicaSet
from btree.tree import Move
from client_lib.api.admin import MigrationReport
from client_lib.api.rest import Outcome
from client_lib.cidr import Block
from controller import migrations
from controller.saga import Cancelled, Operation, Saga, StepError
from controller.world import SagaWorld


def move_blocks(world: SagaWorld, op: Operation, kind: str, name: str, blocks: list[Block],
                target: str) -> Saga:
    """Move `blocks` from `name` to `target`, which gets them with a whole new
    replica set (copy, assign, flows, commit, serve); the record of the move,
    or the outcome (`kind`-aborted, -cancelled) if it was undone. Said to
    the world's recorder, with its duration, either way."""
    started = world.clock()
    moved = yield from _move_blocks(world, op, kind, name, blocks, target, started)
    world.recorder.move(kind, world.clock() - started, not isinstance(moved, Outcome))
    return moved


def _move_blocks(world: SagaWorld, op: Operation, kind: str, name: str, blocks: list[Block],
                 target: str, started: float) -> Saga:
    phase = "" if kind == "split" else f"{kind} "   # a split's own steps keep their plain names
    replicas = world.replicas_or_raise()
    placement = world.place(blocks, [target], replicas.r - 1, avoid={name})
    members = [target, *placement.backups]
    op.involves |= set(members)
    old = {b: _covering(replicas.sets, b) for b in blocks}

    op.step = f"{phase}copy"
    try:
        migration = yield from migrations.copy(world, name, blocks, members)
    except Cancelled as why:
        yield from migrations.abort_unknown(world, name, members, blocks)
        return world.outcome_event(f"{kind}-cancelled", server=name, target=target, reason=str(why))
    if migration is None:
        return world.outcome_event(f"{kind}-aborted", server=name, target=target, reason="copy failed")
    copied = world.clock()

    op.step = f"{phase}assign"
    moves = world.tree_or_raise().transfer(blocks, target)
    diff = world.planner_or_raise().update(moves)
    for block in blocks:
        replicas.assign(block, members)
    replicas.realign()
    world.hold(blocks)
    committed = False
    try:
        try:
            yield world.assign_steps(blocks, migration=migration.id)
        except StepError as failed:
            yield from _undo(world, op, name, moves, old, members, migration, [])
            return world.outcome_event(f"{kind}-aborted", server=name, target=target,
                                       reason=f"assign: {failed}")
        op.step = f"{phase}flows"
        try:
            yield world.send_diff(diff)
        except StepError as failed:
            yield from _undo(world, op, name, moves, old, members, migration, list(diff))
            return world.outcome_event(f"{kind}-aborted", server=name, target=target,
                                       reason=f"flows: {failed}")
        flows_done = world.clock()
        op.step = f"{phase}commit"
        committed = True   # from here on only forward: the new set holds every record
        if not (yield from migrations.commit(world, name, migration)):
            world.event("commit-unconfirmed", server=name, migration=migration.id,
                        note="the source's copy is stale (older epoch): a rebuild drops it")
        op.step = f"{phase}serve"
        yield from world.activate(blocks)
        yield from _drop_old_backups(world, name, blocks, old, members)
    except Cancelled as why:
        if committed:
            yield from world.resync(list(diff))
            yield from world.activate(blocks)
        else:
            yield from _undo(world, op, name, moves, old, members, migration, list(diff))
        return world.outcome_event(f"{kind}-cancelled", server=name, target=target, reason=str(why))
    return {"server": name, "target": target, "backups": list(placement.backups),
            "blocks": [str(b) for b in blocks], "keys_moved": migration.keys, "switches": len(diff),
            "flow_mods": sum(len(d) for d in diff.values()),
            "copy_s": round(copied - started, 4), "flows_s": round(flows_done - copied, 4)}


def _covering(sets: dict[Block, ReplicaSet], block: Block) -> ReplicaSet:
    return next(s for b, s in sets.items() if b.covers(block))


def _undo(world: SagaWorld, op: Operation, source: str, moves: list[Move], old: dict[Block, ReplicaSet],
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
    replicas = world.replicas_or_raise()
    world.revert(moves)
    holders = {m for s in old.values() for m in s.members}
    renewed: dict[Block, ReplicaSet] = {}
    for block, s in old.items():
        if holders & set(members):
            renewed[block] = replicas.assign(block, s.members, s.unsynced)
        else:
            replicas.sets[block] = s
    world.release(old)
    replicas.realign()
    yield from world.resync(dpids)
    for member in members:
        if member not in holders:
            yield from migrations.drop(world, member, list(old), "split undone")
    unchanged = [b for b, s in renewed.items() if replicas.sets.get(b) is s]   # no fail-over took them
    try:
        yield from world.reassign(unchanged)
    except StepError as failed:
        world.event("assign-unconfirmed", blocks=[str(b) for b in unchanged], reason=str(failed),
                    note="a member left at the undone epoch fences the primary; a repair follows")
    if not world.registry[source].failed:
        yield from migrations.abort(world, source, migration)


def _drop_old_backups(world: SagaWorld, source: str, blocks: list[Block], old: dict[Block, ReplicaSet],
                      members: list[str]) -> Saga:
    gone = {m for s in old.values() for m in s.members} - {source} - set(members)
    for member in sorted(gone):
        yield from migrations.drop(world, member, blocks, "moved by a split")


def merge(world: SagaWorld, op: Operation, plan: MergePlan) -> Saga:
    """`plan.source` gives every block it owns to `plan.target` and goes idle;
    the record of the move, or the outcome (merge-aborted, -cancelled) if it
    was undone. The source's keys are the target's until their heartbeats say."""
    source, target = plan.source, plan.target
    assert source is not None and target is not None, "a merge that was refused"
    op.involves |= {source, target}
    moved = yield from move_blocks(world, op, "merge", source, world.tree_or_raise().blocks(source), target)
    if not isinstance(moved, Outcome):
        world.moved_keys(source, target, world.registry[source].keys)
    return moved
