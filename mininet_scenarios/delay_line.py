"""A WAN link in user space: every frame that crosses it arrives half a
round trip later, in the order it came (issue 29).

This kernel has no ``sch_netem``, so the round trip between two sites is
made here: one process with a packet socket on each of two interfaces
(``AF_PACKET``, every protocol) sends each frame it receives on one out of
the other, `one_way` seconds later. The bandwidth cap is the kernel's
(``tbf`` on each interface's egress, `prepare`), and so is the queue that
builds behind it.

What the interfaces need (`prepare` does it): promiscuous mode (the frames
are for the far side's addresses), and no offloads, so that one frame in is
one frame out, never larger than the MTU (a GRO-merged super-frame could not
be sent on). A frame this process sends is seen again by its own socket as
outgoing; it is skipped. At most `MAX_QUEUED` frames wait per direction;
beyond that a frame is dropped, as a router's full buffer drops it.

    python -m mininet_scenarios.delay_line IF_A IF_B --rtt-ms 40

prints ``ready`` once both sockets are bound and runs until SIGTERM or
SIGINT, then exits 0. SIGUSR1 cuts the line (every frame, in flight or
arriving, is lost, as on a cut fibre: the interfaces stay up, so nothing
tells the ends) and SIGUSR2 mends it.
"""

from __future__ import annotations

import argparse
import math
import selectors
import signal
import socket
import subprocess
import sys
import time
from collections import deque
from collections.abc import Iterator
from contextlib import contextmanager

ETH_P_ALL = 0x0003
MAX_FRAME = 65535
MAX_QUEUED = 50_000
"""Frames waiting in one direction, at most (a few seconds of a busy link)."""

IDLE_WAIT = 0.2
"""Seconds between checks for a stop when no frame is in flight."""
PRECISE_WAIT = 0.002
"""A frame due within this many seconds is waited for by sleeping, not by epoll."""


def _packet_socket(interface: str) -> socket.socket:
    sock = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.htons(ETH_P_ALL))
    sock.bind((interface, ETH_P_ALL))
    sock.setblocking(False)
    return sock


def prepare(interface: str, rate_mbit: float | None = None, netns: list[str] | None = None) -> None:
    """Make `interface` fit for the line: promiscuous, offloads off, and (if
    `rate_mbit`) a ``tbf`` cap on what leaves it. `netns`: the command prefix
    that runs a command in the interface's namespace (``ip netns exec NAME``)."""
    prefix = netns or []

    def run(*argv: str) -> None:
        subprocess.run([*prefix, *argv], check=True, capture_output=True, timeout=30)

    run("ip", "link", "set", "dev", interface, "promisc", "on", "up")
    run("ethtool", "-K", interface, "tso", "off", "gso", "off", "gro", "off", "tx", "off", "rx", "off")
    if rate_mbit is not None:
        # A burst of at least one MTU-sized frame per timer tick, and a queue of 50 ms at the rate.
        burst = max(15_000, int(rate_mbit * 1e6 / 8 / 250))
        run("tc", "qdisc", "replace", "dev", interface, "root", "tbf", "rate", f"{rate_mbit}mbit",
            "burst", str(burst), "latency", "50ms")


class DelayLine:
    """The two directions of one link: frames from `a` go out of `b`, and
    from `b` out of `a`, each `one_way` seconds after it came."""

    def __init__(self, a: str, b: str, one_way: float) -> None:
        if one_way < 0:
            raise ValueError(f"a delay cannot be negative ({one_way})")
        self.one_way = one_way
        self.sockets = (_packet_socket(a), _packet_socket(b))
        self.queues: tuple[deque[tuple[float, bytes]], deque[tuple[float, bytes]]] = (deque(), deque())
        self.stopping = False
        self.cut = False
        self.forwarded = 0
        self.dropped = 0

    def close(self) -> None:
        for sock in self.sockets:
            sock.close()

    def run(self) -> None:
        """Forward until `stopping` is set."""
        selector = selectors.DefaultSelector()
        for side, sock in enumerate(self.sockets):
            selector.register(sock, selectors.EVENT_READ, side)
        try:
            while not self.stopping:
                self._send_due(time.monotonic())
                heads = [queue[0][0] for queue in self.queues if queue]
                wait = min(heads) - time.monotonic() if heads else IDLE_WAIT
                if wait < PRECISE_WAIT:
                    # epoll rounds its timeout up to a whole millisecond: the last of
                    # a wait is slept precisely (arriving frames wait in the socket).
                    time.sleep(max(0.0, wait))
                    continue
                timeout = math.floor(min(wait, IDLE_WAIT) * 1000 - 1) / 1000
                for key, _ in selector.select(max(0.0, timeout)):
                    self._receive(key.data)
        finally:
            selector.close()

    def _receive(self, side: int) -> None:
        sock, queue = self.sockets[side], self.queues[side]
        due = time.monotonic() + self.one_way
        while True:
            try:
                frame, address = sock.recvfrom(MAX_FRAME)
            except BlockingIOError:
                return
            if address[2] == socket.PACKET_OUTGOING:
                continue   # one this line sent, seen on its way out
            if self.cut or len(queue) >= MAX_QUEUED:
                self.dropped += 1
                continue
            queue.append((due, frame))

    def _send_due(self, now: float) -> None:
        if self.cut:   # what was in flight when the line was cut is lost too
            self.dropped += sum(map(len, self.queues))
            for queue in self.queues:
                queue.clear()
        for side, queue in enumerate(self.queues):
            out = self.sockets[1 - side]
            while queue and queue[0][0] <= now:
                _, frame = queue.popleft()
                try:
                    out.send(frame)
                    self.forwarded += 1
                except (BlockingIOError, OSError):
                    self.dropped += 1   # the far interface's queue is full, or it went down


@contextmanager
def _stopped_by_signals(line: DelayLine) -> Iterator[None]:
    def stop(_signum: int, _frame: object) -> None:
        line.stopping = True

    def cut(signum: int, _frame: object) -> None:
        line.cut = signum == signal.SIGUSR1

    handlers = {signal.SIGTERM: stop, signal.SIGINT: stop, signal.SIGUSR1: cut, signal.SIGUSR2: cut}
    previous = {sig: signal.signal(sig, handler) for sig, handler in handlers.items()}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m mininet_scenarios.delay_line",
                                description="Join two interfaces with a delay (a WAN link's round trip).")
    p.add_argument("a", help="one end's interface")
    p.add_argument("b", help="the other end's interface")
    p.add_argument("--rtt-ms", type=float, required=True, help="the round trip the line adds, in ms")
    args = p.parse_args(argv)
    if args.rtt_ms < 0:
        p.error("--rtt-ms cannot be negative")
    line = DelayLine(args.a, args.b, args.rtt_ms / 2000)
    try:
        with _stopped_by_signals(line):
            print("ready", flush=True)
            line.run()
    finally:
        line.close()
    print(f"forwarded {line.forwarded} frames, dropped {line.dropped}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
