"""A fail-over as a saga: every block the failed server held is served again.

For each block whose replica set the failed server was in (at once, before
any step; operations that involve it are cancelled first):

- it was the primary and a synced backup lives: that backup is **promoted**.
  The set loses the failed server under a new epoch, which fences it (its
  backups refuse its stream from then on, so it can acknowledge nothing);
  the promoted primary holds the role without serving until the flows that
  route the block to it are confirmed, then serves. No data moves.
- it was a backup: the set just loses it, under a new epoch.
- it was the primary of a set with no other synced copy (r=1, or its
  backups were still syncing): the tree hands the block to the nearest idle
  leaf, and the data is salvaged from the failed server's agent if it still
  answers over the management network (its edge link died, not the server),
  else from any other out-of-service agent that holds it, else served empty
  and said loudly (`DATA-LOST`: every copy died).

Steps: assign the new roles (the fence), salvage what must be, move the
flows (a switch that does not confirm is re-synced: there is no way back to
the failed server), tell the waiting primaries to serve. Re-replication to
restore r copies starts from the next tick, in the background.
"""

from __future__ import annotations

import logging

from btree.tree import Move, TreeError
from client_lib.cidr import Block
from controller import migrations
from controller.saga import Cancelled, Operation, Saga, StepError
from controller.world import SagaWorld


def failover_saga(world: SagaWorld, op: Operation, name: str, reason: str) -> Saga:
    started = world.clock()
    tree = world.tree_or_raise()
    replicas = world.replicas_or_raise()
    moves: list[Move] = []
    promoted: dict[Block, str] = {}
    shrunk: list[Block] = []
    for block, s in sorted(replicas.of(name).items()):
        survivors = [m for m in s.members if m != name and not world.registry[m].failed]
        unsynced = s.unsynced & set(survivors)
        if s.primary != name:
            replicas.assign(block, survivors, unsynced)
            shrunk.append(block)
            continue
        heir = next((m for m in survivors if m not in unsynced), None)
        if heir is None:
            continue   # no synced copy: the salvage path below
        tree.transfer([block], heir)
        moves.append(Move(block, name, heir))
        replicas.assign(block, [heir] + [m for m in survivors if m != heir], unsynced)
        world.hold([block])
        promoted[block] = heir
    try:
        takeover = tree.fail(name, avoid=world.reserved() - {name})
    except TreeError as exc:
        return world.outcome_event("takeover-impossible", server=name, reason=str(exc))
    orphans = [m.block for m in takeover.moves]
    moves += takeover.moves
    successor = takeover.successor
    if successor is not None and orphans:
        for block in orphans:
            replicas.assign(block, (successor,))
        world.hold(orphans)
    replicas.realign()
    op.involves |= set(promoted.values()) | ({successor} if successor else set())
    diff = world.planner_or_raise().update(moves)
    migration = None
    try:
        op.step = "fence"
        try:
            yield from world.reassign([*promoted, *shrunk])
        except StepError as failed:
            world.event("fence-incomplete", logging.WARNING, server=name, reason=str(failed),
                        note="an unreachable member fails over by its heartbeat")
        if orphans and successor is not None:
            op.step = "salvage"
            migration = yield from migrations.copy(world, name, orphans, [successor])
            if migration is not None and not (yield from migrations.adopt(world, orphans, migration,
                                                                          {successor})):
                yield from migrations.abort(world, name, migration)
                migration = None
            if migration is None:
                yield from migrations.recover(world, successor, orphans, lost_with=name, reason=reason)
        op.step = "flows"
        try:
            yield world.send_diff(diff)
        except StepError as failed_flows:
            world.event("flows-unconfirmed", server=name, reason=str(failed_flows))
            yield from world.resync(list(diff))
        op.step = "serve"
        yield from world.activate([*promoted, *orphans])
        if migration is not None and not (yield from migrations.commit(world, name, migration)):
            world.event("commit-unconfirmed", server=name, migration=migration.id,
                        note="the failed server's copy is stale: a rebuild drops it")
    except Cancelled as why:
        return world.outcome_event("takeover-cancelled", server=name, reason=str(why))
    except StepError as failed:
        return world.outcome_event("takeover-incomplete", server=name, reason=str(failed),
                                   note="the tick activates waiting primaries and repairs the sets")
    return world.outcome_event("takeover", ok=True, server=name, reason=reason,
                               promoted={str(b): heir for b, heir in promoted.items()},
                               shrunk=len(shrunk), successor=successor, blocks=len(orphans) + len(promoted),
                               salvaged=migration is not None,
                               salvaged_keys=migration.keys if migration is not None else 0,
                               why=takeover.reason,
                               seconds=round(world.clock() - started, 4))

