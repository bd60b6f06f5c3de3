"""The controller's REST API: a small WSGI app over `MetaFlowCore`.

os-ken 4 dropped Ryu's WSGI layer, so this is a plain WSGI callable served
by the standard library's wsgiref in a thread (`app.py`). JSON in, JSON out, paths
in the spirit of os-ken's ofctl REST:

    GET  /metaflow/topology   switches with layers and groups, links, hosts, pods
    GET  /metaflow/tree       the B-tree: inner nodes, leaves with state and blocks
    GET  /metaflow/flows      MetaFlow entries per switch (dpid -> entries)
    GET  /metaflow/servers    storage servers with key counts, capacity, state
    GET  /metaflow/events     recent events (splits, take-overs, DATA-LOST, ...)
    GET  /metaflow/splits     every split with its timings
    POST /metaflow/agents                    agent registration
    POST /metaflow/agents/{name}/heartbeat   heartbeat (404: register again)
    POST /metaflow/servers/{name}/split      split a server now
    POST /metaflow/servers/{name}/fail       mark a server failed (take-over)
"""

from __future__ import annotations

import json
import logging
import re
from typing import Callable, Iterable

from controller.core import MetaFlowCore

log = logging.getLogger("metaflow.controller.rest")

Locked = Callable[[Callable[[], object]], object]   # runs a function on the core's worker


class RestApi:
    def __init__(self, core: MetaFlowCore, locked: Locked) -> None:
        self.core = core
        self.locked = locked
        core_views = {
            "topology": core.topology_view, "tree": core.tree_view, "flows": core.flows_view,
            "servers": core.servers_view, "events": lambda: list(core.events),
            "splits": lambda: core.splits,
        }
        self.gets = {f"/metaflow/{name}": view for name, view in core_views.items()}
        self.posts: list[tuple[re.Pattern, Callable[[dict, str], tuple[int, object]]]] = [
            (re.compile(r"^/metaflow/agents$"), self._register),
            (re.compile(r"^/metaflow/agents/([^/]+)/heartbeat$"), self._heartbeat),
            (re.compile(r"^/metaflow/servers/([^/]+)/split$"), self._split),
            (re.compile(r"^/metaflow/servers/([^/]+)/fail$"), self._fail),
        ]

    def __call__(self, environ: dict, start_response) -> Iterable[bytes]:
        method, path = environ["REQUEST_METHOD"], environ.get("PATH_INFO", "")
        try:
            status, body = self._route(method, path, environ)
        except (ValueError, KeyError) as exc:
            status, body = 400, {"error": str(exc)}
        except Exception as exc:  # a bug must not take the controller down; it is logged
            log.exception("%s %s failed", method, path)
            status, body = 500, {"error": str(exc)}
        payload = json.dumps(body, default=str).encode()
        start_response(f"{status} {'OK' if status < 300 else 'Error'}",
                       [("Content-Type", "application/json"), ("Content-Length", str(len(payload)))])
        return [payload]

    def _route(self, method: str, path: str, environ: dict) -> tuple[int, object]:
        if method == "GET" and path in self.gets:
            return 200, self.locked(self.gets[path])
        if method == "POST":
            length = int(environ.get("CONTENT_LENGTH") or 0)
            raw = environ["wsgi.input"].read(length) if length else b"{}"
            doc = json.loads(raw or b"{}")
            if not isinstance(doc, dict):
                raise ValueError("the body must be a JSON object")
            for pattern, handler in self.posts:
                match = pattern.match(path)
                if match:
                    return handler(doc, *match.groups())
        return 404, {"error": f"no {method} {path}"}

    def _register(self, doc: dict) -> tuple[int, object]:
        server = self.locked(lambda: self.core.register(doc))
        return 200, {"registered": server.name}

    def _heartbeat(self, doc: dict, name: str) -> tuple[int, object]:
        # Not queued behind the worker: a long split must not make live
        # agents look silent. It only updates one server's fields.
        known = self.core.heartbeat(name, doc)
        return (200, {"ok": True}) if known else (404, {"error": f"unknown agent {name}"})

    def _known(self, name: str) -> None:
        if name not in self.core.servers:
            raise KeyError(f"unknown server {name}")

    def _split(self, doc: dict, name: str) -> tuple[int, object]:
        self._known(name)
        return 200, self.locked(lambda: self.core.split(name))

    def _fail(self, doc: dict, name: str) -> tuple[int, object]:
        self._known(name)
        return 200, self.locked(lambda: self.core.fail(name, doc.get("reason", "marked failed over REST")))
