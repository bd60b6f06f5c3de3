"""The os-ken shim: OpenFlow events in, the core's steps out, nothing decided here.

One decision thread owns `MetaFlowCore`: it takes events from one queue
(OpenFlow events from os-ken's threads, REST requests, step outcomes,
ticks) and carries out the steps the core returns:

- `SendFlows`: the messages, then a barrier; done when the barrier reply
  comes back, failed when the switch is not connected or stays silent for
  --barrier-timeout;
- `ReadFlows`: a flow-stats request, done with the (multi-part) reply;
- `CallAgent`: an admin API call in a worker thread (signed with the
  cluster's secret), whose answer returns as an event;
- `PacketOut`, `Answer`: sent or handed over at once.

Among several controllers (`--etcd`, `controller.leadership`), every step
toward a switch or an agent is carried out only while `Leadership.leads()`
says so, checked right before it leaves; a standby's core still hears the
switches (port status, switches coming and going) but its steps are
dropped. On every change of leadership the decision thread replaces the
core with its `successor` (the fabric as seen, nothing decided): a new
leader first sends the Nicira role MASTER to every switch, then rebuilds
from the agents and the switches' tables as a restarted controller does;
a demoted one sends SLAVE and waits. A switch that connects gets its role
request before anything else.

The decision thread never waits on the network, so a split's copy, a slow
agent or a silent switch never holds up a heartbeat, a failure or a view.
"""

from __future__ import annotations

import heapq
import logging
import queue
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

from os_ken.base import app_manager
from os_ken.controller import ofp_event
from os_ken.controller.handler import DEAD_DISPATCHER, MAIN_DISPATCHER, set_ev_cls
from os_ken.ofproto import ofproto_v1_0
from os_ken.topology import event as topo_event

from client_lib.api.auth import Verifier, server_authority
from client_lib.api.clients import ApiClient
from client_lib.errors import MetaFlowError
from controller import arp, ofmsgs, views
from controller.core import MetaFlowCore
from controller.etcd_lease import EtcdElection
from controller.leadership import Leadership
from controller.liveness import Liveness, LivenessServer
from controller.metrics import ControllerMetrics
from controller.nativehub import HandlerFailuresLogged
from controller.rest import RestApi, RestServer, not_leader
from controller.settings import Settings
from controller.steps import (
    Answer,
    ArpIn,
    CallAgent,
    Event,
    LinkDown,
    LinkUp,
    PacketOut,
    PortDown,
    PortUp,
    ReadFlows,
    Request,
    SendFlows,
    Step,
    StepDone,
    StepFailed,
    SwitchDown,
    SwitchError,
    SwitchUp,
    Tick,
    Wait,
)
from controller.telemetry import Gauges

log = logging.getLogger("metaflow.controller.app")

# os-ken's handshake handler reads `ofproto.OFPET_EXPERIMENTER` on every error a
# switch sends, and OpenFlow 1.0 has no such error type: the AttributeError ends
# the connection, so every refusal (a standby's LLDP packet-out refused by a
# switch that holds it as slave, every few hundred milliseconds) cut the switch
# off. OpenFlow 1.2's value never occurs in 1.0, so the comparison is just false.
if not hasattr(ofproto_v1_0, "OFPET_EXPERIMENTER"):
    ofproto_v1_0.OFPET_EXPERIMENTER = 0xFFFF

TICK_S = 1.0
CLOCK_S = 0.1
"""The clock thread's step: how often it looks at deadlines and ticks."""
STALL_S = 0.25
"""An oversleep of the clock thread above this is a stall of the whole
controller (`Tick.stalled_s`), not a scheduling hiccup: about one heartbeat
interval of the agents, the least that makes a server look a beat late."""
SCRAPE_TIMEOUT_S = 5.0
"""How long a scrape waits for the decision loop to read the core."""
AGENT_WORKERS = 32
TIMER_SLACK_S = 0.02
"""A timer may fire a little before its time; a tick meant for a deadline comes this much after it."""
RECONFIGURE_WAIT_S = 10.0
"""How long a reload waits for the decision thread (which never waits on the network)."""


class _Query:
    """A function to run on the decision thread (a REST view)."""

    def __init__(self, fn: Callable[[MetaFlowCore], object]) -> None:
        self.fn = fn
        self.result: Future[object] = Future()


_STOP = object()
_LEADERSHIP = object()
"""Wakes the decision thread to act on a change of leadership."""


class MetaFlowApp(HandlerFailuresLogged, app_manager.OSKenApp):
    OFP_VERSIONS = [ofproto_v1_0.OFP_VERSION]

    def __init__(self, *args: Any, settings: Settings, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.settings = settings
        self.leadership = Leadership(settings.lease_ttl_s, own_url=settings.rest_url) \
            if settings.etcd else Leadership.alone()
        self._leading = not settings.etcd
        """What the decision thread last acted as (`_follow_leadership`)."""
        self.election: EtcdElection | None = None   # started once REST listens
        self.refused_role: set[int] = set()
        """Switches that refused the Nicira role request: run as their only controller."""
        self._told: dict[int, tuple[Any, bool]] = {}
        """dpid -> (the connection, the role claimed on it): a switch that
        connects while the leadership changes is told once, not by both the
        event thread and the decision thread."""
        self._told_lock = threading.Lock()
        self.metrics = ControllerMetrics(self._gauges, self.leadership)
        self.core = MetaFlowCore(settings, recorder=self.metrics)
        self.inbox: queue.Queue[object] = queue.Queue()
        self.datapaths: dict[int, Any] = {}
        self.pending: dict[tuple[int, int], tuple[int, list[Any] | None, Any]] = {}
        """(dpid, xid) -> the step, the stats parts collected, the connection it went on."""
        self.deadlines: list[tuple[float, int, tuple[int, int]]] = []
        self.barriers: dict[tuple[int, int], float] = {}   # (dpid, xid) -> when a barrier was sent
        self.lock = threading.Lock()   # pending and deadlines: os-ken threads and ours
        # First, so that a taken port stops the start before anything else runs.
        self._stop_metrics: Callable[[], None] | None = None
        if settings.metrics_port:
            self._stop_metrics = self.metrics.serve(settings.rest_host, settings.metrics_port)
            log.info("metrics on %s:%d", settings.rest_host, settings.metrics_port)
        self.agents = ThreadPoolExecutor(AGENT_WORKERS, thread_name_prefix="agent-call")
        # Liveness datagrams: a thread of their own, which writes `liveness.heard`, the table
        # every core's registry reads (`_follow_leadership` hands it to a new core).
        self.liveness = Liveness(settings.secret, lambda: self.core.registry, self._leads_now,
                                 lambda: self.leadership.term)
        self.core.registry.heard = self.liveness.heard
        self.beats: LivenessServer | None = None
        if settings.liveness_udp_port:
            self.beats = LivenessServer(self.liveness, settings.rest_host, settings.liveness_udp_port,
                                        self.metrics.datagram)
            log.info("liveness datagrams on %s:%d (UDP)", settings.rest_host, self.beats.port)
        verifier = Verifier(settings.secret, server_authority(settings.rest_host, settings.rest_port))
        api = RestApi(self.query, self.post, verifier, settings.open_reads, self.leadership,
                      self.beats.port if self.beats is not None else 0)
        self.rest = RestServer(api, settings.rest_host, settings.rest_port)
        # Not `self.threads`: that is os-ken's list, to which it adds its own event loop,
        # which never ends; `close` waited 5 s for it on every stop.
        self._loops = [threading.Thread(target=self._decide, name="decide", daemon=True),
                       threading.Thread(target=self._clock, name="clock", daemon=True)]
        self._running = True
        for thread in self._loops:
            thread.start()
        self.rest.start()
        if self.beats is not None:
            self.beats.start()
        log.info("REST API on %s:%d", settings.rest_host, settings.rest_port)
        if settings.etcd:
            self.election = EtcdElection(settings.etcd, settings.etcd_prefix, settings.lease_ttl_s,
                                         settings.rest_url, self.leadership,
                                         lambda: self.inbox.put(_LEADERSHIP),
                                         self.post)
            self.election.start()
            log.info("standby until elected: etcd %s, prefix %s, lease %d s", ",".join(settings.etcd),
                     settings.etcd_prefix, settings.lease_ttl_s)

    # -- the queue ------------------------------------------------------------------

    def post(self, event: Event) -> None:
        self.inbox.put(event)

    def query(self, fn: Callable[[MetaFlowCore], object]) -> Future[object]:
        item = _Query(fn)
        self.inbox.put(item)
        return item.result

    def reconfigure(self, new: Settings) -> Settings:
        """Hand `new` to the core on the decision thread (`MetaFlowCore.reconfigure`
        says what it takes) and run with what it now holds: the barrier and agent
        timeouts are read here."""
        done = self.query(lambda core: core.reconfigure(new)).result(timeout=RECONFIGURE_WAIT_S)
        assert isinstance(done, Settings)
        self.settings = done
        return done

    def _gauges(self) -> Gauges:
        """The core's state for a scrape, read on the decision loop."""
        gauges = self.query(views.gauges).result(timeout=SCRAPE_TIMEOUT_S)
        assert isinstance(gauges, Gauges)
        return gauges

    def close(self) -> None:
        """Stop serving REST, stop deciding, let in-flight agent calls end."""
        self._running = False
        self.rest.close()
        if self.beats is not None:
            self.beats.close()
        if self.election is not None:
            self.election.close()
        if self._stop_metrics is not None:
            self._stop_metrics()
        self.inbox.put(_STOP)
        for thread in self._loops:
            thread.join(timeout=5)
        self.agents.shutdown(wait=False, cancel_futures=True)

    def _decide(self) -> None:
        while True:
            item = self.inbox.get()
            if item is _STOP:
                return
            self._follow_leadership()
            if item is _LEADERSHIP:
                continue
            if isinstance(item, Request) and not self._leading:
                # Let in while this controller led, handled after it stopped: not a standby's to decide.
                assert isinstance(item.reply, Future)
                item.reply.set_result(not_leader(self.leadership))
                continue
            if isinstance(item, _Query):
                try:
                    item.result.set_result(item.fn(self.core))
                except Exception as exc:  # a view that fails is that request's error, not ours
                    item.result.set_exception(exc)
                continue
            started = time.perf_counter()
            try:
                steps = self.core.handle(item)  # type: ignore[arg-type]
            except Exception:
                log.exception("the core failed on %r; carrying on", item)
                continue
            for step in steps:
                self._execute(step)
            self.metrics.decided(type(item).__name__, time.perf_counter() - started)
            if isinstance(item, Tick) and self._leading and self.election is not None:
                self.election.publish(self.core.fabric_seen())

    def _follow_leadership(self) -> None:
        """On the decision thread, before anything else is handled: a change of
        leadership replaces the core (`MetaFlowCore.successor`) and tells every
        switch our role, the MASTER request ahead of any flow mod."""
        leads = self.leadership.leads()
        if leads == self._leading:
            return
        self._leading = leads
        self.core = self.core.successor(self.leadership.term if leads else 0)
        self.core.registry.heard = self.liveness.heard
        if leads:
            log.warning("taking over at term %d: MASTER on %d switches, rebuilding from the agents",
                        self.leadership.term, len(self.datapaths))
        else:
            log.warning("standby (%s): SLAVE on %d switches; decisions dropped", self.leadership.reason,
                        len(self.datapaths))
        for dp in list(self.datapaths.values()):
            self._claim_role(dp, leads)
        if leads:   # a tick the moment the rebuild may run, not up to TICK_S after it
            due = max(0.0, self.core.build_after - time.monotonic()) + TIMER_SLACK_S
            wake = threading.Timer(due, self.post, (Tick(),))
            wake.daemon = True
            wake.start()

    def _claim_role(self, dp: Any, leading: bool) -> None:
        """The role request, and what the role hears (`ofmsgs.async_config`),
        unless this connection was told this role already."""
        if dp.id in self.refused_role:
            return
        with self._told_lock:
            told = self._told.get(dp.id)
            if told is not None and told[0] is dp and told[1] == leading:
                return
            self._told[dp.id] = (dp, leading)
            for msg in (ofmsgs.role_request(leading), ofmsgs.async_config()):
                msg.datapath = dp
                dp.send_msg(msg)

    def _clock(self) -> None:
        """Ticks for the core, and step deadlines (barriers, flow stats)."""
        next_tick = time.monotonic() + TICK_S
        while self._running:
            asleep = time.monotonic()
            time.sleep(CLOCK_S)
            now = time.monotonic()
            stalled = now - asleep - CLOCK_S
            expired = []
            with self.lock:
                if stalled > STALL_S:   # replies that came meanwhile are still unread: no step ran late
                    self.deadlines = [(at + stalled, step, key) for at, step, key in self.deadlines]
                while self.deadlines and self.deadlines[0][0] <= now:
                    _, step, key = heapq.heappop(self.deadlines)
                    if self.pending.get(key, (None,))[0] == step:
                        del self.pending[key]
                        self.barriers.pop(key, None)
                        expired.append((step, key))
            for step, key in expired:
                self.post(StepFailed(step, f"no reply from switch {key[0]} within "
                                           f"{self.settings.barrier_timeout_s:g} s"))
            if stalled > STALL_S:
                log.warning("the controller did not run for %.2f s (stopped, or starved of CPU)", stalled)
                next_tick = now + TICK_S
                self.post(Tick(stalled_s=stalled))
            elif now >= next_tick:
                next_tick = now + TICK_S
                if self.inbox.qsize() < 100:
                    self.post(Tick())

    # -- carrying out steps -------------------------------------------------------------

    def _execute(self, step: Step) -> None:
        if not isinstance(step, (Answer, Wait)) and not self._may_act(step):
            return
        if isinstance(step, Answer):
            reply = step.reply
            assert isinstance(reply, Future)
            reply.set_result(step.value)
        elif isinstance(step, CallAgent):
            self.agents.submit(self._call_agent, step)
        elif isinstance(step, (SendFlows, ReadFlows, PacketOut)):
            self._to_switch(step)
        elif isinstance(step, Wait):
            timer = threading.Timer(step.seconds, self.post, (StepDone(step.id),))
            timer.daemon = True
            timer.start()
        else:
            log.error("no way to carry out %r", step)

    def _leads_now(self) -> bool:
        """Whether a liveness datagram counts here: as for a step, a leader
        whose decision thread acts as one (a standby nudges the agent to
        its HTTP heartbeat, whose 503 names the leader)."""
        return self._leading and self.leadership.leads()

    def _may_act(self, step: Step) -> bool:
        """The gate of every step toward a switch or an agent: only a leader
        within its lease acts (`Leadership.leads`), and only once the decision
        thread acts as one (its core is a leader's); a standby's steps are dropped."""
        if self._leads_now():
            return True
        log.debug("not leading: %s dropped", type(step).__name__)
        return False

    def _call_agent(self, step: CallAgent) -> None:
        timeout = self.settings.agent_timeout_s
        term = self.leadership.term if self.leadership.coordinated else None
        try:
            assert step.route is not None
            if not self._may_act(step):   # queued behind others while the lease ran out
                raise MetaFlowError("this controller no longer leads")
            result = ApiClient(step.url, self.settings.secret, timeout, term).call(step.route, step.body,
                                                                                    **step.params)
        except MetaFlowError as exc:
            self.post(StepFailed(step.id, str(exc)))
        except Exception as exc:  # a bug in a call must still end the step
            log.exception("agent call %s failed", step.route)
            self.post(StepFailed(step.id, f"{type(exc).__name__}: {exc}"))
        else:
            self.post(StepDone(step.id, result))

    def _to_switch(self, step: SendFlows | ReadFlows | PacketOut) -> None:
        dp = self.datapaths.get(step.dpid)
        if dp is None:
            if not isinstance(step, PacketOut):
                self.post(StepFailed(step.id, f"switch {step.dpid} is not connected"))
            return
        parser, ofp = dp.ofproto_parser, dp.ofproto
        if isinstance(step, PacketOut):
            dp.send_msg(parser.OFPPacketOut(datapath=dp, buffer_id=ofp.OFP_NO_BUFFER, in_port=ofp.OFPP_NONE,
                                            data=step.data, actions=[parser.OFPActionOutput(step.port)]))
            return
        parts: list[Any] | None = None   # a barrier's reply has no body; flow stats collect theirs
        if isinstance(step, SendFlows):
            request = parser.OFPBarrierRequest(dp)
            messages = [*step.messages, request]
            self.metrics.sent(step.dpid, len(step.messages))
        else:
            request = parser.OFPFlowStatsRequest(dp, 0, parser.OFPMatch(), 0xFF, ofp.OFPP_NONE)
            messages, parts = [request], []
        for msg in messages:
            msg.datapath = dp
            if msg.xid is None:
                dp.set_xid(msg)
            msg.serialize()
        key = (step.dpid, request.xid)
        with self.lock:
            self.pending[key] = (step.id, parts, dp)
            if parts is None:
                self.barriers[key] = time.monotonic()
            heapq.heappush(self.deadlines, (time.monotonic() + self.settings.barrier_timeout_s, step.id, key))
        # One buffer per step: os-ken's per-switch send queue holds 16 buffers
        # and blocks the sender when full, so a build's flow mods sent one by
        # one (dozens per switch) held the decision thread hostage to every
        # switch's reading speed; and each buffer is a hand-off between threads.
        dp.send(b"".join(bytes(msg.buf) for msg in messages))

    def _reply(self, dpid: int, xid: int, body: list[Any] | None, more: bool) -> None:
        with self.lock:
            waiting = self.pending.get((dpid, xid))
            if waiting is None:
                return
            step, parts, _ = waiting
            if parts is not None and body:
                parts.extend(body)
            if more:
                return
            del self.pending[(dpid, xid)]
            sent = self.barriers.pop((dpid, xid), None)
        if sent is not None:
            self.metrics.barrier(dpid, time.monotonic() - sent)
        self.post(StepDone(step, parts))

    # -- OpenFlow events ----------------------------------------------------------------

    @set_ev_cls(ofp_event.EventOFPStateChange, [MAIN_DISPATCHER, DEAD_DISPATCHER])
    def _state(self, ev: Any) -> None:
        dp = ev.datapath
        if dp.id is None:
            return
        if ev.state == MAIN_DISPATCHER:
            self.datapaths[dp.id] = dp
            log.info("switch %s connected", dp.id)
            ofp = dp.ofproto
            ports = tuple(sorted(p for p in dp.ports if p <= ofp.OFPP_MAX))
            local = dp.ports.get(ofp.OFPP_LOCAL)
            name = local.name.decode(errors="replace").rstrip("\0") if local is not None else ""
            if self.leadership.coordinated:
                self._claim_role(dp, self.leadership.leads())
            self.post(SwitchUp(dp.id, ports, name))
        else:
            # A switch that connected again before its old connection was seen
            # to end (os-ken: "Multiple connections") is up on the new one:
            # only what went over the old one is lost, and the switch is not down.
            current = self.datapaths.get(dp.id) is dp
            with self.lock:
                lost = [(key, step) for key, (step, _, conn) in self.pending.items() if conn is dp]
                for key, _ in lost:
                    del self.pending[key]
                    self.barriers.pop(key, None)
            for _, step in lost:
                self.post(StepFailed(step, f"switch {dp.id} disconnected"))
            if current:
                del self.datapaths[dp.id]
                log.warning("switch %s disconnected", dp.id)
                self.post(SwitchDown(dp.id))
            else:
                log.info("an older connection of switch %s ended; it is connected on a newer one", dp.id)

    @set_ev_cls(ofp_event.EventOFPErrorMsg, MAIN_DISPATCHER)
    def _error(self, ev: Any) -> None:
        """A switch refused something (a flow mod over its table, a bad
        match): counted per switch; the barrier after it still decides the step.
        The core judges what was refused (hybrid mode's NORMAL is said loudly)."""
        msg = ev.msg
        if self.leadership.coordinated and not self._leading and ofmsgs.refused_as_slave(msg.type, msg.code):
            log.debug("switch %s refused a standby's message, as it should", msg.datapath.id)
            return
        if self.leadership.coordinated and ofmsgs.refuses_role(msg.type, bytes(msg.data or b"")):
            self.refused_role.add(msg.datapath.id)
            log.error("switch %s refused the Nicira role request (not Open vSwitch?): it takes flow mods "
                      "from every controller connected to it; give it this controller only", msg.datapath.id)
            return
        self.metrics.refused(msg.datapath.id)
        log.warning("switch %s: OpenFlow error type %s code %s", msg.datapath.id, msg.type, msg.code)
        self.post(SwitchError(msg.datapath.id, msg.type, msg.code, bytes(msg.data)))

    @set_ev_cls(ofp_event.EventOFPBarrierReply, MAIN_DISPATCHER)
    def _barrier(self, ev: Any) -> None:
        self._reply(ev.msg.datapath.id, ev.msg.xid, None, False)

    @set_ev_cls(ofp_event.EventOFPFlowStatsReply, MAIN_DISPATCHER)
    def _flow_stats(self, ev: Any) -> None:
        msg = ev.msg
        more = bool(msg.flags & msg.datapath.ofproto.OFPSF_REPLY_MORE)
        self._reply(msg.datapath.id, msg.xid, msg.body, more)

    @set_ev_cls(ofp_event.EventOFPPortStatus, MAIN_DISPATCHER)
    def _port_status(self, ev: Any) -> None:
        msg = ev.msg
        ofp = msg.datapath.ofproto
        down = msg.reason == ofp.OFPPR_DELETE or msg.desc.state & ofp.OFPPS_LINK_DOWN
        event = PortDown if down else PortUp
        self.post(event(msg.datapath.id, msg.desc.port_no))

    @set_ev_cls(topo_event.EventLinkAdd)
    def _link_add(self, ev: Any) -> None:
        link = ev.link
        self.post(LinkUp(link.src.dpid, link.src.port_no, link.dst.dpid, link.dst.port_no))

    @set_ev_cls(topo_event.EventLinkDelete)
    def _link_delete(self, ev: Any) -> None:
        link = ev.link
        self.post(LinkDown(link.src.dpid, link.src.port_no, link.dst.dpid, link.dst.port_no))

    @set_ev_cls(ofp_event.EventOFPPacketIn, MAIN_DISPATCHER)
    def _packet_in(self, ev: Any) -> None:
        msg = ev.msg
        message = arp.parse(msg.data)
        if message is not None:   # LLDP is os-ken's topology service's; nothing else comes to us
            self.post(ArpIn(msg.datapath.id, msg.in_port, message))
