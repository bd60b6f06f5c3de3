"""Who may change a MetaFlow cluster: HMAC-SHA256 over every request and response.

The controller, every agent and the operator's `metaflowctl` share one
secret, read from a file (`--secret-file`; `metaflowctl secret` makes one).
A request carries::

    Authorization: MetaFlow-HMAC-SHA256 ts=<unix seconds>,nonce=<hex>,sig=<hex>

where ``sig`` is HMAC-SHA256(secret, the ``Host`` it is addressed to,
method, path, query, ts, nonce, SHA-256 of the body). The server refuses
(401, changing nothing) a request without it, with a bad signature, a
timestamp outside its window, a nonce it has already seen within that
window (a replay), or addressed to another server (a request for one agent
replayed to another: each server knows its own address). Its response
carries ``X-MetaFlow-Signature: sig=<hex>`` over the request's nonce, the
status and the body, so the caller also knows it reached a holder of the
secret and not whatever answers at that address: an agent that streams
records to a migration target checks this before sending the first one.

A leader controller (one of several, elected through etcd) also sends its
term, ``X-MetaFlow-Term: <decimal>``, and the signature then covers it too
(appended to the signed material as ``"term", <decimal>``): an agent keeps
the highest term it has seen and refuses a call from an older leader, and
nobody can lower or strip the term of a signed request without breaking
its signature. A request without the header signs exactly as before, so a
single controller and ``metaflowctl`` are unchanged.

Why HMAC and not TLS: the control plane is a handful of processes on a
management network, every message is small JSON, and the standard library
does all of it, so the client package stays dependency-free. What it does
not give: confidentiality (the management network carries metadata in the
clear during migrations) and per-agent identities (any holder of the
secret can act as any agent). `ARCHITECTURE.md` says what remains open.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import secrets
import stat
import time
from collections.abc import Callable, Mapping
from pathlib import Path

from client_lib.errors import AuthError, InvalidArgument

SCHEME = "MetaFlow-HMAC-SHA256"
AUTH_HEADER = "Authorization"
SIGNATURE_HEADER = "X-MetaFlow-Signature"
TERM_HEADER = "X-MetaFlow-Term"
"""The sender's leadership term (a leader controller's calls only)."""
MIN_SECRET_BYTES = 16
WINDOW_S = 60.0
"""How far a request's timestamp may be from the server's clock (and so how
long a nonce is remembered)."""

Clock = Callable[[], float]


def load_secret(path: str | os.PathLike[str]) -> bytes:
    """The secret in `path` (surrounding whitespace dropped). Refused, with the
    fix in the message, when it is too short or readable by group or others."""
    file = Path(path)
    try:
        mode = file.stat().st_mode
        secret = file.read_bytes().strip()
    except OSError as exc:
        raise InvalidArgument(f"cannot read the secret file {file}: {exc.strerror or exc}") from None
    if mode & (stat.S_IRWXG | stat.S_IRWXO):
        raise InvalidArgument(f"secret file {file} is accessible by group or others; chmod 600 {file}")
    if len(secret) < MIN_SECRET_BYTES:
        raise InvalidArgument(f"secret file {file} holds {len(secret)} bytes; at least "
                              f"{MIN_SECRET_BYTES} are needed (metaflowctl secret FILE)")
    return secret


def new_secret() -> str:
    """A fresh secret as text: 32 random bytes, URL-safe base64."""
    return secrets.token_urlsafe(32)


def write_secret(path: str | os.PathLike[str], secret: str | None = None) -> Path:
    """Create `path` with mode 0600 holding `secret` (a new one by default)."""
    file = Path(path)
    fd = os.open(file, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as out:
        out.write((secret or new_secret()) + "\n")
    os.chmod(file, 0o600)
    return file


def server_authority(host: str, port: int) -> str | None:
    """What requests to a server listening on host:port must be addressed to
    (`Verifier`'s `authority`); None for a wildcard address, which cannot
    know the names it is reached by."""
    return None if host in ("", "0.0.0.0", "::") else f"{host}:{port}"


def _digest(secret: bytes, *parts: str | bytes) -> str:
    mac = hmac.new(secret, digestmod=hashlib.sha256)
    for part in parts:
        data = part.encode() if isinstance(part, str) else part
        mac.update(len(data).to_bytes(4, "big") + data)  # length-prefixed: no ambiguous joins
    return mac.hexdigest()


def _term_parts(term: int | None) -> tuple[str, ...]:
    """What a term adds to the signed material: nothing without one, so a
    request without a term signs as it always did."""
    return () if term is None else ("term", str(term))


def header_term(headers: Mapping[str, str]) -> int | None:
    """The term a request's `TERM_HEADER` carries (None: absent), whatever
    the header's case; AuthError for anything but a non-negative decimal,
    which no signer sends. Not verified: `Verifier.verify` does that."""
    value = _header(headers, TERM_HEADER)
    if not value:
        return None
    if not (value.isascii() and value.isdigit()):
        raise AuthError(f"{TERM_HEADER}: {value[:40]!r} is not a term (a non-negative integer)", 401)
    return int(value)


def _body_hash(body: bytes) -> bytes:
    return hashlib.sha256(body).digest()


def _fields(value: str, scheme: str | None) -> dict[str, str]:
    if scheme is not None:
        name, _, value = value.strip().partition(" ")
        if name != scheme:
            return {}
    out = {}
    for item in value.split(","):
        key, sep, val = item.strip().partition("=")
        if sep:
            out[key] = val
    return out


class Signer:
    """The calling side: signs requests and checks the signed responses."""

    def __init__(self, secret: bytes, clock: Clock = time.time) -> None:
        self._secret = secret
        self._clock = clock

    def sign(self, authority: str, method: str, path: str, query: str,
             body: bytes, term: int | None = None) -> tuple[dict[str, str], str]:
        """Headers to send (``Host`` among them: it is signed, and
        `TERM_HEADER` when there is a term), and the nonce to check the
        response against. `authority`: the server's host:port."""
        if term is not None and term < 0:
            raise InvalidArgument(f"a term is a non-negative integer, not {term}")
        ts = str(int(self._clock()))
        nonce = secrets.token_hex(16)
        sig = _digest(self._secret, "request", authority, method, path, query, ts, nonce, _body_hash(body),
                      *_term_parts(term))
        headers = {"Host": authority, AUTH_HEADER: f"{SCHEME} ts={ts},nonce={nonce},sig={sig}"}
        if term is not None:
            headers[TERM_HEADER] = str(term)
        return headers, nonce

    def check_response(self, nonce: str, status: int, body: bytes, headers: Mapping[str, str],
                       where: str) -> None:
        got = _fields(_header(headers, SIGNATURE_HEADER), None).get("sig", "")
        want = _digest(self._secret, "response", nonce, str(status), _body_hash(body))
        if not hmac.compare_digest(got, want):
            raise AuthError(f"{where}: the response is not signed with the cluster's secret "
                            "(wrong address, or a different secret)", status)


class Verifier:
    """The serving side: checks requests and signs responses."""

    def __init__(self, secret: bytes, authority: str | None = None, window: float = WINDOW_S,
                 clock: Clock = time.time) -> None:
        """`authority`: this server's host:port, which a request must be
        addressed to (None: a server on a wildcard address takes any)."""
        self._secret = secret
        self._authority = authority
        self._window = window
        self._clock = clock
        self._seen: dict[str, float] = {}   # nonce -> when it may be forgotten

    def check(self, method: str, path: str, query: str, headers: Mapping[str, str], body: bytes) -> str:
        """The request's nonce if it is signed, fresh and not a replay; else AuthError (401)."""
        return self.verify(method, path, query, headers, body)[0]

    def verify(self, method: str, path: str, query: str, headers: Mapping[str, str],
               body: bytes) -> tuple[str, int | None]:
        """As `check`, and the request's signed term (None: it carries none)."""
        fields = _fields(_header(headers, AUTH_HEADER), SCHEME)
        ts, nonce, sig = fields.get("ts", ""), fields.get("nonce", ""), fields.get("sig", "")
        if not (ts.isdigit() and nonce and sig):
            raise AuthError(f"{method} {path}: not signed; send {AUTH_HEADER}: {SCHEME} "
                            "with the cluster's secret (--secret-file)", 401)
        term = header_term(headers)
        host = _header(headers, "Host")
        want = _digest(self._secret, "request", host, method, path, query, ts, nonce, _body_hash(body),
                       *_term_parts(term))
        if not hmac.compare_digest(sig, want):
            raise AuthError(f"{method} {path}: bad signature (a different secret?)", 401)
        if self._authority is not None and host != self._authority:
            raise AuthError(f"{method} {path}: signed for {host}, "
                            f"not for this server ({self._authority})", 401)
        now = self._clock()
        if abs(now - int(ts)) > self._window:
            raise AuthError(f"{method} {path}: timestamp {ts} is more than {self._window:g} s "
                            "from this server's clock", 401)
        self._forget(now)
        if nonce in self._seen:
            raise AuthError(f"{method} {path}: nonce already used (a replayed request)", 401)
        self._seen[nonce] = now + 2 * self._window
        return nonce, term

    def response_headers(self, nonce: str, status: int, body: bytes) -> dict[str, str]:
        sig = _digest(self._secret, "response", nonce, str(status), _body_hash(body))
        return {SIGNATURE_HEADER: f"sig={sig}"}

    def _forget(self, now: float) -> None:
        if len(self._seen) > 4096:
            self._seen = {n: t for n, t in self._seen.items() if t > now}


def _header(headers: Mapping[str, str], name: str) -> str:
    value = headers.get(name)
    if value is None:
        lower = name.lower()
        value = next((v for k, v in headers.items() if k.lower() == lower), "")
    return value
