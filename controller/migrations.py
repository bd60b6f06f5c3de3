"""What a split, a fail-over and a rebuild all do to migrations and roles,
with the ambiguity of a lost answer resolved in one place.

An admin call whose answer is lost may or may not have happened. Each
helper here asks the agents what did happen before deciding: a copy whose
answer was lost is found by its blocks and targets; a commit is judged by
the source's own record of the migration. Each helper is a sub-saga:
`yield from` it.

A move of blocks, in any operation, goes: the source copies them to every
member of their new replica set (writes to them frozen at the source); the
controller assigns the members their roles under a new epoch, the import
kept; the flows move; the source commits (stops serving them and deletes);
the new primary is told to serve (`controller.move`).

`recover` is the salvage a fail-over or a rebuild falls back on: blocks
whose owner could not hand them over are fetched from any out-of-service
agent that still holds them, or served empty, loudly.
"""

from __future__ import annotations

from client_lib.api.admin import ADMIN, DisownRequest, MigrateRequest, MigrationReport
from client_lib.cidr import Block
from controller.saga import Saga, StepError
from controller.steps import CallAgent
from controller.world import SagaWorld

UNFINISHED = ("copying", "copied")
COPY_TRIES = 2
"""A copy is tried again once: a lost answer or a blip must not turn into
data declared lost while the agent still holds it."""


def copy(world: SagaWorld, source: str, blocks: list[Block], targets: list[str]) -> Saga:
    """The source's copied migration of `blocks` to `targets` (server names,
    primary first), or None when the source cannot give it."""
    urls = [world.registry[t].admin_url for t in targets]
    reason = ""
    for _ in range(COPY_TRIES):
        try:
            migration: MigrationReport = yield CallAgent(
                server=source, url=world.registry[source].admin_url, route=ADMIN.migrate,
                body=MigrateRequest(blocks, urls, world.settings.migration_lease_s))
            return migration
        except StepError as exc:
            reason = str(exc)
        for m in (yield from unfinished(world, source)):
            if not any(a.covers(b) or b.covers(a) for a in m.blocks for b in blocks):
                continue
            if m.state == "copied" and m.blocks == blocks and _same(m.targets, urls):
                return m          # the copy happened; only its answer was lost
            yield from abort(world, source, m)   # a stale one (to targets that died) holds them frozen
    world.event("copy-impossible", server=source, blocks=[str(b) for b in blocks], reason=reason)
    return None


def adopt(world: SagaWorld, blocks: list[Block], migration: MigrationReport, members: set[str]) -> Saga:
    """True once `members` hold their roles in `blocks` with the migration's
    copy as their data. Tried again on a lost answer or a blip: an agent
    that already holds a role at that epoch takes the repeat as done."""
    reason = ""
    for _ in range(COPY_TRIES):
        try:
            yield world.assign_steps(blocks, migration=migration.id, only=members)
            return True
        except StepError as failed:
            reason = str(failed)
    world.event("adopt-failed", blocks=[str(b) for b in blocks], migration=migration.id,
                members=sorted(members), reason=reason)
    return False


def commit(world: SagaWorld, source: str, migration: MigrationReport) -> Saga:
    """True once the source has stopped serving the blocks and deleted them;
    a lost answer is judged by the source's record of the migration."""
    url = world.registry[source].admin_url
    try:
        yield CallAgent(server=source, url=url, route=ADMIN.commit, params={"id": migration.id})
        return True
    except StepError as failed:
        world.event("commit-unclear", server=source, migration=migration.id, reason=str(failed))
    try:
        report: MigrationReport = yield CallAgent(server=source, url=url, route=ADMIN.migration,
                                                  params={"id": migration.id})
        if report.state == "copied":   # the commit never reached it: try once more
            report = yield CallAgent(server=source, url=url, route=ADMIN.commit,
                                     params={"id": migration.id})
        return report.state == "committed"
    except StepError:
        return False


