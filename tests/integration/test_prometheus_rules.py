"""The Prometheus files of deploy/prometheus/ against promtool (Debian's
``prometheus`` package, which `make setup` installs) and against the metric
families the daemons declare (`client_lib.api.metrics`).

``promtool check`` proves the rules and the scrape configuration are valid;
``promtool test rules`` runs alerts_test.yml, which makes each alert fire on
the series it is about and stay silent before; and every ``metaflow_`` name
the rules query must be one the daemons expose, so a renamed metric cannot
leave an alert that never fires.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

from client_lib.api import metrics as m

ROOT = Path(__file__).resolve().parents[2]
PROMETHEUS = ROOT / "deploy" / "prometheus"
PROMTOOL = shutil.which("promtool") or "promtool"


@pytest.mark.parametrize("command", [["check", "rules", "alerts.yml"],
                                     ["check", "config", "prometheus.yml"],
                                     ["test", "rules", "alerts_test.yml"]], ids=" ".join)
def test_promtool_passes(command: list[str]) -> None:
    done = subprocess.run([PROMTOOL, *command], cwd=PROMETHEUS, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "SUCCESS" in done.stdout


def test_the_rules_query_only_metrics_the_daemons_expose() -> None:
    exposed = {f.name for f in (*m.CONTROLLER, *m.AGENT)}
    queried = set(re.findall(r"\bmetaflow_[a-z_]+", (PROMETHEUS / "alerts.yml").read_text()))
    assert queried, "no metaflow_ metric in the rules"
    assert queried <= exposed, f"queried but exposed by no daemon: {sorted(queried - exposed)}"
