"""What a split, a fail-over and a rebuild all do to a migration, with the
ambiguity of a lost answer resolved in one place.

An admin call whose answer is lost may or may not have happened. Each
helper here asks the agents what did happen before deciding: a commit is
judged by the source's record of the migration, then by the target's
ownership; an unknown migration is found by its blocks and target; a
salvage that cannot be completed leaves the successor serving the blocks
empty, said loudly. Each helper is a sub-saga: `yield from` it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from client_lib.api.admin import ADMIN, MigrateRequest, MigrationReport
from client_lib.cidr import Block
from controller.saga import Saga, StepError
from controller.steps import CallAgent

if TYPE_CHECKING:
    from controller.core import MetaFlowCore

UNFINISHED = ("copying", "copied")
SALVAGE_TRIES = 2
"""A salvage's copy is tried again once: a lost answer or a blip must not
turn into data declared lost while the agent still holds it."""


def commit(core: MetaFlowCore, source: str, target: str, migration: MigrationReport) -> Saga:
    """True if the target now serves the blocks. A lost answer is resolved by
    asking the source's record, then the target's ownership."""
    url = core.registry[source].admin_url
    try:
        yield CallAgent(server=source, url=url, route=ADMIN.commit, params={"id": migration.id})
        return True
    except StepError as failed:
        core.event("commit-unclear", server=source, migration=migration.id, reason=str(failed))
    try:
        report: MigrationReport = yield CallAgent(server=source, url=url, route=ADMIN.migration,
                                                  params={"id": migration.id})
        if report.state == "copied":   # the commit never reached it: try once more
            report = yield CallAgent(server=source, url=url, route=ADMIN.commit,
                                     params={"id": migration.id})
        return report.state == "committed"
    except StepError:
        pass
    return (yield from target_serves(core, target, migration.blocks))


def target_serves(core: MetaFlowCore, target: str, blocks: list[Block]) -> Saga:
    try:
        health = yield CallAgent(server=target, url=core.registry[target].admin_url,
                                 route=ADMIN.health)
    except StepError:
        return False
    owned = health.owned
    return all(any(o.covers(b) for o in owned) for b in blocks)


def abort(core: MetaFlowCore, source: str, migration: MigrationReport) -> Saga:
    """Abort a migration we know; its lease ends it anyway if this is lost."""
    try:
        yield CallAgent(server=source, url=core.registry[source].admin_url, route=ADMIN.abort,
                        params={"id": migration.id})
    except StepError as failed:
        core.event("abort-unconfirmed", server=source, migration=migration.id, reason=str(failed),
                   note="the migration's lease aborts it")


def unfinished(core: MetaFlowCore, source: str) -> Saga:
    """The source's unfinished migrations ([] if it cannot be asked)."""
    try:
        listing = yield CallAgent(server=source, url=core.registry[source].admin_url,
                                  route=ADMIN.migrations)
    except StepError:
        return []
    return [m for m in listing.migrations if m.state in UNFINISHED]


def find_unfinished(core: MetaFlowCore, source: str, target_url: str, blocks: list[Block]) -> Saga:
    """The source's unfinished migration of exactly `blocks` to `target_url`,
    if there is one (a copy whose answer was lost); None if there is none
    or the source cannot be asked."""
    found = yield from unfinished(core, source)
    return next((m for m in found if m.target.rstrip("/") == target_url.rstrip("/") and m.blocks == blocks),
                None)


def abort_unknown(core: MetaFlowCore, source: str, target: str, blocks: list[Block]) -> Saga:
    """The copy's answer was lost (or the operation was overtaken during it):
    find the migration by its blocks and target, and abort it if unfinished.
    A dead source needs nothing (its blocks fail over); a dead target's
    leftover import is dropped by the source's abort."""
    if core.registry[source].failed and not core.registry[target].failed:
        return
    found = yield from find_unfinished(core, source, core.registry[target].admin_url, blocks)
    if found is not None:
        yield from abort(core, source, found)


def salvage_now(core: MetaFlowCore, donor: str, successor: str, blocks: list[Block]) -> Saga:
    """Move `blocks` from an agent that is out of service (but answers) to
    the server the switches already send them to; if that fails, the
    successor serves them empty and the loss is said."""
    migration = yield from salvage(core, donor, core.registry[successor].admin_url, blocks)
    if migration is not None and (yield from commit(core, donor, successor, migration)):
        core.event("salvaged", server=donor, successor=successor, blocks=[str(b) for b in blocks],
                   keys=migration.keys)
        return
    yield from core.own_empty(successor, blocks, lost_with=donor, reason="salvage impossible")


def salvage(core: MetaFlowCore, name: str, successor_url: str, blocks: list[Block]) -> Saga:
    """Copy an out-of-service agent's blocks to a successor: the copied
    migration, or None when the agent cannot give its data."""
    reason = ""
    for _ in range(SALVAGE_TRIES):
        try:
            migration: MigrationReport = yield CallAgent(
                server=name, url=core.registry[name].admin_url, route=ADMIN.migrate,
                body=MigrateRequest(blocks, successor_url, core.settings.migration_lease_s))
            return migration
        except StepError as exc:
            reason = str(exc)
        for m in (yield from unfinished(core, name)):
            if not any(a.covers(b) or b.covers(a) for a in m.blocks for b in blocks):
                continue
            same_target = m.target.rstrip("/") == successor_url.rstrip("/")
            if m.state == "copied" and m.blocks == blocks and same_target:
                return m          # the copy happened; only its answer was lost
            yield from abort(core, name, m)   # a stale one (to a successor that died) holds them frozen
    core.event("salvage-impossible", server=name, reason=reason)
    return None
