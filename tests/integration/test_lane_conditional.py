"""The worker threads' conditional writes (`FastLane.conditional`: SET with
NX, XX or IFEQ, DEL, DELIFEQ, ECREATE) against the Python path, their
oracle, on real agents.

One agent serves its port from a worker thread (the compiled path takes
these commands), the other from its event loop (whose lane leaves them to
the Python path). Both get the same random streams, pipelined and cut into
random chunks so that turn boundaries fall anywhere: every reply and every
record afterwards must be the same. Then clients that increment one counter
by compare-and-set, half through the compiled path and half through the
Python path (the GET option sends a SET there), on one agent at once: an
increment is lost if two of them ever both win on the same old value.

The same streams again with each agent the primary of a set of two: the
worker's plain SETs then go through its turns' RMSETs (`Replicator.begin_turn`),
the event loop's through the Python replicator's RSETs; the replies, and
both backups' records afterwards, must be the same.

And redis-benchmark's SETs and DELs of a few keys over four workers at once:
every reply a count, and the agent's key total the records there are.
"""

from __future__ import annotations

import itertools
import re
import socket
import subprocess
import threading
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from client_lib.api.admin import ADMIN, AssignRequest, Role
from client_lib.api.metrics import COMPILED_REQUESTS
from client_lib.cidr import Block
from client_lib.constants import DEFAULT_SPACE_CIDR
from client_lib.resp import OK, Reply, RespParser, encode_command
from mininet_scenarios.daemons import AgentProcess, private_secret
from nat_agent.ports import listen_port
from tests.integration.agent_probe import stored_records

PREFIXES = itertools.count()
METRICS_PORT = listen_port()
NAMES = [b"x", b"y"]
VALUES = [b"1", b"2", b"3"]
KEYS = [b"a", b"b", b"d", b"d\0x", b"d\0y"]   # below the example's own prefix; d is a directory

op = st.one_of(
    st.tuples(st.sampled_from(["SET", "NX", "XX", "GET", "EXISTS", "DEL"]), st.sampled_from(KEYS),
              st.sampled_from(VALUES)),
    st.tuples(st.sampled_from(["IFEQ"]), st.sampled_from(KEYS), st.sampled_from(VALUES),
              st.sampled_from(VALUES)),
    st.tuples(st.just("DELIFEQ"), st.sampled_from(KEYS), st.sampled_from(VALUES)),
    st.tuples(st.just("ECREATE"), st.sampled_from(NAMES), st.sampled_from(VALUES)),
    st.tuples(st.just("ERMDIR")))
ops = st.lists(op, min_size=1, max_size=25)
plain_set = st.tuples(st.just("SET"), st.sampled_from(KEYS), st.sampled_from(VALUES))
replicated_ops = st.lists(st.one_of(op, plain_set, plain_set), min_size=1, max_size=25)
"""Mostly plain SETs: several in one turn make an RMSET of several records."""


def command(op: tuple, prefix: bytes) -> bytes:
    name, *args = op
    key = prefix + args[0] if args and name != "ECREATE" else b""
    if name == "SET":
        return encode_command(b"SET", key, args[1])
    if name in ("NX", "XX"):
        return encode_command(b"SET", key, args[1], name.encode())
    if name == "IFEQ":
        return encode_command(b"SET", key, args[2], b"IFEQ", args[1])
    if name in ("GET", "EXISTS", "DEL"):
        return encode_command(name.encode(), key)
    if name == "DELIFEQ":
        return encode_command(b"DELIFEQ", key, args[1])
    if name == "ECREATE":
        return encode_command(b"ECREATE", prefix + b"d", args[0], args[1])
    return encode_command(b"ERMDIR", prefix + b"d")


def replies(agent: AgentProcess, chunks: list[bytes], count: int) -> list[Reply]:
    """Send each chunk (a pause between), then read `count` replies."""
    with socket.create_connection((agent.host, agent.port), timeout=10) as sock:
        for chunk in chunks:
            sock.sendall(chunk)
            time.sleep(0.001)
        parser, out = RespParser(), list[Reply]()
        while len(out) < count:
            done, reply = parser.next_reply()
            if done:
                out.append(reply)
                continue
            data = sock.recv(65536)
            assert data, f"the agent closed after {len(out)} of {count} replies"
            parser.feed(data)
        return out


