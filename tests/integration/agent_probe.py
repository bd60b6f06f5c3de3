"""Talking RESP to a real agent from a test, finding the processes it runs,
and reading its store once it has stopped."""

from __future__ import annotations

import asyncio
import socket
import time
from pathlib import Path

from client_lib.cidr import Block
from client_lib.resp import OK, ErrorReply, Reply, RespParser, encode_command
from mininet_scenarios.daemons import AgentProcess
from nat_agent.leveldb_store import LevelDBStore
from nat_agent.store import Record


def stored_records(path: Path, space: Block) -> list[Record]:
    """Every record of a stopped agent's LevelDB store, in order."""
    async def scan() -> list[Record]:
        store = LevelDBStore(path, space.width)
        try:
            return [r async for batch in store.scan(space.first, space.last) for r in batch]
        finally:
            await store.close()

    return asyncio.run(scan())


def _reply(sock: socket.socket, parser: RespParser, what: bytes) -> Reply:
    while not (reply := parser.next_reply())[0]:
        data = sock.recv(65536)
        assert data, f"the agent closed the connection instead of answering {what!r}"
        parser.feed(data)
    return reply[1]


def ask(agent: AgentProcess, *command: bytes) -> Reply:
    """One command on a fresh connection (a closed connection fails the test)."""
    with socket.create_connection((agent.host, agent.port), timeout=10) as sock:
        sock.sendall(encode_command(*command))
        return _reply(sock, RespParser(), command[0])


def until_ok(agent: AgentProcess, *command: bytes, timeout: float = 20) -> list[Reply]:
    """Repeat a command until it succeeds; returns the failures seen on the way."""
    failures: list[Reply] = []
    deadline = time.monotonic() + timeout
    while isinstance(reply := ask(agent, *command), ErrorReply):
        failures.append(reply)
        assert time.monotonic() < deadline, failures[-3:]
        time.sleep(0.05)
    return failures


def set_all(agent: AgentProcess, items: list[tuple[bytes, bytes]], clients: int) -> list[tuple[bytes, bytes]]:
    """SET every ``(key, value)`` over ``clients`` connections, one request in
    flight on each: the writes of one round of ``clients`` are concurrent, the
    rounds follow each other. Returns the pairs acknowledged with ``+OK``, in
    order (a key written twice is acknowledged in round order)."""
    socks = [socket.create_connection((agent.host, agent.port), timeout=20) for _ in range(clients)]
    parsers = [RespParser() for _ in socks]
    acknowledged: list[tuple[bytes, bytes]] = []
    try:
        for start in range(0, len(items), clients):
            chunk = items[start:start + clients]
            for sock, (key, value) in zip(socks, chunk):
                sock.sendall(encode_command(b"SET", key, value))
            for sock, parser, pair in zip(socks, parsers, chunk):
                if _reply(sock, parser, b"SET") == OK:
                    acknowledged.append(pair)
    finally:
        for sock in socks:
            sock.close()
    return acknowledged


def redis_child(agent: AgentProcess) -> int:
    """The PID of the redis-server the agent started (from any of its threads)."""
    assert agent.proc is not None
    for task in Path(f"/proc/{agent.proc.pid}/task").iterdir():
        for child in map(int, (task / "children").read_text().split()):
            if b"redis-server" in Path(f"/proc/{child}/cmdline").read_bytes():
                return child
    raise AssertionError("the agent runs no redis-server")
