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

The core keeps dispatch and tick policy: what an event means, when to build,
fail over, split, repair or rebalance, and the learning of hosts and routes
(the load comes from `controller.watch`). What the sagas share (the tree, the replica sets, the flow planner,
the registry's key counts, the blocks waiting to serve, the event log) is
its `world` (`controller.world.SagaWorld`), the only thing a saga is given:
sagas never import the core. The REST views read the core from
`controller.views`.

Everything runs on one thread, the shim's decision loop; REST reads go
through the same loop.
"""

from __future__ import annotations

import bisect
import dataclasses
import itertools
import logging
import time
from collections import deque
from collections.abc import Callable, Iterable
from typing import Any

import networkx as nx

from btree.balance import ImbalanceModel, transfers
from btree.flows import FlowPlanner
from btree.replicas import Replicas
from btree.tree import LogicalBTree, State
from client_lib.api.rest import (
    Ack,
    Outcome,
    Registered,
)
from client_lib.cidr import Block
from client_lib.errors import Conflict, NotFound
from controller import arp, ofmsgs
from controller.build import build, build_saga, uncovered
from controller.drain import drain_saga, holdings
from controller.failover import failover_saga
from controller.inventory import Inventory
from controller.rack import grow_rack, rack_saga
from controller.rebalance import rebalance_saga
from controller.registry import Registry, Server
from controller.repair import repair_saga
from controller.routing import diff_routes, mode_routes, next_hops, routes_to, switch_adjacency
from controller.saga import Operation, Operations, Saga
from controller.settings import Settings
from controller.split import split_saga
from controller.steps import (
    Answer,
    ArpIn,
    DrainNow,
    Event,
    FabricSeen,
    FailNow,
    Heartbeat,
    LinkDown,
    LinkUp,
    PacketOut,
    PortDown,
    PortUp,
    Register,
    SendFlows,
    SplitNow,
    Step,
    StepDone,
    StepFailed,
    SwitchDown,
    SwitchError,
    SwitchUp,
    Tick,
)
from controller.telemetry import NoRecorder, Recorder
from controller.watch import LoadWatch, owner_loads
from controller.world import Drain, SagaWorld
from topology.classify import Classification, discovered_graph

log = logging.getLogger("metaflow.controller")

LIVE_SETTINGS = frozenset({
    "heartbeat_timeout_s", "barrier_timeout_s", "agent_timeout_s", "migration_lease_s", "settle_s",
    "locate_timeout_s", "auto_split", "merge", "bounds", "capacity", "table_budget", "sync_rate",
    "max_syncs", "load_poll_s", "load_capacity", "imbalance_threshold", "rebalance",
    "churn_per_rebalance", "churn_per_minute",
})
"""The `Settings` a running controller takes from a reload (SIGHUP): thresholds,
timeouts, limits and switches of policy, each read when it is next used. The
rest shape what is already built or bound (the space, the replica count, the
bootstrap, the addresses, the secret, the mode) and take a restart."""

PROBE_INTERVAL_S = 2.0
"""Hybrid mode: how often a storage server not located yet is asked for
(`arp.probe` out of every edge port)."""
PROBE_BUDGET = 1024
"""Hybrid mode: the most probes (packet-outs) one round sends. A probe goes
to every edge port for each server not located, so a storage row powering up
at k=32 (2,000 servers, 8,192 edge ports) would ask for 16 million in one
tick; the (server, port) pairs are asked through in turn instead, this many a
round (512 packet-outs a second, against the 930 flow mods a second the
controller sent at most in the k=32 run), while the servers' own ARP for the
gateway locates most of them."""


BUSY = "is busy"
"""What a refusal says of a server another operation involves: worth asking
again once that ends (`mininet_scenarios.rolling` does)."""
BASE_FLOW_TRIES = 3
"""How many times a connected switch is sent the base entries before the
controller gives up on it (each try waits --barrier-timeout for the barrier):
a switch left without them never punts its servers' ARP."""

CLAIM_WAIT_TIMEOUTS = 5
"""How many heartbeat timeouts past its first wait a successor waits for
agents whose blocks no registered agent claims (`_claims_missing`)."""


class MetaFlowCore:
    """Dispatch and tick policy; what the sagas share is `world`."""

    def __init__(self, settings: Settings, clock: Callable[[], float] = time.monotonic,
                 recorder: Recorder | None = None, term: int = 0, first_id: int = 1,
                 inventory: Inventory | None = None) -> None:
        """`recorder`: where ended operations and moves are said (`controller.telemetry`).
        `term`: the leader's (0: the one controller without etcd). `first_id`:
        of the steps this core issues; a core that replaces another (a
        takeover, a demotion) starts above the old one's, so a late outcome
        of an old step is never taken for one of the new core's. `inventory`:
        the fabric as already seen (`successor`)."""
        self.settings = settings
        self.clock = clock
        self.recorder = recorder or NoRecorder()
        self.inventory = inventory or Inventory(settings.space, settings.gateway_ip)
        self.registry = Registry(settings.space)
        self.registry.hearing.quiet_s = settings.heartbeat_timeout_s / 2
        self.operations = Operations(self._issue, clock)
        self.world = SagaWorld(settings, clock, self.registry, self.inventory, self.operations, self.recorder)
        self.world.term = term
        self.graph: nx.Graph | None = None
        self._graph_version = -1
        """The inventory's version `graph` was made at; `_arp` routes a host
        learned while nothing else changed by itself (`_route_one`)."""
        self.classification: Classification | None = None
        self.last_change = clock()
        self._ids = itertools.count(first_id)
        self._loose: dict[int, str] = {}   # steps no operation waits for: what they were
        self._base: dict[int, tuple[int, int]] = {}
        """Base-entry steps not yet answered: their switch and which try they are."""
        self._routing: dict[str, set[int]] = {}
        """Hosts just learned: the route steps toward them not yet confirmed."""
        self._held: list[tuple[set[str], PacketOut]] = []
        """ARP replies from or for such hosts, sent once none of them is in `_routing`."""
        self._unjoinable: set[str] = set()   # servers told they cannot join (said once)
        self._told_links: tuple[tuple[int, int, int, int], ...] = ()
        """The links the leader last published (`FabricSeen`)."""
        self._expected: frozenset[str] = frozenset()
        """The servers the leader had in service (`FabricSeen.servers`): a
        successor builds once all of them registered, not only after `build_after`."""
        self._probed = float("-inf")   # hybrid mode: when the last probes went out
        self._probed_up_to: tuple[str, tuple[int, int]] = ("", (0, 0))
        """... and the last (server address, edge port) they asked through: a round goes on after it."""
        self._grow_tried: tuple[float, int] | None = None
        """(last topology change, registrations) of the last new-rack attempt: tried once per state."""
        self.first_registration: float | None = None
        self.build_after = 0.0
        self._claims_awaited = False   # "waiting-for-claims" said once
        """No build before this time (a successor's: the agents' time to find it)."""
        self._grace_until = float("-inf")
        """After a stall (`Tick.stalled_s`) or a tick that heard nobody: no server is failed over before."""
        self.watch = LoadWatch(settings.load_poll_s, self.registry, self.inventory)
        self.imbalance = ImbalanceModel(settings.load_capacity, settings.imbalance_threshold)
        self._loads: deque[dict[str, float]] = deque(maxlen=self.imbalance.hold)
        """Per-server load after each of the last complete polls."""

    def reconfigure(self, new: Settings) -> Settings:
        """Take the `LIVE_SETTINGS` of `new` (the others stay as they are) and
        return the settings now in force. The load poll keeps its schedule and
        the churn limit the moves it has counted: only their bounds change."""
        current = dataclasses.replace(self.settings, **{name: getattr(new, name) for name in LIVE_SETTINGS})
        self.settings = self.world.settings = current
        self.watch.interval = current.load_poll_s
        self.imbalance = dataclasses.replace(self.imbalance, capacity=current.load_capacity,
                                             threshold=current.imbalance_threshold)
        self.world.churn.per_rebalance = current.churn_per_rebalance
        self.world.churn.per_minute = current.churn_per_minute
        return current

    # -- the world's state, read here and by the REST views and the tests ------------

    @property
    def tree(self) -> LogicalBTree | None:
        return self.world.tree

    @property
    def replicas(self) -> Replicas | None:
        return self.world.replicas

    @property
    def planner(self) -> FlowPlanner | None:
        return self.world.planner

    @property
    def not_serving(self) -> set[Block]:
        return self.world.not_serving

    @property
    def events(self) -> deque[dict[str, Any]]:
        return self.world.events

    @property
    def lost(self) -> list[dict[str, Any]]:
        return self.world.lost

    @property
    def splits(self) -> list[dict[str, Any]]:
        return self.world.splits

    # -- the one entry point ---------------------------------------------------------

    def handle(self, event: Event) -> list[Step]:
        """Everything the controller hears goes through here, in order."""
        if isinstance(event, (StepDone, StepFailed)):
            return self._outcome(event)
        if isinstance(event, Tick):
            self.registry.catch_up()   # what the liveness datagrams said since the last tick
            self._after_silence()
            return [*self._probe(self.clock()), *self._tick(event)]
        if isinstance(event, ArpIn):
            return self._arp(event)
        if isinstance(event, FabricSeen):
            return self._fabric_seen(event)
        if isinstance(event, (SwitchUp, SwitchDown, LinkUp, LinkDown, PortUp, PortDown)):
            return self._topology(event)
        if isinstance(event, SwitchError):
            return self._refused(event)
        if isinstance(event, (Register, Heartbeat)):
            self._heard(self.clock())
        if isinstance(event, Register):
            try:
                return self._register(event) + self._build_due()
            except (Conflict, NotFound, ValueError) as exc:
                return [self._issue_answer(event.reply, exc)]
        if isinstance(event, Heartbeat):
            return self._answer(event.reply, lambda: self._heartbeat(event))
        if isinstance(event, SplitNow):
            return self._split_now(event)
        if isinstance(event, FailNow):
            return self._fail_now(event)
        if isinstance(event, DrainNow) and event.undrain:
            return self._answer(event.reply, lambda: self._undrain(event.name))
        if isinstance(event, DrainNow):
            return self._drain_now(event)
        raise TypeError(f"unknown event {event!r}")

    # -- steps and their outcomes -----------------------------------------------------

    def _issue(self, step: Step) -> int:
        step.id = next(self._ids)
        return step.id

    def successor(self, term: int) -> MetaFlowCore:
        """A fresh core for a change of leadership (`controller.app`): it keeps
        the fabric as seen (switches, links, ports, hosts, and when they last
        changed) and forgets everything decided (registry, tree, replica sets,
        operations). A new leader rebuilds those from the agents' registrations
        and the switches' tables exactly as a restarted controller does
        (`controller.build`); a demoted one waits as a standby."""
        new = MetaFlowCore(self.settings, self.clock, self.recorder, term, self.next_id(), self.inventory)
        new.last_change = self.last_change
        # The agents find a new leader on their own (their next heartbeat after
        # the 503s end): a build waits for them (`_waited`: every server the
        # leader had in service, or one heartbeat timeout), and one not heard
        # from by then counts as gone (its blocks' backups are promoted).
        new.build_after = self.clock() + self.settings.heartbeat_timeout_s
        new._expected = self._expected
        if term:
            new.world.event("leader-elected", term=term, note="rebuilding from the agents and the switches")
        return new

    def next_id(self) -> int:
        """Above every step id this core issued: a successor core's `first_id`."""
        return next(self._ids)

    def _loose_steps(self, steps: Iterable[Step], what: str) -> list[Step]:
        """Steps no operation waits for; a failure is only logged."""
        out = list(steps)
        for step in out:
            self._loose[self._issue(step)] = what
        return out

    def _base_flows(self, dpid: int, tries: int) -> list[Step]:
        """The base entries for a switch that connected (`BASE_FLOW_TRIES`)."""
        base = ofmsgs.base_messages(self.settings.mode, self.settings.gateway_ip)
        steps = self._loose_steps([SendFlows(dpid=dpid, messages=base)], f"base flows of {dpid}")
        self._base[steps[0].id] = (dpid, tries)
        return steps

    def _outcome(self, event: StepDone | StepFailed) -> list[Step]:
        if self.watch.polling(event.step):
            result = event.result if isinstance(event, StepDone) else None
            return self._judge_load() if self.watch.answered(event.step, result, self.clock()) else []
        what = self._loose.pop(event.step, None)
        if what is not None:
            steps = self._confirmed(event.step)
            dpid, tries = self._base.pop(event.step, (None, 0))
            if isinstance(event, StepFailed):
                again = dpid is not None and dpid in self.inventory.dpids and tries < BASE_FLOW_TRIES
                self.world.event("step-failed", logging.WARNING, what=what, reason=event.error,
                                 **({"again": tries + 1} if again else {}))
                if again:
                    assert dpid is not None
                    steps += self._base_flows(dpid, tries + 1)
            return steps
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

    # -- topology ----------------------------------------------------------------------

    def _topology(self, event: Event) -> list[Step]:
        inv = self.inventory
        if isinstance(event, SwitchUp):
            inv.switch_up(event.dpid, event.ports, event.name)
            self._take_told_links()
            self.last_change = self.clock()
            if self.planner is not None and event.dpid in self.planner.fabric.switches:
                self.world.event("switch-resync", dpid=event.dpid)
                return self.start("resync", f"s{event.dpid}", set(),
                                  lambda op: self.world.resync([event.dpid]))
            return self._base_flows(event.dpid, 1)
        if isinstance(event, SwitchDown):
            inv.switch_down(event.dpid)
            self.watch.forget(event.dpid)
            self.last_change = self.clock()
            return []
        if isinstance(event, LinkUp):
            if inv.link_up(event.a, event.port_a, event.b, event.port_b):
                self.last_change = self.clock()
                for stray in inv.forget_hosts_at(((event.a, event.port_a), (event.b, event.port_b))):
                    self.world.event("host-forgotten", logging.WARNING, ip=stray.ip,
                                     at=f"{stray.dpid}:{stray.port}",
                                     why="its port carries a switch-to-switch link")
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
                self.world.event("arp-refused", logging.WARNING, ip=message.sender_ip, mac=message.sender_mac,
                                 at=f"{event.dpid}:{event.port}", why=why)
        elif self._learn(message, event.dpid, event.port):
            self.last_change = self.clock()
            if self.graph is not None:
                steps += self._route_one(message.sender_ip) if self._graph_version == self.inventory.version \
                    else self._refresh_routes()
                pending = {s.id for s in steps if isinstance(s, SendFlows)}
                if pending:
                    self._routing[message.sender_ip] = pending
        # Hybrid mode answers the gateway only: the fabric resolves its hosts itself.
        mac_of = self.inventory.mac_of if self.settings.mode == "full" else _nobody
        reply = arp.answer(message, mac_of, self.settings.gateway_ip)
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

    def _fabric_seen(self, event: FabricSeen) -> list[Step]:
        """The leader's hosts and links (`controller.etcd_lease`), taken where
        this core has no word of its own: a standby's, so that at a takeover
        it knows every server and link without waiting for ARP or LLDP."""
        changed = False
        for ip, mac, dpid, port in event.hosts:
            changed |= ip not in self.inventory.hosts and self.inventory.learn(ip, mac, dpid, port)
        self._told_links = event.links
        self._expected = frozenset(event.servers)
        if self._take_told_links() or changed:
            self.last_change = self.clock()
        return []

    def _take_told_links(self) -> bool:
        """The leader's links between switches connected here (a switch that
        connects later gets its links when it does); True if one was news."""
        dpids = self.inventory.dpids
        return any([self.inventory.link_up(*link) for link in self._told_links
                    if link[0] in dpids and link[2] in dpids])

    def fabric_seen(self) -> FabricSeen:
        """What a leader publishes for the standbys."""
        in_service = sorted(s.name for s in self.registry.live())   # (`FabricSeen.servers`)
        return FabricSeen(tuple(sorted((h.ip, h.mac, h.dpid, h.port) for h in self.inventory.hosts.values())),
                          tuple(sorted(self.inventory.links)), tuple(in_service))

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

    def _refused(self, event: SwitchError) -> list[Step]:
        """A switch that refuses hybrid mode's NORMAL entry forwards nothing
        of the fabric's own traffic: said at connect, by name, not found
        later by lost packets. Other refusals are the shim's to count."""
        if ofmsgs.refuses_normal(event.error_type, event.error_code, event.data):
            self.world.event("normal-refused", logging.ERROR, switch=self.inventory.name(event.dpid),
                             error=f"type {event.error_type} code {event.error_code}",
                             note="hybrid mode needs the NORMAL action: this switch forwards only "
                                  "MetaFlow's entries; run it in full mode or replace it")
        return []

    def _probe(self, now: float) -> list[Step]:
        """Hybrid mode: ask for every storage server the data plane does not
        reach yet, out of every edge port (`arp.probe`), every
        PROBE_INTERVAL_S, as many (server, port) pairs as PROBE_BUDGET
        allows, in turn; its answer to the gateway locates it (`_arp`). Only
        servers heard from lately (registered or beating, failed ones too,
        which rejoin once located): a dead one is not asked for forever. Only
        once the topology has been quiet for --settle: every switch then
        holds the gateway entry, and LLDP has found the links, so a probe
        leaves by host ports only and the answer is caught by the server's
        own switch."""
        if self.settings.mode != "hybrid" or now - self._probed < PROBE_INTERVAL_S \
                or now - self.last_change < self.settings.settle_s:
            return []
        heard = max(self.settings.heartbeat_timeout_s, PROBE_INTERVAL_S)
        targets = sorted(s.data_ip for s in self.registry.servers.values()
                         if now - s.last_seen <= heard and not self.inventory.attached(s.data_ip))
        if not targets:
            return []
        self._probed = now
        ports = self.inventory.edge_ports()
        if not ports:
            return []
        # (server, port) pairs in order, a round going on after the last pair the one before sent
        ip, where = self._probed_up_to
        turn = bisect.bisect_left(targets, ip)
        same = targets[turn:turn + 1] == [ip]
        start = turn * len(ports) + (bisect.bisect_right(ports, where) if same else 0)
        total = len(targets) * len(ports)
        pairs = [(targets[n // len(ports)], ports[n % len(ports)])
                 for n in ((start + i) % total for i in range(min(PROBE_BUDGET, total)))]
        self._probed_up_to = pairs[-1]
        steps: list[Step] = [PacketOut(dpid=dpid, port=port, data=arp.probe(ip, self.settings.gateway_ip))
                             for ip, (dpid, port) in pairs]
        for step in steps:
            self._issue(step)
        return steps

    def missing(self) -> list[str]:
        """What keeps the network from being built: servers not located yet."""
        return sorted(s.name for s in self.registry.live() if s.data_ip not in self.inventory.hosts)

    def graph_now(self) -> nx.Graph:
        """The fabric as discovered, with its located hosts. In hybrid mode only
        storage servers: a client is located only if it happens to ARP for the
        gateway, so letting clients shape the classification made the tree
        depend on timing, and a new leader that saw a client the old one had
        not built another tree and rewrote the flow tables (the deploy guide's
        test caught a takeover removing up-rules). Clients need no location
        there: their replies go NORMAL."""
        storage = {s.data_ip: s.name for s in self.registry.servers.values()}
        hybrid = self.settings.mode == "hybrid"
        hosts = [(storage.get(h.ip, f"h{h.ip}"), h.dpid, h.port, h.mac, h.ip,
                  "storage" if h.ip in storage else "client")
                 for h in self.inventory.hosts.values()
                 if h.dpid in self.inventory.dpids and not (hybrid and h.ip not in storage)]
        return discovered_graph(self.inventory.dpids, self.inventory.links, hosts)

    def _learn(self, message: arp.ArpMessage, dpid: int, port: int) -> bool:
        """Locate an ARP sender (True if news); a graph that was current
        before stays current but for it (`_route_one` routes it)."""
        current = self._graph_version == self.inventory.version
        if not self.inventory.learn(message.sender_ip, message.sender_mac, dpid, port):
            return False
        if current:
            self._graph_version = self.inventory.version
        return True

    def _route_one(self, ip: str) -> list[Step]:
        """The routes toward one host just located, when nothing else in the
        fabric changed since `graph` was made: one breadth-first search from
        its switch and one entry per switch, instead of every host's routes
        recomputed (at k=32, 1,280 switches by 2,000 hosts and more, seconds
        per ARP). Another host's routes do not depend on where this one is,
        so the tables end as `_refresh_routes` would leave them. `graph`
        keeps its hosts as they were (only routes are made from it)."""
        graph, host = self.graph, self.inventory.hosts[ip]
        edge = f"s{host.dpid}"
        if graph is None or graph.nodes.get(edge, {}).get("kind") != "switch":
            return self._refresh_routes()
        if self.settings.mode != "full":
            return []
        toward = routes_to(next_hops(graph, switch_adjacency(graph), edge), host.dpid, host.port, ip)
        steps: list[Step] = []
        for dpid, table in self.world.routes.items():
            if ip in table and dpid not in toward:
                del table[ip]
                steps.append(SendFlows(dpid=dpid, messages=ofmsgs.route_messages({}, [ip])))
        for dpid, out in toward.items():
            table = self.world.routes.setdefault(dpid, {})
            if table.get(ip) != out:
                table[ip] = out
                steps.append(SendFlows(dpid=dpid, messages=ofmsgs.route_messages({ip: out})))
        return self._loose_steps(steps, "host routes")

    def _refresh_routes(self) -> list[Step]:
        """Every switch's host routes made again from the fabric as now seen."""
        self._graph_version = self.inventory.version
        self.graph = self.graph_now()
        new = mode_routes(self.graph, self.settings.mode)
        steps: list[Step] = []
        for dpid, table in new.items():
            changed, deleted = diff_routes(self.world.routes.get(dpid, {}), table)
            if changed or deleted:
                steps.append(SendFlows(dpid=dpid, messages=ofmsgs.route_messages(changed, deleted)))
        self.world.routes = new
        return self._loose_steps(steps, "host routes")

    # -- agents ---------------------------------------------------------------------------

    def _register(self, event: Register) -> list[Step]:
        """Answer what the agent may hold: nothing yet (None) while the network
        is not built, or while a server declared failed has its fail-over
        running or pending (its store may be what a salvage copies); its roles
        as this controller knows them; or nothing at all ([]) for a server that
        was declared failed once its blocks are elsewhere, which rejoins empty
        and idle. An agent that restarted while in service is failed over first
        when every set it is in has another synced copy: its store may hold
        writes its sets never acknowledged (a write it applied and then died
        before its backups had it), and serving them, or being promoted with
        them, would show a value that can vanish. Where it holds the only
        synced copy (r=1), it serves what it holds again. The same process
        registering again (`Registration.incarnation`) did not restart."""
        answer, grown = self._registered(event)
        name = answer.name
        server = self.registry[name]
        if answer.roles and server.suspended and not server.again and self._backed_up(name):
            steps = self._fail(name, "restarted: its store may hold writes its sets never acknowledged")
            return [*steps, self._issue_answer(event.reply, Registered(name, [], self.world.term))]
        return [*grown, self._issue_answer(event.reply, answer)]

    def _backed_up(self, name: str) -> bool:
        """Every set `name` is in has another synced member."""
        return all(set(s.synced) - {name} for s in self.world.replicas_or_raise().of(name).values())

    def _registered(self, event: Register) -> tuple[Registered, list[Step]]:
        """The answer, and the steps of a new rack its server's joining grew."""
        server, new = self.registry.register(event.registration, self.clock())
        if self.first_registration is None:
            self.first_registration = self.clock()
        cut_off = server.failed is not None and not self.inventory.attached(server.data_ip)
        # A cut-off server registers again at every heartbeat (404): quietly.
        self.world.event("agent-registered", logging.DEBUG if cut_off and not new else logging.INFO,
                         name=server.name, ip=server.data_ip, new=new, roles=len(server.roles),
                         suspended=server.suspended, failed=server.failed)
        if self.tree is None:
            return Registered(server.name, None, self.world.term), []
        if not self.world.in_tree(server.name):
            return Registered(server.name, [], self.world.term), self._join(server)
        if server.failed:
            busy = self.operations.involving(server.name)
            if not busy and self._kept(server):
                # its fail-over found nobody to take its blocks: it keeps them (their only copy)
                if not cut_off:
                    self.world.event("server-rejoined", logging.WARNING, server=server.name,
                                     was=server.failed, note="with its blocks: no fail-over could take them")
                    server.failed = None
                return Registered(server.name, self.world.roles_of(server.name), self.world.term), []
            if busy or self.tree.blocks(server.name):
                # Its fail-over runs, or has not moved its blocks yet: no word,
                # so it keeps its store, which a salvage may be copying (told
                # to hold nothing here, it once deleted what was being copied).
                return Registered(server.name, None, self.world.term), []
            if cut_off:
                # its blocks live elsewhere now: a stale copy must not resurface
                return Registered(server.name, [], self.world.term), []
            self.world.event("server-rejoined", server=server.name, was=server.failed, note="empty, idle")
            server.failed = None
            self.tree.join(server.name, self.tree.parent(server.name) or "")
            return Registered(server.name, [], self.world.term), []
        return Registered(server.name, self.world.roles_of(server.name), self.world.term), []

    def _kept(self, server: Server) -> bool:
        """A failed server still owns blocks in the tree (its fail-over found
        every other leaf failed: `takeover-impossible`) and says it holds
        each of them: it holds their only copy, and keeps it (told to drop
        what it held, as any failed server is, it lost a block's acknowledged
        writes in the nemesis, after a mass false failure); back on the data
        plane, it serves them again."""
        owned = self.world.tree_or_raise().blocks(server.name)
        held = [role.block for role in server.roles]
        return bool(owned) and all(any(h.covers(b) for h in held) for b in owned)

    def _join(self, server: Server) -> list[Step]:
        """A server the built network does not know (new, or dead while this
        controller was built) becomes an idle leaf under its edge switch's
        group once the data plane reaches it: no table changes until it gets
        blocks (a split, a fail-over, a backup). Under a switch that carries
        no group of servers yet, the tree grows by a new rack first
        (`_grow`); the steps are that growth's."""
        tree, planner = self.tree, self.planner
        host = self.inventory.hosts.get(server.data_ip)
        if tree is None or planner is None or host is None or not self.inventory.attached(server.data_ip) \
                or self.world.in_tree(server.name):   # joined with its rack this tick
            return []
        switch = planner.fabric.switches.get(host.dpid)
        if switch is None or switch.group is None:
            return self._grow(server, f"{host.dpid}:{host.port}")
        if any(not tree.is_leaf(c) for c in tree.children(switch.group)):
            self._not_joined(server, f"{host.dpid}:{host.port}", "its switch carries switch groups below it, "
                             "not servers; restart the controller to map it")
            return []
        tree.join(server.name, switch.group)
        planner.fabric = planner.fabric.with_leaf(server.name, host.dpid, host.port,
                                                  server.data_mac or host.mac)
        server.failed = None
        self._unjoinable.discard(server.name)
        self.world.event("server-joined", server=server.name, group=switch.group, note="idle")
        return []

    def _not_joined(self, server: Server, at: str, why: str) -> None:
        """Said once per server (the join is tried again at every tick)."""
        if server.name not in self._unjoinable:
            self._unjoinable.add(server.name)
            self.world.event("server-not-joined", logging.WARNING, server=server.name, at=at, why=why)

    def _grow(self, server: Server, at: str) -> list[Step]:
        """A new rack (`controller.rack`): once the topology has been quiet
        for --settle (a switch's links are discovered one by one, and a
        fabric seen in part is no growth), and once per state of the
        topology and of the registrations, the tree grows by the new switch
        groups; their servers that are in service join as idle leaves, held
        out of splits and placements by the push of their switches' tables;
        host routes follow the grown graph."""
        if self.clock() - self.last_change < self.settings.settle_s:
            return []
        attempt = (self.last_change, len(self.registry.servers))
        if attempt == self._grow_tried:
            return []
        self._grow_tried = attempt
        graph = self.graph_now()
        grown = grow_rack(self.world, graph)
        if isinstance(grown, str):
            self._not_joined(server, at, grown)
            return []
        growth, switches = grown
        self.graph, self.classification = graph, growth.classification
        self._graph_version = -1   # made again by `_refresh_routes` below
        for leaf, _group in growth.leaves:   # in the classifier's order, as a rebuild would place them
            candidate = self.registry.servers.get(leaf)
            if candidate is not None and (not candidate.failed or candidate is server):
                self._join(candidate)
        joined = {leaf for leaf, _group in growth.leaves if self.world.in_tree(leaf)}
        pushed = self.start("rack", growth.groups[0][0], joined, lambda op: rack_saga(self.world, switches))
        return [*pushed, *self._refresh_routes()]

    def _heartbeat(self, event: Heartbeat) -> Ack:
        """A server declared failed that still beats (it was cut off, not dead)
        is asked to register again (404), which makes it drop what it holds
        and rejoin empty."""
        server = self.registry.heartbeat(event.name, event.beat, self.clock())
        if server.failed:
            raise NotFound(f"{server.name} was declared failed ({server.failed}): register again")
        heard = self.registry.heard.get(server.name)
        return Ack(True, None if heard is None else round(max(0.0, self.clock() - heard[0]), 3))

    # -- the tick: build, fail over, poll, repair, split -------------------------------

    def _tick(self, tick: Tick) -> list[Step]:
        now = self.clock()
        if tick.stalled_s > 0:
            # Its own pause is not the servers' silence: each gets the grace (`_grace`) from now.
            self._grace_until = now + self._grace()
            self.world.event("controller-stalled", logging.WARNING, seconds=round(tick.stalled_s, 2),
                             grace=self._grace())
        if self.tree is None:
            if now - self.last_change >= self.settings.settle_s and self._waited(now):
                return self._build(now)
            return []
        steps: list[Step] = []
        timeout = self.settings.heartbeat_timeout_s
        silent = self.registry.silent(now, timeout) if now > self._grace_until else []
        live = self.registry.live()
        if silent and len(live) > 1 and now - max(s.last_seen for s in live) > timeout / 2:
            # Nobody heard for half a timeout (their beats are staggered: at this tick some are
            # past the timeout, the others nearly): the controller is the one cut off (and were
            # they all down, no fail-over could help). It fails nobody over, and counts again.
            self._grace_until = now + self._grace()
            self.world.event("controller-deaf", logging.WARNING, servers=len(silent), grace=self._grace())
            silent = []
        for server in silent:
            steps += self._fail(server.name, f"no heartbeat for {now - server.last_seen:.1f} s")
        leaves = set(self.tree.leaves())   # once per tick, not once per server
        for server in self.registry.live():
            if server.name not in leaves:
                steps += self._join(server)
        leaves = set(self.tree.leaves())
        steps += self._poll_load(now)
        steps += self._keep_replicated()
        if self.settings.auto_split:
            busy = self.operations.reserved()
            for server in self.registry.live():
                if (server.name not in busy and server.keys >= self.world.capacity(server)
                    and server.name in leaves
                    and self.tree.state(server.name) is State.BUSY):
                    steps += self._start_split(server.name)
                    busy = self.operations.reserved()
        return steps

    def _claims_missing(self, now: float) -> bool:
        """A successor waits (up to `CLAIM_WAIT_TIMEOUTS` heartbeat timeouts after
        its first wait) while the registered agents' roles, which some agent
        holds, leave part of the space unclaimed. One dead server leaves none
        (its backups claim its blocks); a part no registered agent claims is
        most likely held by agents still finding the new leader, and building
        without them would give it to an heir empty and then tell them to drop
        it (the two-controller nemesis: a leader paused 1.5 s, the new one built
        from 2 of 8 agents, and 482 acknowledged writes were lost)."""
        wait = CLAIM_WAIT_TIMEOUTS * self.settings.heartbeat_timeout_s
        if not self.build_after or now >= self.build_after + wait:
            return False
        blocks = [role.block for server in self.registry.live() for role in server.roles]
        if not blocks or not uncovered(self.settings.space, blocks):
            return False
        if not self._claims_awaited:
            self._claims_awaited = True
            self.world.event("waiting-for-claims", seconds=wait,
                             note="part of the space is claimed by no registered agent yet")
        return True

    def _build_due(self) -> list[Step]:
        """A successor (`build_after` set) builds at the registration that finds
        its wait over, not at the next tick, up to a second later."""
        if self.tree is None and self.build_after and self._waited(self.clock()):
            return self._tick(Tick())
        return []

    def _waited(self, now: float) -> bool:
        """A successor's wait for the agents is over: `build_after` passed, or
        every server the leader had in service registered here (the agents
        find a new leader within a heartbeat or two; the timeout is for those
        that never will)."""
        if now >= self.build_after:
            return True
        servers = self.registry.servers   # (counted first: this runs at every registration)
        return bool(self._expected) and len(servers) >= len(self._expected) and \
            all(name in servers and not servers[name].failed for name in self._expected)

    def _heard(self, now: float) -> None:
        """An agent's word (by HTTP here; by datagram in the liveness thread,
        read at the tick) after half a heartbeat timeout in which the
        controller heard nobody ends a silence that was the controller's own
        (cut from the management network, or its listener starved): every
        server gets the whole grace from that word, since those whose request
        the silence caught try again only after their own request timeout.
        Said here and not only at a tick (`controller-deaf`): a cut that ends
        between two ticks is heard first from one agent, and the tick after
        it took the others' silence for theirs (the nemesis: 7 of 8 servers
        failed over at once after a 1.5 s cut, whose cascade of cancelled
        take-overs left a block's only copy to be dropped)."""
        self.registry.hearing.word(now)
        self._after_silence()

    def _after_silence(self) -> None:
        """The grace for each silence of everyone a word ended (`_heard`)."""
        for when, silence in self.registry.hearing.ended():
            if self.tree is not None:
                self._grace_until = max(self._grace_until, when + self._grace())
                self.world.event("controller-heard-again", logging.WARNING, silent_s=round(silence, 2),
                                 grace=self._grace())

    def _grace(self) -> float:
        """How long servers get to be heard again once the controller can hear:
        two heartbeat timeouts, because an agent whose beat was lost meanwhile
        tries again only after its request timed out (one second) and one
        interval more (one timeout of grace, measured: 3 of 8 agents failed
        over after a 1.5 s pause of the controller)."""
        return 2 * self.settings.heartbeat_timeout_s

    def _too_few_to_preallocate(self, now: float) -> bool:
        """A first build (no registered agent holds a role) whose bootstrap
        pre-allocates the space to more servers than are live waits for them,
        up to --locate-timeout after the first registration; then the space is
        spread over those there are (`bootstrap-short`). Built at once, one
        server late to register (or briefly failed on a loaded machine) left
        the space to 7 of preallocate:8."""
        wanted = self.settings.bootstrap.count
        if not wanted or self.first_registration is None \
                or now - self.first_registration >= self.settings.locate_timeout_s:
            return False
        live = self.registry.live()
        return len(live) < wanted and not any(server.roles for server in live)

    def _build(self, now: float) -> list[Step]:
        """Map the network and program every switch (`controller.build`), once
        every registered server is located (or --locate-timeout passed: then
        without the missing ones, whose blocks are salvaged)."""
        if self.first_registration is None:
            return []
        if self._claims_missing(now):
            return []
        missing = self.missing()
        if missing and now - self.first_registration < self.settings.locate_timeout_s:
            return []
        if self._too_few_to_preallocate(now):
            return []
        for name in missing:
            self.world.mark_failed(name, f"not seen on the data plane within "
                                   f"{self.settings.locate_timeout_s:g} s")
        graph = self.graph_now()
        built = build(self.world, graph)
        if built is None:
            self.last_change = self.clock()   # wait for more of the topology
            return []
        self.graph, self.classification = graph, built.classification
        self._graph_version = self.inventory.version
        return self.start("build", "network", set(), lambda op: build_saga(self.world, built.restored))

    def _poll_load(self, now: float) -> list[Step]:
        """The edge switches' counters, when due (`controller.watch`)."""
        if self.planner is None:
            return []
        hosts = self.planner.fabric.hosts
        edges = {hosts[leaf][0] for leaf in self.world.tree_or_raise().leaves() if leaf in hosts}
        return self.watch.poll(now, edges, self._issue)

    def _judge_load(self) -> list[Step]:
        """After each complete poll: once the imbalance model has seen `hold`
        harmful polls in a row, say what it would ship where and (unless
        `--no-rebalance`) start moving load off the hottest server that is
        not busy with another operation (`controller.rebalance`)."""
        loads = owner_loads(self.tree, self.watch.server_loads())
        if any(op.kind == "rebalance" for op in self.operations.running.values()):
            self._loads.clear()   # judged again on `hold` polls of the load after it, not during it
            return []
        if not loads:
            return []
        self._loads.append(loads)
        if not self.imbalance.should_rebalance(self._loads):
            return []
        plan = transfers(loads, self.settings.load_capacity)
        self.world.event("imbalanced", factor=round(self.imbalance.factor(loads), 4),
                         transfers=[{"from": t.source, "to": t.target, "packets_per_s": round(t.load)}
                                    for t in plan])
        self._loads.clear()   # said once per `hold` polls, not on every poll
        busy = self.operations.reserved()
        sources = [t.source for t in plan if t.source not in busy]
        if not self.settings.rebalance or not sources:
            return []
        return self.start("rebalance", sources[0], {sources[0]},
                          lambda op: rebalance_saga(self.world, op, sources[0], loads))

    def _keep_replicated(self) -> list[Step]:
        """Under-replicated or degraded blocks get a repair (a few at a time),
        and primaries left waiting by an overtaken operation are told to serve."""
        replicas = self.world.replicas_or_raise()
        busy = self.operations.reserved()
        steps: list[Step] = []
        waiting = [b for b in self.not_serving if b in replicas.sets and replicas.sets[b].primary not in busy]
        if waiting:
            steps += self.start("activate", "blocks", set(), lambda op: self.world.activate(waiting))
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
        primary = self.world.replicas_or_raise().sets[block].primary
        return self.start("repair", primary, members, lambda op: repair_saga(self.world, op, block, resync))

    # -- operations ----------------------------------------------------------------------

    def start(self, kind: str, server: str, involves: set[str], make: Callable[[Operation], Saga],
              reply: object = None) -> list[Step]:
        """Run a saga as an operation; `reply` (a REST caller) gets its outcome."""
        op = Operation(f"op{next(self._ids)}", kind, server, set(involves), self.clock())

        def done(outcome: object) -> list[Step]:
            failed = op.cancelled is not None or isinstance(outcome, Outcome) and not outcome.ok
            took = self.clock() - op.started
            self.recorder.operation(kind, took, not failed)
            if kind == "build":   # rare, and the one whose time the scale runs account for
                self.world.event("build-finished", seconds=round(took, 2), ok=not failed,
                                 rounds=[[r.what, r.steps, round(r.seconds, 2)] for r in op.rounds])
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
        return self.start("split", name, {name}, lambda op: split_saga(self.world, op, name), reply)

    def _why_not_split(self, name: str) -> Exception | Outcome | None:
        if name not in self.registry:
            return NotFound(f"unknown server {name!r}")
        if self.tree is None:
            return Conflict("the network is not built yet")
        if self.registry[name].failed:
            return Outcome("split-refused", name, False, {"reason": f"{name} has failed"})
        if self.operations.involving(name):
            return Outcome("split-refused", name, False,
                           {"reason": f"{name} {BUSY}: {self.operations.involving(name)[0].kind}"})
        return None

    def _fail_now(self, event: FailNow) -> list[Step]:
        if event.name not in self.registry:
            return [self._issue_answer(event.reply, NotFound(f"unknown server {event.name!r}"))]
        return self._fail(event.name, event.reason or "marked failed over REST", event.reply)

    # -- drain and undrain -------------------------------------------------------------

    def _drain_now(self, event: DrainNow) -> list[Step]:
        """Start draining a server (`controller.drain`): answered at once with
        what it holds (progress: `/drains`), or refused with the reason."""
        name = event.name
        try:
            self._why_not_drain(name)
        except (Conflict, NotFound) as refused:
            return [self._issue_answer(event.reply, refused)]
        owned, backups = holdings(self.world, name)
        self.world.drains[name] = Drain("draining", self.clock())
        self.world.event("drain-started", server=name, blocks=len(owned), backups=len(backups))
        started = Outcome("drain-started", name, True, {"blocks": len(owned), "backups": len(backups)})
        return [*self.start("drain", name, {name}, lambda op: drain_saga(self.world, op, name)),
                self._issue_answer(event.reply, started)]

    def _why_not_drain(self, name: str) -> None:
        """Raise NotFound (404) or Conflict (409) with the reason a drain of `name` cannot start."""
        server = self.registry[name]
        if self.tree is None:
            raise Conflict("the network is not built yet")
        if server.failed:
            raise Conflict(f"{name} has failed ({server.failed}): its fail-over moved what it held")
        drain = self.world.drains.get(name)
        if drain is not None and drain.out:
            raise Conflict(f"{name} is already {drain.state}")
        if not self.world.in_tree(name):
            raise Conflict(f"{name} is not in the tree: it holds nothing")
        busy = self.operations.involving(name)
        if busy:
            raise Conflict(f"{name} {BUSY}: {busy[0].kind} ({busy[0].step}); try again when it ends")

    def _undrain(self, name: str) -> Outcome:
        """A drained server goes back to the idle pool: it takes blocks,
        copies and splits again."""
        self.registry[name]   # NotFound for an unknown server
        drain = self.world.drains.get(name)
        if drain is None or not drain.out:
            raise Conflict(f"{name} is not drained")
        if drain.state == "draining":
            raise Conflict(f"{name} is still draining: undrain it once it is drained (or stopped)")
        del self.world.drains[name]
        return self.world.outcome_event("undrained", ok=True, server=name, note="idle: it takes blocks again")

    def _stopped_drained(self, name: str, reason: str) -> None:
        """A drained server that goes silent was stopped on purpose: it holds
        nothing, so there is nothing to fail over, only said."""
        self.registry[name].failed = reason
        if self.tree is not None and self.world.in_tree(name) and self.tree.state(name) is not State.FAILED:
            self.tree.fail(name)   # idle: no blocks move
        self.world.event("drained-server-stopped", server=name, reason=reason,
                         note="it held nothing: no fail-over; it rejoins drained")

    def _fail(self, name: str, reason: str, reply: object = None) -> list[Step]:
        """Take a server out of service: cancel what it is part of, then fail it
        over (a drained one holds nothing: it is only marked)."""
        server = self.registry[name]
        if server.failed:
            already = Outcome("server-failed", name, True, {"already": server.failed})
            return [self._issue_answer(reply, already)] if reply is not None else []
        drain = self.world.drains.get(name)
        if drain is not None and drain.state == "drained" and holdings(self.world, name) == ([], []):
            self._stopped_drained(name, reason)
            outcome = Outcome("server-failed", name, True,
                              {"reason": reason, "note": "drained: nothing moved"})
            return [self._issue_answer(reply, outcome)] if reply is not None else []
        self.world.mark_failed(name, reason)
        steps: list[Step] = []
        for op in self.operations.involving(name):
            steps += self.operations.cancel(op, f"{name} failed: {reason}")
        if self.tree is None or name not in self.tree.leaves():
            if reply is not None:
                outcome = Outcome("server-failed", name, True, {"reason": reason, "note": "not in the tree"})
                steps.append(self._issue_answer(reply, outcome))
            return steps
        return steps + self.start("failover", name, {name},
                                  lambda op: failover_saga(self.world, op, name, reason), reply)


def _nobody(ip: str) -> str | None:
    """No host's MAC: what hybrid mode answers ARP for (only the gateway)."""
    return None
