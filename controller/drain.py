"""A drain as a saga: a server gives away everything it holds, then is drained.

Why: to stop, upgrade or remove a server with nothing lost and no fail-over
(`metaflowctl drain SERVER`). While it drains and once it is drained, it is
never chosen as a target, a split's target or a backup (`SagaWorld.drained`);
`undrain` (the core) returns it to the idle pool.

Steps, one move at a time until the server holds nothing, re-planned after
each (a fail-over elsewhere may promote it to primary of more blocks
meanwhile):

1. its blocks as primary: planned by `btree.drain.plan_drain` on the
   agent's key counts (`controller.oracles`), within the targets' room and
   the table budget; the blocks for the first target move through the
   migration every move shares (`controller.move.move_blocks`: copy,
   assign, flows, commit, serve, each with its compensation), with a whole
   new replica set that leaves the server out;
2. each copy it keeps as a backup: its set grows by a new member placed
   across racks (`SagaWorld.place`), unsynced, under a new epoch; the
   primary syncs it as a repair does (`controller.repair.sync`); once it is
   synced, the set drops the drained server (a new epoch) and the server
   deletes its copy. The set never has fewer synced copies than before.

A failed move or copy (undone, whole) is tried again, `TRIES` times in a
row at most. A drain that cannot go on (no room for a block, a move undone
by faults, a copy that does not sync, the server itself failing) stops: what has moved
stays moved (each move is whole or undone), the rest stays where it is, the
server is back in service, and the reason is said (`drain-stopped`, and
`/drains`). A controller restart forgets a drain: it is not resumed (the
server serves what it still holds), and is asked for again.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping

from btree.drain import DrainPlan, plan_drain
from btree.replicas import ReplicaSet
from client_lib.api.admin import ADMIN, AssignRequest
from client_lib.api.rest import Outcome
from client_lib.cidr import Block
from controller import migrations
from controller.move import move_blocks
from controller.oracles import KEYS, Ask, answered
from controller.repair import sync
from controller.saga import Cancelled, Operation, Saga, StepError
from controller.steps import CallAgent, Wait
from controller.world import Drain, SagaWorld

TRIES = 3
"""How often a drain tells an agent its roles before it gives up: one lost
answer must not leave a member at an older epoch (nothing else would
correct it while nobody writes to the block). Also how often in a row a
move or a copy may fail (undone, whole) before the drain stops: a copy that
times out once on a loaded member is no reason to give the drain up."""
RETRY_S = 0.5

NO_ROOM = "no room: "
"""How a stop for want of room begins: trying again would not help."""

MOVES_PER_BLOCK = 3
"""How many moves (of a primary's block, or of a copy) a drain makes at most
per block it started with, before it gives up: a move overtaken by a
fail-over is tried again, but a drain never runs for ever."""


def holdings(world: SagaWorld, name: str) -> tuple[list[Block], list[Block]]:
    """What `name` still holds: the blocks it owns, and those it keeps a backup of."""
    owned = world.tree_or_raise().blocks(name)
    backups = sorted(b for b, s in world.replicas_or_raise().of(name).items() if s.primary != name)
    return owned, backups


def drain_saga(world: SagaWorld, op: Operation, name: str) -> Saga:
    """Move everything `name` holds to other servers; its `Drain` record
    (made by the core) ends drained, or stopped with the reason."""
    drain = world.drains[name]
    owned, backups = holdings(world, name)
    budget = MOVES_PER_BLOCK * (len(owned) + len(backups)) + 1
    failures = 0
    try:
        for _ in range(budget):
            owned, backups = holdings(world, name)
            if owned:
                reason = yield from _move_primaries(world, op, name, drain)
            elif backups:
                reason = yield from _move_backup(world, op, name, backups[0], drain)
            else:
                break
            op.involves = {name}   # the servers of a finished move are free again
            if not reason:
                failures = 0
                continue
            failures += 1
            if reason.startswith(NO_ROOM) or failures >= TRIES:
                return _stopped(world, name, drain, reason)
            world.event("drain-retry", logging.WARNING, server=name, reason=reason, attempt=failures,
                        note="what moved stays moved; the move is tried again")
            yield Wait(seconds=RETRY_S)
        else:
            owned, backups = holdings(world, name)
            return _stopped(world, name, drain, f"still holds {len(owned)} blocks and {len(backups)} "
                                                f"copies after {budget} moves")
        op.step = "empty"
        unconfirmed = yield from _emptied(world, name)
        if unconfirmed:
            return _stopped(world, name, drain, f"{name} did not confirm it holds nothing: {unconfirmed}")
    except Cancelled as why:
        return _stopped(world, name, drain, f"cancelled: {why}")
    drain.state, drain.finished = "drained", world.clock()
    return world.outcome_event("drained", ok=True, server=name, moves=len(drain.moves),
                               backups_moved=drain.backups_moved,
                               keys_moved=sum(int(m["keys_moved"]) for m in drain.moves),
                               seconds=round(drain.finished - drain.started, 3),
                               note="it holds nothing: it may be stopped; undrain makes it idle again")


def _stopped(world: SagaWorld, name: str, drain: Drain, reason: str) -> Outcome:
    drain.state, drain.finished, drain.reason = "stopped", world.clock(), reason
    owned, backups = holdings(world, name)
    return world.outcome_event("drain-stopped", server=name, reason=reason, blocks_left=len(owned),
                               backups_left=len(backups), moves=len(drain.moves),
                               note="what moved stays moved; the server is back in service with the rest")


def _move_primaries(world: SagaWorld, op: Operation, name: str, drain: Drain) -> Saga:
    """Plan where `name`'s blocks go and move those of the first target; ""
    once moved, else why the drain stops."""
    op.step = "plan"
    try:
        plan = yield from _planned(world, op, name)
    except StepError as failed:
        return f"counting keys: {failed}"
    if not plan.ok:
        return f"{NO_ROOM}{plan.reason}"
    target, blocks = next(iter(plan.by_target().items()))
    op.involves.add(target)
    moved = yield from move_blocks(world, op, "drain", name, blocks, target)
    if isinstance(moved, Outcome):
        return f"{moved.operation} (to {target}): {moved.detail.get('reason', '')}"
    world.moved_keys(name, target, int(moved["keys_moved"]))
    drain.moves.append(moved)
    world.event("drain-progress", server=name, target=target, blocks=len(blocks),
                blocks_left=len(world.tree_or_raise().blocks(name)))
    return ""


def _planned(world: SagaWorld, op: Operation, name: str) -> Saga:
    """The drain's plan on the agent's key counts of its blocks."""
    tree = world.tree_or_raise()
    planner = world.planner_or_raise()
    blocks = tree.blocks(name)

    def decide(asks: Mapping[str, Ask]) -> DrainPlan:
        keys = asks[KEYS]
        return plan_drain(tree, name, {b: keys(b.first, b.last) for b in blocks},
                          lambda leaf: world.registry[leaf].keys if leaf in world.registry else 0,
                          world.capacity(world.registry[name]),
                          avoid=(world.reserved() | world.out_of_service()) - {name},
                          fits=planner.keeps(world.settings.table_budget))

    return (yield from answered(world, name, decide, {KEYS: [(b.first, b.last) for b in blocks]}))


def _move_backup(world: SagaWorld, op: Operation, name: str, block: Block, drain: Drain) -> Saga:
    """`name`'s copy of `block` goes to a new member: the set grows by it,
    the primary syncs it, then the set drops `name`, which deletes its copy.
    "" once done (or overtaken by a fail-over: looked at again), else why the
    drain stops."""
    replicas = world.replicas_or_raise()
    current = replicas.sets[block]
    # Placed for the set it will be, without `name`: the rack the copy leaves
    # is as good as any other (with `name` counted, a two-rack fabric put the
    # copy beside its primary, and a k=32 one sent it to a third rack).
    staying = [m for m in current.members if m != name]
    placement = world.place([block], staying, 1, avoid={name})
    if placement.short:
        return f"{NO_ROOM}no live server outside {block}'s set can take the copy {name} keeps"
    new = placement.backups[0]
    op.involves |= {*current.members, new}
    wanted = replicas.assign(block, (*current.members, new), current.unsynced | {new})
    try:
        op.step = "backup assign"
        yield from world.reassign([block])
        op.step = "backup sync"
        done = yield from sync(world, op, block, wanted.epoch, current.primary, [new])
    except StepError as failed:
        yield from _without(world, block, wanted, new)
        return f"copying {block} to {new}: {failed}"
    except Cancelled:
        yield from _without(world, block, wanted, new)
        raise
    if replicas.sets.get(block) is not wanted:
        return ""   # a fail-over redid the set meanwhile
    if done.get(new) != "synced":
        yield from _without(world, block, wanted, new)
        return f"copying {block} to {new}: {done.get(new, 'failed')}"
    replicas.mark_synced(block, new)
    op.step = "backup drop"
    yield from _without(world, block, replicas.sets[block], name)
    drain.backups_moved += 1
    return ""


def _without(world: SagaWorld, block: Block, wanted: ReplicaSet, member: str) -> Saga:
    """The set of `block` drops `member` (if it is still `wanted`: a fail-over
    may have redone it), which deletes its copy."""
    replicas = world.replicas_or_raise()
    if replicas.sets.get(block) is not wanted:
        return
    replicas.assign(block, [m for m in wanted.members if m != member], wanted.unsynced - {member})
    try:
        unconfirmed = yield from _tried(lambda: world.reassign([block]))
    except Cancelled:   # the set has changed: its members must hear it all the same
        yield from _tried(lambda: world.reassign([block]))
        raise
    if unconfirmed:
        world.event("assign-unconfirmed", logging.WARNING, block=str(block), reason=unconfirmed,
                    note="a member left at the older epoch fences the primary; a repair follows")
    yield from migrations.drop(world, member, [block], "drained")


def _emptied(world: SagaWorld, name: str) -> Saga:
    """The drained server is told it holds nothing (an exclusive assignment
    of no roles: it deletes whatever is left, e.g. a copy whose drop was not
    confirmed); "" once it says so, else why not."""
    server = world.registry[name]

    def tell() -> Saga:
        yield CallAgent(server=name, url=server.admin_url, route=ADMIN.assign,
                        body=AssignRequest([], exclusive=True))

    return (yield from _tried(tell))


def _tried(saga: Callable[[], Saga]) -> Saga:
    """Run `saga` (idempotent: the same roles at the same epochs) up to
    `TRIES` times while a step fails; "" once it went through, else the last failure."""
    reason = ""
    for attempt in range(TRIES):
        if attempt:
            yield Wait(seconds=RETRY_S)
        try:
            yield from saga()
        except StepError as failed:
            reason = str(failed)
        else:
            return ""
    return reason
