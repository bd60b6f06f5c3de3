"""Port 9000 under clients that try to starve it, against the real daemon.

Each test is one finding of issue 10: a client that pipelines huge replies
and never reads, a request trickled a byte at a time, more slow connections
than `--max-clients`, and keys as long as values. In each, the agent must
stay small and keep serving a well-behaved client.
"""

from __future__ import annotations

import multiprocessing
import select
import socket
import time
from collections.abc import Iterator
from multiprocessing.sharedctypes import Synchronized
from multiprocessing.synchronize import Event as EventType
from pathlib import Path

import pytest

from client_lib.api.admin import ADMIN
from client_lib.resp import OK, PONG, ErrorReply, Reply, RespParser, encode_command
from mininet_scenarios.daemons import AgentProcess

SPACE = "100.64.0.0/10"
MIB = 1 << 20

pytestmark = pytest.mark.timeout(120)


def rss_mib(agent: AgentProcess) -> float:
    """Resident memory of the agent, from /proc (VmRSS is in kB)."""
    assert agent.proc is not None
    with open(f"/proc/{agent.proc.pid}/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    raise AssertionError("no VmRSS")


def read_replies(sock: socket.socket, count: int) -> list[Reply]:
    parser, replies = RespParser(max_bulk=64 * MIB), list[Reply]()
    while len(replies) < count:
        data = sock.recv(1 << 16)
        assert data, f"closed after {len(replies)} replies: {replies}"
        parser.feed(data)
        while (reply := parser.next_reply())[0]:
            replies.append(reply[1])
    return replies


def exchange(agent: AgentProcess, *commands: tuple[bytes, ...], timeout: float = 5.0) -> list[Reply]:
    """Send commands on a fresh connection and return their replies."""
    with socket.create_connection((agent.host, agent.port), timeout=timeout) as sock:
        sock.sendall(b"".join(encode_command(*c) for c in commands))
        return read_replies(sock, len(commands))


def read_until_closed(sock: socket.socket) -> bytes:
    out = b""
    while chunk := sock.recv(65536):
        out += chunk
    return out


WORKERS = pytest.mark.parametrize("workers", ["0", "2"], ids=["event-loop", "worker-threads"])
"""Every finding holds for the port served by the event loop and by `--workers` threads."""


@pytest.fixture(params=["0", "2"], ids=["event-loop", "worker-threads"])
def agent(request, tmp_path: Path) -> Iterator[AgentProcess]:
    with AgentProcess(f"leveldb:{tmp_path / 'db'}", "--read-timeout", "1", "--workers", request.param,
                      own=[SPACE], log_path=tmp_path / "agent.log") as proc:
        yield proc


def test_a_client_that_never_reads_its_replies_cannot_grow_the_agent(agent: AgentProcess) -> None:
    """Found: 1,000 pipelined GETs of a 1 MiB value, never read, took the
    agent to 2 GB. Now it stops answering (and reading) that client once about
    a mebibyte is waiting for it, and serves everyone else meanwhile."""
    assert exchange(agent, (b"SET", b"/big", b"x" * MIB), (b"GET", b"/big"))[1] == b"x" * MIB
    baseline = rss_mib(agent)
    hog = socket.socket()
    hog.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)  # reads nothing, buffers little
    hog.connect((agent.host, agent.port))
    try:
        hog.sendall(encode_command(b"GET", b"/big") * 1000)
        peak = baseline
        deadline = time.monotonic() + 4
        while time.monotonic() < deadline:
            peak = max(peak, rss_mib(agent))
            assert peak - baseline < 64, f"the agent grew from {baseline:.0f} to {peak:.0f} MiB"
            assert exchange(agent, (b"SET", b"/small", b"s"), (b"GET", b"/small")) == [OK, b"s"]
            time.sleep(0.2)
        # It is paused, not forgotten: once it reads, the replies flow again, in order.
        hog.settimeout(10)
        assert read_replies(hog, 50) == [b"x" * MIB] * 50
    finally:
        hog.close()
    assert exchange(agent, (b"PING",)) == [PONG]


def test_a_request_trickled_a_byte_at_a_time_still_meets_its_deadline(agent: AgentProcess) -> None:
    """Found: every byte restarted --read-timeout, so a byte a second held a
    connection for as long as the request was long. The deadline now runs
    from the request's first byte."""
    frame = encode_command(b"SET", b"/slow", b"v" * 200)
    with socket.create_connection((agent.host, agent.port), timeout=10) as sock:
        start = time.monotonic()
        for i in range(len(frame) - 1):  # never the last byte
            if _answered(sock):
                break
            sock.sendall(frame[i:i + 1])
            time.sleep(0.1)
        reply = read_until_closed(sock)
        elapsed = time.monotonic() - start
    assert reply.startswith(b"-ERR timeout: request incomplete after 1 s"), reply
    assert elapsed < 3, f"closed only after {elapsed:.1f} s, for a 1 s deadline"
    assert exchange(agent, (b"GET", b"/slow")) == [None]  # nothing half-stored


