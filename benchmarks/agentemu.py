"""Emulated storage agents: many servers' control plane in one asyncio process.

What the controller sees of an agent is its control plane: a signed
registration (`REST.register` with a `Registration`, as
`nat_agent.registration.Registrar` sends it), heartbeats, and an admin API
it calls (`ADMIN`: /assign, /health, /syncs ...). This module speaks all
three for N servers with the addresses and MACs the topology gives them,
holding no records: each answers as an empty agent would, its roles kept by
the agent's own `nat_agent.ownership.Ownership`, so an assignment is checked
and applied exactly as a real agent does.

One HTTP port serves every agent's admin API: an agent's admin URL is
``http://HOST:PORT/a/NAME``, which the controller's `ApiClient` prefixes to
every route's path (and signs with it), and the routes served here are
`ADMIN`'s under ``/a/{agent}`` (`PREFIXED`), dispatched by the same
`Dispatcher` the real agent uses, answers signed with the cluster secret.

Liveness goes through `beat`, one small function: as a real agent beats
(`nat_agent.registration`), a signed UDP datagram (`client_lib.liveness`)
to the port the controller named in its answer to the registration, and an
HTTP heartbeat when the controller has not yet heard the state it carries
(after a registration, a change of roles, every `STATE_PERIOD_S`) or nudged
the agent (a restarted controller does not know it: the heartbeat's 404
makes it register again). One UDP socket serves every agent.

Several controllers (a leader and standbys, elected through etcd): the
farm talks to one at a time and moves on as a real agent does
(`client_lib.api.leaders`: to the leader a `NotLeader` names, or the next
URL when one does not answer). The farm moves as one, not agent by agent:
the first agent to find the leader gone takes them all along, which is
what 2,000 real agents do within one heartbeat of each other.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import secrets
import time
import uuid
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

from client_lib.api.admin import (
    ADMIN,
    Assigned,
    BlocksReport,
    Counts,
    Discarded,
    DisownReply,
    DumpPage,
    Health,
    Importing,
    MigrationList,
    MigrationReport,
    OpsReport,
    Stats,
    SyncList,
    SyncReport,
)
from client_lib.api.auth import Verifier, server_authority
from client_lib.api.clients import AsyncApiClient
from client_lib.api.leaders import Leaders, moves_on
from client_lib.api.rest import REST, Heartbeat, Registration
from client_lib.api.route import Route
from client_lib.cidr import Block
from client_lib.constants import METAFLOW_PORT
from client_lib.errors import ApiError, InvalidArgument, NotFound
from client_lib.liveness import NUDGE, LivenessError, LivenessKey, decode_reply, encode_beat, state_digest
from client_lib.liveness import Sequence as BeatSequence
from client_lib.server.api import MAX_BODY, Call, Dispatcher
from nat_agent.ownership import Ownership
from nat_agent.registration import ACK_WAIT_S, STATE_PERIOD_S
from topology import builders
from topology.builders import Topology

PREFIX = "/a/{agent}"
PREFIXED: dict[Route[Any, Any], Route[Any, Any]] = {
    dataclasses.replace(route, template=PREFIX + route.template): route for route in ADMIN.ALL}
"""The admin routes as served here (with the agent's name first) -> the route itself."""
STORE = "memory"
"""What an emulated agent reports as its store: it keeps no records."""
BEAT_SLICE_S = 0.05
"""The agents' beats are spread over their interval in slices this long."""
SYNC_DONE = "synced"
"""`nat_agent.syncs`' state of a finished sync: an empty block is copied at once."""


@dataclass
class EmulatedAgent:
    name: str
    data_ip: str
    data_mac: str
    admin_url: str
    capacity: int
    space: Block
    ownership: Ownership
    syncs: list[SyncReport] = field(default_factory=list)
    migrations: dict[str, MigrationReport] = field(default_factory=dict)
    registered: float | None = None
    """When the controller accepted its registration (time.monotonic)."""
    liveness_port: int = 0
    """Where the controller takes this agent's datagrams (its answer to the registration; 0: HTTP only)."""
    heard: tuple[bytes, float] | None = None
    """The state digest the controller last answered over HTTP, and when."""
    nudged: bool = False
    unanswered: float | None = None
    """When the first datagram the controller has not answered yet went out."""
    started: float = field(default_factory=time.monotonic)
    dead: bool = False
    """Powered off (`AgentFarm.kill`): it neither beats nor answers."""
    incarnation: str = field(default_factory=lambda: secrets.token_hex(8))
    """Its process's `Registration.incarnation`."""

    def registration(self) -> Registration:
        return Registration(self.name, self.data_ip, self.data_mac, METAFLOW_PORT, self.admin_url, STORE,
                            self.capacity, self.space, self.ownership.owned, f"{self.data_ip}:0",
                            self.ownership.roles, self.ownership.suspended, self.incarnation)

    def heartbeat(self) -> Heartbeat:
        own = self.ownership
        return Heartbeat(0, own.owned, own.frozen, own.degraded)

    def digest(self) -> bytes:
        own = self.ownership
        return state_digest(own.owned, own.frozen, own.degraded)

    def health(self) -> Health:
        own = self.ownership
        return Health("ok", self.name, STORE, self.space, self.data_ip, self.data_mac, METAFLOW_PORT,
                      self.admin_url, self.capacity, 0, own.owned, own.frozen, [],
                      time.monotonic() - self.started, own.roles, own.suspended)


def beat(farm: AgentFarm, agent: EmulatedAgent, host: str) -> bool:
    """One heartbeat of `agent` by datagram to the controller at `host`, if
    that is enough now (module doc); False: an HTTP heartbeat is due."""
    digest, now = agent.digest(), time.monotonic()
    if (farm.udp is None or not agent.liveness_port or agent.nudged or agent.heard is None
            or agent.heard[0] != digest or now - agent.heard[1] >= STATE_PERIOD_S
            or (agent.unanswered is not None and now - agent.unanswered > ACK_WAIT_S)):
        return False   # (the last: datagrams unanswered, a controller gone or restarted)
    if agent.unanswered is None:
        agent.unanswered = now
    datagram = encode_beat(farm.key, agent.name, farm.sequence.next(), digest)
    farm.udp.sendto(datagram, (host, agent.liveness_port))
    farm.datagrams += 1
    return True


class _Replies(asyncio.DatagramProtocol):
    """The controller's replies to the agents' datagrams: a NUDGE asks for an HTTP heartbeat."""

    def __init__(self, farm: AgentFarm) -> None:
        self.farm = farm
        self.last: dict[str, int] = {}

    def datagram_received(self, data: bytes, addr: tuple[str | Any, int]) -> None:
        try:
            reply = decode_reply(data, self.farm.key, time.time(), self.last)
        except LivenessError:
            return
        agent = self.farm.agents.get(reply.name)
        if agent is not None:
            self.last[reply.name] = reply.seq
            agent.nudged = agent.nudged or reply.kind == NUDGE
            agent.unanswered = None


Handler = Callable[[EmulatedAgent, Call], Awaitable[object]]


class AgentFarm:
    """Every storage server of a topology as an emulated agent, and the one
    HTTP server of their admin APIs."""

    def __init__(self, graph: Topology, controllers: Sequence[str], secret: bytes, space: Block,
                 capacity: int = 1000, host: str = "127.0.0.1", servers: Sequence[str] | None = None,
                 on_registered: Callable[[EmulatedAgent], None] | None = None) -> None:
        """`controllers`: their REST URLs (one, or a leader's and its standbys');
        `on_registered` is told of each registration the controller accepted
        (the switch emulator then lets the server's first ARP out)."""
        self.leaders, self.secret, self.space = Leaders(controllers), secret, space
        self._clients: dict[tuple[str, float], AsyncApiClient] = {}
        self.capacity, self.host = capacity, host
        self.on_registered = on_registered
        self._pending: set[asyncio.Task[None]] = set()
        self._http_busy: set[str] = set()
        """Agents whose HTTP heartbeat is under way (one at a time each, as a real agent)."""
        self.names = list(servers) if servers is not None else builders.storage_hosts(graph)
        self.graph = graph
        self.agents: dict[str, EmulatedAgent] = {}
        self.port = 0
        self._runner: web.AppRunner | None = None
        self._dispatcher: Dispatcher | None = None
        self._beating: asyncio.Task[None] | None = None
        self.beats = 0
        """HTTP heartbeats answered."""
        self.datagrams = 0
        self.beat_errors = 0
        self.refused: dict[str, str] = {}   # agent name: the controller's last refusal of its registration
        self.key = LivenessKey(secret)
        self.sequence = BeatSequence()
        self.udp: asyncio.DatagramTransport | None = None
        self.handlers: dict[Route[Any, Any], Handler] = {
            ADMIN.health: _health, ADMIN.blocks: _blocks, ADMIN.count: _count, ADMIN.ops: _ops,
            ADMIN.stats: _stats, ADMIN.assign: _assign, ADMIN.disown: _disown, ADMIN.sync: _sync,
            ADMIN.syncs: _syncs, ADMIN.migrations: _migrations, ADMIN.migration: _migration,
            ADMIN.migrate: _migrate, ADMIN.commit: _commit, ADMIN.abort: _abort,
            ADMIN.import_begin: _import_begin, ADMIN.import_discard: _discard, ADMIN.dump: _dump,
        }

    async def start(self, port: int = 0) -> int:
        """Serve the admin APIs (port 0: any free one); the agents' URLs name it."""
        app = web.Application(client_max_size=MAX_BODY)
        app.router.add_route("*", "/{tail:.*}", self._serve)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        await web.TCPSite(self._runner, self.host, port).start()
        self.port = int(self._runner.addresses[0][1])
        self.udp, _ = await asyncio.get_running_loop().create_datagram_endpoint(
            lambda: _Replies(self), local_addr=(self.host, 0))
        verifier = Verifier(self.secret, server_authority(self.host, self.port))
        self._dispatcher = Dispatcher(list(PREFIXED), verifier)
        for name in self.names:
            node = self.graph.nodes[name]
            url = f"http://{self.host}:{self.port}/a/{name}"
            self.agents[name] = EmulatedAgent(name, node["ip"], node["mac"], url, self.capacity, self.space,
                                              Ownership(self.space.width, name))
        return self.port

    async def close(self) -> None:
        tasks = [*self._pending, *([self._beating] if self._beating else [])]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        if self.udp is not None:
            self.udp.close()
            self.udp = None
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    def kill(self, names: Sequence[str]) -> None:
        """Power these servers off: no beat, no answer, from now on."""
        for name in names:
            self.agents[name].dead = True

    def refusals(self, n: int) -> list[str]:
        """The last refusals of `n` registrations (name: controller: error), for a report."""
        return [f"{name}: {why}" for name, why in list(self.refused.items())[-n:]]

    def client(self, timeout: float) -> AsyncApiClient:
        """A client of the controller the farm talks to now."""
        key = (self.leaders.current, timeout)
        if key not in self._clients:
            self._clients[key] = AsyncApiClient(key[0], self.secret, timeout=timeout)
        return self._clients[key]

    def _moved(self, exc: ApiError, asked: AsyncApiClient) -> bool:
        """Move on from the controller `asked` if `exc` says "not here"
        (`moves_on`), unless another agent already moved the farm."""
        if not moves_on(exc):
            return False
        if asked.base_url.rstrip("/") == self.leaders.current:
            self.leaders.move(getattr(exc, "leader", None))
        return True

    async def register(self, client: AsyncApiClient, agent: EmulatedAgent) -> None:
        """One registration, as `Registrar` sends it; the answer's roles adopted."""
        answer = await client.call(REST.register, agent.registration())
        if answer.roles is not None:
            agent.ownership.assign(answer.roles, exclusive=True)
        agent.registered = time.monotonic()
        agent.liveness_port = answer.liveness_port
        agent.heard, agent.nudged, agent.unanswered = None, False, None
        if self.on_registered is not None:
            self.on_registered(agent)

    async def register_all(self, concurrency: int = 32, patience: float = 60.0) -> list[str]:
        """Register every agent (`concurrency` requests at once); the names
        that failed, each tried again every 0.5 s for `patience` seconds (as
        an agent keeps trying: a leader may die in the middle)."""
        gate = asyncio.Semaphore(concurrency)
        failed = []
        deadline = time.monotonic() + patience

        async def one(agent: EmulatedAgent) -> None:
            async with gate:
                while True:
                    client = self.client(30.0)
                    try:
                        await self.register(client, agent)
                        return
                    except ApiError as exc:
                        self._moved(exc, client)
                        self.refused[agent.name] = f"{client.base_url}: {exc}"
                        if time.monotonic() > deadline:
                            break
                        await asyncio.sleep(0.5)
                failed.append(agent.name)

        await asyncio.gather(*(one(a) for a in self.agents.values()))
        return failed

    def start_beating(self, interval: float) -> None:
        """Every registered agent beats every `interval`, spread evenly over it;
        one the controller does not know (404: it restarted) registers again."""
        timeout = max(1.0, interval)

        async def loop() -> None:
            slices = max(1, round(interval / BEAT_SLICE_S))
            while True:
                agents = [a for a in self.agents.values() if a.registered is not None and not a.dead]
                for i in range(slices):
                    client = self.client(timeout)
                    for agent in agents[i::slices]:
                        if not beat(self, agent, client.host) and agent.name not in self._http_busy:
                            self._http_busy.add(agent.name)
                            self._pending.add(asyncio.create_task(self._beat(client, agent)))
                    await asyncio.sleep(interval / slices)

        self._beating = asyncio.create_task(loop(), name="heartbeats")

    async def _beat(self, client: AsyncApiClient, agent: EmulatedAgent) -> None:
        """An HTTP heartbeat, as `nat_agent.registration` sends it."""
        try:
            digest = agent.digest()
            await client.call(REST.heartbeat, agent.heartbeat(), name=agent.name)
            agent.heard, agent.nudged, agent.unanswered = (digest, time.monotonic()), False, None
            self.beats += 1
        except NotFound:   # the controller restarted, or failed us over: register again
            with contextlib.suppress(ApiError):
                await self.register(client, agent)
        except ApiError as exc:
            self.beat_errors += 1
            if self._moved(exc, client):   # a new leader does not know us yet: its 404 brings us in
                agent.nudged = True
        finally:
            self._http_busy.discard(agent.name)
            self._pending.discard(asyncio.current_task())

    async def _serve(self, request: web.Request) -> web.Response:
        assert self._dispatcher is not None
        body = await request.read()
        call = self._dispatcher.resolve(request.method, request.path, request.query_string,
                                        request.headers, body)
        if not isinstance(call, Call):
            return web.Response(status=call.status, body=call.body, headers=call.headers)
        agent = self.agents.get(call.params["agent"])
        if agent is not None and agent.dead:
            if request.transport is not None:
                request.transport.close()   # a dead server's connection just ends: no answer
            return web.Response(status=503)   # (written to nobody)
        try:
            if agent is None:
                raise NotFound(f"no emulated agent {call.params['agent']!r}", 404)
            handler = self.handlers.get(PREFIXED[call.route])
            if handler is None:
                raise InvalidArgument(f"{PREFIXED[call.route]}: an emulated agent holds no records", 400)
            result = await handler(agent, call)
            response = self._dispatcher.reply(call, result)
        except Exception as exc:
            response = self._dispatcher.fail(call, exc)
        return web.Response(status=response.status, body=response.body, headers=response.headers)


# -- what an empty agent answers --------------------------------------------------------


async def _health(agent: EmulatedAgent, call: Call) -> Health:
    return agent.health()


async def _blocks(agent: EmulatedAgent, call: Call) -> BlocksReport:
    return BlocksReport([], 0)


async def _count(agent: EmulatedAgent, call: Call) -> Counts:
    return Counts([0 for _ in call.body.ranges])


async def _ops(agent: EmulatedAgent, call: Call) -> OpsReport:
    return OpsReport([0 for _ in call.body.ranges], 1.0)


async def _stats(agent: EmulatedAgent, call: Call) -> Stats:
    return Stats({}, {})


async def _assign(agent: EmulatedAgent, call: Call) -> Assigned:
    agent.ownership.check_assign(call.body.roles)
    agent.ownership.assign(call.body.roles, call.body.exclusive)
    return Assigned(agent.ownership.roles, f"{agent.data_ip}:{METAFLOW_PORT}")


async def _disown(agent: EmulatedAgent, call: Call) -> DisownReply:
    released = agent.ownership.disown(call.body.blocks, call.body.moved_to)
    return DisownReply(agent.ownership.owned, released)


async def _sync(agent: EmulatedAgent, call: Call) -> SyncReport:
    body = call.body
    agent.ownership.update_peer(body.block, body.epoch, body.member, synced=True)
    report = SyncReport(body.block, body.epoch, body.member, SYNC_DONE, 0, None, 0.0)
    agent.syncs.append(report)
    return report


async def _syncs(agent: EmulatedAgent, call: Call) -> SyncList:
    return SyncList(list(agent.syncs))


async def _migrations(agent: EmulatedAgent, call: Call) -> MigrationList:
    return MigrationList(list(agent.migrations.values()))


def _known(agent: EmulatedAgent, call: Call) -> MigrationReport:
    report = agent.migrations.get(call.params["id"])
    if report is None:
        raise NotFound(f"no migration {call.params['id']!r}", 404)
    return report


async def _migration(agent: EmulatedAgent, call: Call) -> MigrationReport:
    return _known(agent, call)


async def _migrate(agent: EmulatedAgent, call: Call) -> MigrationReport:
    """Frozen and copied at once: an empty block has no records to send (the
    targets adopt it by the controller's /assign, which names the migration)."""
    body = call.body
    agent.ownership.freeze(body.blocks)
    report = MigrationReport(uuid.uuid4().hex, body.blocks, body.targets, "copied", 0, None, 0.0,
                             body.lease_s)
    agent.migrations[report.id] = report
    return report


async def _commit(agent: EmulatedAgent, call: Call) -> MigrationReport:
    report = _known(agent, call)
    if report.state == "copied":
        agent.ownership.disown(report.blocks, report.targets[0] if report.targets else None)
        report = dataclasses.replace(report, state="committed", lease_left_s=None)
        agent.migrations[report.id] = report
    return report


async def _abort(agent: EmulatedAgent, call: Call) -> MigrationReport:
    report = _known(agent, call)
    if report.state == "copied":
        agent.ownership.unfreeze(report.blocks)
        report = dataclasses.replace(report, state="aborted", lease_left_s=None)
        agent.migrations[report.id] = report
    return report


async def _import_begin(agent: EmulatedAgent, call: Call) -> Importing:
    return Importing(call.body.blocks)


async def _discard(agent: EmulatedAgent, call: Call) -> Discarded:
    return Discarded(call.params["id"])


async def _dump(agent: EmulatedAgent, call: Call) -> DumpPage:
    return DumpPage(call.body.block, call.body.epoch or 0, [], False)
