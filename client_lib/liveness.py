"""Liveness datagrams: an agent's signed "I am alive" in one small UDP packet.

Why: an HTTP heartbeat costs the controller about 1.5 ms of CPU (a
connection, a thread, JSON, an HMAC over the request and one over the
response, an event on the decision loop); 2,000 servers beating four
times a second would need about 12 cores. A datagram carries only what
liveness needs and is checked with one HMAC, without a connection and
without the decision loop. The HTTP heartbeat stays for what changes
rarely: an agent sends one when its state (owned, frozen, degraded
blocks) changes, and at a slow period as a safety net.

Layout (network byte order), `HEADER` then the name then the tag::

    magic "MF" | version u8 | kind u8 | seq u64 | term u64 | keys u64 |
    state digest 8 bytes | name length u8 | name (UTF-8) | tag 16 bytes

* ``kind``: `BEAT` (agent to controller), or the controller's reply to a
  beat it verified: `ACK` (taken), or `NUDGE` ("send an HTTP heartbeat
  now": a name it does not know or has declared failed, or it is a
  standby; the answer to that heartbeat, 404 or 503, makes the agent
  register again or move to the leader, as over HTTP alone). An agent
  that hears no reply for a while falls back to HTTP, which finds a
  controller that is down.
* ``seq``: in a beat, the sender's clock in microseconds, strictly
  increasing per sender (`Sequence`), so a receiver refuses a replay
  (``seq`` not above the last one it accepted for that name) and a
  datagram far from its own clock (more than `auth.WINDOW_S`: a replay
  after the receiver forgot). A reply echoes the beat's ``seq``.
* ``term``: the sender's leadership term as it knows it (0: none).
* ``keys``: how many keys the agent holds (it changes with every write;
  carrying it here keeps it out of the state digest, so writes do not
  trigger HTTP heartbeats).
* state digest: `state_digest` of the blocks the last HTTP heartbeat
  would carry; the controller compares it with the one it last received
  over HTTP and so knows whether its view of the agent is current.
* tag: HMAC-SHA256 over everything before it, keyed with the cluster's
  secret (the one `client_lib.api.auth` signs HTTP with) and a label of
  its own, so no datagram is a valid HTTP signature or the reverse;
  truncated to 16 bytes (128 bits, as the datagram lives seconds).

Sans-I/O: bytes in, bytes out; sockets belong to the agent and the controller.
"""

from __future__ import annotations

import hashlib
import hmac
import struct
import time
from collections.abc import Iterable, Mapping
from typing import NamedTuple

from client_lib.api.auth import WINDOW_S, Clock
from client_lib.cidr import Block
from client_lib.errors import InvalidArgument, MetaFlowError

MAGIC = b"MF"
VERSION = 1
BEAT = 1
ACK = 2
NUDGE = 3
REPLIES = (ACK, NUDGE)
HEADER = struct.Struct("!2sBBQQQ8sB")
"""Everything before the name (its last field is the name's length)."""
TAG_BYTES = 16
DIGEST_BYTES = 8
MAX_NAME = 255
MAX_DATAGRAM = HEADER.size + MAX_NAME + TAG_BYTES
"""The largest datagram a sender makes; anything longer is refused unread."""
_LABEL = b"metaflow-liveness-v1"
_U64 = (1 << 64) - 1


class LivenessError(MetaFlowError, ValueError):
    """A datagram refused; `reason` (one word, a metric label) says why:
    ``oversized``, ``malformed``, ``signature``, ``replay``, ``skew``."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(f"liveness datagram refused ({reason}): {message}")
        self.reason = reason


REASONS = ("oversized", "malformed", "signature", "replay", "skew")
"""Every `LivenessError.reason`, for metric labels known in advance."""


class Beat(NamedTuple):
    """One verified datagram (a tuple: made 8,000 times a second at 2,000 servers)."""

    kind: int
    name: str
    seq: int
    term: int
    keys: int
    digest: bytes

    @property
    def sent(self) -> float:
        """The sender's clock when it sent this (unix seconds)."""
        return self.seq / 1e6


class LivenessKey:
    """The cluster secret prepared for tagging datagrams (the keyed hash's
    first block is computed once, not once per datagram)."""

    def __init__(self, secret: bytes) -> None:
        self._base = hmac.new(secret, _LABEL, hashlib.sha256)

    def tag(self, data: bytes) -> bytes:
        mac = self._base.copy()
        mac.update(data)
        return mac.digest()[:TAG_BYTES]


class Sequence:
    """A sender's sequence numbers: its clock in microseconds, and never the
    same or lower twice (two beats within a microsecond, a clock stepped
    back), so a restarted sender continues above what it sent before."""

    def __init__(self, clock: Clock = time.time) -> None:
        self._clock = clock
        self._last = 0

    def next(self) -> int:
        self._last = max(self._last + 1, int(self._clock() * 1e6))
        return self._last


