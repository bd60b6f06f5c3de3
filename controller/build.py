"""Building the network: the tree, its owners and replica sets, and every
switch's table, from scratch or from what the agents hold.

A first start bootstraps: the policy picks the primaries, `btree.replicas`
places their backups. A restarted controller rebuilds from the agents'
claims: each registration lists the agent's roles with their epochs, and for
each block the claim with the highest epoch wins, never the first to arrive.
A claim a newer one overrides (a server that was declared failed and came
back, a source whose migration finished) is simply left out: every agent is
then told exactly which roles it holds (an exclusive assignment), and drops
the rest. Blocks nobody in service claims go to an idle leaf, salvaged from
an out-of-service agent that still has them, or served empty, loudly.

`build` maps and plans into the world (the core decides when: once every
registered server is located, or --locate-timeout passed); then the saga
(`build_saga`, started by the core): assign every role (primaries that were
not serving yet stay so), re-sync every switch from what it holds, tell the
waiting primaries to serve, abort the migrations a predecessor left, drop
stray imports, fill the gaps.
"""

from __future__ import annotations

import bisect
import logging
from dataclasses import dataclass, field

import networkx as nx

from btree.flows import FlowPlanner
from btree.replicas import Replicas, ReplicaSet
from btree.tree import LogicalBTree, State
from client_lib.api.admin import ADMIN, Role
from client_lib.cidr import Block
from controller import migrations
from controller.leadership import epoch_floor
from controller.routing import mode_routes
from controller.saga import Saga, StepError
from controller.steps import CallAgent
from controller.world import SagaWorld
from topology.classify import Classification, TopologyError, map_topology


@dataclass
class Restored:
    claimed: bool = False
    """Agents held roles: this is a rebuild, not a first start."""
    gaps: dict[str, list[Block]] = field(default_factory=dict)
    """Heir -> blocks no agent in service claimed."""


@dataclass(frozen=True)
class Built:
    """What a build mapped, for the core (the rest is in the world)."""

    classification: Classification
    restored: Restored


def build(world: SagaWorld, graph: nx.Graph) -> Built | None:
    """Map the discovered topology onto the B-tree, its owners and replica
    sets, and plan every switch's table (`build_saga` programs them); None
    while the topology cannot be mapped (said: the core waits for more)."""
    try:
        classification, tree, fabric = map_topology(graph, world.settings.space)
    except TopologyError as exc:
        world.event("topology-not-mappable", logging.WARNING, reason=str(exc))
        return None
    replicas = Replicas(tree, world.settings.replicas, floor=epoch_floor(world.term))
    world.install(tree, replicas)
    restored = restore(world, tree, replicas)
    if not tree.leaves_in(State.BUSY):
        world.settings.bootstrap.apply(tree)
        owners, wanted = len(tree.leaves_in(State.BUSY)), world.settings.bootstrap.wanted(tree)
        if owners < wanted:
            world.event("bootstrap-short", logging.WARNING, owners=owners, wanted=wanted,
                        failed=len(tree.leaves_in(State.FAILED)),
                        note="fewer servers usable at the first build (failed, or not registered) than "
                             "the bootstrap wants: the space is spread over them, splits do the rest")
        for block, owner in tree.partition():
            place(world, block, owner)
    planner = FlowPlanner(tree, fabric, minimize=world.settings.minimize)
    world.plan_flows(planner, mode_routes(graph, world.settings.mode))
    replicas.check()
    world.event("network-built", switches=len(fabric.switches), servers=len(tree.leaves()),
                busy=len(tree.leaves_in(State.BUSY)), restored=restored.claimed,
                replicas=replicas.r, entries=planner.total_entries())
    return Built(classification, restored)


def place(world: SagaWorld, block: Block, primary: str) -> ReplicaSet:
    """A new set for `block`: its primary and r-1 backups placed across racks."""
    replicas = world.replicas_or_raise()
    placement = world.place([block], [primary], replicas.r - 1)
    return replicas.assign(block, (primary, *placement.backups))


