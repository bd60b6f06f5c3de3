"""A real Prometheus server (Debian's ``prometheus``) scraping a real agent
and a real controller, with the alert rules of deploy/prometheus/ loaded.

No fabric here (that is the Mininet run's): the controller has no switch and
no server, the agent holds a block on its own. What is checked is what a
fabric does not change: Prometheus takes both exporters' pages, loads the
rules, the request counts it stores agree exactly with what the client sent
(by command and outcome), and every dashboard panel that does not need a
fabric returns data for its query. And a controller whose metrics port is
taken exits 1 at start.
"""

from __future__ import annotations

import json
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import redis

from client_lib.api import metrics as m
from client_lib.api.auth import write_secret
from client_lib.cidr import Block
from client_lib.mdid import mdid
from mininet_scenarios.daemons import ROOT, AgentProcess
from nat_agent.ports import listen_port
from tests.integration.test_prometheus_rules import PROMETHEUS, panel_queries

SPACE = Block.parse("100.64.0.0/10")
HELD = Block.parse("100.64.0.0/11")
FOREIGN = Block.parse("100.96.0.0/11")
NEED_A_FABRIC = {
    "Table budget in use per switch", "Flow mods sent per second", "Barrier round trip (p50, p99)",
    "Keys per server", "Load per server", "Operations ended (per 5 minutes)", "Operation seconds (p90)",
    "Operations running", "Replication lag by backup"}
"""Dashboard panels about switches, servers, operations or backups, which this run has none of
(a backup's lag is scraped with one in test_agent_metrics.py, and in the Mininet run)."""

pytestmark = pytest.mark.timeout(180)


def _controller(tmp_path: Path, metrics_port: int) -> subprocess.Popen[bytes]:
    secret = write_secret(tmp_path / "controller-secret")
    log = open(tmp_path / "controller.log", "wb")
    return subprocess.Popen([sys.executable, "-m", "controller.launcher", "--secret-file", str(secret),
                             "--of-port", str(listen_port()), "--rest-port", str(listen_port()),
                             "--metrics-port", str(metrics_port)], cwd=ROOT, stdout=log, stderr=log)


def _stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


class Prometheus:
    """A Prometheus server of its own, scraping `targets` (job: its host:port
    addresses) every second, with the alert rules of `rules`."""

    def __init__(self, tmp_path: Path, targets: dict[str, list[str]],
                 rules: Path = PROMETHEUS / "alerts.yml") -> None:
        tmp_path.mkdir(parents=True, exist_ok=True)
        shutil.copy(rules, tmp_path / "alerts.yml")
        config = tmp_path / "prometheus.yml"
        config.write_text(json.dumps({   # YAML is a superset of JSON
            "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
            "rule_files": ["alerts.yml"],
            "scrape_configs": [{"job_name": job, "static_configs": [{"targets": addresses}]}
                               for job, addresses in targets.items()]}))
        self.url = f"http://127.0.0.1:{listen_port()}"
        self.log = open(tmp_path / "prometheus.log", "wb")
        self.proc = subprocess.Popen(
            [shutil.which("prometheus") or "prometheus", f"--config.file={config}",
             f"--storage.tsdb.path={tmp_path / 'tsdb'}", f"--web.listen-address={self.url[7:]}"],
            stdout=self.log, stderr=self.log)

    def api(self, path: str, **params: str) -> object:
        query = f"?{urllib.parse.urlencode(params)}" if params else ""
        with urllib.request.urlopen(f"{self.url}/api/v1/{path}{query}", timeout=10) as answer:
            body = json.loads(answer.read())
        assert body["status"] == "success", body
        return body["data"]

    def query(self, expr: str) -> list[dict[str, object]]:
        data = self.api("query", query=expr)
        assert isinstance(data, dict)
        return list(data["result"])

    def value(self, expr: str) -> float | None:
        result = self.query(expr)
        return float(result[0]["value"][1]) if result else None  # type: ignore[index]

    def until(self, expr: str, want: float | Callable[[], float], timeout: float = 30.0) -> float | None:
        """Poll `expr` until it equals `want` (or the time is up); its last
        value. A callable `want` is asked again at each poll: a count that
        may still grow elsewhere (the controller's own view, say)."""
        deadline = time.monotonic() + timeout
        while True:
            try:
                got = self.value(expr)
            except OSError:
                got = None   # not listening yet
            if got == (want() if callable(want) else want) or time.monotonic() > deadline:
                return got
            time.sleep(0.5)

    def close(self) -> None:
        self.proc.terminate()
        self.proc.wait(30)
        self.log.close()


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[tuple[Prometheus, AgentProcess]]:
    agent_metrics, controller_metrics = listen_port(), listen_port()
    controller = _controller(tmp_path, controller_metrics)
    agent = AgentProcess(f"leveldb:{tmp_path / 'db'}", "--fsync", "off", "--metrics-port", str(agent_metrics),
                         own=[str(HELD)], log_path=tmp_path / "agent.log")
    with agent:
        prometheus = Prometheus(tmp_path, {"metaflow-agent": [f"127.0.0.1:{agent_metrics}"],
                                           "metaflow-controller": [f"127.0.0.1:{controller_metrics}"]})
        try:
            yield prometheus, agent
        finally:
            prometheus.close()
            _stop(controller)


