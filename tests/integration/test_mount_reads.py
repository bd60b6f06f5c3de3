"""The mount's reads on trio (`client_lib.fs.mount_reads`) against real
sockets: the misbehaving peers the blocking client is tested with, a real
agent, and a real redis-server for the central baseline's reads."""

from __future__ import annotations

import socket
import time
from pathlib import Path

import pytest
import trio

from client_lib import BadReply, MetaFlowClient, RetryPolicy, Unavailable, entry_key
from client_lib.fs.central import CentralRecords
from client_lib.fs.mount_reads import CentralReads, TrioMetaFlowClient
from client_lib.resp import moved_message
from mininet_scenarios.daemons import AgentProcess
from tests.integration.resp_peer import Peer, close_after_one, garbage, hang_up, resp, silent, value
from tests.integration.test_client import SLACK, wait_until

FAST = RetryPolicy(attempts=3, base=0.001, cap=0.01)


@pytest.mark.parametrize("behaviour, error, reason, attempts", [
    (silent, Unavailable, "timeout after 0.2 s", FAST.attempts),
    (hang_up, Unavailable, "server closed the connection", FAST.attempts),
    (garbage, BadReply, "unknown reply type", 1),
])
def test_a_misbehaving_peer_fails_the_read_with_the_reason(behaviour, error, reason, attempts) -> None:
    with Peer(behaviour) as peer:
        async def main() -> None:
            client = TrioMetaFlowClient(route=peer.route, timeout=0.2, retry=FAST)
            with pytest.raises(error, match=reason):
                await client.get("/x")
        trio.run(main)
        assert peer.accepted == attempts


def test_a_silent_peer_fails_the_read_by_its_deadline() -> None:
    with Peer(silent) as peer:
        async def main() -> float:
            client = TrioMetaFlowClient(via=peer.via, deadline=0.5)
            started = time.monotonic()
            with pytest.raises(Unavailable, match="deadline 0.5 s"):
                await client.get("/x")
            return time.monotonic() - started
        elapsed = trio.run(main)
        assert 0.45 <= elapsed <= 0.5 + SLACK, elapsed


def test_a_cancelled_read_closes_its_connection_and_the_next_one_opens_another() -> None:
    """A reply may still come on a connection whose read was cancelled: it
    must never be pooled, or the next read would take that reply for its own."""
    with Peer(resp(value, delay=0.3)) as peer:
        async def main() -> TrioMetaFlowClient:
            client = TrioMetaFlowClient(via=peer.via)
            with trio.move_on_after(0.1) as cancelled:
                await client.get("/x")
            assert cancelled.cancelled_caught
            assert await client.get("/x") == b"v"
            client.close()
            return client
        client = trio.run(main)
        assert client.stats.connects == 2 and peer.accepted == 2
        assert wait_until(lambda: peer.open == 0)


def test_an_idle_connection_the_server_closed_is_not_used() -> None:
    with Peer(close_after_one) as peer:
        async def main() -> TrioMetaFlowClient:
            client = TrioMetaFlowClient(via=peer.via)
            assert await client.get("/a") == b"v"
            await trio.sleep(0.1)   # idle: the server closes it
            assert await client.get("/a") == b"v"
            return client
        client = trio.run(main)
        assert client.stats.retries == 0 and client.stats.connects == 2


def test_a_moved_hint_is_followed_at_once() -> None:
    with Peer(resp(value)) as owner:
        moved = moved_message(0x64400001, "127.0.0.1", owner.port)
        with Peer(resp(lambda _c: f"-{moved}\r\n".encode())) as old:
            async def main() -> TrioMetaFlowClient:
                client = TrioMetaFlowClient(via=old.via, retry=RetryPolicy(attempts=3, base=1.0, cap=1.0))
                assert await client.get("/a") == b"v"
                return client
            started = time.monotonic()
            client = trio.run(main)
            assert time.monotonic() - started < 0.5   # no backoff pause
            assert (client.stats.moved, client.stats.hints) == (1, 1)
            assert old.accepted == 1 and owner.accepted == 1


def test_reads_of_a_real_agent_match_the_blocking_client(standalone_agent: AgentProcess,
                                                         standalone_client: MetaFlowClient) -> None:
    via = f"{standalone_agent.host}:{standalone_agent.port}"
    standalone_client.put("/mr/a", b"1")
    standalone_client.put("/mr/d", b"header")
    for name in ("x", "y", "z"):
        standalone_client.create_entry("/mr/d", name, name.encode() * 3)

    async def main() -> None:
        client = TrioMetaFlowClient(via=via)
        assert await client.get("/mr/a") == standalone_client.get("/mr/a") == b"1"
        assert await client.get("/mr/absent") is None
        assert await client.get(entry_key("/mr/d", "y")) == b"yyy"
        connects = client.stats.connects
        reads = [await client.get("/mr/a") for _ in range(20)]
        assert reads == [b"1"] * 20 and client.stats.connects == connects   # the pooled connection
        client.close()
    trio.run(main)


def test_central_reads_see_what_the_central_records_wrote(tmp_path: Path, redis_server: str) -> None:
    host, port = redis_server.removeprefix("redis://").split(":")
    records = CentralRecords(host, int(port))
    directory = f"/cr/{tmp_path.name}"
    records.put(f"{directory}/a", b"value")
    records.put(directory, b"header")
    records.create_entry(directory, "e", b"entry")   # an entry key (with its NUL)

    async def main() -> None:
        reads = CentralReads(host, int(port))
        assert await reads.get(f"{directory}/a") == b"value"
        assert await reads.get(f"{directory}/absent") is None
        assert await reads.get(entry_key(directory, "e")) == b"entry"
        reads.close()
    trio.run(main)
    records.close()


def test_central_reads_of_a_server_that_is_down_are_unavailable() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]   # bound, not listening: refused

        async def main() -> None:
            with pytest.raises(Unavailable, match="central redis-server"):
                await CentralReads("127.0.0.1", port).get("/x")
        trio.run(main)
