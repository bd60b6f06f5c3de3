"""The client against real sockets: peers that misbehave in precise ways
(never answer, answer garbage, hang up, refuse, redirect, close idle
connections), the per-call deadline, the bounded pool, and the standalone
route against a real agent."""

from __future__ import annotations

import asyncio
import errno
import socket
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

import pytest
import redis

from client_lib import (
    DEFAULT_SPACE,
    AsyncMetaFlowClient,
    BadReply,
    FileMetadata,
    InvalidPath,
    MetaFlowClient,
    NamespaceError,
    RetryPolicy,
    Unavailable,
    entry_key,
    mdid,
)
from client_lib.resp import moved_message
from mininet_scenarios.daemons import AgentProcess
from tests.integration.resp_peer import (
    Answer,
    Peer,
    close_after_one,
    garbage,
    hang_up,
    resp,
    silent,
    value,
)

FAST = RetryPolicy(attempts=3, base=0.001, cap=0.01)
SLACK = 0.5  # seconds a call may overrun its deadline on a busy 2-core machine


@pytest.mark.parametrize("behaviour, error, reason", [
    (silent, Unavailable, "timeout after 0.2 s"),
    (hang_up, Unavailable, "server closed the connection"),
    (garbage, BadReply, "unknown reply type"),
])
def test_sync_and_async_clients_fail_with_the_reason(behaviour, error, reason):
    with Peer(behaviour) as peer:
        with MetaFlowClient(route=peer.route, timeout=0.2, retry=FAST) as client, \
                pytest.raises(error, match=reason):
            client.get("/x")
        expected_attempts = 1 if error is BadReply else FAST.attempts
        assert peer.accepted == expected_attempts

        async def main():
            async with AsyncMetaFlowClient(route=peer.route, timeout=0.2, retry=FAST) as client:
                with pytest.raises(error, match=reason):
                    await client.put("/x", b"v")
        asyncio.run(main())
        assert peer.accepted == 2 * expected_attempts


def test_nobody_listening_is_unavailable_with_the_os_error():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # bound, not listening: connections are refused
        with MetaFlowClient(via=f"127.0.0.1:{port}", retry=FAST) as client, \
                pytest.raises(Unavailable, match="Connection refused") as caught:
            client.exists("/x")
        assert caught.value.attempts == FAST.attempts


def test_a_silent_peer_fails_the_call_by_its_deadline():
    """The issue's case: 10 attempts x 2 s and no overall bound took 21.5 s.
    The default policy and timeout, a 1 s deadline: one attempt, cut to 1 s."""
    with Peer(silent) as peer:
        with MetaFlowClient(via=peer.via, deadline=1.0) as client:
            started = time.monotonic()
            with pytest.raises(Unavailable, match=r"deadline 1 s.*timeout") as caught:
                client.get("/x")
            elapsed = time.monotonic() - started
        assert 0.95 <= elapsed <= 1.0 + SLACK, elapsed
        assert caught.value.attempts == 1 and caught.value.reason.startswith("timeout after 1 s")

        async def main():
            async with AsyncMetaFlowClient(via=peer.via, deadline=1.0) as client:
                started = time.monotonic()
                with pytest.raises(Unavailable, match="deadline 1 s"):
                    await client.get("/x")
                return time.monotonic() - started
        elapsed = asyncio.run(main())
        assert 0.95 <= elapsed <= 1.0 + SLACK, elapsed


def get_once(client: MetaFlowClient | AsyncMetaFlowClient, path: str) -> bytes | None:
    """One call of either client (the async one on a loop of its own)."""
    if isinstance(client, MetaFlowClient):
        return client.get(path)
    return asyncio.run(client.get(path))


@pytest.mark.parametrize("client_cls", [MetaFlowClient, AsyncMetaFlowClient])
def test_retries_stop_at_the_deadline_not_at_the_attempts(client_cls):
    """A block that stays frozen: TRYAGAIN forever. The deadline, not the
    10,000 attempts, ends the call, and the error says what kept failing."""
    many = RetryPolicy(attempts=10_000, base=0.001, cap=0.02)
    with Peer(resp(lambda _c: b"-TRYAGAIN 100.64.0.1 block 100.64.0.0/12 is migrating\r\n")) as peer:
        client = client_cls(via=peer.via, deadline=0.5, retry=many)
        started = time.monotonic()
        with pytest.raises(Unavailable, match="deadline 0.5 s") as caught:
            get_once(client, "/x")
        elapsed = time.monotonic() - started
    assert 0.45 <= elapsed <= 0.5 + SLACK, elapsed
    assert 5 < caught.value.attempts < many.attempts
    assert caught.value.reason.startswith("TRYAGAIN")
    assert client.stats.tryagain == caught.value.attempts


