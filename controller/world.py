"""The world the sagas act on: what they may read and the operations they
may perform, owned by the core (`controller.core.MetaFlowCore.world`).

A saga (build, split, merge, fail-over, repair, rebalance, drain, the migrations)
gets a `SagaWorld`, never the core: it reads the registry, the tree, the
replica sets and the flow planner, and changes what the core keeps only
through the operations here (place a set, assign roles, send a flow diff
and its barrier, re-sync, revert, hold or release blocks, count keys,
record a move or a split, say an event). The core keeps the rest (the
inventory's learning, host routes, load polling, dispatch and tick policy)
and installs what a build maps (`install`). Nothing here does I/O: every
switch or agent call is a step a saga yields.
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Callable, Collection, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from btree.flows import FlowDiff, FlowPlanner, as_now
from btree.rebalance import ChurnLimit
from btree.replicas import Placement, Replicas
from btree.tree import LogicalBTree, Move
from client_lib.api.admin import ADMIN, AssignRequest, Member, Role
from client_lib.api.rest import Outcome
from client_lib.cidr import Block
from client_lib.errors import Conflict
from controller import ofmsgs
from controller.inventory import Inventory
from controller.registry import Registry, Server
from controller.routing import Routes
from controller.saga import Operations, Saga, StepError
from controller.settings import Settings
from controller.steps import CallAgent, ReadFlows, SendFlows, Step
from controller.telemetry import Recorder

log = logging.getLogger("metaflow.controller")

DrainState = Literal["draining", "drained", "stopped"]
"""A drain under way; done (the server holds nothing and takes nothing new);
or stopped short (the reason says why; the server is back in service with
what it still holds)."""


RESYNC_BATCH = 128
"""Switches whose messages one step of a re-sync computes (`SagaWorld.resync`).
A build re-syncs every switch, and at k=32 computing all 1,280 tables' messages
(2.6 million entries) at once held the decision thread for tens of seconds;
batch by batch, the heartbeats and port status that arrive meanwhile are
handled between two batches. A fabric of at most 128 switches (k=8 has 80) is
re-synced in one batch, as it always was."""


@dataclass
class Drain:
    """One server's drain (`controller.drain`), as `/drains` shows it."""

    state: DrainState
    started: float
    finished: float | None = None
    reason: str = ""
    moves: list[dict[str, Any]] = field(default_factory=list)
    """The moves of its primaries done so far (`controller.move.move_blocks` records)."""
    backups_moved: int = 0

    @property
    def out(self) -> bool:
        """The server takes no new block, copy or split: draining or drained."""
        return self.state != "stopped"


