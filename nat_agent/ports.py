"""A TCP port for a daemon to listen on, chosen before it starts.

Why not the kernel's choice for port 0: that port comes from the ephemeral
range, and once the probe closes it the kernel may hand it out again as the
source port of any outgoing connection (the daemon's own, to its
redis-server, made before it binds) and the daemon's bind then fails with
EADDRINUSE. A port below the ephemeral range is never chosen that way, so
only another listener can take it, and `listen_port` checks for those. It
also never hands one port out twice in a process: a daemon asks for several
before it binds any (service, admin, replication), and a port that is free
now is free for every one of those calls.
"""

from __future__ import annotations

import random
import socket
from pathlib import Path

FLOOR = 10_000
"""The lowest port chosen: above the well-known and most registered ones."""

_handed: set[int] = set()
"""Ports this process has handed out (forgotten only when half the range has gone)."""


def _ephemeral_range() -> tuple[int, int]:
    try:
        low, high = Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()
        return int(low), int(high)
    except (OSError, ValueError):
        return 32768, 60999   # Linux's default


def listen_port(host: str = "127.0.0.1") -> int:
    """A port outside the ephemeral range that nobody listens on at `host` now."""
    low, high = _ephemeral_range()
    candidates = [*range(FLOOR, low), *range(high + 1, 65536)]
    if not candidates:
        raise RuntimeError(f"no port outside the ephemeral range {low}-{high}")
    if len(_handed) > len(candidates) // 2:
        _handed.clear()
    rng = random.SystemRandom()
    for _ in range(256):
        port = rng.choice(candidates)
        if port in _handed:
            continue
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                probe.bind((host, port))
            except OSError:
                continue
        _handed.add(port)
        return port
    raise RuntimeError(f"no free port outside the ephemeral range {low}-{high} after 256 tries")
