"""Registration with the controller and heartbeats, over the management network.

The controller learns a storage server from the agent rather than from the
data plane alone: the agent knows its data-plane MAC and address, its admin
URL and replication listener, its store and capacity, and the roles it
holds with their epochs (which a restarted controller needs to rebuild the
B-tree and the replica sets, resolving two claims to a block by epoch).
Heartbeats (every ``--heartbeat``, 0.25 s by default, so the controller can
notice a silent server within a second) carry the key total so the
controller sees a server fill up, and the blocks this primary holds back
(degraded or fenced) so it re-syncs them; their absence is how it notices a
dead agent whose edge port is still up.

The answer to a registration says what the agent may hold
(`Registered.roles`): a list means exactly those roles (an exclusive
assignment: everything else is dropped and deleted, and a suspended agent
serves again), ``[]`` for a server that was declared failed (it rejoins
empty); None means the controller has no word yet, and the agent keeps what
it holds, suspended if it was, until an exclusive ``/assign`` arrives.

Both go through `AsyncApiClient` with the cluster's secret (`REST.register`
with a `Registration`, `REST.heartbeat` with a `Heartbeat`), so the
controller knows the agent is of its cluster and the agent knows it talks
to its controller (the answers are signed). What the answers mean:

- a heartbeat answered 404: the controller does not know us (it restarted):
  register again;
- a registration answered 409: our name is bound to another server (another
  data address, MAC or admin URL). That is an operator's mistake or an
  attempt to take the name over, never something to fight: log an error,
  loudly, and keep asking at the interval until the other one is gone;
- 401: the controller does not share our secret (or is not the
  controller): an error too, and keep asking.

Liveness datagrams (issue 26, `client_lib.liveness`): a controller that
takes them says where in its answer to a registration
(`Registered.liveness_port`). Then the beats go as signed UDP datagrams,
a few dozen bytes each, and an HTTP heartbeat only when the state it
carries (owned, frozen, degraded blocks) changes, every
``--state-period`` as a safety net, when the controller nudges us (it
does not know us, declared us failed, is a standby, or holds an older
state of us), and when datagrams go unanswered for `ACK_WAIT_S`: that
heartbeat finds a controller that is down or paused, and its failure
moves us on as before; when it succeeds the datagrams resume, unless
that happened more than `UNANSWERED_LIMIT` times in a row without an ACK
between (UDP blocked on the way: then HTTP for a state period). When the
heartbeat's answer says the controller does take our datagrams
(`Ack.datagram_age_s`), only its replies are late (a controller starved
of CPU): the next HTTP heartbeat waits twice as long, up to
`ACK_WAIT_MAX_S`, instead of putting our load back on HTTP, which would
starve it further. The key count
rides in every datagram, so writes cause no HTTP heartbeats.
Agents beat by datagram only with ``--liveness-datagrams`` (off by default: docs/liveness.md).

A controller that is down is not an agent error: we log once per outage
and keep trying every interval, serving clients all the while.

Several controllers (``--controller URL,URL...``; one leader elected
through etcd, the others standbys): the agent talks to one at a time
(`client_lib.api.leaders`). When it gets no answer (refused, timed out) or
a 503 `NotLeader`, it moves on, to the leader the standby names if any,
else to the next URL, and registers there (a new leader may know nothing
of us, as after a controller's restart). A standby that names a leader
is followed at once (with a short timeout if it is the controller that
just gave no answer: `QUICK_S`); everything else waits the interval. Each move is
logged once per trouble, not once per heartbeat. An answer to a
registration whose term (`Registered.term`) is older than one the agent
has seen comes from a leader that was deposed: its roles are not adopted
and the agent moves on (`nat_agent.fence`).
"""

from __future__ import annotations

import asyncio
import logging
import secrets
import socket
import time
from collections.abc import Sequence
from urllib.parse import urlsplit

from client_lib.api.admin import AssignRequest
from client_lib.api.clients import AsyncApiClient
from client_lib.api.leaders import Leaders, moves_on
from client_lib.api.rest import REST, Heartbeat, Registered, Registration
from client_lib.errors import ApiError, AuthError, Conflict, InvalidArgument, NotFound, NotLeader
from client_lib.liveness import NUDGE, LivenessError, LivenessKey, decode_reply, encode_beat, state_digest
from client_lib.liveness import Sequence as BeatSequence
from nat_agent.agent import Agent
from nat_agent.fence import StaleTerm

log = logging.getLogger("metaflow.agent.registration")

