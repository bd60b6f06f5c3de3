"""The controller's brain: events in, steps out, no I/O and no waiting.

`MetaFlowCore.handle(event)` updates the state (the inventory of switches,
links and hosts; the registry of servers; the B-tree and its flow planner)
and returns the steps that carry out what it decided: OpenFlow messages for
a switch, an admin call to an agent, an answer to a REST caller. The shim
(`controller.app`) performs them and reports each outcome back as an event.
Multi-step work (building the network, a split, a fail-over, re-syncing a
switch) runs as sagas (`controller.saga`), many at once: while a split's
copy runs, the core keeps deciding, so a failure is handled at once and
cancels the operations it overtakes.

Everything runs on one thread, the shim's decision loop; REST reads go
through the same loop.
"""

from __future__ import annotations

import itertools
import logging
import time
from collections import deque
from collections.abc import Callable, Collection, Iterable, Sequence
from typing import Any

import networkx as nx

from btree.balance import ImbalanceModel, imbalance_factor, transfers
from btree.flows import FlowDiff, FlowPlanner
from btree.rebalance import ChurnLimit
from btree.replicas import Placement, Replicas
from btree.tree import LogicalBTree, Move, State
from client_lib.api.admin import ADMIN, AssignRequest, Member, Role
from client_lib.api.rest import (
    Ack,
    EventsView,
    FlowInfo,
    FlowsView,
    HostInfo,
    LeafInfo,
    LoadView,
    OperationInfo,
    OperationsView,
    Outcome,
    PrefixLoad,
    Registered,
    ServerInfo,
    ServersView,
    SplitsView,
    SwitchInfo,
    TopologyView,
    TreeView,
)
from client_lib.cidr import Block
from client_lib.errors import Conflict, NotFound
from controller import arp, ofmsgs
from controller.build import build
from controller.failover import failover_saga
from controller.inventory import Inventory
from controller.load import LoadMeter
from controller.migrations import salvage_now
from controller.rebalance import rebalance_saga
from controller.registry import Registry, Server
from controller.repair import repair_saga
from controller.routing import Routes, diff_routes, host_routes
from controller.saga import Operation, Operations, Saga, StepError
from controller.settings import Settings
from controller.split import split_saga
from controller.steps import (
    Answer,
    ArpIn,
    CallAgent,
    Event,
    FailNow,
    Heartbeat,
    LinkDown,
    LinkUp,
    PacketOut,
    PortDown,
    PortUp,
    ReadFlows,
    Register,
    SendFlows,
    SplitNow,
    Step,
    StepDone,
    StepFailed,
    SwitchDown,
    SwitchUp,
    Tick,
)
from topology.classify import Classification, discovered_graph

log = logging.getLogger("metaflow.controller")