@pytest.mark.parametrize("workers", ["0", "1"], ids=["event-loop", "worker"])
def test_a_client_still_sending_at_its_deadline_reads_its_error_not_a_reset(tmp_path: Path,
                                                                            workers: str) -> None:
    """Found (a CI run): closing a socket with bytes of the client's still
    unread makes the kernel send a reset, and the reset can discard the
    timeout error the client had not read yet. The event loop and the
    worker threads half-close after the error and drop what still arrives
    until the client closes. Here the client never stops sending (every
    2 ms, past the deadline), and reads only once it is done."""
    with AgentProcess(f"leveldb:{tmp_path / 'db'}", "--read-timeout", "1", "--workers", workers,
                      own=[SPACE], log_path=tmp_path / "agent.log") as agent:
        for _ in range(3):
            with socket.create_connection((agent.host, agent.port), timeout=10) as sock:
                sock.sendall(b"*3\r\n$3\r\nSET\r\n$5\r\n/slow\r\n$100000\r\n")
                until = time.monotonic() + 1.5
                while time.monotonic() < until:
                    sock.sendall(b"v")
                    time.sleep(0.002)
                reply = read_until_closed(sock)
            assert reply.startswith(b"-ERR timeout: request incomplete after 1 s"), reply


def _answered(sock: socket.socket) -> bool:
    """Whether the agent has sent something or closed (nothing is consumed)."""
    readable, _, _ = select.select([sock], [], [], 0)
    return bool(readable)


class Tricklers:
    """`count` connections that each send one byte of a request a second and
    never finish it; a connection the agent closes is opened again at once,
    as an attacker would. They run in a process of their own. As a thread of
    the test's, a burst of their reconnections could hold the GIL between a
    good client's connect and its send, long enough for the agent (at the
    limit, one reclaim per reconnection) to reclaim the good connection,
    which had sent nothing yet and so was the stalest: the likeliest reading
    of a fresh-clone CI run (4 workers) whose good client was closed after 0
    replies, without the "connection reclaimed" error a reclaimed connection
    with a command read gets. Not reproduced here, also not with the 2 cores
    kept busy."""

    def __init__(self, agent: AgentProcess, count: int) -> None:
        context = multiprocessing.get_context("fork")
        self._reopened = context.Value("i", 0)
        self._stop = context.Event()
        self._process = context.Process(target=_trickle, args=((agent.host, agent.port), count, self._stop,
                                                                self._reopened), daemon=True)

    @property
    def reopened(self) -> int:
        """Connections the agent closed and the tricklers opened again."""
        return int(self._reopened.value)

    def __enter__(self) -> Tricklers:
        self._process.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._process.join(10)
        if self._process.is_alive():
            self._process.kill()
            self._process.join()


TRICKLE_FRAME = encode_command(b"SET", b"/trickle", b"x" * 1000)


def _trickle(address: tuple[str, int], count: int, stop: EventType, reopened: Synchronized) -> None:
    """`Tricklers`' process."""
    def connect() -> socket.socket:
        sock = socket.create_connection(address)
        sock.setblocking(False)
        return sock

    socks = [connect() for _ in range(count)]
    sent = [0] * count
    try:
        while not stop.wait(1.0):
            for n, sock in enumerate(socks):
                try:
                    if _answered(sock):
                        raise ConnectionError("the agent closed it")
                    sock.send(TRICKLE_FRAME[sent[n]:sent[n] + 1])
                    sent[n] += 1
                except OSError:
                    sock.close()
                    socks[n], sent[n] = connect(), 0
                    with reopened.get_lock():
                        reopened.value += 1
    finally:
        for sock in socks:
            sock.close()


EVERY_WORKER_COUNT = pytest.mark.parametrize("workers", ["0", "1", "2", "4"],
                                             ids=["event-loop", "1-worker", "2-workers", "4-workers"])
"""The reclaim at `--max-clients` chooses across the whole agent, whatever serves the port."""

ROUNDS = 3
"""Rounds per case of the reclaim tests: the race they guard against came up
once in a `make test` run, so one round proves little."""


@EVERY_WORKER_COUNT
def test_slow_connections_beyond_max_clients_do_not_lock_out_a_working_client(tmp_path: Path,
                                                                             workers: str) -> None:
    """Found: 4,200 connections sending a byte a second held every slot and
    no good client was served. At the limit, a new connection now reclaims the
    slot of the least recently useful one. Found next (once, in a `make test`
    run, with worker threads): under this churn a good client's new
    connection was reclaimed before its first command was read; now what a
    candidate has sent is read and answered before it is judged."""
    with AgentProcess(f"leveldb:{tmp_path / 'db'}", "--max-clients", "64", "--workers", workers, own=[SPACE],
                      log_path=tmp_path / "agent.log") as agent, Tricklers(agent, 150) as slow:
        time.sleep(1.5)  # every trickler has sent something and holds (or wants) a slot
        waits = []
        for i in range(20 * ROUNDS):
            start = time.monotonic()
            assert exchange(agent, (b"SET", b"/good/%d" % i, b"v"), (b"GET", b"/good/%d" % i)) == [OK, b"v"]
            waits.append(time.monotonic() - start)
            time.sleep(0.1)
        assert max(waits) < 1.0, waits
        assert slow.reopened > 0  # the tricklers were the ones reclaimed
        stats = agent.call(ADMIN.stats).service
    assert stats["reclaimed_connections"] >= 20 * ROUNDS and stats.get("refused_connections", 0) == 0
    assert "reclaiming" in agent.log()


