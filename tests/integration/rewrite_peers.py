"""The processes `test_rewrite_netns.py` runs inside its namespaces.

    rewrite_peers.py rewriter MODE SPACE OWN_IP TAG   start a Rewriter, print its
        stats as JSON, wait for SIGTERM, print its stats again, stop it
    rewrite_peers.py echo PORT                        TCP and UDP echo on 0.0.0.0:PORT;
        prints "ready" once listening
    rewrite_peers.py client PORT SIZE TIMEOUT ADDRESS...  one TCP round trip of
        SIZE bytes and one UDP datagram to each ADDRESS:PORT, each socket
        operation given TIMEOUT seconds; prints JSON results
    rewrite_peers.py pingpong PORT ROUNDS ADDRESS     ROUNDS 64-byte round trips on one
        connection; prints {"peer": ..., "us_per_round_trip": ...}
    rewrite_peers.py sameport PORT LOCAL ADDRESS...   one connection from local port LOCAL
        to each ADDRESS:PORT, all open at once (Linux allows that: the
        destinations differ), then round trips on each in turn; prints JSON

A separate process per role, because each must live in its own namespace
(and the rewriter in a process the test can SIGKILL).
"""

from __future__ import annotations

import json
import signal
import socket
import sys
import threading
import time

from client_lib.cidr import Block
from nat_agent.rewrite import Rewriter


def run_rewriter(mode: str, space: str, own_ip: str, tag: str) -> None:
    terminated = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: terminated.set())
    rewriter = Rewriter(mode, Block.parse(space), own_ip, tag=tag)
    rewriter.start()
    print(json.dumps(rewriter.stats()), flush=True)
    terminated.wait()
    print(json.dumps(rewriter.stats()), flush=True)
    rewriter.stop()


def run_echo(port: int) -> None:
    listener = socket.socket()
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listener.bind(("0.0.0.0", port))
    listener.listen(64)
    datagrams = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    datagrams.bind(("0.0.0.0", port))
    threading.Thread(target=_echo_datagrams, args=(datagrams,), daemon=True).start()
    print("ready", flush=True)
    while True:
        conn, _ = listener.accept()
        threading.Thread(target=_echo_stream, args=(conn,), daemon=True).start()


def _echo_stream(conn: socket.socket) -> None:
    with conn:
        while data := conn.recv(65536):
            conn.sendall(data)


def _echo_datagrams(sock: socket.socket) -> None:
    while True:
        data, peer = sock.recvfrom(65536)
        sock.sendto(data, peer)


def run_client(port: int, size: int, timeout: float, addresses: list[str]) -> None:
    results = []
    for n, address in enumerate(addresses):
        payload = bytes((n + i) % 251 for i in range(size))
        result: dict[str, object] = {"address": address}
        started = time.monotonic()
        try:
            with socket.create_connection((address, port), timeout=timeout) as conn:
                result["peer"] = conn.getpeername()[0]
                conn.sendall(payload)
                conn.shutdown(socket.SHUT_WR)
                received = bytearray()
                while chunk := conn.recv(65536):
                    received += chunk
            result["echo_ok"] = bytes(received) == payload
            with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as udp:
                udp.settimeout(timeout)
                udp.sendto(payload[:1000], (address, port))
                data, peer = udp.recvfrom(65536)
                result["udp_ok"] = data == payload[:1000]
                result["udp_peer"] = peer[0]
        except OSError as exc:
            result["error"] = f"{type(exc).__name__}: {exc}"
        result["seconds"] = round(time.monotonic() - started, 3)
        results.append(result)
    print(json.dumps(results), flush=True)


def run_pingpong(port: int, rounds: int, address: str) -> None:
    message = b"p" * 64
    with socket.create_connection((address, port), timeout=5) as conn:
        conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        started = time.perf_counter()
        for _ in range(rounds):
            conn.sendall(message)
            received = b""
            while len(received) < len(message):
                received += conn.recv(len(message) - len(received))
        elapsed = time.perf_counter() - started
        peer = conn.getpeername()[0]
    print(json.dumps({"peer": peer, "us_per_round_trip": elapsed / rounds * 1e6}), flush=True)


def run_sameport(port: int, local: int, addresses: list[str]) -> None:
    conns = []
    for address in addresses:
        conn = socket.socket()
        conn.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        conn.bind(("0.0.0.0", local))
        conn.settimeout(5)
        started = time.monotonic()
        conn.connect((address, port))
        conns.append((conn, {"address": address, "peer": conn.getpeername()[0],
                             "local_port": conn.getsockname()[1],
                             "connect_s": round(time.monotonic() - started, 3), "echoed": 0}))
    for round_ in range(3):
        for conn, result in conns:
            if "error" in result:
                continue
            message = f"{result['address']} round {round_}".encode()
            try:
                conn.sendall(message)
                received = b""
                while len(received) < len(message) and (chunk := conn.recv(64)):
                    received += chunk
            except OSError as exc:
                result["error"] = f"{type(exc).__name__}: {exc}"
                continue
            result["echoed"] += received == message
    for conn, _ in conns:
        conn.close()
    print(json.dumps([result for _, result in conns]), flush=True)


def main(argv: list[str]) -> None:
    role, *args = argv
    if role == "rewriter":
        run_rewriter(*args)
    elif role == "echo":
        run_echo(int(args[0]))
    elif role == "client":
        run_client(int(args[0]), int(args[1]), float(args[2]), args[3:])
    elif role == "pingpong":
        run_pingpong(int(args[0]), int(args[1]), args[2])
    elif role == "sameport":
        run_sameport(int(args[0]), int(args[1]), args[2:])
    else:
        raise SystemExit(f"unknown role {role!r}")


if __name__ == "__main__":
    main(sys.argv[1:])
