"""Fixtures for the per-server agent's tests: real stores, no mocks.

One redis-server (on a free TCP port) serves the whole session; each test gets
its own key prefix on it, and the prefix's keys are removed afterwards.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from client_lib import MetaFlowClient
from client_lib.api.auth import write_secret
from client_lib.constants import DEFAULT_SPACE_CIDR
from mininet_scenarios.daemons import AgentProcess
from nat_agent.redis_server import RedisServer
from tests.two_servers import HIGH, LOW, route_by_halves


@pytest.fixture(scope="session")
def redis_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """URL (``redis://127.0.0.1:PORT``) of a redis-server shared by the session."""
    with RedisServer(tmp_path_factory.mktemp("redis"), port=0) as server:
        yield server.url


@pytest.fixture
def redis_prefix(redis_server: str) -> Iterator[str]:
    """A key prefix no other test uses; its keys are deleted after the test.

    The prefix is plain ``[0-9a-z:]``, so it is also a literal SCAN pattern.
    """
    prefix = f"t{uuid.uuid4().hex[:12]}:"
    yield prefix
    with redis.Redis.from_url(redis_server) as client:
        doomed = list(client.scan_iter(match=f"{prefix}*", count=1000))
        if doomed:
            client.delete(*doomed)


@pytest.fixture
def leveldb_path(tmp_path: Path) -> Path:
    """A LevelDB directory path that does not exist yet."""
    return tmp_path / "leveldb"


@pytest.fixture
def cluster_secret(tmp_path: Path) -> Path:
    """A secret file for the agents of one test that must trust each other
    (`AgentProcess(secret_file=...)`); without it each gets its own."""
    return write_secret(tmp_path / "cluster.secret")


@pytest.fixture(scope="module")
def standalone_agent(tmp_path_factory: pytest.TempPathFactory) -> Iterator[AgentProcess]:
    """One real agent that owns the whole space (LevelDB), shared by a
    module's tests: give each test keys of its own."""
    store = f"leveldb:{tmp_path_factory.mktemp('standalone') / 'db'}"
    with AgentProcess(store, own=[DEFAULT_SPACE_CIDR]) as agent:
        yield agent


@pytest.fixture(scope="module")
def standalone_client(standalone_agent: AgentProcess) -> Iterator[MetaFlowClient]:
    """A client of `standalone_agent`."""
    with MetaFlowClient(via=f"{standalone_agent.host}:{standalone_agent.port}") as client:
        yield client


@pytest.fixture(scope="module")
def two_servers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[AgentProcess, AgentProcess]]:
    """Two real agents that own one half of the space each (`tests.two_servers`)."""
    base = tmp_path_factory.mktemp("two-servers")
    with AgentProcess(f"leveldb:{base / 'low'}", own=[str(LOW)]) as low, \
            AgentProcess(f"leveldb:{base / 'high'}", own=[str(HIGH)]) as high:
        yield low, high


@pytest.fixture(scope="module")
def two_server_client(two_servers: tuple[AgentProcess, AgentProcess]) -> Iterator[MetaFlowClient]:
    """A client of `two_servers`, routed by MetaDataID as the switches would:
    operations on two keys (a rename across directories) often span two
    servers."""
    low, high = two_servers
    with MetaFlowClient(route=route_by_halves((low.host, low.port), (high.host, high.port))) as client:
        yield client
