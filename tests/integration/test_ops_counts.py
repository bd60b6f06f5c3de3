"""``POST /ops`` on a real agent: every request it serves for an ID counts
once, in that ID's range, whichever path answered it (the compiled lane for
a plain GET, SET or EXISTS; the Python path for DEL and SET with an option,
and for everything with the Redis store, which has no lane); a MOVED counts
nowhere; the counts leave the window once it has slid past them; and a
range that is empty or outside the space is refused as ``POST /count``
refuses it."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from client_lib.api.admin import ADMIN, CountRequest, OpsReport
from client_lib.cidr import Block
from client_lib.errors import ApiError
from client_lib.mdid import mdid
from mininet_scenarios.daemons import AgentProcess
from nat_agent.ops_meter import OPS_WINDOW_S, SAMPLE_S, Buckets

SPACE = Block.parse("100.64.0.0/10")     # buckets of 64 IDs
HOT = Block.parse("100.64.0.0/12")       # held here: the keys asked for
FOREIGN = Block.parse("100.80.0.0/12")   # not held: MOVED
COLD = Block.parse("100.96.0.0/11")      # held here: a little load
BUCKETS = Buckets.of(SPACE)

pytestmark = pytest.mark.timeout(120)


@pytest.fixture(params=["leveldb", "redis"])
def agent(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[AgentProcess]:
    """An agent holding all but `FOREIGN`; ``--fsync off`` lets the lane take writes too."""
    if request.param == "leveldb":
        store = f"leveldb:{tmp_path / 'db'}"
    else:
        prefix = request.getfixturevalue("redis_prefix")
        store = f"{request.getfixturevalue('redis_server')}/0?prefix={prefix}"
    with AgentProcess(store, "--fsync", "off", own=[str(HOT), str(COLD)],
                      log_path=tmp_path / "agent.log") as proc:
        yield proc


def _paths(block: Block, count: int) -> list[str]:
    """Paths whose IDs fall in `block`, each in a bucket of its own."""
    found: dict[int, str] = {}
    for i in range(100_000):
        ident = mdid(path := f"/ops/{i}", SPACE)
        if block.contains(ident):
            found.setdefault(BUCKETS.index(ident), path)
            if len(found) == count:
                return list(found.values())
    raise AssertionError(f"fewer than {count} paths in {block}")


def _bucket(path: str) -> tuple[int, int]:
    """The inclusive range of the bucket the path's ID counts in."""
    first = BUCKETS.first + (BUCKETS.index(mdid(path, SPACE)) << BUCKETS.shift)
    return first, first + (1 << BUCKETS.shift) - 1


def _span(block: Block) -> tuple[int, int]:
    return block.first, block.last


def test_each_served_request_counts_once_in_its_range(agent: AgentProcess) -> None:
    hot, cold, foreign = _paths(HOT, 5), _paths(COLD, 3), _paths(FOREIGN, 1)
    lane_before = agent.call(ADMIN.stats).service.get("compiled_requests", 0)
    with redis.Redis(agent.host, agent.port, single_connection_client=True) as r:
        for path in hot:
            assert r.set(path, b"v") is True                     # the lane's (a LevelDB store's)
            assert r.get(path) == b"v" and r.exists(path) == 1   # the lane's
            assert r.set(path, b"w", nx=True) is None           # the lane's too (a worker's)
            assert r.set(path, b"w", xx=True, get=True) == b"v"  # the Python path's (GET)
        for path in cold:
            assert r.get(path) is None and r.get(path) is None
        with pytest.raises(redis.exceptions.MovedError):
            r.get(foreign[0])
    lane = agent.call(ADMIN.stats).service.get("compiled_requests", 0) - lane_before
    assert lane == (4 * 5 + 2 * 3 if agent.call(ADMIN.health).store == "leveldb" else 0)

    ranges = [_span(SPACE), _span(HOT), _span(FOREIGN), _span(COLD), *map(_bucket, hot + cold)]
    report = agent.call(ADMIN.ops, CountRequest(ranges))
    assert report.counts == [5 * 5 + 2 * 3, 5 * 5, 0, 2 * 3, *[5] * 5, *[2] * 3]
    assert 0 < report.seconds <= OPS_WINDOW_S

    for bad in [(HOT.last, HOT.first), (SPACE.first - 1, SPACE.first), (SPACE.last, SPACE.last + 1)]:
        with pytest.raises(ApiError, match="empty or outside") as refused:
            agent.call(ADMIN.ops, CountRequest([_span(HOT), bad]))
        assert refused.value.status == 400

    deadline = time.monotonic() + OPS_WINDOW_S + 5 * SAMPLE_S
    while (quiet := _everything(agent)).counts != [0] and time.monotonic() < deadline:
        time.sleep(SAMPLE_S / 2)
    assert quiet.counts == [0] and quiet.seconds <= OPS_WINDOW_S   # the window slid past them


def _everything(agent: AgentProcess) -> OpsReport:
    return agent.call(ADMIN.ops, CountRequest([_span(SPACE)]))
