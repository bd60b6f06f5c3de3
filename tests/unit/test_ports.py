"""nat_agent.ports: a daemon's port is never one the kernel may hand to an
outgoing connection meanwhile (the cause of a flaky EADDRINUSE at start)."""

from __future__ import annotations

import random
import socket

import pytest

from nat_agent import ports
from nat_agent.ports import FLOOR, _ephemeral_range, listen_port


def test_ports_lie_outside_the_ephemeral_range_and_are_free() -> None:
    low, high = _ephemeral_range()
    for _ in range(50):
        port = listen_port()
        assert FLOOR <= port < low or high < port <= 65535
        with socket.socket() as s:   # nobody listens there: it binds
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            s.bind(("127.0.0.1", port))


def test_a_process_never_gets_one_port_twice(monkeypatch: pytest.MonkeyPatch) -> None:
    """A daemon takes several ports before it binds any: the same free port
    offered again is passed over."""
    first = listen_port()
    second = listen_port()
    offered = iter([first, second, first, second + 1 if second + 1 != first else second + 2])
    monkeypatch.setattr(random.SystemRandom, "choice", lambda self, seq: next(offered))
    assert listen_port() not in (first, second)


def test_a_port_in_use_is_passed_over(monkeypatch: pytest.MonkeyPatch) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", listen_port()))
        taken.listen()
        busy = taken.getsockname()[1]
        free = listen_port()
        monkeypatch.setattr(ports, "_handed", set())   # offered afresh, as if by another process
        offered = iter([busy, busy, free])
        monkeypatch.setattr(random.SystemRandom, "choice", lambda self, seq: next(offered))
        assert listen_port() == free
