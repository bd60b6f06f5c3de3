"""``--fsync`` on the real agent: its syscalls under strace, and what a power cut leaves.

Issue 11 found that the stores were not durable across a power loss: LevelDB
writes were never synced (3,859 acknowledged SETs, 0 fsync), and the Redis
store ran ``appendfsync everysec``.
"""

from __future__ import annotations

import math
import re
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TypeVar

import pytest

from mininet_scenarios.daemons import AgentProcess
from nat_agent.store import FSYNC_MODES
from tests.integration.agent_probe import ask, redis_child, set_all
from tests.integration.power_loss import LoopDisk

T = TypeVar("T")

SPACE = "100.64.0.0/10"
SPECS = {"leveldb": "leveldb:{}", "redis": "redis-server:{}"}

pytestmark = pytest.mark.timeout(180)

_SYNC_CALL = re.compile(rb"\b(?:fsync|fdatasync)\(")


def agent(kind: str, mode: str, directory: Path, log: Path) -> AgentProcess:
    return AgentProcess(SPECS[kind].format(directory), "--fsync", mode, own=[SPACE], log_path=log)


def store_pids(running: AgentProcess, kind: str) -> list[int]:
    """The processes that write the store: the agent, and its redis-server."""
    assert running.proc is not None
    return [running.proc.pid, *([redis_child(running)] if kind == "redis" else [])]


def syncs_during(pids: list[int], work: Callable[[], T], trace: Path) -> tuple[int, float, T]:
    """fsync and fdatasync calls made by ``pids`` (every thread, and threads
    they start) while ``work`` runs; also the seconds it took, and its result."""
    argv = ["strace", "-f", "-e", "trace=fsync,fdatasync", "-o", str(trace)]
    tracer = subprocess.Popen([*argv, *(arg for pid in pids for arg in ("-p", str(pid)))],
                              stderr=subprocess.PIPE)
    try:
        assert tracer.stderr is not None
        for _ in pids:  # "strace: Process N attached [with K threads]", once per -p
            line = tracer.stderr.readline()
            assert b"attached" in line, line
        started = time.monotonic()
        result = work()
        elapsed = time.monotonic() - started
    finally:
        tracer.send_signal(signal.SIGINT)  # detaches, leaving the processes running
        tracer.communicate(timeout=30)
    return len(_SYNC_CALL.findall(trace.read_bytes())), elapsed, result


def writes(prefix: str, count: int, rounds: int = 1) -> list[tuple[bytes, bytes]]:
    """``count`` keys, each written ``rounds`` times (all keys once per round)."""
    return [(b"/%s/%d" % (prefix.encode(), i), b"v%d-%d" % (r, i))
            for r in range(rounds) for i in range(count)]


LONE = 100
"""Writes made one at a time: each needs a sync of its own."""
CLIENTS = 25
CROWD = 200
"""Writes made by CLIENTS connections at once, CROWD / CLIENTS rounds."""


@pytest.mark.parametrize("mode", FSYNC_MODES)
@pytest.mark.parametrize("kind", sorted(SPECS))
def test_syncs_per_write(kind: str, mode: str, tmp_path: Path) -> None:
    """always: a sync per write, or per turn of a worker; batch: a sync per
    lone write, and concurrent writes share; off: none (Redis's everysec:
    about one a second).

    Redis runs ``appendfsync always`` for both always and batch: one fsync per
    round of its event loop, for the writes that arrived by then, so how many
    concurrent writes share one depends on timing (more, the slower the disk);
    only its bounds are certain: at least one per round of writes (each waits
    for its sync before the next round is sent), at most one per write. The
    agent's worker threads do the same under always, with the extension's
    LevelDB: a turn's SETs are one synced batch."""
    with agent(kind, mode, tmp_path / "store", tmp_path / "agent.log") as running:
        pids = store_pids(running, kind)
        lone_items, crowd_items = writes("lone", LONE), writes("crowd", CROWD)
        lone, lone_secs, lone_acked = syncs_during(
            pids, lambda: set_all(running, lone_items, clients=1), tmp_path / "lone.strace")
        crowd, crowd_secs, crowd_acked = syncs_during(
            pids, lambda: set_all(running, crowd_items, clients=CLIENTS), tmp_path / "crowd.strace")
    assert (lone_acked, crowd_acked) == (lone_items, crowd_items)
    print(f"{kind} --fsync {mode}: {lone} syncs for {LONE} lone writes ({lone_secs:.2f} s), "
          f"{crowd} for {CROWD} writes by {CLIENTS} clients ({crowd_secs:.2f} s)")
    if mode == "off":
        if kind == "leveldb":
            assert (lone, crowd) == (0, 0)
        else:
            assert lone <= math.ceil(lone_secs) + 1 and crowd <= math.ceil(crowd_secs) + 1
        return
    assert lone >= LONE
    if kind == "redis" or mode == "always":
        assert CROWD // CLIENTS <= crowd <= CROWD
    else:
        assert CROWD // CLIENTS <= crowd < CROWD // 4


@pytest.fixture
def short_dir() -> Iterator[Path]:
    """A directory with a short path: a redis-server's socket path inside a
    mount inside pytest's tmp_path would pass the 107-byte limit."""
    path = Path(tempfile.mkdtemp(prefix="mf-pl-"))
    yield path
    shutil.rmtree(path)


@pytest.mark.parametrize("mode", ["always", "batch"])
@pytest.mark.parametrize("kind", sorted(SPECS))
def test_acknowledged_writes_survive_a_power_cut(kind: str, mode: str, tmp_path: Path,
                                                 short_dir: Path) -> None:
    """Every acknowledged SET is on the disk a power cut leaves behind, with
    the last value acknowledged for its key (`power_loss` says how the cut is
    made). With ``off``, the same run loses the LevelDB writes not yet written
    back (benchmarks/bench_fsync.py shows how many)."""
    items = writes("cut", 150, rounds=2)
    with LoopDisk(tmp_path / "disk.img", short_dir / "d") as disk:
        running = agent(kind, mode, disk.mountpoint / "s", tmp_path / "agent.log").start()
        try:
            acknowledged = set_all(running, items, clients=20)
            disk.crash_image(tmp_path / "after-cut.img")  # the agent still runs: nothing was closed
        finally:
            running.kill()
    assert acknowledged == items
    expected = dict(acknowledged)  # the last acknowledged value of each key

    with (LoopDisk(tmp_path / "after-cut.img", short_dir / "a", existing=True) as after,
          agent(kind, "off", after.mountpoint / "s", tmp_path / "reopened.log") as reopened):
        found = {key: ask(reopened, b"GET", key) for key in expected}
    lost = sorted(key for key, value in expected.items() if found[key] != value)
    assert not lost, f"{len(lost)} of {len(expected)} acknowledged keys lost, e.g. {lost[:5]}"
