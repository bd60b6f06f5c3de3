"""A redis-server started by an agent does not outlive it, even after SIGKILL."""

from __future__ import annotations

import os
import time

from mininet_scenarios.daemons import AgentProcess


def test_killed_agent_takes_its_redis_server_along(tmp_path):
    agent = AgentProcess(f"redis-server:{tmp_path / 'r'}", own=["100.64.0.0/10"]).start()
    children = [int(p) for p in open(f"/proc/{agent.proc.pid}/task/{agent.proc.pid}/children").read().split()]
    redis = [p for p in children if b"redis-server" in open(f"/proc/{p}/cmdline", "rb").read()]
    assert len(redis) == 1
    agent.kill()
    deadline = time.monotonic() + 10
    while os.path.exists(f"/proc/{redis[0]}") and b"redis" in open(f"/proc/{redis[0]}/cmdline", "rb").read():
        assert time.monotonic() < deadline, "redis-server outlived its agent"
        time.sleep(0.1)