REMIND_S = 60.0
"""How often a trouble that persists is logged again."""
QUICK_S = 0.5
"""The request timeout for a controller that gave no answer less than
`STAY_S` ago, when a standby sends us back to it: it is paused or cut off,
and the standby has not noticed yet (its lease has not run out). Another
full request timeout there could bring us to the standby's takeover a
second late, when the new leader has built without us (the nemesis: a
leader paused for 1.5 s, a successor that built from 2 of 8 agents, a
block lost). Staying with the standby instead was tried and is worse: when
the leader was only cut off, the agents came back to it after the cut
later than the controller's grace, and 5 of 8 were failed over at once."""
STAY_S = 1.0
"""How long after a controller's silence its requests use `QUICK_S`
(from the first silence: a leader that is alive but slow still gets the
full timeout after that)."""
STOP_WAIT_S = 0.5
"""How long `Registrar.stop` waits for a cancellation to end the loop before it cancels again."""
STATE_PERIOD_S = 60.0
"""Seconds between HTTP heartbeats while beating by datagram (``--state-period``):
only the safety net (a change of state goes at once; a controller's
restart, a standby, a failure declared or a state it lost nudge at once;
a silent controller is noticed by the missing ACKs), so it may be long:
2,000 servers at one per 60 s are 33 requests a second, about 3 % of a
controller core at the 0.8-1 ms one costs (docs/liveness.md)."""
ACK_WAIT_S = 1.0
"""How long datagrams may go unanswered, beyond one heartbeat interval (the
next beat, whose reply would say it, goes out only then), before the agent
beats over HTTP (the controller's heartbeat timeout, 1 s by default): a
controller that is paused or gone is then found, and left, as over HTTP
alone. (Counted from the last reply alone, every beat of an agent beating
every 1 s or slower was "unanswered", and it fell back to HTTP.)"""
ACK_WAIT_MAX_S = 4.0
"""The longest `ACK_WAIT_S` doubles to while the controller says it takes our
datagrams but its replies do not come: 2,000 agents then send 500 HTTP
heartbeats a second, not 8,000; a controller that stops answering HTTP too
is left within this and a request's timeout."""
UNANSWERED_LIMIT = 2
"""HTTP heartbeats sent in a row because datagrams went unanswered, after
which the next one puts the agent on HTTP alone for a state period: a
lost or late ACK (a busy controller) must not put its load back on HTTP;
three times in a row is UDP that does not get through."""


class _Replies(asyncio.DatagramProtocol):
    """The controller's replies to our beats, handed to `Registrar._reply`."""

    def __init__(self, registrar: Registrar) -> None:
        self._registrar = registrar

    def datagram_received(self, data: bytes, addr: tuple[str | object, ...]) -> None:
        self._registrar._reply(data)

    def error_received(self, exc: Exception) -> None:
        """A refused port (ICMP): nothing to do; the missing replies say it (`ACK_WAIT_S`)."""