@EVERY_WORKER_COUNT
def test_a_connection_that_has_sent_nothing_yet_outlasts_newer_tricklers(tmp_path: Path,
                                                                          workers: str) -> None:
    """Found (the test above, once in a fresh-clone run with 4 workers): each
    reconnecting trickler reclaimed the oldest connection not yet useful, so
    a good client's connection, between its connect and its command, went
    before the tricklers that came after it. Now connections with an
    incomplete request go first: at a limit of 4, a silent connection
    outlasts the 3 tricklers opened before it and the 3 opened after it, and
    answers when it speaks."""
    limit = 4
    partial = TRICKLE_FRAME[:5]
    with AgentProcess(f"leveldb:{tmp_path / 'db'}", "--max-clients", str(limit), "--workers", workers,
                      own=[SPACE], log_path=tmp_path / "agent.log") as agent:
        address = (agent.host, agent.port)
        def trickler() -> socket.socket:
            sock = socket.create_connection(address, timeout=5)
            sock.sendall(partial)
            time.sleep(0.02)  # accepted and read, in this order
            return sock

        for _ in range(ROUNDS):
            opened = [trickler() for _ in range(limit - 1)]
            try:
                silent = socket.create_connection(address, timeout=5)
                opened.append(silent)
                time.sleep(0.02)
                opened += [trickler() for _ in range(limit)]   # at the limit: each reclaims one
                silent.sendall(encode_command(b"PING"))
                assert read_replies(silent, 1) == [PONG], "the silent connection was reclaimed"
            finally:
                for sock in opened:
                    sock.close()
            time.sleep(0.2)  # the agent sees them closed
        stats = agent.call(ADMIN.stats).service
    assert stats["reclaimed_connections"] >= limit * ROUNDS and stats.get("refused_connections", 0) == 0


@EVERY_WORKER_COUNT
def test_at_the_limit_the_stalest_connection_anywhere_in_the_agent_goes_first(tmp_path: Path,
                                                                             workers: str) -> None:
    """Found: each worker thread reclaimed among its own connections only, so
    a newcomer taken by one worker cost a working connection there while an
    idle one sat on another worker (or, with none of its own, was refused).
    Now the idle connection goes, whichever worker holds it."""
    limit = 8
    with AgentProcess(f"leveldb:{tmp_path / 'db'}", "--max-clients", str(limit), "--workers", workers,
                      own=[SPACE], log_path=tmp_path / "agent.log") as agent:
        for _ in range(ROUNDS * 3):
            address = (agent.host, agent.port)
            idle = socket.create_connection(address, timeout=5)
            time.sleep(0.05)  # so that the working ones were useful later
            working = [socket.create_connection(address, timeout=5) for _ in range(limit - 1)]
            try:
                for sock in working:
                    sock.sendall(encode_command(b"PING"))
                    assert read_replies(sock, 1) == [PONG]
                assert exchange(agent, (b"PING",)) == [PONG]  # the newcomer
                assert idle.recv(1) == b"", "the idle connection should have been the one reclaimed"
                for sock in working:
                    sock.sendall(encode_command(b"PING"))
                    assert read_replies(sock, 1) == [PONG], "a working connection was reclaimed"
            finally:
                idle.close()
                for sock in working:
                    sock.close()
            time.sleep(0.2)  # the agent sees them closed
        stats = agent.call(ADMIN.stats).service
    assert stats.get("refused_connections", 0) == 0


def test_keys_are_held_to_their_own_limit_at_the_header(agent: AgentProcess) -> None:
    """Found: keys shared the 1 MiB value limit, so clients streaming 1 MiB
    keys slowed everyone. A key header over 4,096 bytes is refused before the
    key is read; its bytes are skipped and the connection stays usable."""
    with socket.create_connection((agent.host, agent.port), timeout=5) as sock:
        sock.sendall(b"*2\r\n$3\r\nGET\r\n$1000000\r\n")
        first = sock.recv(1000)  # answered at the header, before any of the key
        assert first.startswith(b"-ERR argument 1 of 'get' of 1000000 bytes exceeds the limit of 4096")
        baseline = rss_mib(agent)
        for _ in range(100):
            sock.sendall(b"/" * 10_000)
        sock.sendall(b"\r\n" + encode_command(b"SET", b"/k", b"v" * 100_000) + encode_command(b"GET", b"/k"))
        assert read_replies(sock, 2) == [OK, b"v" * 100_000]
        assert rss_mib(agent) - baseline < 16
    assert exchange(agent, (b"SET", b"/" + b"k" * 4095, b"at the limit"))[0] == OK
    reply = exchange(agent, (b"SET", b"/" + b"k" * 4096, b"v"))[0]
    assert isinstance(reply, ErrorReply) and "exceeds the limit of 4096" in reply.message
