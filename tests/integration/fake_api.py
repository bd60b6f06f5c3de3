"""HTTP peers for the agent's tests: a stand-in that dispatches like the real
servers, and an attacker's listener that signs nothing.

`FakeApi` plays the other side of a contract the agent calls (another agent
during a migration, the controller during registration) where the test needs
that side to misbehave on cue: refuse, hang, forget. It is a real threaded
HTTP server that runs the same `Dispatcher` as the daemons, so signatures,
routes and bodies are checked exactly as they would be; only the handler's
answers are the test's.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from socketserver import ThreadingMixIn
from types import TracebackType
from typing import Any, Self
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

from client_lib.api.auth import Verifier
from client_lib.api.route import Route
from client_lib.server.api import Call, Dispatcher


class _Quiet(WSGIRequestHandler):
    def log_message(self, *args: object) -> None:
        pass


class _ThreadingWSGIServer(ThreadingMixIn, WSGIServer):
    daemon_threads = True


class _Served:
    """A server run by a thread while in the `with` block; `_stopping` runs
    first on the way out."""

    _httpd: ThreadingHTTPServer | WSGIServer

    def __enter__(self) -> Self:
        threading.Thread(target=self._httpd.serve_forever, daemon=True).start()
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self._stopping()
        self._httpd.shutdown()
        self._httpd.server_close()

    def _stopping(self) -> None:
        pass


class FakeApi(_Served):
    """Serves `routes` with `handle(call)`; every authenticated call is kept
    in `calls`. `release` is set on exit, so a handler that hangs on it
    (a silent peer) lets the server stop."""

    def __init__(self, routes: Sequence[Route[Any, Any]], secret: bytes,
                 handle: Callable[[Call], object]) -> None:
        self.dispatcher = Dispatcher(routes, Verifier(secret))
        self.handle = handle
        self.calls: list[Call] = []
        self.release = threading.Event()
        self._httpd = make_server("127.0.0.1", 0, self._app, server_class=_ThreadingWSGIServer,
                                  handler_class=_Quiet)
        self.url = f"http://127.0.0.1:{self._httpd.server_port}"

    def routes_called(self) -> list[Route[Any, Any]]:
        return [c.route for c in self.calls]

    def _app(self, environ: dict[str, Any], start_response: Callable[..., object]) -> list[bytes]:
        body = environ["wsgi.input"].read(int(environ.get("CONTENT_LENGTH") or 0))
        headers = {k[5:].replace("_", "-").title(): v for k, v in environ.items() if k.startswith("HTTP_")}
        path = environ["PATH_INFO"].encode("latin-1").decode()
        call = self.dispatcher.resolve(environ["REQUEST_METHOD"], path, environ.get("QUERY_STRING", ""),
                                       headers, body)
        if isinstance(call, Call):
            self.calls.append(call)
            try:
                response = self.dispatcher.reply(call, self.handle(call))
            except Exception as exc:
                response = self.dispatcher.fail(call, exc)
        else:
            response = call
        start_response(f"{response.status} X", [*response.headers.items(),
                                                ("Content-Length", str(len(response.body)))])
        return [response.body]

    def _stopping(self) -> None:
        self.release.set()


class Listener(_Served):
    """An attacker's HTTP endpoint: answers 200 ``{}`` unsigned to anything,
    and keeps what reached it: `connections` accepted, and (method, path,
    body) of each request in `received`."""

    def __init__(self) -> None:
        self.received: list[tuple[str, str, bytes]] = []
        self.connections = 0
        received, listener = self.received, self

        class Handler(BaseHTTPRequestHandler):
            def setup(self) -> None:
                listener.connections += 1
                super().setup()

            def _any(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                received.append((self.command, self.path, body))
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", "2")
                self.end_headers()
                self.wfile.write(b"{}")

            do_GET = do_POST = _any

            def log_message(self, *args: object) -> None:
                pass

        self._httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self._httpd.server_address[1]}"