def wait_until(condition: Callable[[], bool], timeout: float = 5.0) -> bool:
    end = time.monotonic() + timeout
    while not condition() and time.monotonic() < end:
        time.sleep(0.01)
    return condition()


def test_a_burst_leaves_max_idle_connections_open_and_reused():
    """The issue's case in small: more connections to one MetaDataID came back
    than max_idle, and the pool closed all of them instead of one."""
    with Peer(resp(value, delay=0.2)) as peer:
        client = MetaFlowClient(via=peer.via, max_idle=4)
        with ThreadPoolExecutor(6) as pool:
            assert list(pool.map(client.get, ["/same"] * 6)) == [b"v"] * 6
        assert client.stats.connects == 6
        assert wait_until(lambda: peer.open == 4)  # the least recently used 2 were closed
        with ThreadPoolExecutor(4) as pool:
            assert list(pool.map(client.get, ["/same"] * 4)) == [b"v"] * 4
        assert client.stats.connects == 6  # all 4 reused
        client.close()
        assert wait_until(lambda: peer.open == 0)


def test_the_async_pool_is_bounded_the_same_way():
    async def main(peer: Peer) -> None:
        async with AsyncMetaFlowClient(via=peer.via, max_idle=4) as client:
            assert await asyncio.gather(*(client.get("/same") for _ in range(6))) == [b"v"] * 6
            assert client.stats.connects == 6
            for _ in range(500):
                if peer.open == 4:
                    break
                await asyncio.sleep(0.01)
            assert peer.open == 4
            assert await asyncio.gather(*(client.get("/same") for _ in range(4))) == [b"v"] * 4
            assert client.stats.connects == 6

    with Peer(resp(value, delay=0.2)) as peer:
        asyncio.run(main(peer))
        assert wait_until(lambda: peer.open == 0)  # close() closed the 4 idle ones


def test_an_idle_connection_the_server_closed_is_not_used():
    """Without the check, the next call sent on the dead connection, failed,
    paused and retried (a retry for every reclaimed connection)."""
    with Peer(close_after_one) as peer:
        with MetaFlowClient(via=peer.via) as client:
            assert client.get("/a") == b"v"
            time.sleep(0.1)  # idle: the server closes it
            assert client.get("/a") == b"v"
            assert client.stats.retries == 0 and client.stats.connects == 2

        async def main() -> AsyncMetaFlowClient:
            async with AsyncMetaFlowClient(via=peer.via) as client:
                assert await client.get("/a") == b"v"
                await asyncio.sleep(0.1)
                assert await client.get("/a") == b"v"
            return client
        client = asyncio.run(main())
        assert client.stats.retries == 0 and client.stats.connects == 2


def test_a_moved_hint_is_followed_at_once():
    with Peer(resp(value)) as owner:
        moved = moved_message(0x64400001, "127.0.0.1", owner.port)
        with Peer(resp(lambda _c: f"-{moved}\r\n".encode())) as old:
            with MetaFlowClient(via=old.via, retry=RetryPolicy(attempts=3, base=1.0, cap=1.0)) as client:
                started = time.monotonic()
                assert client.get("/a") == b"v"
                assert time.monotonic() - started < 0.5  # no 0.5-1 s backoff pause
                assert (client.stats.moved, client.stats.hints, client.stats.connects) == (1, 1, 2)
            assert old.accepted == 1 and owner.accepted == 1

            async def main() -> None:
                async with AsyncMetaFlowClient(via=old.via) as client:
                    assert await client.get("/a") == b"v"
                    assert client.stats.hints == 1
            asyncio.run(main())