def state_digest(owned: Iterable[Block], frozen: Iterable[Block], degraded: Iterable[Block]) -> bytes:
    """A short digest of an agent's role state as an HTTP heartbeat carries
    it (`client_lib.api.rest.Heartbeat` without its key count), in the order
    given: the agent and the controller compute it over the same lists."""
    text = ";".join(",".join(str(b) for b in blocks) for blocks in (owned, frozen, degraded))
    return hashlib.sha256(text.encode()).digest()[:DIGEST_BYTES]


def encode_beat(key: LivenessKey, name: str, seq: int, digest: bytes, keys: int = 0, term: int = 0) -> bytes:
    """An agent's beat. InvalidArgument for what no receiver would accept
    (a name over `MAX_NAME` bytes, a digest of another size, a negative or
    oversized number)."""
    return _encode(key, BEAT, name, seq, term, keys, digest)


def encode_reply(key: LivenessKey, kind: int, beat: Beat, term: int = 0) -> bytes:
    """The controller's reply to `beat` (`ACK` or `NUDGE`), echoing its sequence."""
    if kind not in REPLIES:
        raise InvalidArgument(f"a reply is ACK ({ACK}) or NUDGE ({NUDGE}), not {kind}")
    return _encode(key, kind, beat.name, beat.seq, term, 0, bytes(DIGEST_BYTES))


def decode_beat(data: bytes, key: LivenessKey, now: float,
                last_seq: Mapping[str, int] | None = None, window: float = WINDOW_S) -> Beat:
    """The beat in `data`, verified: signed with the cluster's secret,
    ``seq`` above ``last_seq[name]`` (the caller records the accepted ones)
    and within `window` seconds of `now`. LivenessError otherwise."""
    return _decode(data, key, (BEAT,), now, last_seq, window)


def decode_reply(data: bytes, key: LivenessKey, now: float,
                 last_seq: Mapping[str, int] | None = None, window: float = WINDOW_S) -> Beat:
    """As `decode_beat`, for a controller's `ACK` or `NUDGE` (``last_seq``:
    the last beat's sequence a reply was taken for)."""
    return _decode(data, key, REPLIES, now, last_seq, window)


def _encode(key: LivenessKey, kind: int, name: str, seq: int, term: int, keys: int, digest: bytes) -> bytes:
    raw = name.encode()
    if not 0 < len(raw) <= MAX_NAME:
        raise InvalidArgument(f"a liveness datagram carries a name of 1 to {MAX_NAME} bytes, not {len(raw)}")
    if len(digest) != DIGEST_BYTES:
        raise InvalidArgument(f"a state digest has {DIGEST_BYTES} bytes, not {len(digest)}")
    for what, value in (("seq", seq), ("term", term), ("keys", keys)):
        if not 0 <= value <= _U64:
            raise InvalidArgument(f"a liveness datagram's {what} is 0 to 2**64-1, not {value}")
    body = HEADER.pack(MAGIC, VERSION, kind, seq, term, keys, digest, len(raw)) + raw
    return body + key.tag(body)


def _decode(data: bytes, key: LivenessKey, kinds: tuple[int, ...], now: float,
            last_seq: Mapping[str, int] | None, window: float) -> Beat:
    if len(data) > MAX_DATAGRAM:
        raise LivenessError("oversized", f"{len(data)} bytes, at most {MAX_DATAGRAM}")
    if len(data) < HEADER.size + 1 + TAG_BYTES:
        raise LivenessError("malformed", f"{len(data)} bytes, too short")
    magic, version, got_kind, seq, term, keys, digest, size = HEADER.unpack_from(data)
    if magic != MAGIC or version != VERSION:
        raise LivenessError("malformed", f"not a MetaFlow liveness datagram of version {VERSION}")
    if len(data) != HEADER.size + size + TAG_BYTES or size == 0:
        raise LivenessError("malformed", f"its name's length ({size}) does not match its size ({len(data)})")
    body, tag = data[:-TAG_BYTES], data[-TAG_BYTES:]
    if not hmac.compare_digest(tag, key.tag(body)):
        raise LivenessError("signature", "bad tag (a different secret?)")
    if got_kind not in kinds:
        raise LivenessError("malformed", f"kind {got_kind}, expected one of {kinds}")
    try:
        name = body[HEADER.size:].decode()
    except UnicodeDecodeError:
        raise LivenessError("malformed", "its name is not UTF-8") from None
    last = last_seq.get(name) if last_seq is not None else None
    if last is not None and seq <= last:
        raise LivenessError("replay", f"{name}: sequence {seq} not above {last}")
    if abs(now - seq / 1e6) > window:
        raise LivenessError("skew", f"{name}: sent {seq / 1e6:.0f}, more than {window:g} s from {now:.0f}")
    return Beat(got_kind, name, seq, term, keys, digest)
