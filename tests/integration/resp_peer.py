"""RESP peers for the client's tests: a real TCP server on loopback that
misbehaves in one precise way (never answers, answers garbage, hangs up,
redirects, closes a connection after one reply)."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Callable

from nat_agent.resp_commands import CommandParser

Behaviour = Callable[[socket.socket], None]
Answer = Callable[[list[bytes]], bytes | None]


class Peer:
    """A TCP server on loopback that runs `behaviour(conn)` for every connection."""

    def __init__(self, behaviour: Behaviour) -> None:
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self.via = f"127.0.0.1:{self.port}"
        self.accepted = 0
        self.open = 0
        self._lock = threading.Lock()
        self.behaviour = behaviour
        threading.Thread(target=self._serve, daemon=True).start()

    def route(self, _address: str) -> tuple[str, int]:
        return "127.0.0.1", self.port

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            with self._lock:
                self.accepted += 1
                self.open += 1
            threading.Thread(target=self._run, args=(conn,), daemon=True).start()

    def _run(self, conn: socket.socket) -> None:
        try:
            self.behaviour(conn)
        except OSError:
            pass
        finally:
            conn.close()
            with self._lock:
                self.open -= 1

    def __enter__(self) -> Peer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.sock.close()


def resp(answer: Answer, delay: float = 0.0) -> Behaviour:
    """A RESP server: each command gets `answer(command)` after `delay`;
    None closes the connection."""
    def behaviour(conn: socket.socket) -> None:
        parser = CommandParser()
        while data := conn.recv(65536):
            parser.feed(data)
            while (command := parser.next_command()) is not None:
                time.sleep(delay)
                reply = answer(command)
                if reply is None:
                    return
                conn.sendall(reply)
    return behaviour


def silent(conn: socket.socket) -> None:
    """Read the request and never answer, until the client hangs up."""
    conn.recv(1000)
    conn.recv(1000)


def garbage(conn: socket.socket) -> None:
    conn.recv(1000)
    conn.sendall(b"HTTP/1.1 400 Bad Request\r\n\r\n")


def hang_up(conn: socket.socket) -> None:
    """Read the request and close the connection (`Peer` closes on return)."""
    conn.recv(1000)


def value(_command: list[bytes]) -> bytes:
    return b"$1\r\nv\r\n"


def close_after_one(conn: socket.socket) -> None:
    """Answer one request, then close: a server reclaiming an idle connection."""
    parser = CommandParser()
    while data := conn.recv(65536):
        parser.feed(data)
        if parser.next_command() is not None:
            conn.sendall(b"$1\r\nv\r\n")
            return
