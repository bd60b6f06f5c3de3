"""Stores that come back: the real agent with a Redis store whose server goes away.

Issue 10 found that after a `redis://` server restarted, no write succeeded
until an admin call happened to reconnect, and that when the agent's own
`redis-server:DIR` died the agent stayed up, closing every request, and
nothing restarted Redis.
"""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest

from client_lib.resp import OK, ErrorReply
from mininet_scenarios.daemons import AgentProcess
from nat_agent.redis_server import RedisServer
from nat_agent.redis_store import RESTARTS_ALLOWED
from tests.integration.agent_probe import ask, redis_child, until_ok

SPACE = "100.64.0.0/10"

pytestmark = pytest.mark.timeout(120)


def test_a_redis_url_store_serves_again_as_soon_as_redis_is_back(tmp_path: Path) -> None:
    with RedisServer(tmp_path / "redis", port=0) as redis, \
            AgentProcess(f"{redis.url}/0?prefix=recovery:", own=[SPACE],
                         log_path=tmp_path / "agent.log") as agent:
        assert ask(agent, b"SET", b"/before", b"1") == OK
        redis.stop()
        reply = ask(agent, b"SET", b"/meanwhile", b"1")
        assert isinstance(reply, ErrorReply) and reply.code == "TRYAGAIN"  # retried by clients
        redis.start()  # the same port, its append-only file reloaded
        assert [ask(agent, b"SET", b"/after/%d" % i, b"1") for i in range(10)] == [OK] * 10
        assert ask(agent, b"GET", b"/before") == b"1"


def test_the_agent_restarts_its_own_redis_server(tmp_path: Path) -> None:
    with AgentProcess(f"redis-server:{tmp_path / 'r'}", own=[SPACE],
                      log_path=tmp_path / "agent.log") as agent:
        for i in range(20):
            assert ask(agent, b"SET", b"/k/%d" % i, b"v%d" % i) == OK
        first = redis_child(agent)
        os.kill(first, signal.SIGKILL)
        failures = until_ok(agent, b"SET", b"/after", b"x")
        assert all(f.code == "TRYAGAIN" for f in failures if isinstance(f, ErrorReply)), failures
        assert redis_child(agent) != first
        assert [ask(agent, b"GET", b"/k/%d" % i) for i in range(20)] == [b"v%d" % i for i in range(20)]
    assert "restarting it from its append-only file" in agent.log()


def test_the_agent_exits_loudly_when_its_redis_server_keeps_dying(tmp_path: Path) -> None:
    agent = AgentProcess(f"redis-server:{tmp_path / 'r'}", own=[SPACE], log_path=tmp_path / "agent.log")
    agent.start()
    try:
        for _ in range(RESTARTS_ALLOWED):
            os.kill(redis_child(agent), signal.SIGKILL)
            until_ok(agent, b"PING")
            until_ok(agent, b"EXISTS", b"/x")  # the store answers again: restarted
        os.kill(redis_child(agent), signal.SIGKILL)
        assert agent.proc is not None
        status = agent.proc.wait(20)
    finally:
        agent.kill()
    assert status == 1
    log = agent.log()
    assert "CRITICAL" in log and f"died {RESTARTS_ALLOWED + 1} times" in log