def restore(world: SagaWorld, tree: LogicalBTree, replicas: Replicas) -> Restored:
    """The tree and the replica sets from the agents' claims, highest epoch first."""
    live = {s.name: s for s in world.registry.live() if s.name in tree.leaves()}
    # At one epoch, an agent that restarted loses to one that did not: its
    # store may hold a write its set never acknowledged (see core._register).
    claims = sorted(((role, name) for name, s in live.items() for role in s.roles),
                    key=lambda c: (-c[0].epoch, live[c[1]].suspended, not c[0].primary,
                                   not _synced(c[0], c[1]), c[1]))
    if not claims:
        return Restored()
    replicas.continue_from(max(role.epoch for role, _ in claims))
    accepted: list[tuple[Block, str, Role]] = []
    taken = _Disjoint()
    for role, name in claims:
        # What newer claims cover is stale here (a migration's target was
        # assigned its part of the block): the claim keeps only the rest.
        pieces = uncovered(role.block, taken.overlapping(role.block))
        accepted += [(piece, name, role) for piece in pieces]
        taken.add(pieces)
    tree.bootstrap_organic(accepted[0][1])
    for block, name, _ in accepted:
        tree.transfer([block], name)
        tree.carve(block)
    at_epoch: dict[int, list[tuple[str, Block]]] = {}   # by epoch: a scan of every role per block was
    for n, s in live.items():                          # quadratic in servers (seconds at 2,000)
        for r in s.roles:
            at_epoch.setdefault(r.epoch, []).append((n, r.block))
    for block, name, role in accepted:
        holds = {n for n, held in at_epoch.get(role.epoch, ()) if held.covers(block)}
        members = [name] + [m.name for m in role.members if m.name != name and m.name in holds]
        unsynced = {m.name for m in role.members
                    if m.name in live and (not m.synced or live[m.name].suspended)}
        if role.primary:
            replicas.sets[block] = ReplicaSet(role.epoch, tuple(members),
                                              frozenset(unsynced & set(members[1:])))
            if not role.serving:
                world.hold([block])
        else:   # the primary of this epoch is gone: promote a backup, a synced one if any
            replicas.assign(block, members, unsynced & set(members[1:]))
            world.hold([block])
            world.event("promoted-at-rebuild", block=str(block), primary=name)
            if not _synced(role, name):
                world.event("promoted-unsynced", logging.ERROR, block=str(block), primary=name,
                            note="no synced copy registered: writes it had not caught up are lost")
    gaps = _gaps(world, tree, replicas, [(b, n) for b, n, _ in accepted])
    replicas.realign()
    return Restored(True, gaps)


class _Disjoint:
    """Pairwise disjoint blocks, sorted: the ones a block overlaps are found
    by bisection, not by a scan of all of them (a rebuild from 2,000 agents'
    claims compared every claim with every accepted one)."""

    def __init__(self) -> None:
        self._firsts: list[int] = []
        self._blocks: list[Block] = []

    def add(self, blocks: list[Block]) -> None:
        for block in blocks:
            at = bisect.bisect_left(self._firsts, block.first)
            self._firsts.insert(at, block.first)
            self._blocks.insert(at, block)

    def overlapping(self, block: Block) -> list[Block]:
        """Those that cover `block` or that it covers (CIDR blocks nest or are disjoint)."""
        at = bisect.bisect_right(self._firsts, block.last)
        out = []
        while at > 0 and self._blocks[at - 1].last >= block.first:
            at -= 1
            out.append(self._blocks[at])
        return out


def _synced(role: Role, name: str) -> bool:
    return all(m.synced for m in role.members if m.name == name)


