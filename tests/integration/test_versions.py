"""`--version` on every command, run as the console scripts run them."""

from __future__ import annotations

import subprocess
import sys

import pytest

from client_lib.version import version
from mininet_scenarios.daemons import ROOT

COMMANDS = {
    "metaflowctl": "controller.ctl",
    "metaflow-controller": "controller.launcher",
    "metaflow-agent": "nat_agent.daemon",
    "metaflow-lookupd": "benchmarks.baselines.lookupd",
}


@pytest.mark.parametrize("prog", sorted(COMMANDS))
def test_version(prog: str) -> None:
    out = subprocess.run([sys.executable, "-m", COMMANDS[prog], "--version"], cwd=ROOT,
                         capture_output=True, text=True, timeout=60)
    assert (out.returncode, out.stdout, out.stderr) == (0, f"{prog} {version()}\n", "")
    assert version() != "unknown"   # the venv has the distribution installed
