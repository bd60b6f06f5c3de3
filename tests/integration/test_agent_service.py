"""The real daemon on loopback: commands, redis-cli, bad input, shutdown (the admin API and
registration: test_admin_api.py, test_registration.py)."""

from __future__ import annotations

import asyncio
import select
import shutil
import socket
import subprocess
import time

import pytest

from client_lib.api.admin import ADMIN
from client_lib.cidr import Block
from client_lib.client import (
    AsyncMetaFlowClient,
    InvalidPath,
    MetaFlowClient,
    RetryPolicy,
    ServerError,
    Unavailable,
)
from client_lib.mdid import mdid
from client_lib.metadata import FileMetadata
from mininet_scenarios.daemons import AgentProcess

SPACE = "100.64.0.0/10"
NOW = 1_795_000_000_000


@pytest.fixture(params=["leveldb", "redis"])
def store_spec(request, tmp_path):
    if request.param == "leveldb":
        return f"leveldb:{tmp_path / 'db'}"
    url = request.getfixturevalue("redis_server")
    return f"{url}/0?prefix={request.getfixturevalue('redis_prefix')}"


@pytest.fixture(params=["0", "2"], ids=["event-loop", "worker-threads"])
def workers(request):
    """`--workers`: the port served by the event loop, or by threads of the
    compiled path (the Redis store has none: its agent serves on the event loop)."""
    return request.param


@pytest.fixture
def agent(store_spec, workers, tmp_path):
    with AgentProcess(store_spec, "--read-timeout", "0.5", "--max-value", "4096", "--workers", workers,
                      own=[SPACE], log_path=tmp_path / "agent.log") as proc:
        yield proc


def client_for(proc: AgentProcess, **kw) -> MetaFlowClient:
    return MetaFlowClient(space=SPACE, route=lambda _a: (proc.host, proc.port), **kw)


def raw(proc: AgentProcess, data: bytes, wait: float = 2.0, until: bytes | None = None) -> bytes:
    """Send bytes on a fresh connection and read until the server closes, goes
    quiet for `wait` seconds, or what was read ends with `until`."""
    with socket.create_connection((proc.host, proc.port), timeout=wait) as sock:
        sock.sendall(data)
        out = b""
        try:
            while chunk := sock.recv(65536):
                out += chunk
                if until is not None and out.endswith(until):
                    break
        except TimeoutError:
            pass
        return out


def test_put_get_stat_delete_round_trip(agent):
    with client_for(agent) as c:
        meta = FileMetadata.new_file("/user/a/data.csv", 1 << 30, NOW)
        assert c.get("/user/a/data.csv") is None and not c.exists("/user/a/data.csv")
        c.put("/user/a/data.csv", meta)
        c.put("/user/a", FileMetadata.new_dir("/user/a", NOW, children=1))
        assert c.stat("/user//a/./data.csv") == meta  # normalized on both sides
        assert c.stat("/user/a").is_dir
        assert c.exists("/user/a/data.csv")
        assert c.delete("/user/a/data.csv") and not c.delete("/user/a/data.csv")
        assert c.stat("/user/a/data.csv") is None
        assert c.stats.connects == 2  # one connection per MetaDataID, reused
    blocks = agent.call(ADMIN.blocks)
    assert blocks.total == 1 and str(blocks.blocks[0].block) == SPACE


def test_async_client_has_the_same_surface(agent):
    async def main():
        async with AsyncMetaFlowClient(space=SPACE, route=lambda _a: (agent.host, agent.port)) as c:
            await asyncio.gather(*(c.put(f"/async/{i}", b"v%d" % i) for i in range(50)))
            values = await asyncio.gather(*(c.get(f"/async/{i}") for i in range(50)))
            assert values == [b"v%d" % i for i in range(50)]
            assert await c.exists("/async/7") and await c.delete("/async/7")
            assert await c.stat("/async/7") is None
    asyncio.run(main())