def test_a_moved_reply_naming_the_id_itself_goes_back_through_the_route():
    """The agent's "ask the switches" (MOVED to the MetaDataID on port 9000):
    the client must not connect to the ID beside its route (here, via)."""
    replies = iter([None, b"$1\r\nv\r\n"])

    def first_moved(command: list[bytes]) -> bytes | None:
        ident = mdid(command[1])
        to_the_id = moved_message(ident, DEFAULT_SPACE.address(ident), 9000)
        return next(replies) or f"-{to_the_id}\r\n".encode()

    with Peer(resp(first_moved)) as peer:
        with MetaFlowClient(via=peer.via, retry=FAST) as client:
            assert client.get("/a") == b"v"
            assert (client.stats.moved, client.stats.hints, client.stats.retries) == (1, 0, 1)
        assert peer.accepted == 2


def test_hints_that_point_at_each_other_cannot_loop() -> None:
    """Two servers that each say the other owns the ID: the hint is followed
    once, then the route (the switches) is tried until the deadline."""
    ports: dict[str, int] = {}

    def pointing_at(name: str) -> Answer:
        return lambda _c: f"-{moved_message(1, '127.0.0.1', ports[name])}\r\n".encode()

    with Peer(resp(pointing_at("b"))) as a, Peer(resp(pointing_at("a"))) as b:
        ports.update(a=a.port, b=b.port)
        with MetaFlowClient(via=a.via, deadline=0.5, retry=RetryPolicy(1000, 0.001, 0.01)) as client:
            started = time.monotonic()
            with pytest.raises(Unavailable, match="MOVED") as caught:
                client.get("/a")
            assert time.monotonic() - started <= 0.5 + SLACK
        assert b.accepted == 1 and client.stats.hints == 1
        assert a.accepted == caught.value.attempts - 1 > 5


def test_the_standalone_route_reaches_a_real_agent(tmp_path):
    """The documented way without the fabric: one agent that owns the space."""
    with AgentProcess(f"leveldb:{tmp_path / 'db'}", own=["100.64.0.0/10"]) as agent:
        meta = FileMetadata.new_file("/user/a/data.csv", 1 << 30, 1_795_000_000_000)
        with MetaFlowClient(via=f"{agent.host}:{agent.port}") as client:
            client.put("/user/a/data.csv", meta)
            assert client.stat("/user//a/data.csv") == meta
            assert client.delete("/user/a/data.csv") and not client.exists("/user/a/data.csv")

        # A name is resolved (an IPv4 literal, as above, skips the resolver).
        with MetaFlowClient(via=f"localhost:{agent.port}") as client:
            assert client.get("/user/a/data.csv") is None and client.stats.connects == 1

        async def main() -> None:
            async with AsyncMetaFlowClient(via=agent.host, port=agent.port) as client:
                await client.put("/b", b"raw")
                assert await client.get("/b") == b"raw"
        asyncio.run(main())