class SagaWorld:
    """The core's state as the sagas see it, and what they may do to it."""

    def __init__(self, settings: Settings, clock: Callable[[], float], registry: Registry,
                 inventory: Inventory, operations: Operations, recorder: Recorder) -> None:
        self.settings = settings
        self.clock = clock
        self.recorder = recorder
        """Where a saga says what ended (a move of blocks), for the metrics."""
        self.registry = registry
        self._inventory = inventory   # read for the connected switches only
        self._operations = operations   # read for what running operations hold only
        self.tree: LogicalBTree | None = None
        self.replicas: Replicas | None = None
        self.planner: FlowPlanner | None = None
        self.routes: Routes = {}
        """Host routes per switch, as the core last computed them (a re-sync keeps them)."""
        self.not_serving: set[Block] = set()
        """Blocks whose primary holds its role but waits to serve (a promotion
        or a move before its flows are in place)."""
        self.events: deque[dict[str, Any]] = deque(maxlen=500)
        self.splits: list[dict[str, Any]] = []
        self.lost: list[dict[str, Any]] = []
        self.drains: dict[str, Drain] = {}
        """Servers being drained or drained (`controller.drain`); a controller
        restart forgets them (the drain is not resumed)."""
        self.churn = ChurnLimit(settings.churn_per_rebalance, settings.churn_per_minute, clock)
        self.term = 0
        """The leader's term (`controller.leadership`): a build's epochs start
        above `term << 32`; 0 for the one controller without etcd."""

    # -- what a build maps ------------------------------------------------------------

    def install(self, tree: LogicalBTree, replicas: Replicas) -> None:
        """A build's tree and replica sets (their flows follow: `plan_flows`)."""
        self.tree, self.replicas = tree, replicas

    def plan_flows(self, planner: FlowPlanner, routes: Routes) -> None:
        """A build's flow planner, once the tree and its sets are final, and the host routes."""
        self.planner, self.routes = planner, routes

    # -- events, and what operations hold ----------------------------------------------

    def event(self, kind: str, level: int = logging.INFO, **detail: Any) -> dict[str, Any]:
        record = {"t": round(self.clock(), 3), "event": kind, **detail}
        if level >= logging.INFO:   # what is only worth a debug line is not kept either
            self.events.append(record)
        log.log(level, "%s %s", kind, " ".join(f"{k}={v}" for k, v in detail.items()))
        return record

    def outcome_event(self, kind: str, ok: bool = False, **detail: Any) -> Outcome:
        """Record how an operation ended, and say it to whoever asked for it."""
        level = logging.INFO if ok else logging.WARNING
        record = self.event(kind, level, **detail)
        return Outcome(kind, str(detail.get("server", "")), ok,
                       {k: v for k, v in record.items() if k not in ("t", "event")})

    def tree_or_raise(self) -> LogicalBTree:
        if self.tree is None:
            raise Conflict("the network is not built yet")
        return self.tree

    def planner_or_raise(self) -> FlowPlanner:
        if self.planner is None:
            raise Conflict("the network is not built yet")
        return self.planner

    def reserved(self) -> set[str]:
        """Servers the running operations hold exclusively, and those being
        drained or drained: no operation may choose them as its target."""
        return self._operations.reserved() | self.drained()

    def drained(self) -> set[str]:
        """Servers being drained or drained: they get no new block or copy."""
        return {name for name, drain in self.drains.items() if drain.out}

    def mark_failed(self, name: str, reason: str) -> None:
        """`name` is out of service from now on, said loudly."""
        self.registry[name].failed = reason
        self.event("server-failed", logging.ERROR, server=name, reason=reason)

    def hold(self, blocks: Iterable[Block]) -> None:
        """The primaries of `blocks` hold their roles without serving until
        their flows are in place (`activate`)."""
        self.not_serving.update(blocks)

    def release(self, blocks: Iterable[Block]) -> None:
        """`blocks` no longer wait to serve (given back, or served)."""
        self.not_serving.difference_update(blocks)

    def record_split(self, record: dict[str, Any]) -> None:
        """A finished split, for `/splits`."""
        self.splits.append(record)

    # -- switch I/O as steps -----------------------------------------------------------

    def send_diff(self, diff: FlowDiff) -> list[Step]:
        """The switches' part of `diff`, each entry as the planner has it now
        (`as_now`): another operation may have changed it since."""
        planner = self.planner_or_raise()
        return [SendFlows(dpid=dpid, messages=ofmsgs.diff_messages(as_now(change, planner.table(dpid))))
                for dpid, change in diff.items() if dpid in self._inventory.dpids]

    def base_entries(self) -> list[ofmsgs.BaseEntry]:
        """What every switch holds besides MetaFlow's entries, in this mode."""
        return ofmsgs.base_entries(self.settings.mode, self.settings.gateway_ip)

    def resync(self, dpids: Iterable[int], alongside: Sequence[Step] = ()) -> Saga:
        """Read what the switches hold and send each only its differences:
        after a restart, a reconnect, or a diff of unknown fate. Traffic that
        the switch already forwards right is not disturbed. `alongside`:
        steps that need not wait for the reads, sent in the same round (a
        rebuild's assignments: at k=32, 7.7 s of agent calls and then 3.1 s
        of reads, one after the other); returns their `StepError`, or None."""
        planner = self.planner_or_raise()
        targets = [d for d in dpids if d in self._inventory.dpids and d in planner.fabric.switches]
        if not targets and not alongside:
            return None
        theirs: StepError | None = None
        try:
            got = yield [*alongside, *(ReadFlows(dpid=d) for d in targets)]
        except StepError as failed:
            got = failed.results
            split = len(alongside)
            if their_errors := {i: e for i, e in failed.errors.items() if i < split}:
                theirs = StepError(their_errors, got[:split])
            if our_errors := [e for i, e in failed.errors.items() if i >= split]:
                self.event("resync-incomplete", logging.WARNING, switches=targets,
                           reason="; ".join(our_errors), note="a switch that reconnects is re-synced")
        stats = got[len(alongside):]
        read = [(dpid, have) for dpid, have in zip(targets, stats, strict=True) if have is not None]
        failures = []
        for start in range(0, len(read), RESYNC_BATCH):
            sends = [SendFlows(dpid=dpid, messages=ofmsgs.resync_messages(
                ofmsgs.installed(have), list(planner.table(dpid).values()), self.routes.get(dpid, {}),
                self.base_entries())) for dpid, have in read[start:start + RESYNC_BATCH]]
            try:
                yield sends
            except StepError as failed:
                failures.append(str(failed))
        if failures:
            self.event("resync-incomplete", logging.WARNING, switches=targets, reason="; ".join(failures),
                       note="a switch that reconnects is re-synced")
        return theirs

    def revert(self, moves: list[Move]) -> None:
        """Give moved blocks back in the tree and the planner (the switches are
        re-synced by the caller)."""
        back = [Move(m.block, m.target, m.source) for m in reversed(moves) if m.source is not None]
        tree = self.tree_or_raise()
        for move in back:
            tree.transfer([move.block], move.target)
        self.planner_or_raise().update(back)

    def own_empty(self, server: str, blocks: list[Block], lost_with: str | None, reason: str) -> Saga:
        """`server` serves `blocks` without their data, which died with every
        copy (`lost_with`; None: no agent claims them): said loudly, never
        silently. The blocks get a set of one; re-replication adds backups."""
        keys = self.registry[lost_with].keys if lost_with is not None and lost_with in self.registry else None
        lost = {"server": lost_with, "blocks": [str(b) for b in blocks],
                "keys_lost_at_most": keys, "reason": reason}
        self.lost.append(lost)
        self.event("DATA-LOST", logging.ERROR, **lost, successor=server,
                   note="every copy of these blocks is gone; their metadata is lost until rewritten")
        replicas = self.replicas_or_raise()
        for block in blocks:
            replicas.assign(block, (server,))
        self.release(blocks)
        try:
            yield self.assign_steps(blocks)
        except StepError as failed:
            self.event("assign-failed", logging.ERROR, server=server, reason=str(failed),
                       note="its heartbeat decides whether it fails over")

    # -- roles: what each agent holds ----------------------------------------------------

    def replicas_or_raise(self) -> Replicas:
        if self.replicas is None:
            raise Conflict("the network is not built yet")
        return self.replicas

    def out_of_service(self) -> set[str]:
        """Servers a new copy must not go to: the failed ones, and those being
        drained or drained. (A server busy
        with another operation may take a copy: a role in one set does not
        touch its roles in others, and leaving it out made splits and
        repairs start short of copies whenever several ran at once.)"""
        return {s.name for s in self.registry.servers.values() if s.failed} | self.drained()

    def place(self, blocks: Iterable[Block], members: Sequence[str], count: int,
              avoid: Collection[str] = ()) -> Placement:
        """`count` more members for the set of `members` (primary first) of
        `blocks`, across racks, never on a failed server or one in `avoid`;
        a backup that has to share a rack, or one that cannot be placed at
        all, is said."""
        placement = self.replicas_or_raise().place(list(members), count,
                                                   avoid=self.out_of_service() | set(avoid))
        where = [str(b) for b in blocks]
        if placement.shared_domain:
            self.event("replicas-share-a-rack", logging.WARNING, blocks=where,
                       note="no other rack has a live server")
        if placement.short:
            self.event("replicas-short", logging.WARNING, blocks=where, missing=placement.short,
                       note="not enough live servers for every copy")
        return placement

    def role(self, block: Block, name: str) -> Role:
        s = self.replicas_or_raise().sets[block]
        members = [Member(m, self.registry[m].replication, m not in s.unsynced) for m in s.members]
        return Role(block, s.epoch, s.primary == name, members, serving=block not in self.not_serving)

    def roles_of(self, name: str) -> list[Role]:
        return [self.role(block, name) for block in sorted(self.replicas_or_raise().of(name))]

    def assign_steps(self, blocks: Iterable[Block], migration: str | None = None,
                     only: Collection[str] | None = None, primaries: bool | None = None) -> list[Step]:
        """One /assign per member of these blocks' sets (or of `only`), giving it
        its role in each (`primaries`: only the primaries' roles, or only the
        backups'); a failed member is skipped."""
        replicas = self.replicas_or_raise()
        per: dict[str, list[Role]] = {}
        for block in blocks:
            s = replicas.sets[block]
            for member in s.members:
                if primaries is not None and (member == s.primary) != primaries:
                    continue
                if (only is None or member in only) and not self.registry[member].failed:
                    per.setdefault(member, []).append(self.role(block, member))
        return [CallAgent(server=name, url=self.registry[name].admin_url, route=ADMIN.assign,
                          body=AssignRequest(roles, migration)) for name, roles in sorted(per.items())]

    def reassign(self, blocks: Sequence[Block]) -> Saga:
        """Every member of the blocks' sets takes its role at the sets' new
        epoch, the primaries first. A primary that learns the epoch before its
        backups resends its stream until they catch up; a backup ahead of its
        primary answers it STALE instead, which fences the primary for nothing
        (and its heartbeat would then ask for a full re-sync)."""
        yield self.assign_steps(blocks, primaries=True)
        yield self.assign_steps(blocks, primaries=False)

    def assign_all(self) -> list[Step]:
        """Every live server is told exactly what it holds (it drops the rest)."""
        return [CallAgent(server=s.name, url=s.admin_url, route=ADMIN.assign,
                          body=AssignRequest(self.roles_of(s.name) if self.in_tree(s.name) else [],
                                             exclusive=True))
                for s in self.registry.live()]

    def activate(self, blocks: Iterable[Block]) -> Saga:
        """The primaries of `blocks` start serving (their flows are in place)."""
        blocks = [b for b in blocks if b in self.replicas_or_raise().sets]
        self.release(blocks)
        if not blocks:
            return
        try:
            yield self.assign_steps(blocks, only={self.replicas_or_raise().sets[b].primary for b in blocks})
        except StepError as failed:
            self.hold(blocks)   # the tick tries again
            self.event("activation-unconfirmed", logging.WARNING, blocks=[str(b) for b in blocks],
                       reason=str(failed))

    def in_tree(self, name: str) -> bool:
        return self.tree is not None and name in self.tree.leaves()

    # -- keys ----------------------------------------------------------------------------

    def capacity(self, server: Server) -> int:
        return self.settings.capacity or server.capacity

    def stored_keys(self) -> int:
        """Keys stored, by the live servers' last heartbeats (each key counted
        once, not once per copy): what the churn limits are shares of."""
        return sum(server.keys for server in self.registry.live()) // self.settings.replicas

    def moved_keys(self, source: str, target: str, keys: int) -> None:
        """The key counts after `keys` moved from `source` to `target`, until
        their next heartbeats say: the placement of the next move and the
        churn limit read them before."""
        self.registry[target].keys += keys
        self.registry[source].keys = max(0, self.registry[source].keys - keys)
