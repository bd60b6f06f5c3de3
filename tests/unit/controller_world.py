"""A world for the controller core without a network: fake switches that
apply the real OpenFlow 1.0 messages the core emits (faucet's FakeOFTable),
fake agents that follow the admin API's contract (roles with epochs,
synchronous replication to the synced members, migrations to replica sets,
syncs), and a driver that carries out the core's steps one by one, so a
test can fail any step, kill the core or a server between any two, and
then send packets through what the switches really hold.
"""

from __future__ import annotations

import itertools
from collections import Counter, deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import networkx as nx
from os_ken.ofproto import ofproto_v1_0 as ofp
from os_ken.ofproto import ofproto_v1_0_parser as parser

from btree.bootstrap import Bootstrap
from btree.split import SplitBounds
from btree.tree import LogicalBTree
from client_lib.api.admin import (
    ADMIN,
    Assigned,
    AssignRequest,
    BlockKeys,
    BlocksReport,
    Counts,
    Discarded,
    DisownReply,
    Health,
    Importing,
    ImportProgress,
    MigrationList,
    MigrationReport,
    OpsReport,
    Role,
    SyncList,
    SyncReport,
    SyncRequest,
)
from client_lib.api.rest import Heartbeat as HeartbeatBody
from client_lib.api.rest import Registration
from client_lib.cidr import Block, subtract
from client_lib.constants import METAFLOW_PORT
from client_lib.errors import ApiError, Conflict, NotFound
from controller.arp import ArpMessage
from controller.core import MetaFlowCore
from controller.settings import Settings
from controller.steps import (
    Answer,
    ArpIn,
    CallAgent,
    Heartbeat,
    LinkUp,
    PacketOut,
    PortDown,
    PortUp,
    ReadFlows,
    Register,
    SendFlows,
    Step,
    StepDone,
    StepFailed,
    SwitchUp,
    Tick,
    Wait,
)
from topology.builders import client_hosts, port, storage_hosts

SPACE = Block.parse("100.64.0.0/10")
SECRET = b"test secret for the controller core"


# -- switches ------------------------------------------------------------------------


def _match_key(match: Any) -> tuple[Any, ...]:
    w = match.wildcards
    plen = max(0, 32 - ((w & ofp.OFPFW_NW_DST_MASK) >> ofp.OFPFW_NW_DST_SHIFT))
    return (None if w & ofp.OFPFW_DL_TYPE else match.dl_type,
            None if w & ofp.OFPFW_NW_PROTO else match.nw_proto,
            None if w & ofp.OFPFW_TP_DST else match.tp_dst,
            (match.nw_dst >> (32 - plen) << (32 - plen) if plen else 0, plen))


@dataclass
class Flow:
    match: Any
    priority: int
    cookie: int
    actions: list[Any]
    installed: float = 0.0
    packets: int = 0


class FakeSwitch:
    """One OF1.0 flow table: applies flow mods as a switch does and
    forwards a packet by the highest-priority matching entry."""

    def __init__(self, dpid: int, clock: Callable[[], float] = lambda: 0.0) -> None:
        self.dpid = dpid
        self.clock = clock
        self.flows: dict[tuple[int, tuple[Any, ...]], Flow] = {}
        self.mods = 0

    def apply(self, msg: Any) -> None:
        if not isinstance(msg, parser.OFPFlowMod):
            raise TypeError(f"a switch table takes flow mods, not {msg!r}")
        self.mods += 1
        key = (msg.priority, _match_key(msg.match))
        if msg.command == ofp.OFPFC_ADD:   # a new entry: counters from zero (OF1.0 5.3.3)
            self.flows[key] = Flow(msg.match, msg.priority, msg.cookie, list(msg.actions), self.clock())
        elif msg.command == ofp.OFPFC_MODIFY_STRICT:   # keeps its cookie and counters
            old = self.flows.get(key)
            if old is None:
                self.flows[key] = Flow(msg.match, msg.priority, msg.cookie, list(msg.actions), self.clock())
            else:
                old.actions = list(msg.actions)
        elif msg.command == ofp.OFPFC_DELETE_STRICT:
            self.flows.pop(key, None)
        else:
            raise NotImplementedError(f"flow mod command {msg.command}")

    def stats(self) -> list[Any]:
        out = []
        for flow in self.flows.values():
            stat = parser.OFPFlowStats()
            stat.match, stat.priority, stat.cookie, stat.actions = (flow.match, flow.priority,
                                                                    flow.cookie, flow.actions)
            age = max(0.0, self.clock() - flow.installed)
            stat.duration_sec, stat.duration_nsec = int(age), int(age % 1 * 1e9)
            stat.packet_count = flow.packets
            out.append(stat)
        return out

    def lookup(self, nw_dst: int, nw_proto: int = 6, tp_dst: int = METAFLOW_PORT) -> Flow | None:
        best: Flow | None = None
        for (priority, (dl_type, proto, port_, (first, plen))), flow in self.flows.items():
            if dl_type not in (None, 0x0800) or proto not in (None, nw_proto):
                continue
            if port_ not in (None, tp_dst):
                continue
            if plen and nw_dst >> (32 - plen) << (32 - plen) != first:
                continue
            if best is None or priority > best.priority:
                best = flow
        return best


