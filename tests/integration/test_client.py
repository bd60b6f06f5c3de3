"""The client against misbehaving peers (real sockets): timeouts, garbage, resets."""

from __future__ import annotations

import asyncio
import socket
import threading

import pytest

from client_lib.client import (
    AsyncMetaFlowClient,
    BadReply,
    MetaFlowClient,
    RetryPolicy,
    Unavailable,
)

FAST = RetryPolicy(attempts=3, base=0.001, cap=0.01)


class Peer:
    """A TCP server that answers every connection with `behaviour(conn)`."""

    def __init__(self, behaviour) -> None:
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self.accepted = 0
        self.behaviour = behaviour
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self.accepted += 1
            threading.Thread(target=self.behaviour, args=(conn,), daemon=True).start()

    def close(self) -> None:
        self.sock.close()


def silent(conn: socket.socket) -> None:
    conn.recv(1000)  # read the request, never answer


def garbage(conn: socket.socket) -> None:
    conn.recv(1000)
    conn.sendall(b"HTTP/1.1 400 Bad Request\r\n\r\n")


def hang_up(conn: socket.socket) -> None:
    conn.recv(1000)
    conn.close()


@pytest.mark.parametrize("behaviour, error, reason", [
    (silent, Unavailable, "timeout after 0.2 s"),
    (hang_up, Unavailable, "server closed the connection"),
    (garbage, BadReply, "unknown reply type"),
])
def test_sync_and_async_clients_fail_with_the_reason(behaviour, error, reason):
    peer = Peer(behaviour)
    try:
        route = lambda _a: ("127.0.0.1", peer.port)  # noqa: E731
        with MetaFlowClient(route=route, timeout=0.2, retry=FAST) as client:
            with pytest.raises(error, match=reason):
                client.get("/x")
        expected_attempts = 1 if error is BadReply else FAST.attempts
        assert peer.accepted == expected_attempts

        async def main():
            async with AsyncMetaFlowClient(route=route, timeout=0.2, retry=FAST) as client:
                with pytest.raises(error, match=reason):
                    await client.put("/x", b"v")
        asyncio.run(main())
        assert peer.accepted == 2 * expected_attempts
    finally:
        peer.close()


def test_nobody_listening_is_unavailable_with_the_os_error():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # bound, not listening: connections are refused
        with MetaFlowClient(route=lambda _a: ("127.0.0.1", port), retry=FAST) as client:
            with pytest.raises(Unavailable, match="Connection refused"):
                client.exists("/x")