def test_create_compare_and_set_and_paged_entries_on_a_real_agent(tmp_path):
    """The metadata engine's primitives through both clients and redis-py:
    SET NX and SET IFEQ say whether they wrote, ELIST pages a directory, and
    bad arguments get clear errors with the connection still usable."""
    with AgentProcess(f"leveldb:{tmp_path / 'db'}", own=["100.64.0.0/10"]) as agent:
        with MetaFlowClient(via=f"{agent.host}:{agent.port}") as client:
            names = [f"n{i:03}".encode() for i in range(250)]
            for name in names:
                assert client.create(entry_key("/dir", name), name.upper())
            assert client.mdid(entry_key("/dir", "n000")) == client.mdid("/dir")
            pages, after = [], b""
            while page := client.entries("/dir", after, 100):
                pages.append(page)
                after = page[-1][0]
            assert [len(p) for p in pages] == [100, 100, 50]
            assert [e for p in pages for e in p] == [(n, n.upper()) for n in names]
            client.put("/file", b"v1")
            assert client.compare_and_set("/file", b"v1", b"v2")
            assert not client.compare_and_set("/file", b"v1", b"v3")
            assert client.get("/file") == b"v2"
            client.put("/doomed", b"d1")
            assert not client.delete_if_equal("/doomed", b"d0") and client.get("/doomed") == b"d1"
            assert client.delete_if_equal("/doomed", b"d1") and client.get("/doomed") is None
            assert not client.delete_if_equal("/doomed", b"d1")
            with pytest.raises(InvalidPath):
                client.entries(entry_key("/dir", "n000"))
            with pytest.raises(InvalidPath):
                client.create(entry_key("/dir", "a/b"), b"")

        async def main() -> None:
            async with AsyncMetaFlowClient(via=agent.host, port=agent.port) as aclient:
                assert await aclient.create("/only-once", b"1")
                assert not await aclient.create("/only-once", b"2")
                assert await aclient.compare_and_set("/only-once", b"1", b"3")
                assert not await aclient.delete_if_equal("/only-once", b"1")
                assert await aclient.delete_if_equal("/only-once", b"3")
                assert await aclient.entries("/dir", "n248") == [(b"n249", b"N249")]
        asyncio.run(main())

        r = redis.Redis(host=agent.host, port=agent.port)
        assert r.execute_command("SET", "/file", "v3", "IFEQ", "v2") is True   # redis-py: +OK is True
        assert r.execute_command("SET", "/file", "v4", "IFEQ", "nope") is None
        r.execute_command("SET", "/file", "v4", "IFEQ", "v3", "GET")   # GET's reply: redis-py maps it
        assert r.get("/file") == b"v4"
        assert r.execute_command("DELIFEQ", "/file", "v3") == 0 and r.get("/file") == b"v4"
        assert r.execute_command("ELIST", "/dir", "n247", "2") == [b"n248", b"N248", b"n249", b"N249"]
        for args, message in [(("ELIST", "/dir", "", "0"), "count"), (("ELIST", "/dir", "", "x"), "count"),
                              (("ELIST", "/dir\0n000"), "not an entry key"),
                              (("ELIST", "/dir", "a/b"), "invalid name"),
                              (("SET", "/file", "v", "IFEQ"), "syntax"),
                              (("SET", "/file", "v", "NX", "IFEQ", "v"), "syntax"),
                              (("DELIFEQ", "/file"), "wrong number of arguments")]:
            with pytest.raises(redis.ResponseError, match=message):
                r.execute_command(*args)
        assert r.get("/file") == b"v4"
        r.close()


def test_directories_exclude_creates_and_rmdir_on_a_real_agent(tmp_path):
    """ECREATE and ERMDIR through the client and redis-py: an entry only in a
    directory whose header exists, rmdir only when empty, POSIX errors."""
    with AgentProcess(f"leveldb:{tmp_path / 'db'}", own=["100.64.0.0/10"]) as agent:
        with MetaFlowClient(via=f"{agent.host}:{agent.port}") as client:
            with pytest.raises(NamespaceError) as missing:
                client.create_entry("/.mf/d/1", "a", b"x")
            assert missing.value.errno == errno.ENOENT
            assert client.create("/.mf/d/1", b"header")
            assert client.create_entry("/.mf/d/1", "a", b"x")
            assert not client.create_entry("/.mf/d/1", "a", b"y")
            with pytest.raises(NamespaceError) as full:
                client.remove_directory("/.mf/d/1")
            assert full.value.errno == errno.ENOTEMPTY and client.get("/.mf/d/1") == b"header"
            assert client.entries("/.mf/d/1") == [(b"a", b"x")]
            assert client.delete(entry_key("/.mf/d/1", "a"))
            assert client.remove_directory("/.mf/d/1")
            assert not client.remove_directory("/.mf/d/1")
            with pytest.raises(InvalidPath):
                client.create_entry("/.mf/d/1", "..", b"")
        r = redis.Redis(host=agent.host, port=agent.port)
        for args, message in [(("ECREATE", "/nope", "a", "v"), "ENOENT"),
                              (("ECREATE", "/d\0x", "a", "v"), "not an entry key"),
                              (("ECREATE", "/", "a/b", "v"), "invalid entry"),
                              (("ERMDIR", "/d\0x"), "not an entry key")]:
            with pytest.raises(redis.ResponseError, match=message):
                r.execute_command(*args)
        assert r.execute_command("SET", "/", "root") is True
        assert r.execute_command("ECREATE", "/", "top", "v" * 100_000) == b"OK"   # a value may be long
        with pytest.raises(redis.ResponseError, match="ENOTEMPTY"):
            r.execute_command("ERMDIR", "/")
        r.close()
