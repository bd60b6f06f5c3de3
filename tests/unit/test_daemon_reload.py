"""Each daemon's ``reload``: re-read flags applied to the running daemon, the
live ones taken and the rest named for a restart; a bad value changes nothing.
(SIGHUP reaching it in the running processes is tests/integration/test_supervision.py.)"""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from client_lib.api.auth import write_secret
from client_lib.errors import InvalidArgument
from controller.core import MetaFlowCore
from controller.launcher import reload as reload_controller
from controller.settings import from_args, parser
from nat_agent.daemon import parse_args as agent_args
from nat_agent.daemon import reload as reload_agent


@pytest.fixture
def secret(tmp_path: Path) -> str:
    return str(write_secret(tmp_path / "secret"))


@pytest.fixture(autouse=True)
def _root_level() -> object:
    """The reloads set the root logger's level: put it back."""
    root = logging.getLogger()
    level = root.level
    logging.getLogger().setLevel(logging.INFO)
    yield
    root.setLevel(level)


def test_the_controller_takes_thresholds_and_names_the_rest(secret: str) -> None:
    now = [0.0]
    core = MetaFlowCore(from_args(parser().parse_args(["--secret-file", secret])), lambda: now[0])
    core.world.churn.spend(190)   # of 1,000 keys: 200 a minute allowed, 10 left
    assert core.world.churn.allowance(1000) == 10
    new = parser().parse_args(["--secret-file", secret, "--log-level", "DEBUG", "--heartbeat-timeout", "3",
                               "--load-poll", "2.5", "--imbalance-threshold", "0.3",
                               "--churn-per-minute", "0.3", "--churn-per-rebalance", "0.5", "--no-rebalance",
                               "--space", "10.0.0.0/8", "--rest-port", "18080"])
    outcome = reload_controller(core, new)
    assert outcome.applied == {"log_level": ("INFO", "DEBUG"), "heartbeat_timeout_s": (1.0, 3.0),
                               "load_poll_s": (1.0, 2.5), "imbalance_threshold": (0.1, 0.3),
                               "churn_per_minute": (0.2, 0.3), "churn_per_rebalance": (0.05, 0.5),
                               "rebalance": (True, False)}
    assert outcome.restart == ["rest_port", "space"]
    assert logging.getLogger().level == logging.DEBUG
    assert logging.getLogger("os_ken").level == logging.WARNING   # never chattier than WARNING
    # In force where each is read: the settings every saga reads, the load
    # poll's schedule, the imbalance model, the churn limit.
    assert core.settings is core.world.settings
    assert core.settings.heartbeat_timeout_s == 3.0 and not core.settings.rebalance
    assert str(core.settings.space) == "100.64.0.0/10" and core.settings.rest_port != 18080
    assert core.watch.interval == 2.5 and core.imbalance.threshold == 0.3
    assert core.world.churn.allowance(1000) == 300 - 190   # the new limit, the moves counted before
    now[0] = 61.0
    assert core.world.churn.allowance(1000) == 300
    assert reload_controller(core, new).applied == {}   # the same file again: nothing to do


def test_a_bad_controller_value_changes_nothing(secret: str) -> None:
    core = MetaFlowCore(from_args(parser().parse_args(["--secret-file", secret])))
    before = core.settings
    bad = parser().parse_args(["--secret-file", secret, "--load-poll", "5", "--churn-per-minute", "2"])
    with pytest.raises(InvalidArgument, match="--churn-per-minute"):
        reload_controller(core, bad)
    assert core.settings is before and core.watch.interval == before.load_poll_s


def test_the_agent_takes_its_log_level_and_heartbeat(secret: str) -> None:
    running = agent_args(["--secret-file", secret])
    new = agent_args(["--secret-file", secret, "--log-level", "WARNING", "--heartbeat", "0.5",
                      "--listen", "0.0.0.0:9100", "--workers", "2"])
    outcome = reload_agent(running, new, None)
    assert outcome.applied == {"log_level": ("INFO", "WARNING"), "heartbeat": (0.25, 0.5)}
    assert outcome.restart == ["listen", "workers"]
    assert logging.getLogger().level == logging.WARNING
    assert running.heartbeat == 0.5 and running.listen == ("0.0.0.0", 9000)   # what is in force
    assert reload_agent(running, new, None).applied == {}
