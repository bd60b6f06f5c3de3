"""A fail-over as a saga: the tree names a successor, the data is salvaged if
the failed server's agent still answers, and the switches follow.

1. (at once, before any step) the server is out of service; operations that
   involve it are cancelled first, then the tree hands its blocks to the
   nearest idle leaf not promised to another operation;
2. salvage: if the failed server's agent answers over the management
   network (its edge link died, not the server), its blocks are copied to
   the successor exactly as in a split; otherwise the successor owns them
   empty, and the loss is said loudly (there is no replication yet);
3. flows: every switch whose table changes gets its diff. There is no way
   back (the failed server cannot serve), so a switch that does not confirm
   is re-synced, and re-synced again when it reconnects;
4. commit the salvage (or, if that fails, the successor owns the blocks empty).

A successor that fails meanwhile cancels this operation; its own fail-over
then moves the blocks on.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from btree.tree import TreeError
from controller import migrations
from controller.saga import Cancelled, Operation, Saga, StepError

if TYPE_CHECKING:
    from controller.core import MetaFlowCore


def failover_saga(core: MetaFlowCore, op: Operation, name: str, reason: str) -> Saga:
    started = core.clock()
    tree = core.tree_or_raise()
    try:
        takeover = tree.fail(name, avoid=core.operations.reserved() - {name})
    except TreeError as exc:
        return core.outcome_event("takeover-impossible", server=name, reason=str(exc))
    blocks = [m.block for m in takeover.moves]
    if takeover.successor is None or not blocks:
        return core.outcome_event("server-failed", ok=True, server=name, reason=reason,
                                  note=takeover.reason)
    successor = core.registry[takeover.successor]
    op.involves.add(successor.name)
    try:
        op.step = "salvage"
        migration = yield from migrations.salvage(core, name, successor.admin_url, blocks)
        if migration is None:
            yield from core.recover(successor.name, blocks, lost_with=name, reason=reason)
        op.step = "flows"
        diff = core.planner_or_raise().update(list(takeover.moves))
        try:
            yield core.send_diff(diff)
        except StepError as failed_flows:
            core.event("flows-unconfirmed", server=name, reason=str(failed_flows))
            yield from core.resync(list(diff))
        salvaged = False
        if migration is not None:
            op.step = "commit"
            salvaged = yield from migrations.commit(core, name, successor.name, migration)
            if not salvaged:
                core.event("salvage-failed", server=name, migration=migration.id)
                yield from core.own_empty(successor.name, blocks, lost_with=name, reason=reason)
    except Cancelled as why:
        return core.outcome_event("takeover-cancelled", server=name, successor=successor.name,
                                  reason=str(why))
    return core.outcome_event("takeover", ok=True, server=name, successor=successor.name,
                              blocks=len(blocks), same_parent=takeover.same_parent, salvaged=salvaged,
                              why=takeover.reason, reason=reason,
                              seconds=round(core.clock() - started, 4))
