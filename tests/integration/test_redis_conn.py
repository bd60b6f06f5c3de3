"""The pipelining Redis connection, on real redis-servers, under asyncio and uvloop."""

from __future__ import annotations

import asyncio
import socket
import subprocess
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any, cast
from urllib.parse import urlsplit

import pytest
import uvloop

from client_lib.resp import SimpleString
from nat_agent.redis_conn import RedisConnection, RedisNotReady, RedisReplyError
from nat_agent.redis_server import RedisServer

pytestmark = pytest.mark.timeout(60)

Body = Callable[[], Coroutine[Any, Any, None]]


@pytest.fixture(params=["asyncio", "uvloop"])
def run(request: pytest.FixtureRequest) -> Callable[[Body], None]:
    """Runs a test body in a fresh event loop of either kind (the agent uses uvloop)."""
    runner = asyncio.run if request.param == "asyncio" else uvloop.run
    return lambda body: runner(body())


@pytest.fixture
def tcp(redis_server: str) -> Callable[..., RedisConnection]:
    """Makes connections to the session's redis-server (over TCP)."""
    url = urlsplit(redis_server)
    return lambda **options: RedisConnection(host=url.hostname, port=url.port or 6379, **options)


def tcp_port(server: RedisServer) -> int:
    assert server.port is not None
    return server.port


def test_concurrent_callers_each_get_their_own_reply(
    run: Callable[[Body], None], tcp: Callable[..., RedisConnection], redis_prefix: str
) -> None:
    keys = [f"{redis_prefix}n{i}" for i in range(200)]

    async def body() -> None:
        async with tcp() as conn:
            counts = await asyncio.gather(
                *(conn.call(b"INCRBY", key, i) for i, key in enumerate(keys))
            )
            assert counts == list(range(200))
            values = await asyncio.gather(*(conn.call(b"GET", key) for key in keys))
            assert values == [b"%d" % i for i in range(200)]
            # ...and on one socket: the whole burst was pipelined, not pooled.
            ids = await asyncio.gather(*(conn.call(b"CLIENT", b"ID") for _ in range(50)))
            assert len(set(ids)) == 1

            replies = await conn.pipeline(
                [(b"SET", keys[0], b"x"), (b"GET", keys[0]), (b"DEL", keys[0])]
            )
            assert replies == [SimpleString("OK"), b"x", 1]
            assert await conn.pipeline([]) == []

    run(body)


def test_transactions_from_concurrent_callers_stay_atomic(
    run: Callable[[Body], None], tcp: Callable[..., RedisConnection], redis_prefix: str
) -> None:
    counter, log = f"{redis_prefix}counter", f"{redis_prefix}log"

    async def body() -> None:
        async with tcp() as conn:
            results = cast(list[list[int]], await asyncio.gather(*(
                conn.transaction([(b"INCR", counter), (b"RPUSH", log, i), (b"RPUSH", log, i)])
                for i in range(100)
            )))
            # The n-th block to run saw the list at 2(n-1) and left it at 2n,
            # with no other block's push in between.
            assert sorted(n for n, _, _ in results) == list(range(1, 101))
            assert all(results[i][1:] == [2 * n - 1, 2 * n] for i, (n, _, _) in enumerate(results))
            pushed = cast(list[bytes], await conn.call(b"LRANGE", log, 0, -1))
            assert pushed[0::2] == pushed[1::2]

    run(body)