# -- agents --------------------------------------------------------------------------


@dataclass
class FakeMigration:
    id: str
    blocks: list[Block]
    targets: list[str]
    state: str
    keys: int
    lease_until: float | None = None


@dataclass
class FakeAgent:
    """An agent's admin API, data and replication, in memory: every held
    block has a role (epoch, primary or backup, members); a primary's write
    is acknowledged only once every synced member applied it at its epoch."""

    name: str
    ip: str
    mac: str
    world: World
    roles: dict[Block, Role] = field(default_factory=dict)
    records: dict[int, bytes] = field(default_factory=dict)
    frozen: list[Block] = field(default_factory=list)
    fenced: set[Block] = field(default_factory=set)
    degraded: set[Block] = field(default_factory=set)
    migrations: dict[str, FakeMigration] = field(default_factory=dict)
    imports: dict[str, list[Block]] = field(default_factory=dict)
    syncs: list[SyncReport] = field(default_factory=list)
    requests: Counter[int] = field(default_factory=Counter)
    """Packets `World.deliver` brought here, per ID: what `/ops` reports (the
    fake's window is everything since the last `requests.clear()`)."""
    suspended: bool = False
    incarnation: int = 1
    """Its process: `World.restart` starts another."""
    reachable: bool = True
    dead: bool = False
    failing_syncs: int = 0
    """How many of the syncs it is asked for next fail (a member too slow to answer, say)."""

    @property
    def url(self) -> str:
        return f"http://{self.name}.mgmt:9001"

    @property
    def replication(self) -> str:
        return f"{self.name}.mgmt:9002"

    def role_of(self, mdid: int) -> tuple[Block, Role] | None:
        return next(((b, r) for b, r in self.roles.items() if b.contains(mdid)), None)

    def serves(self, mdid: int, write: bool) -> bool:
        """Whether a client request for `mdid` would be answered here."""
        held = self.role_of(mdid)
        if held is None or self.suspended:
            return False
        block, role = held
        if not (role.primary and role.serving) or block in self.fenced or block in self.degraded:
            return False
        return not (write and any(f.contains(mdid) for f in self.frozen))

    # data path, as the metadata service decides it
    def put(self, mdid: int, value: bytes) -> str:
        if not self.serves(mdid, write=True):
            return "moved" if self.role_of(mdid) is None else "tryagain"
        block, role = self.role_of(mdid)  # type: ignore[misc]
        self.records[mdid] = value
        for member in role.members[1:]:
            backup = self.world.agents[member.name]
            held = backup.role_of(mdid)
            if backup.dead or not backup.reachable or backup.suspended:
                if member.synced:
                    self.degraded.add(block)
                    return "tryagain"
                continue
            if held is not None and held[1].epoch < role.epoch and not held[1].primary:
                if member.synced:   # the backup has not heard of this epoch yet: the
                    return "tryagain"   # agent resends until it has (here: the client retries)
                continue
            if held is None or held[1].epoch != role.epoch or held[1].primary:
                if member.synced:
                    self.fenced.add(block)   # a newer epoch exists: this primary was deposed
                    return "tryagain"
                continue
            backup.records[mdid] = value
        return "serve"

    def get(self, mdid: int) -> tuple[str, bytes | None]:
        if not self.serves(mdid, write=False):
            return ("moved" if self.role_of(mdid) is None else "tryagain"), None
        return "serve", self.records.get(mdid)

    def _drop(self, block: Block) -> None:
        for mdid in [m for m in self.records if block.contains(m)]:
            del self.records[mdid]

    def _release(self, block: Block, delete: bool) -> None:
        """Stop holding `block` (any role); pieces of a larger held block keep theirs."""
        for held, role in list(self.roles.items()):
            if block.covers(held):
                del self.roles[held]
            elif held.covers(block):
                del self.roles[held]
                for piece in subtract(held, block):
                    self.roles[piece] = replace(role, block=piece)
        self.frozen = [f for f in self.frozen if not block.covers(f)]
        if delete:
            self._drop(block)

    def expire_leases(self, now: float) -> None:
        for m in self.migrations.values():
            if m.state == "copied" and m.lease_until is not None and now >= m.lease_until:
                self._abort_migration(m)

    # the admin API: one method per route, named after it
    def _health(self, _: None) -> Health:
        return Health("ok", self.name, "fake", SPACE, self.ip, self.mac, METAFLOW_PORT, self.url, 100,
                      len(self.records), self.owned(), list(self.frozen), sorted(self.imports), 0.0,
                      self.role_list(), self.suspended)

    def owned(self) -> list[Block]:
        return sorted(b for b, r in self.roles.items() if r.primary)

    def role_list(self) -> list[Role]:
        return [self.roles[b] for b in sorted(self.roles)]

    def _blocks(self, _: None) -> BlocksReport:
        return BlocksReport([BlockKeys(b, self._keys_in(b.first, b.last), False) for b in self.owned()],
                            len(self.records))

    def _keys_in(self, first: int, last: int) -> int:
        return sum(1 for m in self.records if first <= m <= last)

    def _count(self, body: Any) -> Counts:
        return Counts([self._keys_in(a, b) for a, b in body.ranges])

    def _ops(self, body: Any) -> OpsReport:
        return OpsReport([sum(n for m, n in self.requests.items() if a <= m <= b) for a, b in body.ranges],
                         seconds=1.0)   # no window: the caller clears `requests`

    def _assign(self, body: AssignRequest) -> Assigned:
        for role in body.roles:
            for held, current in self.roles.items():
                if (held.covers(role.block) or role.block.covers(held)) and current.epoch > role.epoch:
                    raise Conflict(f"{role.block}: epoch {role.epoch} is older than {current.epoch}")
        kept = set(self.imports.pop(body.migration, [])) if body.migration else set()
        if body.migration and not kept:
            if not all(self.roles.get(r.block, None) is not None and self.roles[r.block].epoch == r.epoch
                       for r in body.roles):
                raise NotFound(f"no import {body.migration!r}")
            kept = {r.block for r in body.roles}   # a repeat of an adoption that happened
        if body.exclusive:
            for held in list(self.roles):   # what no new role covers goes, data and all
                rest = [held]
                for role in body.roles:
                    rest = [p for q in rest for p in
                            (subtract(q, role.block) if q.covers(role.block) else
                             [] if role.block.covers(q) else [q])]
                for piece in rest:
                    self._release(piece, delete=True)
            self.suspended = False
        for role in body.roles:
            fresh = not any(h.covers(role.block) or role.block.covers(h) for h in self.roles)
            if fresh and not any(k.covers(role.block) for k in kept):
                self._drop(role.block)
            for held in list(self.roles):
                if held.covers(role.block) or role.block.covers(held):
                    self._release(held if role.block.covers(held) else role.block, delete=False)
            self.roles[role.block] = role
            self.fenced.discard(role.block)
            self.degraded = {d for d in self.degraded if not role.block.covers(d)}
        return Assigned(self.role_list(), f"{self.ip}:{METAFLOW_PORT}")

    def _disown(self, body: Any) -> DisownReply:
        released = [b for b in body.blocks if any(h.covers(b) or b.covers(h) for h in self.roles)]
        for block in body.blocks:
            self._release(block, body.delete)
        return DisownReply(self.owned(), released)

    def _migrations(self, _: None) -> MigrationList:
        return MigrationList([self._report(m) for m in self.migrations.values()])

    def _migration(self, _: None, id: str) -> MigrationReport:
        if id not in self.migrations:
            raise NotFound(f"no migration {id!r}")
        return self._report(self.migrations[id])

    def _report(self, m: FakeMigration) -> MigrationReport:
        return MigrationReport(m.id, m.blocks, m.targets, m.state, m.keys, None, 0.0)

    def _migrate(self, body: Any) -> MigrationReport:
        if not all(any(h.covers(b) and r.primary for h, r in self.roles.items()) for b in body.blocks):
            raise Conflict("not all owned here")
        if any(f.covers(b) or b.covers(f) for f in self.frozen for b in body.blocks):
            raise Conflict("already being migrated")
        m = FakeMigration(f"{self.name}-m{next(self.world.ids)}", list(body.blocks),
                          [t.rstrip("/") for t in body.targets], "copying", 0)
        self.migrations[m.id] = m
        self.frozen += body.blocks
        targets = [self.world.agent_at(t) for t in m.targets]
        if any(t is None or not t.reachable for t in targets):
            self._abort_migration(m)
            raise ApiError(f"migration {m.id} aborted: a target is unreachable", 502)
        rows = {i: v for i, v in self.records.items() if any(b.contains(i) for b in m.blocks)}
        for target in targets:
            assert target is not None
            target._prepare_import(m.id, m.blocks)
            target.records.update(rows)
        m.keys, m.state = len(rows), "copied"
        m.lease_until = self.world.now + body.lease_s
        return self._report(m)

    def _prepare_import(self, ident: str, blocks: list[Block]) -> None:
        for block in blocks:
            self._drop(block)
        self.imports[ident] = list(blocks)

    def _commit(self, _: None, id: str) -> MigrationReport:
        m = self.migrations.get(id)
        if m is None:
            raise NotFound(f"no migration {id!r}")
        if m.state == "committed":
            return self._report(m)
        if m.state != "copied":
            raise Conflict(f"migration {id} is {m.state}, not copied")
        for block in m.blocks:
            self._release(block, delete=True)
        m.state = "committed"
        return self._report(m)

    def _abort(self, _: None, id: str) -> MigrationReport:
        m = self.migrations.get(id)
        if m is None:
            raise NotFound(f"no migration {id!r}")
        if m.state == "aborted":
            return self._report(m)
        if m.state == "committed":
            raise Conflict(f"migration {id} is already committed")
        self._abort_migration(m)
        return self._report(m)

    def _abort_migration(self, m: FakeMigration) -> None:
        self.frozen = [f for f in self.frozen if f not in m.blocks]
        m.state = "aborted"
        for url in m.targets:
            target = self.world.agent_at(url)
            if target is not None and target.reachable:
                target._import_discard(None, m.id)

    def _import_discard(self, _: None, id: str) -> Discarded:
        blocks = self.imports.pop(id, [])
        for block in blocks:
            if not any(h.covers(block) for h in self.roles):
                self._drop(block)
        return Discarded(id)

    def _import_begin(self, body: Any, id: str) -> Importing:
        self._prepare_import(id, body.blocks)
        return Importing(body.blocks)

    def _import_records(self, body: Any, id: str) -> ImportProgress:
        raise NotImplementedError("the fake copies records directly")

    def _sync(self, body: SyncRequest) -> SyncReport:
        held = self.roles.get(body.block)
        if held is None or not held.primary or held.epoch != body.epoch:
            raise Conflict(f"not the primary of {body.block} at epoch {body.epoch}")
        member = self.world.agents[body.member]
        role = member.roles.get(body.block)
        ok = (not member.dead and member.reachable and role is not None and role.epoch == body.epoch)
        slow = ok and self.failing_syncs > 0
        if slow:
            self.failing_syncs -= 1
            ok = False
        if ok:
            for mdid in [m for m in member.records if body.block.contains(m)]:
                del member.records[mdid]
            member.records.update({i: v for i, v in self.records.items() if body.block.contains(i)})
        report = SyncReport(body.block, body.epoch, body.member, "synced" if ok else "failed",
                            self._keys_in(body.block.first, body.block.last),
                            None if ok else f"{body.member} did not answer" if slow else "unreachable", 0.0)
        self.syncs.append(report)
        return report

    def _syncs(self, _: None) -> SyncList:
        return SyncList(list(self.syncs))


