"""The controller's REST API: the routes declared in `client_lib.api.rest`,
served by wsgiref in threads of their own; the views are `controller.views`.

A request never touches the core from its own thread: a view is computed
on the decision loop (`query`), and a registration, heartbeat, split,
fail-over, drain or undrain is an event on the same queue whose answer the request thread
waits for (`ask`). Since the loop never blocks, a heartbeat is answered in
milliseconds even while a split copies for minutes.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
from collections.abc import Callable
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from socketserver import ThreadingMixIn
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

from client_lib.api.auth import Verifier
from client_lib.api.rest import REST, Registered
from client_lib.errors import ApiError, NotLeader
from client_lib.server.api import Call, Dispatcher, wsgi_app
from controller import views
from controller.core import MetaFlowCore
from controller.leadership import Leadership
from controller.steps import DrainNow, FailNow, Heartbeat, Register, SplitNow

log = logging.getLogger("metaflow.controller.rest")

QUICK_S = 30.0
"""How long a registration, heartbeat or view may take (the loop is never blocked)."""
LONG_S = 900.0
"""How long a split or fail-over may take (a copy of a large block)."""

Query = Callable[[Callable[[MetaFlowCore], object]], "Future[object]"]
Asked = Register | Heartbeat | SplitNow | FailNow | DrainNow
"""The REST requests that are events for the core, answered through their `reply`."""
Post = Callable[[Asked], None]


class RestApi:
    def __init__(self, query: Query, post: Post, verifier: Verifier, open_reads: bool,
                 leadership: Leadership | None = None, liveness_port: int = 0) -> None:
        """`leadership`: a standby answers every changing route 503 `NotLeader`
        (None: the one controller, always leading). `liveness_port`: where
        this controller takes liveness datagrams, told in every `Registered` (0: none)."""
        self._query = query
        self._liveness_port = liveness_port
        self._post = post
        self._leadership = leadership or Leadership.alone()
        routes: dict[object, Callable[[MetaFlowCore], object]] = {
            REST.topology: views.topology_view, REST.tree: views.tree_view,
            REST.flows: views.flows_view, REST.servers: views.servers_view,
            REST.events: views.events_view, REST.splits: views.splits_view,
            REST.operations: views.operations_view, REST.load: views.load_view,
            REST.drains: views.drains_view,
        }
        self._views = routes
        self.app = wsgi_app(Dispatcher(REST.ALL, verifier, open_reads), self.handle)

    def handle(self, call: Call) -> object:
        route = call.route
        if route is REST.leadership:
            return views.leadership_view(self._leadership)
        if route.changes and not self._leadership.leads():
            raise not_leader(self._leadership)
        if route in self._views:
            return _wait(self._query(self._views[route]), QUICK_S, route)
        if route is REST.register:
            answer = self._ask(lambda reply: Register(reply, call.body), QUICK_S, route)
            assert isinstance(answer, Registered)
            return dataclasses.replace(answer, liveness_port=self._liveness_port)
        if route is REST.heartbeat:
            return self._ask(lambda reply: Heartbeat(reply, call.params["name"], call.body), QUICK_S, route)
        if route is REST.split:
            return self._ask(lambda reply: SplitNow(reply, call.params["name"]), LONG_S, route)
        if route is REST.fail:
            return self._ask(lambda reply: FailNow(reply, call.params["name"], call.body.reason),
                             LONG_S, route)
        if route is REST.drain:
            return self._ask(lambda reply: DrainNow(reply, call.params["name"]), QUICK_S, route)
        if route is REST.undrain:
            return self._ask(lambda reply: DrainNow(reply, call.params["name"], undrain=True), QUICK_S, route)
        raise TypeError(f"no handler for {route}")

    def _ask(self, make: Callable[[Future[object]], Asked],
             timeout: float, route: object) -> object:
        reply: Future[object] = Future()
        self._post(make(reply))
        value = _wait(reply, timeout, route)
        if isinstance(value, BaseException):
            raise value
        return value


def not_leader(lead: Leadership) -> NotLeader:
    """A standby's answer to a change (503), naming the leader unless that is itself."""
    leader = lead.leader_url if lead.leader_url != lead.own_url else None
    return NotLeader(f"this controller is a standby ({lead.reason})", leader=leader)


def _wait(future: Future[object], timeout: float, route: object) -> object:
    try:
        return future.result(timeout)
    except FutureTimeout:
        raise ApiError(f"{route}: no answer from the controller within {timeout:g} s", 503) from None


REST_BACKLOG = 1024
"""Connections the REST listener queues before it accepts them (the kernel
caps this at net.core.somaxconn). socketserver's default is 5: at a
takeover every agent registers at once, the sixth connection's SYN was
dropped, and its agent waited for the retransmission a second later, past
the successor's wait, so a live server was failed over (the two-controller
nemesis, twice: a registration sent 0.3 s before the election answered
1.5 s after it)."""


class _ThreadingWSGIServer(ThreadingMixIn, WSGIServer):
    daemon_threads = True
    allow_reuse_address = True
    request_queue_size = REST_BACKLOG


class _QuietHandler(WSGIRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:
        log.debug("rest: " + format, *args)


class RestServer:
    """The WSGI server in a thread; `close` stops it."""

    def __init__(self, api: RestApi, host: str, port: int) -> None:
        self.httpd = make_server(host, port, api.app, server_class=_ThreadingWSGIServer,
                                 handler_class=_QuietHandler)
        self.thread = threading.Thread(target=self.httpd.serve_forever, name="rest", daemon=True)

    def start(self) -> None:
        self.thread.start()

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
