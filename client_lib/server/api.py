"""The serving side of a declared API (`client_lib.api`), without I/O: request bytes in, response bytes out.

The agent's admin API runs on aiohttp and the controller's REST API on
wsgiref; both hand each request to a `Dispatcher` built from the same
route declarations the clients use. It checks the signature, finds the
route, decodes and validates the body, and after the shim has run the
handler turns its result or exception into a signed JSON response, so
authentication, validation and the status of every error are decided in
one place for both servers.

Status of an exception raised by a handler:

| exception | status |
|---|---|
| `AuthError` | 401 |
| `CodecError`, `InvalidArgument` (a malformed request) | 400 |
| `NotFound`, `KeyError` | 404 |
| `Conflict`, any other `ValueError` (contradicts the current state) | 409 |
| `NotLeader` (a standby controller; the body names the leader) | 503 |
| `ApiError` (a peer this server called failed) | 502 |
| anything else (a bug; logged with its traceback) | 500 |
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from client_lib.api import codec
from client_lib.api.auth import Verifier, header_term
from client_lib.api.route import Route
from client_lib.errors import ApiError, AuthError, Conflict, InvalidArgument, NotFound, NotLeader

log = logging.getLogger("metaflow.api")

MAX_BODY = 64 << 20
"""The largest request body a server reads (a migration batch is far smaller)."""


@dataclass(frozen=True)
class ErrorBody:
    """What every failed call answers."""

    error: str
    leader: str | None = None
    """With 503 (`NotLeader`): the REST URL of the leader controller, when known."""


@dataclass(frozen=True)
class Call:
    """A request that passed authentication and validation: what the handler gets."""

    route: Route[Any, Any]
    params: dict[str, str]
    body: Any
    nonce: str | None
    term: int | None = None
    """The caller's leadership term, covered by its signature (None: it
    sent none; with no verifier, the header as sent)."""


@dataclass(frozen=True)
class Response:
    status: int
    body: bytes
    headers: dict[str, str] = field(default_factory=dict)


def status_of(exc: BaseException) -> int:
    if isinstance(exc, AuthError):
        return exc.status or 401
    if isinstance(exc, (codec.CodecError, InvalidArgument)):
        return 400
    if isinstance(exc, (NotFound, KeyError)):
        return 404
    if isinstance(exc, (Conflict, ValueError)):
        return 409
    if isinstance(exc, NotLeader):
        return NotLeader.STATUS
    if isinstance(exc, ApiError):
        return 502
    return 500


def message_of(exc: BaseException) -> str:
    if isinstance(exc, KeyError) and exc.args:
        return str(exc.args[0])
    return str(exc) or type(exc).__name__


class Dispatcher:
    """Routes one server's requests. `verifier` None serves without
    authentication (tests of other things only; the daemons always have a
    secret). `open_reads` lets unsigned callers use the routes that change
    nothing."""

    def __init__(self, routes: Sequence[Route[Any, Any]], verifier: Verifier | None,
                 open_reads: bool = False) -> None:
        self.routes = list(routes)
        self.verifier = verifier
        self.open_reads = open_reads

    def resolve(self, method: str, path: str, query: str, headers: Mapping[str, str],
                body: bytes) -> Call | Response:
        """The call to hand to a handler, or the response that refuses it."""
        nonce, term, refusal = None, None, None
        try:
            if self.verifier is not None:
                nonce, term = self.verifier.verify(method, path, query, headers, body)
            else:
                term = header_term(headers)
        except AuthError as exc:
            refusal = exc
        route, params = self._find(method, path)
        if route is None:
            allowed = sorted({r.method for r in self.routes if r.match(r.method, path) is not None})
            if allowed:
                return self._refuse(nonce, 405, f"{method} {path}: use {' or '.join(allowed)}")
            return self._refuse(nonce, 404, f"no route {method} {path}")
        if refusal is not None and (route.changes or route.private or not self.open_reads):
            log.warning("refused %s %s: %s", method, path, refusal)
            return self._refuse(None, status_of(refusal), str(refusal))
        if len(body) > MAX_BODY:
            return self._refuse(nonce, 413, f"body of {len(body)} bytes exceeds {MAX_BODY}")
        try:
            request = (codec.loads(route.request, body) if route.request is not None else None)
        except codec.CodecError as exc:
            return self._refuse(nonce, 400, f"{route}: {exc}")
        return Call(route, params, request, nonce, term)

    def reply(self, call: Call, result: object) -> Response:
        if not isinstance(result, call.route.response):
            raise TypeError(f"{call.route} handler returned {type(result).__name__}, "
                            f"not {call.route.response.__name__}")
        return self._signed(call.nonce, 200, codec.dumps(result))

    def fail(self, call: Call, exc: BaseException) -> Response:
        status = status_of(exc)
        if status == 500:
            log.error("%s failed", call.route, exc_info=exc)
        else:
            log.warning("%s -> %d: %s", call.route, status, message_of(exc))
        leader = exc.leader if isinstance(exc, NotLeader) else None
        return self._signed(call.nonce, status, codec.dumps(ErrorBody(message_of(exc), leader)))

    def _find(self, method: str, path: str) -> tuple[Route[Any, Any] | None, dict[str, str]]:
        for route in self.routes:
            params = route.match(method, path)
            if params is not None:
                return route, params
        return None, {}

    def _refuse(self, nonce: str | None, status: int, message: str) -> Response:
        return self._signed(nonce, status, codec.dumps(ErrorBody(message)))

    def _signed(self, nonce: str | None, status: int, body: bytes) -> Response:
        headers = {"Content-Type": "application/json"}
        if self.verifier is not None and nonce is not None:
            headers.update(self.verifier.response_headers(nonce, status, body))
        return Response(status, body, headers)


Handler = Callable[[Call], object]
WsgiApp = Callable[[dict[str, Any], Callable[..., Any]], Iterable[bytes]]


def wsgi_app(dispatcher: Dispatcher, handle: Handler) -> WsgiApp:
    """A WSGI application serving `dispatcher`'s routes with `handle` (called
    with each authenticated, validated `Call`; it returns the route's response
    body or raises). wsgiref is in the standard library, so any process can
    serve a declared API with it: the controller's REST API does."""

    def app(environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
        try:
            length = int(environ.get("CONTENT_LENGTH") or 0)
        except ValueError:
            length = -1
        if not 0 <= length <= MAX_BODY:
            response = Response(413 if length > 0 else 400, codec.dumps(ErrorBody("bad Content-Length")),
                                {"Content-Type": "application/json"})
        else:
            body = environ["wsgi.input"].read(length) if length else b""
            headers = {k[5:].replace("_", "-").title(): v for k, v in environ.items()
                       if k.startswith("HTTP_")}
            # PEP 3333: PATH_INFO holds the URL-decoded bytes as latin-1 text.
            path = environ.get("PATH_INFO", "").encode("latin-1").decode("utf-8", "replace")
            call = dispatcher.resolve(environ["REQUEST_METHOD"], path, environ.get("QUERY_STRING", ""),
                                      headers, body)
            if isinstance(call, Call):
                try:
                    response = dispatcher.reply(call, handle(call))
                except Exception as exc:  # every failure becomes an answer with its status
                    response = dispatcher.fail(call, exc)
            else:
                response = call
        start_response(f"{response.status} {_REASONS.get(response.status, 'Error')}",
                       [*response.headers.items(), ("Content-Length", str(len(response.body)))])
        return [response.body]

    return app


_REASONS = {200: "OK", 400: "Bad Request", 401: "Unauthorized", 404: "Not Found",
            405: "Method Not Allowed", 409: "Conflict", 413: "Payload Too Large",
            500: "Internal Server Error", 502: "Bad Gateway", 503: "Service Unavailable"}