def _paths(block: Block, count: int) -> list[str]:
    return [p for p in (f"/scraped/{i}" for i in range(10_000)) if block.contains(mdid(p, SPACE))][:count]


def test_prometheus_stores_what_the_client_sent_and_the_dashboard_has_data(
        cluster: tuple[Prometheus, AgentProcess]) -> None:
    prometheus, agent = cluster
    assert prometheus.until('count(up{job=~"metaflow-.*"} == 1)', 2) == 2, prometheus.query("up")
    rules = prometheus.api("rules")
    assert isinstance(rules, dict)
    loaded = {rule["name"] for group in rules["groups"] for rule in group["rules"]}
    assert {"MetaFlowBlockWithoutLiveBackup", "MetaFlowDataLost", "MetaFlowServerSilent"} <= loaded

    held, foreign = _paths(HELD, 30), _paths(FOREIGN, 3)
    with redis.Redis(agent.host, agent.port, single_connection_client=True) as r:
        for path in held:
            assert r.set(path, b"v") is True
            assert r.get(path) == b"v"
        for path in foreign:
            with pytest.raises(redis.exceptions.MovedError):
                r.get(path)
    requests = m.REQUESTS.name
    assert prometheus.until(f'{requests}{{command="set",outcome="served"}}', 30) == 30
    assert prometheus.value(f'{requests}{{command="get",outcome="served"}}') == 30
    assert prometheus.value(f'{requests}{{command="get",outcome="moved"}}') == 3
    assert prometheus.value(m.KEYS.name) == 30
    assert prometheus.value(m.NETWORK_BUILT.name) == 0
    # the decision thread timed its events (no agent registers with this controller: its ticks)
    decided = {str(r["metric"]["event"]): float(r["value"][1])   # type: ignore[index]
               for r in prometheus.query(f"{m.DECISION_SECONDS.name}_count")}
    assert decided.get("Tick", 0) > 0, decided
    time.sleep(3)   # a few more scrapes, for the rates over the requests
    empty = [(title, expr) for title, expr in panel_queries()
             if title not in NEED_A_FABRIC and not prometheus.query(expr)]
    assert not empty, f"panels whose query returns nothing: {empty}"


def test_a_controller_whose_metrics_port_is_taken_exits_1(tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        proc = _controller(tmp_path, taken.getsockname()[1])
        try:
            assert proc.wait(60) == 1
        finally:
            _stop(proc)
    assert "address already in use" in (tmp_path / "controller.log").read_text().lower()
