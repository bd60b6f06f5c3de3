"""Re-replication as a saga: a block back to r synced copies, in the background.

A block is short of copies after a member failed (its set shrank), or has a
member to re-sync after its primary could not get a write acknowledged by
it (the block is degraded: the primary holds it until a newer epoch). The
repair, a few at a time (--max-syncs) and never in anyone's way:

1. the set grows to r members, the new ones (and, for a degraded block, the
   ones that failed to acknowledge) unsynced, under a new epoch: every
   member is assigned, so the primary streams new writes to the new member
   at once;
2. the primary copies the block's records to each unsynced member,
   throttled (--sync-rate), while writes go on;
3. polling its progress, the controller marks each member synced when its
   copy is done (same epoch: nobody's role changes but the member's flag).

A member that fails to sync is dropped from the set (new epoch); the next
tick tries another. A server of the set that fails cancels the repair: its
fail-over redoes the sets, and a later repair starts over.
"""

from __future__ import annotations

from btree.tree import State
from client_lib.api.admin import ADMIN, SyncList, SyncReport, SyncRequest
from client_lib.cidr import Block
from controller.saga import Cancelled, Operation, Saga, StepError
from controller.steps import CallAgent, Wait
from controller.world import SagaWorld

POLL_S = 0.2


def repair_saga(world: SagaWorld, op: Operation, block: Block, resync: bool) -> Saga:
    replicas = world.replicas_or_raise()
    current = replicas.sets[block]
    primary = current.primary
    started = world.clock()
    resynced = set(current.backups) if resync else set()
    unsynced = set(current.unsynced) | resynced
    missing = replicas.r - len(current.members)
    placement = world.place([block], current.members, max(0, missing))
    members = (*current.members, *placement.backups)
    unsynced |= set(placement.backups)
    if not unsynced:
        return None
    op.involves |= set(members)
    wanted = replicas.assign(block, members, unsynced)
    op.step = "assign"
    try:
        yield from world.reassign([block])
        op.step = "sync"
        done = yield from sync(world, op, block, wanted.epoch, primary, sorted(unsynced))
    except StepError as failed:
        return world.outcome_event("repair-failed", server=primary, block=str(block), reason=str(failed))
    except Cancelled as why:
        return world.outcome_event("repair-cancelled", server=primary, block=str(block), reason=str(why))
    if replicas.sets.get(block) is not wanted:
        return world.outcome_event("repair-overtaken", server=primary, block=str(block))
    failed_members = [m for m in unsynced if done.get(m) != "synced"]
    for member in unsynced - set(failed_members):
        replicas.mark_synced(block, member)
    if failed_members:
        replicas.assign(block, [m for m in members if m not in failed_members],
                        set(replicas.sets[block].unsynced) - set(failed_members))
    try:
        yield from world.reassign([block])
    except StepError as failed:
        world.event("assign-unconfirmed", block=str(block), reason=str(failed))
    return world.outcome_event("replicated", ok=not failed_members, server=primary, block=str(block),
                               members=list(replicas.sets[block].members), added=list(placement.backups),
                               resynced=sorted(resynced), failed=failed_members,
                               seconds=round(world.clock() - started, 3))


def sync(world: SagaWorld, op: Operation, block: Block, epoch: int, primary: str,
          members: list[str]) -> Saga:
    """Ask the primary to sync each member and poll until each is synced or
    failed; returns member -> state ("synced", or "failed: " and the
    primary's reason, which a drain's or repair's outcome quotes)."""
    url = world.registry[primary].admin_url
    rate = world.settings.sync_rate
    yield [CallAgent(server=primary, url=url, route=ADMIN.sync, body=SyncRequest(block, epoch, m, rate))
           for m in members]
    states: dict[str, str] = {}
    while len(states) < len(members):
        yield Wait(seconds=POLL_S)
        listing: SyncList = yield CallAgent(server=primary, url=url, route=ADMIN.syncs)
        for report in listing.syncs:
            if _ours(report, block, epoch) and report.member in members and report.state != "copying":
                states[report.member] = report.state if report.error is None \
                    else f"{report.state}: {report.error}"
        for member in members:   # a member that died while syncing fails here; its fail-over follows
            if world.registry[member].failed or world.tree_or_raise().state(member) is State.FAILED:
                states.setdefault(member, "failed")
    return states


def _ours(report: SyncReport, block: Block, epoch: int) -> bool:
    return report.block == block and report.epoch == epoch
