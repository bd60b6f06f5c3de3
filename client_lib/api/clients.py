"""The calling side of a declared API: one sync and one async client.

Both build a request from a `Route` and a body dataclass, sign it, and read
the answer back into the route's response type (or raise from the
`MetaFlowError` family by status); only the transport differs. The sync one
(`ApiClient`, `http.client`) serves the controller's worker threads,
`metaflowctl`, tests and scenarios; the async one (`AsyncApiClient`, asyncio
streams) serves the agents' migrations and registration. Standard library
only, as the rest of `client_lib`.

    admin = ApiClient("http://10.255.0.3:9001", secret)
    admin.call(ADMIN.disown, DisownRequest([Block.parse("100.64.0.0/12")]))
    admin.call(ADMIN.commit, id="3f2a...")
"""

from __future__ import annotations

import asyncio
import http.client
import json
import socket
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, TypeVar
from urllib.parse import unquote, urlsplit

from client_lib.api import codec
from client_lib.api.auth import TERM_HEADER, Signer
from client_lib.api.leaders import Leaders, controller_urls, moves_on
from client_lib.api.route import Route
from client_lib.errors import ApiError, AuthError, Conflict, InvalidArgument, NotFound, NotLeader

Req = TypeVar("Req")
Resp = TypeVar("Resp")

DEFAULT_TIMEOUT = 10.0
LONG_TIMEOUT = 300.0
"""For routes that wait (`Route.waits`): a migration's copy, a split."""


@dataclass(frozen=True)
class _Request:
    method: str
    path: str
    body: bytes
    headers: dict[str, str]
    nonce: str | None
    where: str


class _Surface:
    """What both clients share: the base URL, the signer, and turning a
    route call into bytes and an answer back into a value."""

    def __init__(self, base_url: str, secret: bytes | None, timeout: float = DEFAULT_TIMEOUT,
                 term: int | None = None) -> None:
        """`term`: the leadership term of the controller this client calls
        for, sent signed on every request (None: no term; a single
        controller's and `metaflowctl`'s calls). It may be changed later."""
        self._address(base_url)
        self.timeout = timeout
        self._signer = Signer(secret) if secret is not None else None
        self.term = term

    def _address(self, base_url: str) -> None:
        url = urlsplit(base_url.rstrip("/"))
        if url.scheme != "http" or not url.hostname:
            raise InvalidArgument(f"API address must look like http://HOST:PORT, not {base_url!r}")
        self.base_url = base_url.rstrip("/")
        self.host = url.hostname
        self.port = url.port or 80
        self.prefix = url.path

    def _timeout(self, route: Route[Any, Any]) -> float:
        return max(self.timeout, LONG_TIMEOUT) if route.waits else self.timeout

    def _prepare(self, route: Route[Req, Resp], body: Req | None, params: dict[str, str]) -> _Request:
        if (body is None) != (route.request is None):
            raise TypeError(f"{route} takes {'a ' + route.request.__name__ if route.request else 'no'} body")
        path = self.prefix + route.path(**params)
        payload = codec.dumps(body) if body is not None else b""
        headers = {"Content-Type": "application/json", "Content-Length": str(len(payload)),
                   "Host": f"{self.host}:{self.port}"}
        nonce = None
        if self._signer is not None:
            signed, nonce = self._signer.sign(f"{self.host}:{self.port}", route.method, unquote(path), "",
                                              payload, self.term)
            headers.update(signed)
        elif self.term is not None:
            headers[TERM_HEADER] = str(self.term)
        return _Request(route.method, path, payload, headers, nonce, f"{route.method} {self.base_url}{path}")

    def _answer(self, route: Route[Req, Resp], request: _Request, status: int,
                headers: dict[str, str], body: bytes) -> Resp:
        if self._signer is not None and request.nonce is not None and status != 401:
            self._signer.check_response(request.nonce, status, body, headers, request.where)
        if status >= 300:
            raise _error(request.where, status, body)
        try:
            return codec.loads(route.response, body, strict=False)
        except codec.CodecError as exc:
            raise ApiError(f"{request.where}: unexpected answer: {exc}", status) from None


def _error(where: str, status: int, body: bytes) -> ApiError:
    leader = None
    try:
        answer = json.loads(body)
        message = answer.get("error") or body[:300].decode(errors="replace")
        leader = answer.get("leader") if isinstance(answer.get("leader"), str) else None
    except (ValueError, AttributeError):
        message = body[:300].decode(errors="replace")
    text = f"{where}: HTTP {status}: {message}"
    if status == NotLeader.STATUS:
        return NotLeader(text, status, leader)
    kind = {401: AuthError, 403: AuthError, 404: NotFound, 409: Conflict}.get(status, ApiError)
    return kind(text, status)