class MetaFlowCore:
    def __init__(self, settings: Settings, clock: Callable[[], float] = time.monotonic) -> None:
        self.settings = settings
        self.clock = clock
        self.inventory = Inventory(settings.space, settings.gateway_ip)
        self.registry = Registry(settings.space)
        self.operations = Operations(self._issue)
        self.graph: nx.Graph | None = None
        self.classification: Classification | None = None
        self.tree: LogicalBTree | None = None
        self.planner: FlowPlanner | None = None
        self.routes: Routes = {}
        self.events: deque[dict[str, Any]] = deque(maxlen=500)
        self.splits: list[dict[str, Any]] = []
        self.lost: list[dict[str, Any]] = []
        self.last_change = clock()
        self._ids = itertools.count(1)
        self._loose: dict[int, str] = {}   # steps no operation waits for: what they were
        self._routing: dict[str, set[int]] = {}
        """Hosts just learned: the route steps toward them not yet confirmed."""
        self._held: list[tuple[set[str], PacketOut]] = []
        """ARP replies from or for such hosts, sent once none of them is in `_routing`."""
        self._unjoinable: set[str] = set()   # servers told they cannot join (said once)
        self.first_registration: float | None = None
        self.replicas: Replicas | None = None
        self.not_serving: set[Block] = set()
        """Blocks whose primary holds its role but waits to serve (a promotion
        or a move before its flows are in place)."""
        self.load = LoadMeter()
        self._polls: dict[int, int] = {}
        """Flow-counter reads under way: step id to dpid."""
        self._polled = float("-inf")
        self.imbalance = ImbalanceModel(settings.load_capacity, settings.imbalance_threshold)
        self._loads: deque[dict[str, float]] = deque(maxlen=self.imbalance.hold)
        """Per-server load after each of the last complete polls."""
        self.churn = ChurnLimit(settings.churn_per_rebalance, settings.churn_per_minute, clock)

    # -- the one entry point ---------------------------------------------------------

    def handle(self, event: Event) -> list[Step]:
        """Everything the controller hears goes through here, in order."""
        if isinstance(event, (StepDone, StepFailed)):
            return self._outcome(event)
        if isinstance(event, Tick):
            return self._tick()
        if isinstance(event, ArpIn):
            return self._arp(event)
        if isinstance(event, (SwitchUp, SwitchDown, LinkUp, LinkDown, PortUp, PortDown)):
            return self._topology(event)
        if isinstance(event, Register):
            try:
                return self._register(event)
            except (Conflict, NotFound, ValueError) as exc:
                return [self._issue_answer(event.reply, exc)]
        if isinstance(event, Heartbeat):
            return self._answer(event.reply, lambda: self._heartbeat(event))
        if isinstance(event, SplitNow):
            return self._split_now(event)
        if isinstance(event, FailNow):
            return self._fail_now(event)
        raise TypeError(f"unknown event {event!r}")

    # -- bookkeeping used by the sagas -----------------------------------------------

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

    def _issue(self, step: Step) -> int:
        step.id = next(self._ids)
        return step.id

    def _loose_steps(self, steps: Iterable[Step], what: str) -> list[Step]:
        """Steps no operation waits for; a failure is only logged."""
        out = list(steps)
        for step in out:
            self._loose[self._issue(step)] = what
        return out

    def _outcome(self, event: StepDone | StepFailed) -> list[Step]:
        dpid = self._polls.pop(event.step, None)
        if dpid is not None:
            if isinstance(event, StepDone) and isinstance(event.result, list):
                self.load.observe(dpid, self.clock(), ofmsgs.entry_counts(event.result))
            return self._judge_load() if not self._polls else []   # a failed read: the next poll asks again
        what = self._loose.pop(event.step, None)
        if what is not None:
            if isinstance(event, StepFailed):
                self.event("step-failed", logging.WARNING, what=what, reason=event.error)
            return self._confirmed(event.step)
        if isinstance(event, StepDone):
            return self.operations.result(event.step, True, event.result)
        return self.operations.result(event.step, False, event.error)

    def _answer(self, reply: object, work: Callable[[], object]) -> list[Step]:
        try:
            value: object = work()
        except (Conflict, NotFound, ValueError) as exc:
            value = exc
        return [self._issue_answer(reply, value)]

    def _issue_answer(self, reply: object, value: object) -> Answer:
        step = Answer(reply=reply, value=value)
        self._issue(step)
        return step

    # -- switch I/O as steps -----------------------------------------------------------

    def send_diff(self, diff: FlowDiff) -> list[Step]:
        return [SendFlows(dpid=dpid, messages=ofmsgs.diff_messages(change))
                for dpid, change in diff.items() if dpid in self.inventory.dpids]

    def resync(self, dpids: Iterable[int]) -> Saga:
        """Read what the switches hold and send each only its differences:
        after a restart, a reconnect, or a diff of unknown fate. Traffic that
        the switch already forwards right is not disturbed."""
        planner = self.planner_or_raise()
        targets = [d for d in dpids if d in self.inventory.dpids and d in planner.fabric.switches]
        if not targets:
            return
        try:
            stats = yield [ReadFlows(dpid=d) for d in targets]
        except StepError as failed:
            self.event("resync-incomplete", logging.WARNING, switches=targets, reason=str(failed),
                       note="a switch that reconnects is re-synced")
            stats = failed.results
        sends = []
        for dpid, have in zip(targets, stats, strict=True):
            if have is None:
                continue
            table, routes = ofmsgs.installed(have)
            want = list(planner.table(dpid).values())
            sends.append(SendFlows(dpid=dpid, messages=ofmsgs.resync_messages(
                table, routes, want, self.routes.get(dpid, {}))))
        try:
            yield sends
        except StepError as failed:
            self.event("resync-incomplete", logging.WARNING, switches=targets, reason=str(failed),
                       note="a switch that reconnects is re-synced")

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
        self.not_serving.difference_update(blocks)
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
        """Servers a new copy must not go to: the failed ones. (A server busy
        with another operation may take a copy: a role in one set does not
        touch its roles in others, and leaving it out made splits and
        repairs start short of copies whenever several ran at once.)"""
        return {s.name for s in self.registry.servers.values() if s.failed}

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
                          body=AssignRequest(self.roles_of(s.name) if self._in_tree(s.name) else [],
                                             exclusive=True))
                for s in self.registry.live()]

    def activate(self, blocks: Iterable[Block]) -> Saga:
        """The primaries of `blocks` start serving (their flows are in place)."""
        blocks = [b for b in blocks if b in self.replicas_or_raise().sets]
        self.not_serving.difference_update(blocks)
        if not blocks:
            return
        try:
            yield self.assign_steps(blocks, only={self.replicas_or_raise().sets[b].primary for b in blocks})
        except StepError as failed:
            self.not_serving.update(blocks)   # the tick tries again
            self.event("activation-unconfirmed", logging.WARNING, blocks=[str(b) for b in blocks],
                       reason=str(failed))

    def _in_tree(self, name: str) -> bool:
        return self.tree is not None and name in self.tree.leaves()

    # -- topology ----------------------------------------------------------------------

    def _topology(self, event: Event) -> list[Step]:
        inv = self.inventory
        if isinstance(event, SwitchUp):
            inv.switch_up(event.dpid)
            self.last_change = self.clock()
            if self.planner is not None and event.dpid in self.planner.fabric.switches:
                self.event("switch-resync", dpid=event.dpid)
                return self.start("resync", f"s{event.dpid}", set(),
                                   lambda op: self.resync([event.dpid]))
            return self._loose_steps([SendFlows(dpid=event.dpid, messages=ofmsgs.base_messages())],
                                     f"base flows of {event.dpid}")
        if isinstance(event, SwitchDown):
            inv.switch_down(event.dpid)
            self.load.forget(event.dpid)
            self.last_change = self.clock()
            return []
        if isinstance(event, LinkUp):
            if inv.link_up(event.a, event.port_a, event.b, event.port_b):
                self.last_change = self.clock()
            return []
        if isinstance(event, LinkDown):
            if inv.link_down(event.a, event.port_a, event.b, event.port_b):
                self.last_change = self.clock()
            return []
        if isinstance(event, PortUp):
            inv.port_up(event.dpid, event.port)
            return []
        assert isinstance(event, PortDown)
        inv.port_down(event.dpid, event.port)
        host = inv.host_at(event.dpid, event.port)
        server = self.registry.by_ip(host.ip) if host else None
        if server is None or server.failed:
            return []
        return self._fail(server.name, f"edge port {event.dpid}:{event.port} went down")

    def _arp(self, event: ArpIn) -> list[Step]:
        message = event.message
        server = self.registry.by_ip(message.sender_ip)
        why = self.inventory.judge(message.sender_ip, message.sender_mac, event.dpid, event.port,
                                   server.data_mac if server else None)
        steps: list[Step] = []
        if why is not None:
            log.debug("ARP from %s (%s) at %s:%s ignored: %s", message.sender_ip, message.sender_mac,
                      event.dpid, event.port, why)
            if server is not None or message.sender_ip in self.inventory.hosts:
                self.event("arp-refused", logging.WARNING, ip=message.sender_ip, mac=message.sender_mac,
                           at=f"{event.dpid}:{event.port}", why=why)
        elif self.inventory.learn(message.sender_ip, message.sender_mac, event.dpid, event.port):
            self.last_change = self.clock()
            if self.graph is not None:
                steps += self._refresh_routes()
                pending = {s.id for s in steps if isinstance(s, SendFlows)}
                if pending:
                    self._routing[message.sender_ip] = pending
        reply = arp.answer(message, self.inventory.mac_of, self.settings.gateway_ip)
        if reply is not None:
            packet = PacketOut(dpid=event.dpid, port=event.port, data=reply)
            self._issue(packet)
            waits = {message.sender_ip, message.target_ip} & self._routing.keys()
            if waits:
                # The asker sends its first packet the moment it has this
                # answer; that packet travels the routes toward the target,
                # and the answer to it those toward the asker. A switch that
                # does not hold them yet drops it, so the answer waits for
                # every switch's barrier on either.
                self._held.append((waits, packet))
            else:
                steps.append(packet)
        return steps

    def _confirmed(self, step: int) -> list[Step]:
        """A loose step is over (done or failed: a switch that does not answer
        must not keep a host unreachable): release what waited only for it."""
        for ip, pending in list(self._routing.items()):
            pending.discard(step)
            if not pending:
                del self._routing[ip]
        released: list[Step] = [packet for waits, packet in self._held if not waits & self._routing.keys()]
        self._held = [(waits, packet) for waits, packet in self._held if waits & self._routing.keys()]
        return released

    def missing(self) -> list[str]:
        """What keeps the network from being built: servers not located yet."""
        return sorted(s.name for s in self.registry.live() if s.data_ip not in self.inventory.hosts)

    def graph_now(self) -> nx.Graph:
        storage = {s.data_ip: s.name for s in self.registry.servers.values()}
        hosts = [(storage.get(h.ip, f"h{h.ip}"), h.dpid, h.port, h.mac, h.ip,
                  "storage" if h.ip in storage else "client")
                 for h in self.inventory.hosts.values() if h.dpid in self.inventory.dpids]
        return discovered_graph(self.inventory.dpids, self.inventory.links, hosts)

    def _refresh_routes(self) -> list[Step]:
        self.graph = self.graph_now()
        new = host_routes(self.graph)
        steps: list[Step] = []
        for dpid, table in new.items():
            changed, deleted = diff_routes(self.routes.get(dpid, {}), table)
            if changed or deleted:
                steps.append(SendFlows(dpid=dpid, messages=ofmsgs.route_messages(changed, deleted)))
        self.routes = new
        return self._loose_steps(steps, "host routes")

    # -- agents ---------------------------------------------------------------------------

    def _register(self, event: Register) -> list[Step]:
        """Answer what the agent may hold: nothing yet (None) while the network
        is not built; its roles as this controller knows them; or nothing at
        all ([]) for a server that was declared failed, which rejoins empty and
        idle. An agent that restarted while in service is failed over first
        when every set it is in has another synced copy: its store may hold
        writes its sets never acknowledged (a write it applied and then died
        before its backups had it), and serving them, or being promoted with
        them, would show a value that can vanish. Where it holds the only
        synced copy (r=1), it serves what it holds again."""
        answer = self._registered(event)
        name = answer.name
        if answer.roles and self.registry[name].suspended and self._backed_up(name):
            steps = self._fail(name, "restarted: its store may hold writes its sets never acknowledged")
            return [*steps, self._issue_answer(event.reply, Registered(name, []))]
        return [self._issue_answer(event.reply, answer)]

    def _backed_up(self, name: str) -> bool:
        """Every set `name` is in has another synced member."""
        return all(set(s.synced) - {name} for s in self.replicas_or_raise().of(name).values())

    def _registered(self, event: Register) -> Registered:
        server, new = self.registry.register(event.registration, self.clock())
        if self.first_registration is None:
            self.first_registration = self.clock()
        cut_off = server.failed is not None and not self.inventory.attached(server.data_ip)
        # A cut-off server registers again at every heartbeat (404): quietly.
        self.event("agent-registered", logging.DEBUG if cut_off and not new else logging.INFO,
                   name=server.name, ip=server.data_ip, new=new, roles=len(server.roles),
                   suspended=server.suspended, failed=server.failed)
        if self.tree is None:
            return Registered(server.name, None)
        if not self._in_tree(server.name):
            self._join(server)
            return Registered(server.name, [])
        if server.failed:
            if cut_off or self.operations.involving(server.name) or self.tree.blocks(server.name):
                return Registered(server.name, [])   # not back on the data plane, or its fail-over runs
            self.event("server-rejoined", server=server.name, was=server.failed, note="empty, idle")
            server.failed = None
            self.tree.join(server.name, self.tree.parent(server.name) or "")
            return Registered(server.name, [])
        return Registered(server.name, self.roles_of(server.name))

    def _join(self, server: Server) -> None:
        """A server the built network does not know (new, or dead while this
        controller was built) becomes an idle leaf under its edge switch's
        group once the data plane reaches it: no table changes until it gets
        blocks (a split, a fail-over, a backup). A switch that carries no group
        of servers yet would need the topology mapped again: said, not done."""
        tree, planner = self.tree, self.planner
        host = self.inventory.hosts.get(server.data_ip)
        if tree is None or planner is None or host is None or not self.inventory.attached(server.data_ip):
            return
        switch = planner.fabric.switches.get(host.dpid)
        group = switch.group if switch is not None else None
        if group is None or any(not tree.is_leaf(c) for c in tree.children(group)):
            if server.name in self._unjoinable:
                return
            self._unjoinable.add(server.name)
            self.event("server-not-joined", logging.WARNING, server=server.name,
                       at=f"{host.dpid}:{host.port}",
                       why="its switch carries no group of servers; restart the controller to map it")
            return
        tree.join(server.name, group)
        planner.fabric = planner.fabric.with_leaf(server.name, host.dpid, host.port,
                                                  server.data_mac or host.mac)
        server.failed = None
        self.event("server-joined", server=server.name, group=group, note="idle")

    def _heartbeat(self, event: Heartbeat) -> Ack:
        """A server declared failed that still beats (it was cut off, not dead)
        is asked to register again (404), which makes it drop what it holds
        and rejoin empty."""
        server = self.registry.heartbeat(event.name, event.beat, self.clock())
        if server.failed:
            raise NotFound(f"{server.name} was declared failed ({server.failed}): register again")
        return Ack(True)

    def capacity(self, server: Server) -> int:
        return self.settings.capacity or server.capacity

    # -- building the network ---------------------------------------------------------

    def _tick(self) -> list[Step]:
        now = self.clock()
        if self.tree is None:
            if now - self.last_change >= self.settings.settle_s:
                return build(self, now)
            return []
        steps: list[Step] = []
        for server in self.registry.silent(now, self.settings.heartbeat_timeout_s):
            steps += self._fail(server.name, f"no heartbeat for {now - server.last_seen:.1f} s")
        leaves = set(self.tree.leaves())   # once per tick, not once per server
        for server in self.registry.live():
            if server.name not in leaves:
                self._join(server)
        leaves = set(self.tree.leaves())
        steps += self._poll_load(now)
        steps += self._keep_replicated()
        if self.settings.auto_split:
            busy = self.operations.reserved()
            for server in self.registry.live():
                if (server.name not in busy and server.keys >= self.capacity(server)
                        and server.name in leaves
                        and self.tree.state(server.name) is State.BUSY):
                    steps += self._start_split(server.name)
                    busy = self.operations.reserved()
        return steps

    def _poll_load(self, now: float) -> list[Step]:
        """Read the flow counters of every switch with storage servers below
        it each `load_poll_s`: a request crosses its owner's edge switch
        once, so the edges alone give every server's and every prefix's load,
        and the switches above (most of a fat-tree, with the largest tables)
        are left alone. A poll starts only once the last one has been
        answered, so a slow switch slows the polling rather than piling
        requests on it."""
        interval = self.settings.load_poll_s
        if interval <= 0 or self._polls or now - self._polled < interval or self.planner is None:
            return []
        self._polled = now
        steps: list[Step] = []
        hosts = self.planner.fabric.hosts
        edges = {hosts[leaf][0] for leaf in self.tree_or_raise().leaves() if leaf in hosts}
        for dpid in sorted(self.inventory.dpids & edges):
            step = ReadFlows(dpid=dpid)
            self._polls[self._issue(step)] = dpid
            steps.append(step)
        return steps

    def _judge_load(self) -> list[Step]:
        """After each complete poll: once the imbalance model has seen `hold`
        harmful polls in a row, say what it would ship where and (unless
        `--no-rebalance`) start moving load off the hottest server that is
        not busy with another operation (`controller.rebalance`)."""
        loads = self._owner_loads(self._server_loads())
        if any(op.kind == "rebalance" for op in self.operations.running.values()):
            self._loads.clear()   # judged again on `hold` polls of the load after it, not during it
            return []
        if not loads:
            return []
        self._loads.append(loads)
        if not self.imbalance.should_rebalance(self._loads):
            return []
        plan = transfers(loads, self.settings.load_capacity)
        self.event("imbalanced", factor=round(self.imbalance.factor(loads), 4),
                   transfers=[{"from": t.source, "to": t.target, "packets_per_s": round(t.load)}
                              for t in plan])
        self._loads.clear()   # said once per `hold` polls, not on every poll
        busy = self.operations.reserved()
        sources = [t.source for t in plan if t.source not in busy]
        if not self.settings.rebalance or not sources:
            return []
        return self.start("rebalance", sources[0], {sources[0]},
                          lambda op: rebalance_saga(self, op, sources[0], loads))

    def stored_keys(self) -> int:
        """Keys stored, by the live servers' last heartbeats (each key counted
        once, not once per copy): what the churn limits are shares of."""
        return sum(server.keys for server in self.registry.live()) // self.settings.replicas

    def _server_loads(self) -> dict[str, float]:
        """Packets a second toward each located server, from the polls of its edge."""
        out = {}
        switches = set(self.load.switches())
        for name, server in sorted(self.registry.servers.items()):
            host = self.inventory.hosts.get(server.data_ip)
            if host is not None and host.dpid in switches:
                out[name] = sum(r.packets_per_s for r in self.load.rates(host.dpid) if r.port == host.port)
        return out

    def _owner_loads(self, loads: dict[str, float]) -> dict[str, float]:
        """Those of `loads` of the servers that own blocks: the ones balancing is about."""
        tree = self.tree
        if tree is None:
            return {}
        owners = set(tree.leaves_in(State.BUSY))
        return {name: rate for name, rate in loads.items() if name in owners}

    def _keep_replicated(self) -> list[Step]:
        """Under-replicated or degraded blocks get a repair (a few at a time),
        and primaries left waiting by an overtaken operation are told to serve."""
        replicas = self.replicas_or_raise()
        busy = self.operations.reserved()
        steps: list[Step] = []
        waiting = [b for b in self.not_serving if b in replicas.sets and replicas.sets[b].primary not in busy]
        if waiting:
            steps += self.start("activate", "blocks", set(), lambda op: self.activate(waiting))
        degraded = {b: s.name for s in self.registry.live() for b in s.degraded}
        running = sum(1 for op in self.operations.running.values() if op.kind == "repair")
        for block in sorted(set(replicas.under_replicated()) | {b for b in degraded if b in replicas.sets}):
            if running >= self.settings.max_syncs:
                break
            members = set(replicas.sets[block].members)
            if members & busy or block in self.not_serving:
                continue
            resync = degraded.get(block) == replicas.sets[block].primary
            steps += self._start_repair(block, members, resync)
            busy = self.operations.reserved()
            running += 1
        return steps

    def _start_repair(self, block: Block, members: set[str], resync: bool) -> list[Step]:
        primary = self.replicas_or_raise().sets[block].primary
        return self.start("repair", primary, members, lambda op: repair_saga(self, op, block, resync))

    def recover(self, heir: str, blocks: list[Block], lost_with: str | None, reason: str) -> Saga:
        """`heir` takes over blocks whose owner could not hand them over: they
        are salvaged from any out-of-service agent that still claims them (a
        server cut off from the data plane, an earlier owner whose hand-over
        was overtaken); what nobody has is served empty, loudly."""
        replicas = self.replicas_or_raise()
        for block in blocks:
            if replicas.sets.get(block, None) is None or replicas.sets[block].primary != heir:
                replicas.assign(block, (heir,))
        rest = list(blocks)
        donors = [s for s in self.registry.servers.values()
                  if s.failed and s.name not in (heir, lost_with)]
        try:
            healths = yield [CallAgent(server=d.name, url=d.admin_url, route=ADMIN.health) for d in donors]
        except StepError as failed:
            healths = failed.results     # the dead ones cannot give anything
        for donor, health in zip(donors, healths, strict=True):
            theirs = [b for b in rest if health is not None and any(o.covers(b) for o in health.owned)]
            if theirs:
                rest = [b for b in rest if b not in theirs]
                yield from salvage_now(self, donor.name, heir, theirs)
        if rest:
            yield from self.own_empty(heir, rest, lost_with, reason)

    # -- operations ----------------------------------------------------------------------

    def start(self, kind: str, server: str, involves: set[str], make: Callable[[Operation], Saga],
               reply: object = None) -> list[Step]:
        """Run a saga as an operation; `reply` (a REST caller) gets its outcome."""
        op = Operation(f"op{next(self._ids)}", kind, server, set(involves), self.clock())

        def done(outcome: object) -> list[Step]:
            if reply is None:
                return []
            if outcome is None:
                outcome = Outcome(kind, server, False, {"reason": op.cancelled or "cancelled"})
            return [self._issue_answer(reply, outcome)]

        op.on_done = done
        return self.operations.start(op, make(op))

    def _split_now(self, event: SplitNow) -> list[Step]:
        refusal = self._why_not_split(event.name)
        if refusal is not None:
            return [self._issue_answer(event.reply, refusal)]
        return self._start_split(event.name, event.reply)

    def _start_split(self, name: str, reply: object = None) -> list[Step]:
        return self.start("split", name, {name}, lambda op: split_saga(self, op, name), reply)

    def _why_not_split(self, name: str) -> Exception | Outcome | None:
        if name not in self.registry:
            return NotFound(f"unknown server {name!r}")
        if self.tree is None:
            return Conflict("the network is not built yet")
        if self.registry[name].failed:
            return Outcome("split-refused", name, False, {"reason": f"{name} has failed"})
        if self.operations.involving(name):
            return Outcome("split-refused", name, False,
                           {"reason": f"{name} is busy: {self.operations.involving(name)[0].kind}"})
        return None

    def _fail_now(self, event: FailNow) -> list[Step]:
        if event.name not in self.registry:
            return [self._issue_answer(event.reply, NotFound(f"unknown server {event.name!r}"))]
        return self._fail(event.name, event.reason or "marked failed over REST", event.reply)

    def _fail(self, name: str, reason: str, reply: object = None) -> list[Step]:
        """Take a server out of service: cancel what it is part of, then fail it over."""
        server = self.registry[name]
        if server.failed:
            already = Outcome("server-failed", name, True, {"already": server.failed})
            return [self._issue_answer(reply, already)] if reply is not None else []
        server.failed = reason
        self.event("server-failed", logging.ERROR, server=name, reason=reason)
        steps: list[Step] = []
        for op in self.operations.involving(name):
            steps += self.operations.cancel(op, f"{name} failed: {reason}")
        if self.tree is None or name not in self.tree.leaves():
            if reply is not None:
                outcome = Outcome("server-failed", name, True, {"reason": reason, "note": "not in the tree"})
                steps.append(self._issue_answer(reply, outcome))
            return steps
        return steps + self.start("failover", name, {name},
                                   lambda op: failover_saga(self, op, name, reason), reply)

    # -- views for the REST API -------------------------------------------------------------

    def topology_view(self) -> TopologyView:
        c = self.classification
        return TopologyView(
            switches=[SwitchInfo(d, c.layer.get(f"s{d}") if c else None,
                                 c.group_of.get(f"s{d}") if c else None)
                      for d in sorted(self.inventory.dpids)],
            links=sorted(self.inventory.links),
            hosts=[HostInfo(h.ip, h.mac, h.dpid, h.port) for h in self.inventory.hosts.values()],
            pods=[list(p) for p in c.pods] if c else [],
            missing_servers=self.missing())

    def tree_view(self) -> TreeView:
        t = self.tree
        if t is None:
            return TreeView(False, self.missing())
        return TreeView(True, [], t.root, {n: t.children(n) for n in t.inner_nodes()},
                        {leaf: LeafInfo(t.state(leaf).name.lower(), t.blocks(leaf), t.parent(leaf))
                         for leaf in t.leaves()})

    def flows_view(self) -> FlowsView:
        planner = self.planner
        if planner is None:
            return FlowsView({})
        return FlowsView({str(dpid): [FlowInfo(e.priority, e.prefix, e.out_port, e.set_dl_dst)
                                      for e in sorted(planner.table(dpid).values())]
                          for dpid in sorted(planner.fabric.switches)})

    def servers_view(self) -> ServersView:
        tree = self.tree
        out = {}
        for name, s in sorted(self.registry.servers.items()):
            in_tree = tree is not None and name in tree.leaves()
            busy = self.operations.involving(name)
            backups = sorted(b for b, rs in self.replicas.of(name).items() if rs.primary != name) \
                if self.replicas is not None else []
            out[name] = ServerInfo(
                s.data_ip, s.admin_url, s.keys, self.capacity(s), s.failed,
                tree.state(name).name.lower() if tree is not None and in_tree else None,
                tree.blocks(name) if tree is not None and in_tree else list(s.reported),
                busy[0].kind if busy else None, backups)
        return ServersView(out)

    def events_view(self) -> EventsView:
        return EventsView(list(self.events))

    def splits_view(self) -> SplitsView:
        return SplitsView(list(self.splits))

    def load_view(self) -> LoadView:
        servers = self._server_loads()
        owners = list(self._owner_loads(servers).values())
        mean = sum(owners) / len(owners) if owners else 0.0
        return LoadView(self.settings.load_poll_s, {name: round(rate, 1) for name, rate in servers.items()},
                        {str(dpid): [PrefixLoad(r.block, r.port, round(r.packets_per_s, 1))
                                     for r in self.load.rates(dpid)]
                         for dpid in self.load.switches()},
                        round(max(owners) / mean, 3) if mean > 0 else 0.0,
                        round(imbalance_factor(owners, self.settings.load_capacity), 4))

    def operations_view(self) -> OperationsView:
        now = self.clock()
        return OperationsView([OperationInfo(op.id, op.kind, op.server, op.step, round(now - op.started, 3))
                               for op in self.operations.running.values()])