class Registrar:
    def __init__(self, agent: Agent, controllers: str | Sequence[str], secret: bytes,
                 interval: float = 0.25, datagrams: bool = True,
                 state_period: float = STATE_PERIOD_S) -> None:
        """`controllers`: one base URL, or several (`client_lib.api.leaders`);
        `datagrams`: beat by datagram where the controller takes them;
        `state_period`: seconds between HTTP heartbeats meanwhile."""
        ident = agent.identity
        if not (ident.data_ip and ident.data_mac):
            raise ValueError("registration needs the data-plane address and MAC")
        self.agent = agent
        self.leaders = Leaders([controllers] if isinstance(controllers, str) else controllers)
        self._secret = secret
        self._clients: dict[str, AsyncApiClient] = {}
        self.interval = interval
        self.registered = False
        self.heartbeats = 0
        self._task: asyncio.Task[None] | None = None
        self._stopping = False
        self._trouble: str | None = None
        self._told = 0.0
        self._hopped = False
        self._silent: tuple[str, float] | None = None
        """The controller that last gave no answer, and when it first did."""
        self._quick: dict[str, AsyncApiClient] = {}
        self.datagrams = datagrams
        self.state_period = state_period
        self.beats = 0
        """Datagrams sent (`heartbeats` counts the HTTP ones)."""
        self.incarnation = secrets.token_hex(8)
        """This process's `Registration.incarnation`."""
        self._key = LivenessKey(secret)
        self._seq = BeatSequence()
        self._udp: asyncio.DatagramTransport | None = None
        self._target: tuple[object, ...] = ()
        self._port = 0
        """The current controller's liveness port (`Registered.liveness_port`; 0: HTTP only)."""
        self._http: tuple[bytes, float] | None = None
        """The state digest of our last HTTP heartbeat, and when it was answered."""
        self._answered = 0.0
        self._ack_wait = ACK_WAIT_S
        """How long datagrams may go unanswered now (`ACK_WAIT_S`, doubled while only replies are late)."""
        self._nudged = False
        self._http_only_until = 0.0
        self._unanswered = 0
        """HTTP heartbeats sent, in a row, because datagrams went unanswered."""
        self._last_reply: dict[str, int] = {}

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run(), name="registrar")

    async def stop(self) -> None:
        """Cancel the loop, again if need be: a cancellation that lands as a
        request times out can come back as the request's timeout error,
        which the loop would take for a controller that is down and go on."""
        if self._udp is not None:
            self._udp.close()
            self._udp = None
        if self._task is None:
            return
        self._stopping = True
        while not self._task.done():
            self._task.cancel()
            await asyncio.wait([self._task], timeout=STOP_WAIT_S)
        self._task = None

    @property
    def controller(self) -> AsyncApiClient:
        """The client of the controller we talk to now."""
        url = self.leaders.current
        silent = self._silent
        if silent is not None and silent[0] == url and time.monotonic() - silent[1] < STAY_S:
            if url not in self._quick:
                self._quick[url] = AsyncApiClient(url, self._secret, timeout=QUICK_S)
            return self._quick[url]
        if url not in self._clients:
            self._clients[url] = AsyncApiClient(url, self._secret, timeout=max(1.0, self.interval))
        return self._clients[url]

    def registration(self) -> Registration:
        ident, agent = self.agent.identity, self.agent
        assert ident.data_ip and ident.data_mac  # checked in __init__
        ownership = agent.ownership
        return Registration(ident.name, ident.data_ip, ident.data_mac, ident.data_port, ident.admin_url,
                            agent.store.kind, ident.capacity, agent.space, ownership.owned,
                            ident.replication, ownership.roles, ownership.suspended, self.incarnation)

    async def _run(self) -> None:
        while not self._stopping:
            base = self.controller.base_url
            try:
                await self._once()
                self._silent = None
                self._fine(f"registration with the controller at {base} works again")
            except NotLeader as exc:
                self.registered = False
                if self._follow(exc.leader, base, f"the controller at {base} is not the leader ({exc})"):
                    continue
            except StaleTerm as exc:
                self.registered = False
                self._move("stale", logging.WARNING, None, base,
                           f"the controller at {base} is an older leader; not adopting its answer ({exc})")
            except Conflict as exc:
                self.registered = False
                self._report("conflict", logging.ERROR,
                             f"the controller at {base} refuses to register us as "
                             f"{self.agent.identity.name!r}: the name is bound to another server "
                             f"({exc}); fix the names, or stop the other one; retrying every "
                             f"{self.interval:g} s")
            except AuthError as exc:
                self.registered = False
                self._report("auth", logging.ERROR,
                             f"the controller at {base} does not share our secret: {exc}; "
                             f"retrying every {self.interval:g} s")
            except ApiError as exc:
                self.registered = False
                if moves_on(exc) and self.leaders.several:
                    if self._silent is None or self._silent[0] != base:
                        self._silent = (base, time.monotonic())
                    self._move("down", logging.WARNING, None, base,
                               f"controller at {base} unreachable ({exc})")
                else:
                    self._report("down", logging.WARNING, f"controller at {base} unreachable ({exc}); "
                                 f"retrying every {self.interval:g} s")
            self._hopped = False
            await asyncio.sleep(self.interval)

    def _follow(self, leader: str | None, base: str, why: str) -> bool:
        """Move on after a NotLeader; True to try the named leader at once
        (once in a row: two standbys naming each other wait the interval)."""
        now = bool(leader) and leader != base and not self._hopped
        self._move("not-leader", logging.INFO, leader, base, why)
        self._hopped = now
        return now

    def _move(self, trouble: str, level: int, leader: str | None, base: str, why: str) -> None:
        """Leave the controller at `base` for the next one (or `leader`), logged once per trouble."""
        nxt = self.leaders.move(leader)
        self._report(trouble, level, f"{why}; trying {nxt}" + ("" if nxt != base else
                                                              f" again every {self.interval:g} s"))

    async def _once(self) -> None:
        if self.registered:
            ownership = self.agent.ownership
            keys = await self.agent.store.total()
            digest = state_digest(ownership.owned, ownership.frozen, ownership.degraded)
            if await self._beat(keys, digest):
                return
            beat = Heartbeat(keys, ownership.owned, ownership.frozen, ownership.degraded)
            try:
                ack = await self.controller.call(REST.heartbeat, beat, name=self.agent.identity.name)
                self.heartbeats += 1
                self._http = (digest, time.monotonic())
                self._answered = self._http[1]
                self._nudged = False
                age = ack.datagram_age_s
                if self._unanswered and age is not None and age <= self._ack_wait:
                    # sent for want of replies, but the controller takes our datagrams: they are late
                    self._unanswered = 0
                    self._ack_wait = min(2 * self._ack_wait, ACK_WAIT_MAX_S)
                return
            except NotFound:
                log.info("the controller forgot us; registering again")
                self.registered = False
        answer = await self.controller.call(REST.register, self.registration())
        await self.agent.admit_term(answer.term, "the answer to our registration")
        self.registered = True
        self._to_controller(answer.liveness_port)
        log.info("registered with the controller at %s as %s%s", self.controller.base_url,
                 self.agent.identity.name, "" if answer.roles is not None else
                 "; it has no word on our roles yet" + (" (still suspended)"
                                                         if self.agent.ownership.suspended else ""))
        await self._adopt(answer)

    def _to_controller(self, port: int) -> None:
        """Beat (by datagram, if `port`) to the controller that just registered us."""
        if self._udp is not None:
            self._udp.close()
            self._udp = None
        self._port = port if self.datagrams else 0
        self._http, self._nudged, self._http_only_until, self._unanswered = None, False, 0.0, 0
        self._ack_wait = ACK_WAIT_S

    async def _beat(self, keys: int, digest: bytes) -> bool:
        """Beat by datagram if that is enough now (module docstring); False: send an HTTP heartbeat."""
        now = time.monotonic()
        if (not self._port or self._nudged or self._http is None or self._http[0] != digest
                or now - self._http[1] >= self.state_period or now < self._http_only_until):
            return False
        if now - self._answered > self._ack_wait + self.interval:
            self._unanswered += 1
            if self._unanswered > UNANSWERED_LIMIT:
                self._unanswered = 0
                self._http_only_until = now + self.state_period
                self._report("datagrams", logging.WARNING,
                             f"no answer to our liveness datagrams from {self.controller.base_url} "
                             f"(UDP port {self._port}) while it answers HTTP; heartbeats over HTTP for "
                             f"{self.state_period:g} s")
            return False
        if self._udp is None:
            loop = asyncio.get_running_loop()
            host = urlsplit(self.controller.base_url).hostname or ""
            found = await loop.getaddrinfo(host, self._port, type=socket.SOCK_DGRAM)
            family, _, _, _, self._target = found[0]
            self._udp, _ = await loop.create_datagram_endpoint(lambda: _Replies(self), family=family)
        self._udp.sendto(encode_beat(self._key, self.agent.identity.name, self._seq.next(), digest, keys,
                                     self.agent.fence.term), self._target)
        self.beats += 1
        return True

    def _reply(self, data: bytes) -> None:
        """The controller's reply to a beat: ACK (heard), NUDGE (send an HTTP heartbeat now)."""
        name = self.agent.identity.name
        try:
            reply = decode_reply(data, self._key, time.time(), self._last_reply)
        except LivenessError as exc:
            log.debug("%s", exc)
            return
        if reply.name != name:
            return
        self._last_reply[name] = reply.seq
        self._answered = time.monotonic()
        self._unanswered = 0
        self._ack_wait = ACK_WAIT_S
        if reply.kind == NUDGE:
            self._nudged = True

    async def _adopt(self, answer: Registered) -> None:
        """Hold exactly the roles the controller answered with, if it did."""
        if answer.roles is None:
            return
        try:
            await self.agent.assign(AssignRequest(answer.roles, exclusive=True))
        except (Conflict, InvalidArgument, NotFound) as exc:
            # An older epoch than we hold, or roles that are not ours: the controller is
            # confused; keep what we hold (and any suspension) until it assigns again.
            log.error("the controller's answer to our registration cannot be applied: %s", exc)

    def _report(self, trouble: str, level: int, message: str) -> None:
        """Log a trouble when it starts, and again every `REMIND_S` while it lasts."""
        now = time.monotonic()
        if trouble != self._trouble or now - self._told >= REMIND_S:
            log.log(level, message)
            self._trouble, self._told = trouble, now

    def _fine(self, message: str) -> None:
        if self._trouble is not None:
            log.info(message)
            self._trouble = None