def abort(world: SagaWorld, source: str, migration: MigrationReport) -> Saga:
    """Abort a migration we know; its lease ends it anyway if this is lost."""
    try:
        yield CallAgent(server=source, url=world.registry[source].admin_url, route=ADMIN.abort,
                        params={"id": migration.id})
    except StepError as failed:
        world.event("abort-unconfirmed", server=source, migration=migration.id, reason=str(failed),
                    note="the migration's lease aborts it")


def unfinished(world: SagaWorld, source: str) -> Saga:
    """The source's unfinished migrations ([] if it cannot be asked)."""
    try:
        listing = yield CallAgent(server=source, url=world.registry[source].admin_url,
                                  route=ADMIN.migrations)
    except StepError:
        return []
    return [m for m in listing.migrations if m.state in UNFINISHED]


def abort_unknown(world: SagaWorld, source: str, targets: list[str], blocks: list[Block]) -> Saga:
    """The copy's answer was lost (or the operation was overtaken during it):
    find the migration by its blocks and targets, and abort it if unfinished.
    A dead source needs nothing (its blocks fail over); the targets' leftover
    imports are dropped by the source's abort."""
    if world.registry[source].failed:
        return
    urls = [world.registry[t].admin_url for t in targets]
    for m in (yield from unfinished(world, source)):
        if m.blocks == blocks and _same(m.targets, urls):
            yield from abort(world, source, m)


def drop(world: SagaWorld, server: str, blocks: list[Block], why: str) -> Saga:
    """`server` stops holding `blocks` (either role) and deletes their records."""
    if world.registry[server].failed or not blocks:
        return
    try:
        yield CallAgent(server=server, url=world.registry[server].admin_url, route=ADMIN.disown,
                        body=DisownRequest(blocks, delete=True))
    except StepError as failed:
        world.event("drop-unconfirmed", server=server, blocks=[str(b) for b in blocks], why=why,
                    reason=str(failed), note="its epoch is older: a rebuild drops it")


def salvage_now(world: SagaWorld, donor: str, heir: str, blocks: list[Block]) -> Saga:
    """Move `blocks` from an agent that is out of service (but answers) to
    `heir`, which the switches already send them to (and which holds them in
    the replica sets); if that fails, the heir serves them empty and the loss
    is said."""
    migration = yield from copy(world, donor, blocks, [heir])
    if migration is not None:
        if not (yield from adopt(world, blocks, migration, {heir})):
            world.event("salvage-failed", server=donor, successor=heir)
            yield from abort(world, donor, migration)
        else:
            if not (yield from commit(world, donor, migration)):
                world.event("commit-unconfirmed", server=donor, migration=migration.id,
                            note="the donor is out of service; its copy is stale")
            world.event("salvaged", server=donor, successor=heir, blocks=[str(b) for b in blocks],
                        keys=migration.keys)
            return
    yield from world.own_empty(heir, blocks, lost_with=donor, reason="salvage impossible")


def recover(world: SagaWorld, heir: str, blocks: list[Block], lost_with: str | None,
            reason: str) -> Saga:
    """`heir` takes over blocks whose owner could not hand them over: they
    are salvaged from any out-of-service agent that still claims them (a
    server cut off from the data plane, an earlier owner whose hand-over
    was overtaken); what nobody has is served empty, loudly."""
    replicas = world.replicas_or_raise()
    for block in blocks:
        if replicas.sets.get(block, None) is None or replicas.sets[block].primary != heir:
            replicas.assign(block, (heir,))
    rest = list(blocks)
    donors = [s for s in world.registry.servers.values()
              if s.failed and s.name not in (heir, lost_with)]
    try:
        healths = yield [CallAgent(server=d.name, url=d.admin_url, route=ADMIN.health) for d in donors]
    except StepError as failed:
        healths = failed.results     # the dead ones cannot give anything
    for donor, health in zip(donors, healths, strict=True):
        theirs = [b for b in rest if health is not None and any(o.covers(b) for o in health.owned)]
        if theirs:
            rest = [b for b in rest if b not in theirs]
            yield from salvage_now(world, donor.name, heir, theirs)
    if rest:
        yield from world.own_empty(heir, rest, lost_with, reason)


def _same(reported: list[str], urls: list[str]) -> bool:
    return [u.rstrip("/") for u in reported] == [u.rstrip("/") for u in urls]