def test_error_replies_raise_and_the_connection_carries_on(
    run: Callable[[Body], None], tcp: Callable[..., RedisConnection], redis_prefix: str
) -> None:
    text, other = f"{redis_prefix}text", f"{redis_prefix}other"

    async def body() -> None:
        async with tcp() as conn:
            await conn.call(b"SET", text, b"a string")
            with pytest.raises(RedisReplyError, match="unknown command") as caught:
                await conn.call(b"NOSUCHCOMMAND")
            assert caught.value.code == "ERR"
            with pytest.raises(RedisReplyError) as caught:
                await conn.call(b"LPUSH", text, b"x")
            assert caught.value.code == "WRONGTYPE"

            # An error amid a pipeline raises; the replies after it are still consumed.
            with pytest.raises(RedisReplyError, match="WRONGTYPE"):
                await conn.pipeline([(b"GET", text), (b"LPUSH", text, b"x"), (b"ECHO", b"after")])
            assert await conn.call(b"ECHO", b"next") == b"next"

            # A run-time error inside EXEC's array surfaces; the rest of the block ran.
            with pytest.raises(RedisReplyError) as caught:
                await conn.transaction([(b"SET", other, b"1"), (b"LPUSH", text, b"x")])
            assert caught.value.code == "WRONGTYPE"
            assert await conn.call(b"GET", other) == b"1"

            # A command Redis refuses to queue aborts the whole block.
            with pytest.raises(RedisReplyError, match="wrong number of arguments"):
                await conn.transaction([(b"SET", other, b"2"), (b"GET",)])
            assert await conn.call(b"GET", other) == b"1"

            # Failing and succeeding callers interleaved on the wire.
            calls = [
                conn.call(b"LPUSH", text, b"x") if i % 2 else conn.call(b"ECHO", i)
                for i in range(40)
            ]
            outcomes = await asyncio.gather(*calls, return_exceptions=True)
            assert all(isinstance(o, RedisReplyError) for o in outcomes[1::2])
            assert outcomes[0::2] == [b"%d" % i for i in range(0, 40, 2)]
            assert await conn.call(b"PING") == SimpleString("PONG")

    run(body)


def test_a_cancelled_caller_does_not_shift_the_replies(
    run: Callable[[Body], None], tcp: Callable[..., RedisConnection], redis_prefix: str
) -> None:
    async def body() -> None:
        async with tcp() as conn:
            with pytest.raises(TimeoutError):
                await asyncio.wait_for(conn.call(b"BLPOP", f"{redis_prefix}empty", b"0.3"), 0.05)
            # The BLPOP's nil reply, when it comes, goes to nobody.
            assert await conn.call(b"ECHO", b"mine") == b"mine"

    run(body)


def test_a_server_that_goes_away_fails_pending_calls_and_a_later_call_reconnects(
    run: Callable[[Body], None], tmp_path: Path
) -> None:
    server = RedisServer(tmp_path, port=0).start()
    try:

        async def body() -> None:
            async with RedisConnection(host="127.0.0.1", port=tcp_port(server), db=2) as conn:
                await conn.call(b"SET", b"kept", b"in db 2")
                blocked = asyncio.ensure_future(conn.call(b"BLPOP", b"nothing", 0))
                await asyncio.sleep(0.05)  # written, and blocking in the server
                await asyncio.to_thread(server.stop)
                with pytest.raises(ConnectionError, match="lost the connection"):
                    await blocked
                with pytest.raises(ConnectionError, match="cannot connect"):
                    await conn.call(b"PING")

                await asyncio.to_thread(server.start)  # the same port, its data reloaded
                assert await conn.call(b"GET", b"kept") == b"in db 2"  # SELECTed again
            async with RedisConnection(host="127.0.0.1", port=tcp_port(server)) as db0:
                assert await db0.call(b"GET", b"kept") is None

        run(body)
    finally:
        server.stop()


def drive_by_hand(coro: Coroutine[Any, Any, Any]) -> asyncio.Future[Any]:
    """Run a coroutine as the metadata service runs a command: stepped from
    plain loop callbacks, never inside a task."""
    loop = asyncio.get_running_loop()
    result: asyncio.Future[Any] = loop.create_future()

    def step(_: object = None) -> None:
        assert asyncio.current_task() is None
        try:
            waiting = coro.send(None)
        except StopIteration as stop:
            result.set_result(stop.value)
        except BaseException as exc:
            result.set_exception(exc)
        else:
            if waiting is None:
                loop.call_soon(step)
            else:
                waiting._asyncio_future_blocking = False
                waiting.add_done_callback(step)

    loop.call_soon(step)
    return result