@pytest.fixture(scope="module")
def agents(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[AgentProcess, AgentProcess]]:
    base = tmp_path_factory.mktemp("conditional")
    with AgentProcess(f"leveldb:{base / 'compiled'}", "--workers", "1", "--metrics-port", str(METRICS_PORT),
                      own=[DEFAULT_SPACE_CIDR]) as compiled, \
            AgentProcess(f"leveldb:{base / 'python'}", "--workers", "0", own=[DEFAULT_SPACE_CIDR]) as python:
        yield compiled, python


@given(stream=ops, cuts=st.lists(st.integers(0, 25), max_size=4))
@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
def test_conditional_writes_answer_as_the_python_path(agents: tuple[AgentProcess, AgentProcess],
                                                     stream: list[tuple], cuts: list[int]) -> None:
    prefix = b"/c%d/" % next(PREFIXES)
    frames = [command(op, prefix) for op in stream]
    frames += [encode_command(b"GET", prefix + key) for key in KEYS]   # the records afterwards
    bounds = sorted({0, len(frames), *(c % (len(frames) + 1) for c in cuts)})
    chunks = [b"".join(frames[a:b]) for a, b in itertools.pairwise(bounds)]
    compiled, python = (replies(agent, chunks, len(frames)) for agent in agents)
    differ = [(op, c, p) for op, c, p in zip(stream, compiled, python, strict=False) if c != p]
    assert compiled == python, differ


