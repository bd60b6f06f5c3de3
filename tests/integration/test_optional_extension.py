"""An agent whose compiled extension cannot be imported still serves (issue 23).

Real `metaflow-agent` daemons as subprocesses, each over its own LevelDB
store and owning the whole space. In one, `nat_agent._fastpath` is hidden
by a meta-path finder that a `sitecustomize` on its PYTHONPATH installs
(as if the wheel had no extension): it must say so once at start and
answer SET and GET through the Python path. The other, with the
extension, must answer the same two through the compiled lane. Which path
answered is read from the agent's own counters in INFO, where an operator
reads them: `compiled_requests` counts the lane's answers, ``cmd_get`` and
``cmd_set`` every answer of either path.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from client_lib.constants import DEFAULT_SPACE_CIDR
from mininet_scenarios.daemons import AgentProcess
from nat_agent.extension import PYTHON_PATH_NOTICE

HIDE_EXTENSION = '''\
import sys


class HideExtension:
    """Fail the import of nat_agent._fastpath as a missing file would."""

    def find_spec(self, name, path=None, target=None):
        if name == "nat_agent._fastpath":
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None


sys.meta_path.insert(0, HideExtension())
'''


@pytest.fixture
def without_extension(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Subprocesses started meanwhile cannot import the extension."""
    site = tmp_path / "hide-extension"
    site.mkdir()
    (site / "sitecustomize.py").write_text(HIDE_EXTENSION)
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(site), os.environ.get("PYTHONPATH")])))
    yield


def _set_get_info(agent: AgentProcess) -> dict[str, object]:
    """SET and GET a key, then the agent's INFO."""
    with redis.Redis(agent.host, agent.port, socket_timeout=10) as client:
        assert client.set("/optional-extension", "served") is True
        assert client.get("/optional-extension") == b"served"
        info: dict[str, object] = client.info()
        return info


def _agent(tmp_path: Path) -> AgentProcess:
    """`--fsync always`: the lane takes on writes only where the store
    acknowledges without waiting for a group commit (`batch`, the default)."""
    return AgentProcess(f"leveldb:{tmp_path / 'db'}", "--fsync", "always", own=[DEFAULT_SPACE_CIDR],
                        log_path=tmp_path / "agent.log")


def test_without_the_extension_the_agent_says_so_once_and_serves_through_python(
        tmp_path: Path, without_extension: None) -> None:
    with _agent(tmp_path) as agent:
        info = _set_get_info(agent)
        log = agent.log()
    assert log.count(PYTHON_PATH_NOTICE) == 1, log
    assert "nat_agent._fastpath cannot be imported: No module named 'nat_agent._fastpath'" in log
    assert (info["cmd_set"], info["cmd_get"]) == (1, 1)
    assert "compiled_requests" not in info


def test_with_the_extension_the_compiled_lane_answers(tmp_path: Path) -> None:
    with _agent(tmp_path) as agent:
        info = _set_get_info(agent)
        log = agent.log()
    assert PYTHON_PATH_NOTICE not in log
    assert (info["cmd_set"], info["cmd_get"], info["compiled_requests"]) == (1, 1, 2)