def test_a_reconnect_works_outside_any_task(run: Callable[[Body], None], tmp_path: Path) -> None:
    """Found: after its redis-server restarted, an agent with a redis:// store
    failed every write (0 of 10) until an admin call, which runs in a task,
    happened to reconnect: the connect timeout needed a current task."""
    server = RedisServer(tmp_path, port=0).start()
    try:

        async def body() -> None:
            async with RedisConnection(host="127.0.0.1", port=tcp_port(server)) as conn:
                await conn.call(b"SET", b"k", b"v")
                await asyncio.to_thread(server.stop)
                await asyncio.to_thread(server.start)
                replies = [await drive_by_hand(conn.call(b"INCR", b"n")) for _ in range(10)]
                assert replies == list(range(1, 11))
                assert await drive_by_hand(conn.call(b"GET", b"k")) == b"v"

        run(body)
    finally:
        server.stop()


def test_a_server_still_loading_its_data_is_not_ready_yet(tmp_path: Path) -> None:
    """A restarted server accepts connections before its data is back and
    answers -LOADING meanwhile: that is a ConnectionError (retry), not a failure."""
    server = RedisServer(tmp_path, port=0).start()
    try:

        async def body() -> None:
            fill = ["redis-benchmark", "-p", str(server.port), "-t", "set", "-n", "500000", "-r", "500000",
                    "-P", "200", "-q"]  # enough keys to take a while to load
            await asyncio.to_thread(subprocess.run, fill, check=True, capture_output=True)
            async with RedisConnection(host="127.0.0.1", port=tcp_port(server)) as conn:
                await conn.call(b"SET", b"mine", b"back")
            await asyncio.to_thread(server.stop)  # its append-only file now holds it all
            server.launch()
            seen: list[Exception] = []
            async with RedisConnection(host="127.0.0.1", port=tcp_port(server)) as conn:
                while True:
                    try:
                        assert await conn.call(b"GET", b"mine") == b"back"
                        break
                    except ConnectionError as exc:
                        seen.append(exc)
                        await asyncio.sleep(0.01)
            assert any(isinstance(exc, RedisNotReady) and exc.code == "LOADING" for exc in seen)

        asyncio.run(body())
    finally:
        server.stop()


def test_unix_socket_and_database(run: Callable[[Body], None], tmp_path: Path) -> None:
    with RedisServer(tmp_path, unix_socket=tmp_path / "r.sock") as server:

        async def body() -> None:
            async with RedisConnection(unix_socket=str(server.unix_socket), db=1) as conn:
                assert await conn.transaction([(b"SET", b"u", b"1"), (b"INCR", b"u")]) == [
                    SimpleString("OK"),
                    2,
                ]
                info = cast(bytes, await conn.call(b"CLIENT", b"INFO"))
                assert b" db=1 " in info and str(server.unix_socket).encode() in info
            async with RedisConnection(unix_socket=str(server.unix_socket), db=99) as bad:
                with pytest.raises(RedisReplyError, match="out of range"):
                    await bad.call(b"PING")

        run(body)


def test_close_fails_pending_calls_and_refuses_new_ones(
    run: Callable[[Body], None], tcp: Callable[..., RedisConnection], redis_prefix: str
) -> None:
    async def body() -> None:
        conn = tcp()
        await conn.close()  # never connected: nothing to do
        conn = tcp()
        blocked = asyncio.ensure_future(conn.call(b"BLPOP", f"{redis_prefix}empty", 0))
        await asyncio.sleep(0.05)
        await conn.close()
        with pytest.raises(ConnectionError, match="was closed"):
            await blocked
        with pytest.raises(ConnectionError, match="is closed"):
            await conn.call(b"PING")
        await conn.close()  # idempotent

    run(body)


def test_addresses_are_checked(run: Callable[[Body], None]) -> None:
    with pytest.raises(ValueError, match="either"):
        RedisConnection()
    with pytest.raises(ValueError, match="either"):
        RedisConnection(host="127.0.0.1", unix_socket="/tmp/r.sock")

    async def body(port: int) -> None:
        async with RedisConnection(host="127.0.0.1", port=port) as conn:
            with pytest.raises(ConnectionError, match="cannot connect"):
                await conn.call(b"PING")

    with socket.socket() as bound_not_listening:
        bound_not_listening.bind(("127.0.0.1", 0))
        run(lambda: body(bound_not_listening.getsockname()[1]))