def _route_name(route: Any) -> str:
    return next(k for k, v in vars(ADMIN).items() if v is route)


# -- the world -----------------------------------------------------------------------


class ControllerKilled(Exception):
    """The fault hook killed the controller right after a step was carried out:
    that step's outcome, and every event queued, is lost with it."""


@dataclass
class Delivery:
    host: str | None
    hops: int
    why: str = ""


class World:
    """Switches, agents and a core, with the core's steps carried out one at a time."""

    def __init__(self, graph: nx.Graph, **settings: Any) -> None:
        self.graph = graph
        self.now = 0.0
        self.ids = itertools.count(1)
        defaults: dict[str, Any] = dict(space=SPACE, bounds=SplitBounds(), capacity=100,
                                        bootstrap=Bootstrap("preallocate"), settle_s=1.0,
                                        heartbeat_timeout_s=5.0, migration_lease_s=30.0, locate_timeout_s=3.0,
                                        secret=SECRET)
        defaults.update(settings)
        self.settings = Settings(**defaults)
        self.switches = {d["dpid"]: FakeSwitch(d["dpid"], self.clock) for _, d in graph.nodes(data=True)
                         if d["kind"] == "switch"}
        self.agents = {h: FakeAgent(h, graph.nodes[h]["ip"], graph.nodes[h]["mac"], self)
                       for h in storage_hosts(graph)}
        self.queue: deque[Any] = deque()
        self.answers: dict[object, Any] = {}
        self.executed: list[Step] = []
        self.inject: Callable[[Step], str | None] = lambda step: None
        self.down_ports: set[tuple[int, int]] = set()
        self.offline: set[str] = set()
        """Switches not plugged into the fabric yet (`plug`): a boot does not
        announce them, their links or their hosts."""
        self.core = self.new_core()

    # driving
    def clock(self) -> float:
        return self.now

    def new_core(self) -> MetaFlowCore:
        """A (re)started controller: switches and agents keep their state."""
        self.queue.clear()
        self.core = MetaFlowCore(self.settings, self.clock)
        return self.core

    @property
    def tree(self) -> LogicalBTree:
        """The controller's tree, for a world that has booted (boot() builds it)."""
        tree = self.core.tree
        assert tree is not None, "the controller has not built its tree yet"
        return tree

    def agent_at(self, url: str) -> FakeAgent | None:
        return next((a for a in self.agents.values() if a.url == url.rstrip("/") and not a.dead), None)

    def post(self, event: Any) -> None:
        self.queue.append(event)

    def run(self, limit: int | None = None) -> int:
        """Carry out steps until nothing is pending (or `limit` steps); returns how many."""
        done = 0
        while self.queue and (limit is None or done < limit):
            event = self.queue.popleft()
            for step in self.core.handle(event):
                self.execute(step)
                done += 1
        return done

    def execute(self, step: Step) -> None:
        self.executed.append(step)
        if isinstance(step, Answer):
            self.answers[step.reply] = step.value
            return
        if isinstance(step, PacketOut):
            return
        if isinstance(step, Wait):
            self.advance(step.seconds)
            self.post(StepDone(step.id))
            return
        failure = self.inject(step)
        if failure == "kill":
            self._carry_out(step, None)
            raise ControllerKilled(str(step))
        self._carry_out(step, failure)

    def _carry_out(self, step: Step, failure: str | None) -> None:
        """`failure`: None (works), "unreachable" (not carried out), "reply lost"
        (carried out, reported failed), "barrier timeout" (applied, reported
        failed), "barrier timeout, not applied"."""
        if isinstance(step, SendFlows):
            switch = self.switches[step.dpid]
            if failure != "barrier timeout, not applied":
                for msg in step.messages:
                    switch.apply(msg)
            if failure is not None:
                self.post(StepFailed(step.id, failure))
            else:
                self.post(StepDone(step.id))
        elif isinstance(step, ReadFlows):
            if failure is not None:
                self.post(StepFailed(step.id, failure))
            else:
                self.post(StepDone(step.id, self.switches[step.dpid].stats()))
        elif isinstance(step, CallAgent):
            agent = self.agent_at(step.url)
            if failure not in (None, "reply lost") or agent is None or not agent.reachable:
                self.post(StepFailed(step.id, failure or f"{step.url}: connection refused"))
                return
            name = _route_name(step.route)
            handler = getattr(agent, f"_{name}")
            try:
                result = handler(step.body, **step.params)
            except Exception as exc:
                self.post(StepFailed(step.id, str(exc)))
            else:
                self.post(StepFailed(step.id, "timed out") if failure else StepDone(step.id, result))
        else:
            raise TypeError(step)

    def advance(self, seconds: float) -> None:
        self.now += seconds
        for agent in self.agents.values():
            if not agent.dead:
                agent.expire_leases(self.now)

    def beat_for(self, seconds: float) -> None:
        """`seconds` pass while every live agent the controller can hear beats
        four times a heartbeat timeout, as agents do: a controller that heard
        nobody for half a timeout takes the silence for its own
        (`MetaFlowCore._heard`), so a server's silence is shown beside the others' beats."""
        end = self.now + seconds
        step = self.settings.heartbeat_timeout_s / 4
        while self.now < end:
            self.advance(min(step, end - self.now))
            self.heartbeats()

    # discovery, as the shim would report it
    def boot(self, register: bool = True, patience: float | None = None) -> None:
        """The fabric comes up, hosts say who they are, agents register; then
        time passes with heartbeats and ticks until the network is built or
        `patience` runs out (default: --locate-timeout and 2 s)."""
        g = self.graph
        self._announce([n for n, d in g.nodes(data=True) if d["kind"] == "switch" and n not in self.offline])
        for dpid, number in sorted(self.down_ports):   # what a switch's features say
            self.post(PortDown(dpid, number))
        if register:
            self.register_all()
        for host in storage_hosts(g) + client_hosts(g):
            if not self._cut_off(host) and not set(g.adj[host]) & self.offline:
                self.arp(host)
        self.run()
        started = self.now
        patience = self.settings.locate_timeout_s + 2 if patience is None else patience
        while self.core.tree is None and self.now - started <= patience:
            self.advance(self.settings.settle_s)
            self.heartbeats()
            self.tick()

    def _announce(self, switches: list[str]) -> None:
        """Each switch connects, then its links to the switches already plugged in come up."""
        g = self.graph
        plugged = set(switches)   # once, not per edge: k=32 has 1,280 switches and 24,576 edges
        for name in switches:
            self.post(SwitchUp(g.nodes[name]["dpid"]))
        for a, b in g.edges():
            if g.nodes[a]["kind"] == g.nodes[b]["kind"] == "switch" and {a, b} & plugged \
                    and not {a, b} & self.offline:
                self.post(LinkUp(g.nodes[a]["dpid"], port(g, a, b), g.nodes[b]["dpid"], port(g, b, a)))

    def plug(self, switches: list[str]) -> list[str]:
        """Switches plugged into the running fabric: they connect, their links
        come up, their hosts say who they are by ARP and their agents start
        and register. Returns those agents."""
        g = self.graph
        self.offline -= set(switches)
        self._announce(switches)
        self.run()
        hosts = [h for h in storage_hosts(g) + client_hosts(g) if set(g.adj[h]) & set(switches)]
        for host in hosts:
            self.arp(host)
        self.run()
        started = [h for h in hosts if h in self.agents]
        for name in started:
            self.agents[name].dead = False
            self.register(self.agents[name])
        return started

    def cut(self, host: str) -> None:
        """The host's edge port goes down (its agent still answers on the management network)."""
        g = self.graph
        (switch,) = [n for n in g.neighbors(host) if g.nodes[n]["kind"] == "switch"]
        self.down_ports.add((g.nodes[switch]["dpid"], port(g, switch, host)))
        self.post(PortDown(g.nodes[switch]["dpid"], port(g, switch, host)))

    def reconnect(self, host: str) -> None:
        """The host's edge port comes back up, and the host says so by ARP."""
        g = self.graph
        (switch,) = [n for n in g.neighbors(host) if g.nodes[n]["kind"] == "switch"]
        self.down_ports.discard((g.nodes[switch]["dpid"], port(g, switch, host)))
        self.post(PortUp(g.nodes[switch]["dpid"], port(g, switch, host)))
        self.arp(host)
        self.run()

    def _cut_off(self, host: str) -> bool:
        g = self.graph
        (switch,) = [n for n in g.neighbors(host) if g.nodes[n]["kind"] == "switch"]
        return (g.nodes[switch]["dpid"], port(g, switch, host)) in self.down_ports

    def register_all(self) -> None:
        for agent in self.agents.values():
            if not agent.dead:
                self.register(agent)

    def register(self, agent: FakeAgent) -> Any:
        """As the agent does: register, then hold exactly the roles the answer
        gives (if it gives any)."""
        reply = next(self.ids)
        registration = Registration(agent.name, agent.ip, agent.mac, METAFLOW_PORT, agent.url, "fake",
                                    100, SPACE, agent.owned(), agent.replication, agent.role_list(),
                                    agent.suspended, str(agent.incarnation))
        self.post(Register(reply, registration))
        self.run()
        answer = self.answers[reply]
        if getattr(answer, "roles", None) is not None:
            agent._assign(AssignRequest(answer.roles, exclusive=True))
        return answer

    def restart(self, name: str) -> None:
        """A server killed and started again: its store and roles survive, and
        it serves nothing until the controller answers its registration."""
        agent = self.agents[name]
        agent.dead, agent.suspended = False, True
        agent.incarnation += 1
        agent.fenced.clear()
        agent.degraded.clear()
        self.register(agent)

    def arp(self, host: str, ip: str | None = None, mac: str | None = None, at: str | None = None) -> None:
        g = self.graph
        (switch,) = [n for n in g.neighbors(at or host) if g.nodes[n]["kind"] == "switch"]
        message = ArpMessage(ip or g.nodes[host]["ip"], mac or g.nodes[host]["mac"], "10.255.255.254", True)
        self.post(ArpIn(g.nodes[switch]["dpid"], port(g, switch, at or host), message))

    def heartbeats(self) -> None:
        """Every live agent beats; one the controller answers 404 registers again."""
        replies = {}
        for agent in self.agents.values():
            if agent.reachable and not agent.dead:
                replies[agent.name] = reply = next(self.ids)
                self.post(Heartbeat(reply, agent.name, HeartbeatBody(
                    len(agent.records), agent.owned(), list(agent.frozen),
                    sorted(agent.degraded | agent.fenced))))
        self.run()
        for name, reply in replies.items():
            if isinstance(self.answers.get(reply), NotFound):
                self.register(self.agents[name])

    def tick(self) -> None:
        self.post(Tick())
        self.run()

    def ask(self, event_type: Any, **fields: Any) -> Any:
        reply = next(self.ids)
        self.post(event_type(reply, **fields))
        self.run()
        return self.answers.get(reply)

    # the data path, through what the switches hold
    def deliver(self, mdid: int, client: str | None = None, packets: int = 1) -> Delivery:
        """Where a request to `mdid` ends; every entry it matched on the way
        counts `packets`."""
        g = self.graph
        client = client or client_hosts(g)[0]
        (node,) = [n for n in g.neighbors(client) if g.nodes[n]["kind"] == "switch"]
        for hops in range(1, 16):
            flow = self.switches[g.nodes[node]["dpid"]].lookup(mdid)
            if flow is None:
                return Delivery(None, hops, f"no entry on {node}")
            flow.packets += packets
            out = next(a.port for a in flow.actions if isinstance(a, parser.OFPActionOutput))
            if (g.nodes[node]["dpid"], out) in self.down_ports:
                return Delivery(None, hops, f"{node} port {out} is down")
            peer = next(n for n in g.neighbors(node) if port(g, node, n) == out)
            if g.nodes[peer]["kind"] == "host":
                set_dst = [a for a in flow.actions if isinstance(a, parser.OFPActionSetDlDst)]
                if not set_dst or ":".join(f"{b:02x}" for b in set_dst[0].dl_addr) != g.nodes[peer]["mac"]:
                    return Delivery(None, hops, f"{peer} reached without its MAC")
                if peer in self.agents:
                    self.agents[peer].requests[mdid] += packets
                return Delivery(peer, hops)
            node = peer
        return Delivery(None, 16, "loop")

    def write(self, mdid: int, value: bytes) -> str:
        """A client's write through the switches: the agent's verdict (or why nothing got there)."""
        delivery = self.deliver(mdid)
        if delivery.host is None:
            return f"undelivered: {delivery.why}"
        agent = self.agents[delivery.host]
        if agent.dead or not agent.reachable:
            return "unreachable"
        return agent.put(mdid, value)

    def read(self, mdid: int) -> tuple[str, bytes | None]:
        delivery = self.deliver(mdid)
        if delivery.host is None:
            return f"undelivered: {delivery.why}", None
        agent = self.agents[delivery.host]
        if agent.dead:
            return "unreachable", None
        return agent.get(mdid)


