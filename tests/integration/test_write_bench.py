"""`benchmarks.write_bench`'s driver against real redis-servers, and its report.

The driver is ours (redis-benchmark cannot send a WAIT after each write), so
it is checked against the real thing: each write followed by ``WAIT 1 0``
is on the replica once the driver returns, and an error reply stops it.
"""

from __future__ import annotations

import subprocess
import time
from pathlib import Path

import pytest

from benchmarks.write_bench import ROW_NAMES, TARGETS, drive, format_report
from nat_agent.redis_server import RedisServer

pytestmark = pytest.mark.timeout(120)


def _dbsize(port: int) -> int:
    out = subprocess.run(["redis-cli", "-p", str(port), "DBSIZE"], capture_output=True, text=True,
                         check=True, timeout=10)
    return int(out.stdout)


def test_the_driver_waits_for_the_replica_and_stops_at_an_error(tmp_path: Path) -> None:
    with RedisServer(tmp_path / "primary", port=0, appendfsync="always") as primary, \
            RedisServer(tmp_path / "replica", port=0, replica_of=primary.port, appendonly=False) as replica:
        assert primary.port is not None and replica.port is not None
        deadline = time.monotonic() + 30
        while "master_link_status:up" not in subprocess.run(
                ["redis-cli", "-p", str(replica.port), "INFO", "replication"],
                capture_output=True, text=True, check=True).stdout:
            assert time.monotonic() < deadline, "the replica never connected"
            time.sleep(0.1)
        rate = drive(("127.0.0.1", primary.port), 2_000, wait=True, clients=8)
        assert rate > 0
        # Every write was acknowledged by the replica before the driver went on.
        assert _dbsize(replica.port) == _dbsize(primary.port) > 0
        with pytest.raises(RuntimeError, match="READONLY"):
            drive(("127.0.0.1", replica.port), 10, wait=False, clients=1)


def test_the_report_judges_every_row_against_its_target() -> None:
    rows = {row: {"agent_set": 1.0, "redis_set": 1.0, "set_ratio": TARGETS[row] - 0.01,
                  "agent_cpu_us_per_set": 12.0, "redis_cpu_us_per_set": 15.5} for row in ROW_NAMES}
    rows["off"]["set_ratio"] = TARGETS["off"]
    report = format_report({"rounds": 1, "requests": 10, "rows": rows})
    assert report.count("(MISSED)") == 2 and report.count("(met)") == 1
    assert "measured 12.0 µs (MISSED" in report and "spent 15.5 µs on the same SETs" in report
    assert "| 12.0 / 15.5 |" in report
