"""The Prometheus files of deploy/prometheus/ and the Grafana dashboard of
deploy/grafana/ against promtool (Debian's ``prometheus`` package, which
`make setup` installs) and against the metric families the daemons declare
(`client_lib.api.metrics`).

``promtool check`` proves the rules and the scrape configuration are valid;
``promtool test rules`` runs alerts_test.yml, which makes each alert fire on
the series it is about and stay silent before; and every ``metaflow_`` name
the rules query must be one the daemons expose, so a renamed metric cannot
leave an alert that never fires. Every query of every dashboard panel is
parsed by promtool (as a recording rule) and queries declared metrics only.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from client_lib.api import metrics as m

ROOT = Path(__file__).resolve().parents[2]
PROMETHEUS = ROOT / "deploy" / "prometheus"
DASHBOARD = ROOT / "deploy" / "grafana" / "metaflow.json"
PROMTOOL = shutil.which("promtool") or "promtool"


@pytest.mark.parametrize("command", [["check", "rules", "alerts.yml"],
                                     ["check", "config", "prometheus.yml"],
                                     ["test", "rules", "alerts_test.yml"]], ids=" ".join)
def test_promtool_passes(command: list[str]) -> None:
    done = subprocess.run([PROMTOOL, *command], cwd=PROMETHEUS, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "SUCCESS" in done.stdout


def _queried(text: str) -> set[str]:
    """The metric families a text's queries name (a histogram's by its family name)."""
    histograms = {f.name for f in (*m.CONTROLLER, *m.AGENT, *m.SITE_SYNC) if f.kind == "histogram"}
    names = set(re.findall(r"\bmetaflow_[a-z_]+", text))
    return {next((h for h in histograms if name in (f"{h}_bucket", f"{h}_count", f"{h}_sum")), name)
            for name in names}


@pytest.mark.parametrize("path", [PROMETHEUS / "alerts.yml", DASHBOARD], ids=lambda path: path.name)
def test_the_queries_name_only_metrics_the_daemons_expose(path: Path) -> None:
    exposed = {f.name for f in (*m.CONTROLLER, *m.AGENT, *m.SITE_SYNC)}
    queried = _queried(path.read_text())
    assert queried, f"no metaflow_ metric in {path.name}"
    assert queried <= exposed, f"queried but exposed by no daemon: {sorted(queried - exposed)}"


def panel_queries() -> list[tuple[str, str]]:
    """Every query of the dashboard, with its panel's title."""
    panels = json.loads(DASHBOARD.read_text())["panels"]
    return [(panel["title"], target["expr"]) for panel in panels for target in panel.get("targets", [])]


def test_every_panel_query_is_valid_promql(tmp_path: Path) -> None:
    queries = panel_queries()
    assert len(queries) >= 20
    rules = tmp_path / "panels.yml"
    rules.write_text("groups:\n  - name: panels\n    rules:\n" + "".join(
        f"      - record: panel_{i}\n        expr: {json.dumps(expr)}\n"
        for i, (_, expr) in enumerate(queries)))
    done = subprocess.run([PROMTOOL, "check", "rules", str(rules)], capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr
