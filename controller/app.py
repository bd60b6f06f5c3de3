"""The os-ken shim: OpenFlow 1.0 events in, messages out, nothing decided here.

`MetaFlowCore` decides; this module feeds it what the switches say (switch
and port state, LLDP links via os-ken's topology service, ARP packet-ins)
and carries out what it returns (`ofmsgs` messages, barriers). It also runs
the REST API and a one-second tick that builds the network once discovery
has settled, watches heartbeats and starts splits.

Threads (os-ken 4 runs native threads): every change to the core runs on
one worker thread, in order. OpenFlow event handlers only hand work over
and return, because a split running on the worker waits for barrier
replies, and those arrive through the same os-ken event thread: a handler
that waited for the worker would deadlock it.

Settings come from `controller.launcher`, which sets `SETTINGS` before
os-ken instantiates the app (os-ken apps take no constructor arguments).
"""

from __future__ import annotations

import logging
import queue
import time
from concurrent.futures import Future
from dataclasses import dataclass
from socketserver import ThreadingMixIn
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

from os_ken.base import app_manager
from os_ken.controller import ofp_event
from os_ken.controller.handler import (
    CONFIG_DISPATCHER,
    DEAD_DISPATCHER,
    MAIN_DISPATCHER,
    set_ev_cls,
)
from os_ken.lib import hub
from os_ken.ofproto import ofproto_v1_0
from os_ken.topology import event as topo_event

from btree.flows import FlowDiff, FlowEntry
from btree.split import SplitBounds
from client_lib.cidr import Block
from controller import arp, ofmsgs
from controller.agents import HttpAgent
from controller.core import MetaFlowCore
from controller.rest import RestApi

log = logging.getLogger("metaflow.controller.app")


@dataclass
class Settings:
    space: Block = Block.parse("100.64.0.0/10")
    gateway_ip: str = "10.255.255.254"
    bounds: SplitBounds = SplitBounds()
    capacity: int | None = None
    bootstrap: str = "preallocate"
    rest_host: str = "0.0.0.0"
    rest_port: int = 8080
    settle: float = 3.0           # seconds without topology change before building
    heartbeat_timeout: float = 6.0
    barrier_timeout: float = 10.0
    auto_split: bool = True


SETTINGS = Settings()


class BarrierTimeout(RuntimeError):
    pass


class MetaFlowApp(app_manager.OSKenApp):
    OFP_VERSIONS = [ofproto_v1_0.OFP_VERSION]

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.settings = SETTINGS
        self.datapaths: dict[int, object] = {}
        self.barriers: dict[tuple[int, int], hub.Event] = {}
        self.stats_replies: dict[tuple[int, int], tuple[hub.Event, list]] = {}
        self.work: queue.Queue[tuple[object, Future]] = queue.Queue()
        self.last_change = time.monotonic()
        self.core = MetaFlowCore(self.settings.space, self, HttpAgent, self.settings.bounds,
                                 self.settings.bootstrap, self.settings.capacity,
                                 self.settings.heartbeat_timeout)
        self.rest = RestApi(self.core, self.call)
        self.http = make_server(self.settings.rest_host, self.settings.rest_port, self.rest,
                                server_class=_ThreadingWSGIServer, handler_class=_QuietHandler)
        self.threads = [hub.spawn(self.http.serve_forever), hub.spawn(self._worker),
                        hub.spawn(self._ticker)]
        log.info("REST API on %s:%d", self.settings.rest_host, self.settings.rest_port)

    def submit(self, fn) -> Future:
        """Run `fn` on the worker thread, after everything submitted before it."""
        done: Future = Future()
        self.work.put((fn, done))
        return done

    def call(self, fn, timeout: float | None = 120.0):
        return self.submit(fn).result(timeout)

    def close(self) -> None:
        self.http.shutdown()
        self.work.put((None, Future()))

    # -- background work -------------------------------------------------------

    def _worker(self) -> None:
        while True:
            fn, done = self.work.get()
            if fn is None:
                return
            try:
                done.set_result(fn())
            except Exception as exc:
                log.exception("controller work failed")
                done.set_exception(exc)

    def _ticker(self) -> None:
        while True:
            hub.sleep(1.0)
            if self.work.qsize() == 0:
                self.submit(self._tick_once)

    def _tick_once(self) -> None:
        core = self.core
        if core.tree is None:
            if time.monotonic() - self.last_change >= self.settings.settle:
                core.build()
            return
        core.check_heartbeats()
        if self.settings.auto_split:
            for name in core.due_for_split():
                core.split(name)

    # -- SwitchIO, for the core -------------------------------------------------

    def _send(self, dpid: int, messages: list) -> hub.Event | None:
        dp = self.datapaths.get(dpid)
        if dp is None:
            log.warning("switch %s is not connected; it gets its table when it connects", dpid)
            return None
        for msg in messages:
            dp.send_msg(msg)
        barrier = dp.ofproto_parser.OFPBarrierRequest(dp)
        dp.set_xid(barrier)
        done = hub.Event()
        self.barriers[(dpid, barrier.xid)] = done
        dp.send_msg(barrier)
        return done

    def _wait(self, pending: dict[int, hub.Event]) -> None:
        deadline = time.monotonic() + self.settings.barrier_timeout
        for dpid, done in pending.items():
            if done is not None and not done.wait(max(0.0, deadline - time.monotonic())):
                raise BarrierTimeout(f"no barrier reply from switch {dpid} "
                                     f"within {self.settings.barrier_timeout} s")

    def apply(self, diff: FlowDiff) -> None:
        self._wait({dpid: self._send(dpid, ofmsgs.diff_messages(self.datapaths[dpid], change))
                    for dpid, change in diff.items() if dpid in self.datapaths})

    def sync(self, dpid: int, entries: list[FlowEntry], routes: dict[str, int]) -> None:
        """Read what the switch holds and send only the differences: after a
        controller restart or a reconnect, flowing traffic is not disturbed."""
        dp = self.datapaths.get(dpid)
        if dp is None:
            return
        have, have_routes = ofmsgs.installed(self._flow_stats(dp))
        self._wait({dpid: self._send(dpid, ofmsgs.resync_messages(dp, have, have_routes, entries, routes))})

    def _flow_stats(self, dp) -> list:
        parser, ofp = dp.ofproto_parser, dp.ofproto
        request = parser.OFPFlowStatsRequest(dp, 0, parser.OFPMatch(), 0xFF, ofp.OFPP_NONE)
        dp.set_xid(request)
        done, parts = hub.Event(), []
        self.stats_replies[(dp.id, request.xid)] = (done, parts)
        dp.send_msg(request)
        if not done.wait(self.settings.barrier_timeout):
            self.stats_replies.pop((dp.id, request.xid), None)
            raise BarrierTimeout(f"no flow stats from switch {dp.id}")
        return parts

    def routes(self, dpid: int, changed: dict[str, int], deleted: list[str]) -> None:
        dp = self.datapaths.get(dpid)
        if dp is not None:
            self._send(dpid, ofmsgs.route_messages(dp, changed, deleted))

    # -- OpenFlow events ------------------------------------------------------------

    @set_ev_cls(ofp_event.EventOFPSwitchFeatures, CONFIG_DISPATCHER)
    def _features(self, ev) -> None:
        dp = ev.msg.datapath
        for msg in ofmsgs.base_messages(dp):
            dp.send_msg(msg)

    @set_ev_cls(ofp_event.EventOFPStateChange, [MAIN_DISPATCHER, DEAD_DISPATCHER])
    def _state(self, ev) -> None:
        dp = ev.datapath
        if dp.id is None:
            return
        self.last_change = time.monotonic()
        if ev.state == MAIN_DISPATCHER:
            self.datapaths[dp.id] = dp
            log.info("switch %s connected", dp.id)
            self.submit(lambda: self.core.switch_up(dp.id))
        elif self.datapaths.pop(dp.id, None) is not None:
            log.warning("switch %s disconnected", dp.id)
            self.submit(lambda: self.core.switch_down(dp.id))

    @set_ev_cls(ofp_event.EventOFPBarrierReply, MAIN_DISPATCHER)
    def _barrier(self, ev) -> None:
        done = self.barriers.pop((ev.msg.datapath.id, ev.msg.xid), None)
        if done is not None:
            done.set()

    @set_ev_cls(ofp_event.EventOFPFlowStatsReply, MAIN_DISPATCHER)
    def _flow_stats_reply(self, ev) -> None:
        msg = ev.msg
        waiting = self.stats_replies.get((msg.datapath.id, msg.xid))
        if waiting is None:
            return
        done, parts = waiting
        parts.extend(msg.body)
        if not msg.flags & msg.datapath.ofproto.OFPSF_REPLY_MORE:
            del self.stats_replies[(msg.datapath.id, msg.xid)]
            done.set()

    @set_ev_cls(ofp_event.EventOFPPortStatus, MAIN_DISPATCHER)
    def _port_status(self, ev) -> None:
        msg = ev.msg
        ofp = msg.datapath.ofproto
        down = msg.reason == ofp.OFPPR_DELETE or msg.desc.state & ofp.OFPPS_LINK_DOWN
        if down:
            self.submit(lambda: self.core.port_down(msg.datapath.id, msg.desc.port_no))

    @set_ev_cls(topo_event.EventLinkAdd)
    def _link_add(self, ev) -> None:
        self._link_changed(ev.link, self.core.link_up)

    @set_ev_cls(topo_event.EventLinkDelete)
    def _link_delete(self, ev) -> None:
        self._link_changed(ev.link, self.core.link_down)

    def _link_changed(self, link, change) -> None:
        self.last_change = time.monotonic()
        self.submit(lambda: change(link.src.dpid, link.src.port_no, link.dst.dpid, link.dst.port_no))

    @set_ev_cls(ofp_event.EventOFPPacketIn, MAIN_DISPATCHER)
    def _packet_in(self, ev) -> None:
        msg = ev.msg
        dp = msg.datapath
        message = arp.parse(msg.data)
        if message is None:
            return  # LLDP is os-ken's topology service's; nothing else is sent to us
        ip, mac = message.sender_ip, message.sender_mac
        if not self.core.knows(ip, mac, dp.id, msg.in_port):
            self.last_change = time.monotonic()  # news, not a host re-announcing itself
            self.submit(lambda: self.core.host_seen(ip, mac, dp.id, msg.in_port))
        # The sender may not be recorded yet (that is queued): answer for it anyway.
        reply = arp.answer(message, lambda target: mac if target == ip else self.core.mac_of(target),
                           self.settings.gateway_ip)
        if reply is not None:
            parser, ofp = dp.ofproto_parser, dp.ofproto
            dp.send_msg(parser.OFPPacketOut(datapath=dp, buffer_id=ofp.OFP_NO_BUFFER,
                                            in_port=ofp.OFPP_NONE, data=reply,
                                            actions=[parser.OFPActionOutput(msg.in_port)]))


class _ThreadingWSGIServer(ThreadingMixIn, WSGIServer):
    daemon_threads = True
    allow_reuse_address = True


class _QuietHandler(WSGIRequestHandler):
    def log_message(self, format: str, *args) -> None:
        log.debug("rest: " + format, *args)
