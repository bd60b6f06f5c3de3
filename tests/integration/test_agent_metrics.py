"""An agent's Prometheus metrics, scraped from a real agent's metrics port.

The requests sent here are counted by command and outcome whichever path
answered them (the compiled lane for a plain SET or GET on LevelDB, on the
worker threads or with ``--workers 0`` on the event loop; the Python path
for the rest, or for all with ``--request-path python``), by exactly what
was sent; the seconds histogram counts each command once, on whichever path
ran it; a metrics port that is taken stops the agent at start; a Redis
store's size is its server's memory; and a paused backup shows as the
primary's replication lag, for as long as it is paused, and as 0 again once
it answers.
"""

from __future__ import annotations

import os
import signal
import socket
import threading
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis
from prometheus_client.parser import text_string_to_metric_families

from client_lib.api import metrics as m
from client_lib.cidr import Block
from client_lib.mdid import mdid
from mininet_scenarios.daemons import AgentProcess
from nat_agent.ports import listen_port
from tests.integration.test_replication import SPACE as REPLICATED
from tests.integration.test_replication import _pair

SPACE = Block.parse("100.64.0.0/10")
HELD = Block.parse("100.64.0.0/11")
FOREIGN = Block.parse("100.96.0.0/11")

pytestmark = pytest.mark.timeout(120)

Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


@pytest.fixture(params=[("compiled", "1"), ("compiled", "0"), ("python", "0")],
                ids=("workers", "event-loop", "python"))
