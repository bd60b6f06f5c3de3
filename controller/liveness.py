"""The controller's side of liveness datagrams (`client_lib.liveness`).

Agents beat four times a second; 2,000 of them are 8,000 beats a second,
which as HTTP requests (one decision-loop event each) would take about 12
cores. A beat instead arrives as one UDP datagram, and a thread of its
own (`LivenessServer`) verifies it and writes when the server was heard
into `Liveness.heard`, a dict the decision loop reads when it looks for
silent servers (`controller.registry.Registry.silent`): no event per beat,
O(1) work per datagram, and the decision loop's sweep reads one entry per
server per tick, as it did.

What a verified beat gets back (`client_lib.liveness.encode_reply`): ACK
when it counted (at most every `ACK_EVERY_S` per server: the agent only
needs to know, within a second, that its beats arrive); NUDGE when the
agent should send an HTTP heartbeat now: this controller does not know
the name (it restarted: the heartbeat's 404 makes the agent register
again), has declared it failed (404 too: it rejoins empty), is a standby
(503 names the leader, where the agent moves),
or holds an older state of it than the beat's digest says (the heartbeat
brings the current one; the beat still counts as alive). Anything that
does not verify gets nothing, is counted by reason, and is logged at most
once per `REMIND_S` per reason.

`Liveness.take` is the logic (bytes in, outcome and reply out); the
thread only moves datagrams.
"""

from __future__ import annotations

import logging
import socket
import threading
import time
from collections.abc import Callable

from client_lib.api.auth import Clock
from client_lib.liveness import (
    ACK,
    MAX_DATAGRAM,
    NUDGE,
    REASONS,
    LivenessError,
    LivenessKey,
    decode_beat,
    encode_reply,
)
from controller.registry import Heard, Registry

log = logging.getLogger("metaflow.controller.liveness")

TAKEN = ("accepted", "stale")
"""Outcomes of a beat that counts as the server alive."""
NUDGED = ("stale", "unknown", "failed", "standby")
"""Outcomes answered with NUDGE."""
OUTCOMES = ("accepted", "unknown", "failed", "standby", "stale", *REASONS)
"""Every outcome of a datagram, a metric label each (`client_lib.api.metrics.LIVENESS_DATAGRAMS`)."""
ACK_EVERY_S = 0.4
"""A server's beats are acknowledged at most this often: every other beat at
4/s, two ACKs within the agent's `nat_agent.registration.ACK_WAIT_S`.
Half the replies halve their cost (a signature and a send each)."""
REMIND_S = 10.0
"""How often a refusal or a beat from an unknown name is logged at most, per outcome."""
RECV_BUFFER = 4 << 20
"""The socket's receive buffer: a second of 8,000 beats, should the thread fall behind for a moment."""


class Liveness:
    """Verifies beats and records when each registered server was last heard."""

    def __init__(self, secret: bytes, registry: Callable[[], Registry], leads: Callable[[], bool],
                 term: Callable[[], int], clock: Clock = time.monotonic, wall: Clock = time.time) -> None:
        """`registry`: the current core's (a new leader's core has its own);
        `clock`: the core's (when heard, `Registry.silent` compares it with its own now);
        `wall`: for the datagrams' sequence (the senders' clock)."""
        self._key = LivenessKey(secret)
        self._registry = registry
        self._leads = leads
        self._term = term
        self._clock = clock
        self._wall = wall
        self.heard: Heard = {}
        self._seqs: dict[str, int] = {}
        self._acked: dict[str, float] = {}

    def take(self, data: bytes) -> tuple[str, bytes | None, str]:
        """The datagram's outcome (one of `OUTCOMES`), the reply to send
        back (None: nothing), and the sender's name ("" when it did not verify)."""
        try:
            beat = decode_beat(data, self._key, self._wall(), self._seqs)
        except LivenessError as exc:
            return exc.reason, None, ""
        self._seqs[beat.name] = beat.seq
        registry = self._registry()
        registry.hearing.word(self._clock())   # any verified beat: the controller hears
        server = registry.servers.get(beat.name)
        if not self._leads():
            outcome = "standby"
        elif server is None:
            outcome = "unknown"
        elif server.failed:
            outcome = "failed"
        else:
            now = self._clock()
            self.heard[beat.name] = (now, beat.keys)
            if beat.digest == server.digest:
                if now - self._acked.get(beat.name, -ACK_EVERY_S) < ACK_EVERY_S:
                    return "accepted", None, beat.name
                self._acked[beat.name] = now
                return "accepted", encode_reply(self._key, ACK, beat, self._term()), beat.name
            outcome = "stale"
        return outcome, encode_reply(self._key, NUDGE, beat, self._term()), beat.name


class LivenessServer:
    """The UDP socket and its thread; `close` stops it."""

    def __init__(self, liveness: Liveness, host: str, port: int, count: Callable[[str], None]) -> None:
        """Binds at once, so a port that is taken stops the controller's start."""
        self._liveness = liveness
        self._count = count
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        self.sock = socket.socket(family, socket.SOCK_DGRAM)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, RECV_BUFFER)
        self.sock.bind((host, port))
        self.port: int = self.sock.getsockname()[1]
        self._wake = (host if host not in ("", "0.0.0.0", "::") else "127.0.0.1", self.port)
        self._running = True
        self._told: dict[str, float] = {}
        self.thread = threading.Thread(target=self._serve, name="liveness", daemon=True)

    def start(self) -> None:
        self.thread.start()

    def close(self) -> None:
        """Stop the thread: a blocking read (one system call a datagram, not a
        poll and a read) is woken by an empty datagram of our own."""
        self._running = False
        if self.thread.is_alive():
            with socket.socket(self.sock.family, socket.SOCK_DGRAM) as wake:
                wake.sendto(b"", self._wake)
            self.thread.join(timeout=5)
        self.sock.close()

    def _serve(self) -> None:
        take, count, sock = self._liveness.take, self._count, self.sock
        while True:
            try:
                data, addr = sock.recvfrom(MAX_DATAGRAM + 1)
            except OSError as exc:
                log.error("liveness socket failed (%s); beats are not heard", exc)
                return
            if not self._running:
                return
            try:
                outcome, reply, name = take(data)
                count(outcome)
                if reply is not None:
                    sock.sendto(reply, addr)
            except OSError:   # a reply that cannot leave (the agent's host unreachable)
                continue
            except Exception:  # a bug must not stop liveness for everyone
                log.exception("a liveness datagram from %s failed", addr)
                continue
            if outcome not in TAKEN:
                self._tell(outcome, name, addr)

    def _tell(self, outcome: str, name: str, addr: tuple[str, int]) -> None:
        """Log an outcome that is not a beat taken, once per `REMIND_S` per outcome."""
        now = time.monotonic()
        if now - self._told.get(outcome, -REMIND_S) < REMIND_S:
            return
        self._told[outcome] = now
        nudged = outcome in NUDGED
        log.log(logging.INFO if nudged else logging.WARNING,
                "liveness datagram from %s:%d%s: %s, %s (counted by outcome; said again in %g s at most)",
                addr[0], addr[1], f" ({name})" if name else "", outcome,
                "nudged to send an HTTP heartbeat" if nudged else "dropped", REMIND_S)