def test_compare_and_set_through_both_paths_loses_no_increment(
        agents: tuple[AgentProcess, AgentProcess]) -> None:
    compiled, _ = agents
    key = b"/counter/%d" % time.monotonic_ns()
    won = [0, 0]

    def client(index: int, python_path: bool) -> None:
        with socket.create_connection((compiled.host, compiled.port), timeout=10) as sock:
            parser = RespParser()

            def ask(frame: bytes) -> Reply:
                sock.sendall(frame)
                while True:
                    done, reply = parser.next_reply()
                    if done:
                        return reply
                    parser.feed(sock.recv(65536))
            get = [b"GET"] if python_path else []   # the GET option: a SET the lane leaves to Python
            for _ in range(150):
                old = ask(encode_command(b"GET", key))
                assert old is None or isinstance(old, bytes), old
                new = b"%d" % (int(old) + 1 if old is not None else 1)
                if old is None:
                    reply = ask(encode_command(b"SET", key, new, b"NX", *get))
                    written = reply is None if python_path else reply is not None
                else:
                    reply = ask(encode_command(b"SET", key, new, b"IFEQ", old, *get))
                    written = reply == old if python_path else reply is not None
                won[index] += written

    threads = [threading.Thread(target=client, args=(n % 2, n % 2 == 1)) for n in range(6)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(120)
    with socket.create_connection((compiled.host, compiled.port), timeout=10) as sock:
        sock.sendall(encode_command(b"GET", key))
        parser = RespParser()
        while not (got := parser.next_reply())[0]:
            parser.feed(sock.recv(65536))
    assert all(won), f"both paths must have won some increments: {won}"
    counter = got[1]
    assert isinstance(counter, bytes) and int(counter) == sum(won), \
        f"{sum(won)} increments won, the counter says {counter!r}"


@pytest.mark.parametrize("fsync", ["off", "batch"])
def test_sets_and_dels_of_the_same_keys_on_every_thread_keep_the_count_true(tmp_path: Path,
                                                                            fsync: str) -> None:
    """redis-benchmark SETs and DELs 20 keys from 50 connections over 4
    workers: a worker's turn lands its batch with the GIL released and
    counts it after, and a DEL on another thread (a worker's conditional
    path, or the event loop's under ``batch``) once found a record in
    between. Its reply was then an internal error (the index had no such
    record to uncount), and the key count one too high for good. Every
    reply must be a count, and the agent's key total the records there are."""
    with AgentProcess(f"leveldb:{tmp_path / 'db'}", "--workers", "4", "--fsync", fsync,
                      own=[DEFAULT_SPACE_CIDR]) as agent:
        common = ["redis-benchmark", "-h", agent.host, "-p", str(agent.port), "-c", "25", "-n", "100000",
                  "-r", "20", "-q"]
        runs = [subprocess.Popen([*common, command, "/k__rand_int__", *value], stdout=subprocess.PIPE,
                                 stderr=subprocess.STDOUT, text=True)
                for command, value in (("SET", ["v"]), ("DEL", []))]
        outputs = [run.communicate(timeout=300)[0] for run in runs]
        assert not any("Error" in out for out in outputs), outputs
        there = replies(agent, [b"".join(encode_command(b"EXISTS", b"/k%012d" % n) for n in range(20))], 20)
        assert agent.call(ADMIN.health).keys == there.count(1), there


def test_the_lane_answers_them(agents: tuple[AgentProcess, AgentProcess]) -> None:
    """The compiled agent's lane, not its Python path, answers them: its
    compiled-request counter moves by each one."""
    compiled, _ = agents
    before = _compiled_requests()
    frames = [encode_command(b"SET", b"/lane/k", b"1", b"NX"),
              encode_command(b"SET", b"/lane/k", b"2", b"IFEQ", b"1"),
              encode_command(b"DELIFEQ", b"/lane/k", b"2"),
              encode_command(b"SET", b"/lane/d", b"header"),
              encode_command(b"ECREATE", b"/lane/d", b"e", b"v"),
              encode_command(b"DEL", b"/lane/d\0e")]
    for frame in frames:   # one at a time: none meets a write of its own turn
        assert replies(compiled, [frame], 1) in ([OK], [1])
    assert _compiled_requests() - before == len(frames)


def _compiled_requests() -> int:
    text = urllib.request.urlopen(f"http://127.0.0.1:{METRICS_PORT}/metrics", timeout=10).read().decode()
    found = re.search(rf"^{COMPILED_REQUESTS.name} (\S+)$", text, re.M)
    assert found, text[:2000]
    return int(float(found.group(1)))


def test_replicated_streams_answer_as_the_python_path_and_leave_the_same_backups(tmp_path: Path) -> None:
    space = Block.parse(DEFAULT_SPACE_CIDR)
    secret = private_secret()
    sides = []
    try:
        for side, workers in (("compiled", "1"), ("python", "0")):
            primary = AgentProcess(f"leveldb:{tmp_path / side}", "--workers", workers, own=[str(space)],
                                   secret_file=secret, log_path=tmp_path / f"{side}.log")
            backup = AgentProcess(f"leveldb:{tmp_path / side}-backup", secret_file=secret,
                                  log_path=tmp_path / f"{side}-backup.log")
            sides.append((primary.launch(), backup.launch()))
        for primary, backup in sides:
            primary.wait_ready()
            backup.wait_ready()
            members = [primary.member(), backup.member(True)]
            backup.call(ADMIN.assign, AssignRequest([Role(space, 1, False, members)]))
            primary.call(ADMIN.assign, AssignRequest([Role(space, 1, True, members)]))

        @given(stream=replicated_ops, cuts=st.lists(st.integers(0, 25), max_size=4))
        @settings(max_examples=40, deadline=None)
        def check(stream: list[tuple], cuts: list[int]) -> None:
            prefix = b"/r%d/" % next(PREFIXES)
            frames = [command(op, prefix) for op in stream]
            frames += [encode_command(b"GET", prefix + key) for key in KEYS]
            bounds = sorted({0, len(frames), *(c % (len(frames) + 1) for c in cuts)})
            chunks = [b"".join(frames[a:b]) for a, b in itertools.pairwise(bounds)]
            compiled, python = (replies(primary, chunks, len(frames)) for primary, _ in sides)
            differ = [(op, c, p) for op, c, p in zip(stream, compiled, python, strict=False) if c != p]
            assert compiled == python, differ

        check()
        turns = sides[0][0].call(ADMIN.stats).service.get("replication_worker_records", 0)
        assert turns > 0, "the compiled primary's SETs did not go through its turns"
    finally:
        for pair in sides:
            for agent in pair:
                agent.terminate()
        for pair in sides:
            for agent in pair:
                assert agent.stop() == 0, agent.log()[-2000:]
        secret.unlink()
    compiled, python = (stored_records(tmp_path / f"{side}-backup", space) for side in ("compiled", "python"))
    assert compiled == python
    assert compiled == stored_records(tmp_path / "compiled", space)