def _gaps(world: SagaWorld, tree: LogicalBTree, replicas: Replicas,
          taken: list[tuple[Block, str]]) -> dict[str, list[Block]]:
    """Parts of the space no claim covers go to one idle leaf (their data may
    be on an agent out of service: the build saga salvages it)."""
    by_owner: dict[str, list[Block]] = {}
    for claimed, by in taken:
        by_owner.setdefault(by, []).append(claimed)
    unclaimed = [(piece, owner) for b, owner in tree.partition()
                 for piece in uncovered(b, by_owner.get(owner, []))]
    gaps: dict[str, list[Block]] = {}
    if not unclaimed:
        return gaps
    idle = tree.leaves_in(State.IDLE)
    for block, owner in unclaimed:
        heir = idle[0] if idle else owner
        tree.transfer([block], heir)
        replicas.assign(block, (heir,))
        world.hold([block])
        gaps.setdefault(heir, []).append(block)
    world.event("unclaimed-blocks", logging.WARNING, blocks=[str(b) for b, _ in unclaimed],
                given_to=sorted(gaps))
    return gaps


def build_saga(world: SagaWorld, restored: Restored) -> Saga:
    # The agents told their roles while the switches' tables are read: neither waits for the other.
    unassigned = yield from world.resync(sorted(world.planner_or_raise().fabric.switches),
                                         alongside=world.assign_all())
    if unassigned is not None:
        world.event("assign-incomplete", logging.ERROR, reason=str(unassigned),
                    note="a server that does not answer fails over by its heartbeat")
    yield from finish_leftovers(world)
    for heir, blocks in restored.gaps.items():
        yield from migrations.recover(world, heir, blocks, None, "no agent in service claims these blocks")
    yield from world.activate(sorted(world.not_serving))
    return None


def finish_leftovers(world: SagaWorld) -> Saga:
    """A restarted controller finds the migrations its predecessor left on the
    agents. The tree was rebuilt from what the agents hold, and an unfinished
    migration's blocks are still held by its source at the older epoch, so
    aborting it is what agrees with the flows just installed: the source
    unfreezes and keeps serving, the targets drop their copies."""
    servers = list(world.registry.servers.values())   # out of service too: it may hold leftovers
    # Both listings in one round (at k=32, 2,000 calls each: 3.3 s and 5.1 s one after the other).
    asked = [CallAgent(server=s.name, url=s.admin_url, route=route)
             for route in (ADMIN.migrations, ADMIN.health) for s in servers]
    try:
        answers = yield asked
    except StepError as failed:
        answers = failed.results
    listings, healths = answers[:len(servers)], answers[len(servers):]
    aborts = [CallAgent(server=s.name, url=s.admin_url, route=ADMIN.abort, params={"id": m.id})
              for s, listing in zip(servers, listings, strict=True) if listing is not None
              for m in listing.migrations if m.state in ("copying", "copied")]
    if aborts:
        world.event("leftover-migrations", count=len(aborts), migrations=[a.params["id"] for a in aborts],
                    action="aborted")
        try:
            yield aborts
        except StepError as failed:
            world.event("abort-unconfirmed", logging.WARNING, reason=str(failed),
                        note="the migrations' leases abort them")
    discards = [CallAgent(server=s.name, url=s.admin_url, route=ADMIN.import_discard, params={"id": i})
                for s, health in zip(servers, healths, strict=True) if health is not None
                for i in health.imports]
    if discards:
        world.event("leftover-imports", count=len(discards), action="discarded")
        try:
            yield discards
        except StepError as failed:
            world.event("discard-unconfirmed", logging.WARNING, reason=str(failed))


def uncovered(block: Block, claims: list[Block]) -> list[Block]:
    """The parts of `block` that no claim covers, as blocks (CIDR blocks nest
    or are disjoint, so halving until each half is covered or untouched ends)."""
    if any(c.covers(block) for c in claims):
        return []
    inside = [c for c in claims if block.covers(c)]
    if not inside:
        return [block]
    low, high = block.halves()
    return uncovered(low, inside) + uncovered(high, inside)