# -- what must hold after anything ------------------------------------------------------


def sample_ids(world: World, per_block: int = 2) -> list[int]:
    """The ends of every owned block and a few IDs inside each."""
    tree = world.tree
    out = []
    for block, _ in tree.partition():
        step = max(1, block.size // (per_block + 1))
        out += [block.first, block.last] + [block.first + step * i for i in range(1, per_block + 1)]
    return out


def check_consistent(world: World, acked: dict[int, bytes], lost: Sequence[Block] = (),
                     maybe: Mapping[int, bytes] | None = None) -> None:
    """After the leases have run out: every ID is routed by the switches to a
    server that serves it (owned, not frozen), the controller's tree agrees,
    and every acknowledged write outside `lost` blocks reads back, or the
    value of a later write that was not acknowledged (`maybe`) and took effect."""
    world.beat_for(world.settings.migration_lease_s + 1)
    world.tick()
    tree = world.tree
    tree.check()
    for mdid in sample_ids(world) + list(acked):
        delivery = world.deliver(mdid)
        assert delivery.host == tree.owner(mdid), (SPACE.address(mdid), delivery, tree.owner(mdid))
        agent = world.agents[delivery.host]
        assert not agent.dead
        assert agent.serves(mdid, write=True), (SPACE.address(mdid), delivery.host, agent.roles)
    for agent in world.agents.values():
        assert agent.dead or not agent.frozen, (agent.name, agent.frozen)
    check_replicas(world)
    for mdid, value in acked.items():
        if any(b.contains(mdid) for b in lost):
            continue
        read = world.read(mdid)
        assert read == ("serve", value) or (maybe and mdid in maybe and read == ("serve", maybe[mdid])), \
            (SPACE.address(mdid), read)


def check_replicas(world: World) -> None:
    """The controller's sets agree with what the agents hold, and every synced
    member of a set holds exactly the primary's records of the block."""
    replicas = world.core.replicas
    assert replicas is not None
    replicas.check()
    for block, s in replicas.sets.items():
        primary = world.agents[s.primary]
        mine = {m: v for m, v in primary.records.items() if block.contains(m)}
        for name in s.members:
            agent = world.agents[name]
            held = next((r for b, r in agent.roles.items() if b.covers(block)), None)
            assert held is not None and held.epoch == s.epoch, (block, name, held, s)
            assert held.primary == (name == s.primary), (block, name, held)
            if name not in s.unsynced:
                theirs = {m: v for m, v in agent.records.items() if block.contains(m)}
                assert theirs == mine, (block, name, set(theirs) ^ set(mine))


def fill(world: World, server: str, count: int, seed: int = 0) -> dict[int, bytes]:
    """`count` acknowledged writes into `server`'s blocks, through the switches."""
    import random

    rng = random.Random(seed)
    tree = world.tree
    blocks = tree.blocks(server)
    acked: dict[int, bytes] = {}
    while len(acked) < count:
        block = rng.choice(blocks)
        mdid = rng.randrange(block.first, block.last + 1)
        value = f"v{mdid}".encode()
        if world.write(mdid, value) == "serve":
            acked[mdid] = value
    return acked