class ApiClient(_Surface):
    """Blocking client; one connection per call (the control plane makes few)."""

    def call(self, route: Route[Req, Resp], body: Req | None = None, **params: str) -> Resp:
        request = self._prepare(route, body, params)
        conn = http.client.HTTPConnection(self.host, self.port, timeout=self._timeout(route))
        try:
            conn.request(request.method, request.path, request.body, request.headers)
            response = conn.getresponse()
            data = response.read()
            headers = dict(response.getheaders())
        except (OSError, http.client.HTTPException) as exc:
            raise ApiError(f"{request.where}: {_reason(exc)}") from None
        finally:
            conn.close()
        return self._answer(route, request, response.status, headers, data)


class LeaderClient(ApiClient):
    """An `ApiClient` of whichever of several controllers leads: a call the
    current one does not answer, or answers `NotLeader`, is sent again to
    the next (`client_lib.api.leaders`: the leader named, else the next
    URL), one more time than there are URLs at most (so a named leader
    outside the list is reached too). For `metaflowctl` (``--controller
    URL,URL``); with one URL it is exactly an `ApiClient`."""

    def __init__(self, urls: str | Sequence[str], secret: bytes | None,
                 timeout: float = DEFAULT_TIMEOUT) -> None:
        self.leaders = Leaders(controller_urls(urls))
        super().__init__(self.leaders.current, secret, timeout)

    def call(self, route: Route[Req, Resp], body: Req | None = None, **params: str) -> Resp:
        for _ in range(len(self.leaders.urls) if self.leaders.several else 0):
            try:
                return super().call(route, body, **params)
            except ApiError as exc:
                if not moves_on(exc):
                    raise
                self._address(self.leaders.move(exc.leader if isinstance(exc, NotLeader) else None))
        return super().call(route, body, **params)


class AsyncApiClient(_Surface):
    """The asyncio twin of `ApiClient`: one connection per call as well, so
    concurrent calls of one agent (a migration and a heartbeat) never wait
    on each other."""

    async def call(self, route: Route[Req, Resp], body: Req | None = None, **params: str) -> Resp:
        request = self._prepare(route, body, params)
        try:
            status, headers, data = await asyncio.wait_for(self._exchange(request), self._timeout(route))
        except (TimeoutError, OSError, EOFError, ValueError) as exc:
            raise ApiError(f"{request.where}: {_reason(exc)}") from None
        return self._answer(route, request, status, headers, data)

    async def _exchange(self, request: _Request) -> tuple[int, dict[str, str], bytes]:
        reader, writer = await asyncio.open_connection(self.host, self.port)
        try:
            head = [f"{request.method} {request.path} HTTP/1.1",
                    *(f"{k}: {v}" for k, v in request.headers.items()), "Connection: close", "", ""]
            writer.write("\r\n".join(head).encode("latin-1") + request.body)
            await writer.drain()
            return await _read_response(reader)
        finally:
            writer.close()


async def _read_response(reader: asyncio.StreamReader) -> tuple[int, dict[str, str], bytes]:
    status_line = (await reader.readuntil(b"\r\n")).decode("latin-1")
    parts = status_line.split(" ", 2)
    if len(parts) < 2 or not parts[0].startswith("HTTP/") or not parts[1].isdigit():
        raise ValueError(f"not an HTTP response: {status_line[:80]!r}")
    headers: dict[str, str] = {}
    while (line := (await reader.readuntil(b"\r\n")).decode("latin-1")) != "\r\n":
        name, _, value = line.partition(":")
        headers[name.strip()] = value.strip()
    lower = {k.lower(): v for k, v in headers.items()}
    if lower.get("transfer-encoding", "").lower() == "chunked":
        body = bytearray()
        while size := int((await reader.readuntil(b"\r\n")).split(b";")[0], 16):
            body += await reader.readexactly(size)
            await reader.readexactly(2)
        await reader.readuntil(b"\r\n")
        data = bytes(body)
    elif "content-length" in lower:
        data = await reader.readexactly(int(lower["content-length"]))
    else:
        data = await reader.read()
    return int(parts[1]), headers, data


def _reason(exc: BaseException) -> str:
    if isinstance(exc, (asyncio.TimeoutError, socket.timeout, TimeoutError)):
        return "timed out"
    if isinstance(exc, ConnectionRefusedError):
        return "connection refused (is it running?)"
    return str(exc) or type(exc).__name__