@pytest.mark.skipif(shutil.which("redis-cli") is None, reason="redis-cli is installed by make setup")
def test_redis_cli_is_a_debugging_client(agent):
    def cli(*args):
        return subprocess.run(["redis-cli", "-h", agent.host, "-p", str(agent.port), *args],
                              capture_output=True, text=True, timeout=10).stdout.strip()
    assert cli("PING") == "PONG"
    assert cli("SET", "/a/b", "hello") == "OK"
    assert cli("GET", "/a/b") == "hello"
    assert cli("EXISTS", "/a/b", "/a/c") == "1"
    stat = cli("STAT", "/a/b").splitlines()
    assert stat[stat.index("mdid") + 1] == Block.parse(SPACE).address(mdid("/a/b", Block.parse(SPACE)))
    assert stat[stat.index("state") + 1] == "owned"
    assert "keys:1" in cli("INFO")
    assert cli("DEL", "/a/b") == "1"
    assert "unknown command" in cli("FLUSHALL")


def test_wrong_owner_gets_moved_and_the_client_gives_up_with_the_reason(store_spec, tmp_path):
    with AgentProcess(store_spec, own=["100.64.0.0/11"], log_path=tmp_path / "a.log") as proc:
        space = Block.parse(SPACE)
        path = next(f"/p{i}" for i in range(1000) if mdid(f"/p{i}", space) >= space.first + space.size // 2)
        reply = raw(proc, b"*2\r\n$3\r\nGET\r\n$%d\r\n%s\r\n" % (len(path), path.encode()), wait=0.5)
        ident = mdid(path, space)  # MOVED <id> <ip>:<port>, here the ID itself on port 9000
        assert reply == b"-MOVED %d %s:9000\r\n" % (ident, space.address(ident).encode())
        with client_for(proc, retry=RetryPolicy(3, 0.001, 0.01)) as c:
            with pytest.raises(Unavailable, match="MOVED"):
                c.get(path)
            assert c.stats.moved == 3


@pytest.mark.parametrize("frame, expect, closes", [
    (b"*1\r\n$4\r\nPONG\r\n", b"-ERR unknown command 'PONG'", False),
    (b"*2\r\n$3\r\nGET\r\n$3\r\na/b\r\n", b"-ERR invalid path: path must be absolute", False),
    (b"*2\r\n$3\r\nGET\r\n$2\r\n/\xff\r\n", b"-ERR invalid path: not valid UTF-8", False),
    (b"*3\r\n$3\r\nGET\r\n$2\r\n/a\r\n$2\r\n/b\r\n", b"-ERR wrong number of arguments for 'get'", False),
    # Over its limit: refused at the header, its bytes skipped, the connection kept.
    (b"*3\r\n$3\r\nSET\r\n$2\r\n/a\r\n$5000\r\n" + b"x" * 5000 + b"\r\n",
     b"-ERR argument 2 of 'set' of 5000 bytes exceeds the limit of 4096 bytes", False),
    (b"*2\r\n$3\r\nGET\r\n$5000\r\n" + b"/" * 5000 + b"\r\n",
     b"-ERR argument 1 of 'get' of 5000 bytes exceeds the limit of 4096 bytes", False),
    (b"*2\r\n$3\r\nGET\r\n$999999999999\r\n", b"-ERR protocol error: bulk string of 999999999999", True),
    (b"\r\n\r\n", b"+PONG\r\n", False),  # blank lines between commands are skipped
    (b"*3\r\n$3\r\nSET\r\n$2\r\n/a\r\n$3000\r\n" + b"x" * 3000 + b"\r\n", b"+OK", False),
    (b"*1\r\n:12\r\n", b"-ERR protocol error: expected a bulk string", True),
    (b"$$$\r\n", b"-ERR unknown command", False),
    (b"*2\r\n$3\r\nGET\r\n$2\r\n/a", b"-ERR timeout: request incomplete", True),
])
def test_bad_input_gets_a_clear_error_and_the_server_keeps_serving(agent, frame, expect, closes):
    # A kept connection answers the PING sent after the frame last.
    reply = raw(agent, frame + (b"" if closes else b"*1\r\n$4\r\nPING\r\n"), wait=2.0,
                until=None if closes else b"+PONG\r\n")
    assert reply.startswith(expect), reply[:200]
    if not closes:
        assert reply.endswith(b"+PONG\r\n")  # same connection still served
    with client_for(agent) as c:
        c.put("/still/serving", b"yes")
        assert c.get("/still/serving") == b"yes"


def test_value_limit_is_a_typed_error_for_the_client(agent):
    with client_for(agent) as c:
        with pytest.raises(ServerError, match="exceeds the limit of 4096"):
            c.put("/big", b"x" * 4097)
        with pytest.raises(InvalidPath):
            c.get("relative")


@pytest.mark.parametrize("threads", ["0", "1"], ids=["event-loop", "worker-thread"])
def test_vanishing_and_flooding_clients_do_not_disturb_others(tmp_path, threads):
    # One worker thread: with more, each reclaims among the connections it accepted itself.
    with AgentProcess(f"leveldb:{tmp_path / 'db'}", "--max-clients", "40", "--workers", threads, own=[SPACE],
                      log_path=tmp_path / "agent.log") as agent:
        _vanish_and_flood(agent)


def _vanish_and_flood(agent: AgentProcess) -> None:
    for _ in range(20):  # half a request, then gone
        with socket.create_connection((agent.host, agent.port)) as s:
            s.sendall(b"*3\r\n$3\r\nSET\r\n$2\r\n/v\r\n$100\r\nabc")
    flood = []
    for _ in range(45):
        flood.append(socket.create_connection((agent.host, agent.port)))
        time.sleep(0.005)  # in order, so that the oldest is known
    try:
        time.sleep(0.3)
        # The limit is 40: the five idle the longest were closed, silently, to make room.
        closed, _, _ = select.select(flood, [], [], 0)
        assert 4 <= len(closed) <= 5 and set(closed) <= set(flood[:5])  # a vanished one may count
        assert all(s.recv(100) == b"" for s in closed)
    finally:
        for s in flood:
            s.close()
    time.sleep(0.3)
    with client_for(agent) as c:
        assert c.get("/v") is None  # the half-sent SET stored nothing
        c.put("/after/flood", b"ok")
        assert c.get("/after/flood") == b"ok"
    stats = agent.call(ADMIN.stats).service
    assert stats["reclaimed_connections"] >= 4 and "refused_connections" not in stats
    assert "reclaiming" in agent.log() and "closed mid-request" in agent.log()


def test_ownership_survives_a_restart_and_sigterm_is_clean(tmp_path):
    spec = f"leveldb:{tmp_path / 'db'}"
    with AgentProcess(spec, own=["100.64.0.0/11"]) as proc:
        with client_for(proc) as c:
            half = Block.parse("100.64.0.0/11")
            path = next(f"/k{i}" for i in range(1000) if half.contains(mdid(f"/k{i}", Block.parse(SPACE))))
            c.put(path, b"kept")
    with AgentProcess(spec) as proc:  # no --own: restored from the store
        assert proc.call(ADMIN.health).owned == [Block.parse("100.64.0.0/11")]
        with client_for(proc) as c:
            assert c.get(path) == b"kept"


def test_a_second_agent_on_the_same_port_is_refused_and_the_first_keeps_every_connection(tmp_path):
    """The workers share their port with SO_REUSEPORT, which the kernel
    would let another agent of the same user join, taking half of the
    connections: the second one must refuse to start, whichever way it serves."""
    with AgentProcess(f"leveldb:{tmp_path / 'first'}", "--workers", "2", own=[SPACE],
                      log_path=tmp_path / "first.log") as first:
        for workers, why in (("2", f"port {first.port} is already served by another process"),
                             ("0", "address already in use")):
            second = AgentProcess(f"leveldb:{tmp_path / f'second{workers}'}", "--workers", workers,
                                  own=[SPACE], port=first.port, log_path=tmp_path / f"second{workers}.log")
            with pytest.raises(RuntimeError, match="exited with 1 at start"):
                second.launch().wait_ready(30)
            assert why in second.log(), second.log()
        with client_for(first) as c:
            for i in range(50):   # fresh connections, all to the first agent
                c.put(f"/alone/{i}", b"%d" % i)
            assert [c.get(f"/alone/{i}") for i in range(50)] == [b"%d" % i for i in range(50)]