def agent(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[tuple[AgentProcess, int]]:
    """An agent holding `HELD`, with ``--fsync off`` so that the lane takes writes too."""
    port = listen_port()
    path, workers = request.param
    with AgentProcess(f"leveldb:{tmp_path / 'db'}", "--fsync", "off", "--request-path", path,
                      "--workers", workers, "--metrics-port", str(port), own=[str(HELD)],
                      log_path=tmp_path / "agent.log") as proc:
        yield proc, port


def scrape(port: int) -> Samples:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as answer:
        text = answer.read().decode()
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def _paths(block: Block, count: int) -> list[str]:
    return [p for p in (f"/metrics/{i}" for i in range(10_000)) if block.contains(mdid(p, SPACE))][:count]


def _delta(after: Samples, before: Samples, name: str, **labels: str) -> float:
    key = (name, tuple(sorted(labels.items())))
    return after[key] - before.get(key, 0.0)


def test_requests_count_by_command_and_outcome_on_both_paths(agent: tuple[AgentProcess, int]) -> None:
    proc, port = agent
    compiled = proc.argv[proc.argv.index("--request-path") + 1] == "compiled"
    held, foreign = _paths(HELD, 5), _paths(FOREIGN, 2)
    before = scrape(port)
    with redis.Redis(proc.host, proc.port, single_connection_client=True) as r:
        for path in held:
            assert r.set(path, b"v") is True                # the lane's, when compiled
            assert r.get(path) == b"v"                      # the lane's, when compiled
            assert r.set(path, b"w", nx=True, get=True) == b"v"   # always the Python path's (GET)
        for path in foreign:
            with pytest.raises(redis.exceptions.MovedError):
                r.get(path)
    after = scrape(port)
    requests = m.REQUESTS.name
    assert _delta(after, before, requests, command="set", outcome="served") == 10
    assert _delta(after, before, requests, command="get", outcome="served") == 5
    assert _delta(after, before, requests, command="get", outcome="moved") == 2
    assert _delta(after, before, requests, command="get", outcome="error") == 0
    lane = _delta(after, before, m.COMPILED_REQUESTS.name)
    assert lane == (10 if compiled else 0)
    seconds = m.REQUEST_SECONDS.name
    for command, sent in (("set", 10), ("get", 7)):   # the lane's with the Python path's, each once
        assert _delta(after, before, seconds + "_count", command=command) == sent
        assert _delta(after, before, seconds + "_bucket", command=command, le="+Inf") == sent
        assert 0 < _delta(after, before, seconds + "_sum", command=command) < sent * m.REQUEST_BUCKETS[-1]
    assert _delta(after, before, m.CONNECTIONS.name, event="opened") >= 1
    assert after[(m.KEYS.name, ())] == 5
    assert after[(m.STORE_BYTES.name, ())] > 0
    assert after[(m.BLOCKS_HELD.name, (("role", "primary"),))] == 1
    exposed = {name for name, _ in after}
    declared = {f.name for f in m.AGENT}
    assert {name.removesuffix("_bucket").removesuffix("_count").removesuffix("_sum") for name in exposed} \
        <= declared


def test_a_metrics_port_that_is_taken_stops_the_start(tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        proc = AgentProcess(f"leveldb:{tmp_path / 'db'}", "--metrics-port", str(taken.getsockname()[1]),
                            log_path=tmp_path / "agent.log")
        with pytest.raises(RuntimeError, match="exited with 1"):
            proc.start()
        assert "address already in use" in proc.log().lower()


def test_writes_synced_in_groups_show_their_disk_sync_seconds(tmp_path: Path) -> None:
    port = listen_port()
    with AgentProcess(f"leveldb:{tmp_path / 'db'}", "--fsync", "batch", "--metrics-port", str(port),
                      own=[str(HELD)], log_path=tmp_path / "agent.log") as proc:
        before = scrape(port)
        with redis.Redis(proc.host, proc.port, single_connection_client=True) as r:
            for path in _paths(HELD, 5):
                assert r.set(path, b"v") is True   # one at a time: each waits for a sync of its own
        after = scrape(port)
    synced = _delta(after, before, m.DISK_SYNC_SECONDS.name + "_count")
    assert synced >= 5
    assert _delta(after, before, m.DISK_SYNC_SECONDS.name + "_sum") > 0


def test_a_redis_store_is_as_big_as_its_servers_memory(tmp_path: Path, redis_server: str,
                                                        redis_prefix: str) -> None:
    port = listen_port()
    with AgentProcess(f"{redis_server}/0?prefix={redis_prefix}", "--metrics-port", str(port),
                      own=[str(HELD)], log_path=tmp_path / "agent.log") as proc:
        with redis.Redis(proc.host, proc.port, single_connection_client=True) as r:
            for path in _paths(HELD, 5):
                assert r.set(path, b"v" * 1000) is True
        size = scrape(port)[(m.STORE_BYTES.name, ())]
    with redis.Redis.from_url(redis_server) as server:
        used = server.info("memory")["used_memory"]
    assert 0.8 * used < size < 1.2 * used   # the same server, read a moment apart


def test_a_paused_backup_shows_as_replication_lag_until_it_answers(tmp_path: Path,
                                                                    cluster_secret: Path) -> None:
    port = listen_port()
    # A replication timeout far past the pause: the write waits instead of failing the block.
    with AgentProcess(f"leveldb:{tmp_path / 'a'}", "--metrics-port", str(port), "--replication-timeout", "60",
                      own=[str(REPLICATED)], log_path=tmp_path / "a.log", secret_file=cluster_secret) as a, \
            AgentProcess(f"leveldb:{tmp_path / 'b'}", log_path=tmp_path / "b.log",
                         secret_file=cluster_secret) as b:
        _pair(a, b)
        lag, queue = (m.REPLICATION_LAG.name, (("backup", b.replication),)), \
            (m.REPLICATION_QUEUE.name, (("backup", b.replication),))
        with redis.Redis(a.host, a.port, single_connection_client=True) as r:
            assert r.set("/lag/warm", b"v") is True   # the link to b is up: what follows waits on b alone
        assert scrape(port)[lag] == 0
        assert b.proc is not None
        os.kill(b.proc.pid, signal.SIGSTOP)
        paused = time.monotonic()
        try:
            outcome: list[bool | None] = []

            def write() -> None:
                with redis.Redis(a.host, a.port, single_connection_client=True, socket_timeout=60) as r:
                    outcome.append(r.set("/lag/x", b"while paused"))

            writing = threading.Thread(target=write)
            writing.start()
            time.sleep(1.5)
            during = scrape(port)
            assert 1.0 < during[lag] <= time.monotonic() - paused
            assert during[queue] == 1
            time.sleep(0.5)
            assert scrape(port)[lag] > during[lag] + 0.4   # it grows while the backup is paused
        finally:
            os.kill(b.proc.pid, signal.SIGCONT)
        writing.join(30)
        assert outcome == [True]   # acknowledged once the backup had it
        after = scrape(port)
        assert after[lag] == 0 and after[queue] == 0
