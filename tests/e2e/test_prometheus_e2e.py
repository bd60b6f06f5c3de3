"""A real Prometheus watching a real MetaFlow fabric in Mininet.

Debian's ``prometheus``, started here with a configuration written here,
scrapes the controller and every agent each second (over the management
network, from the root namespace) while the demo's phases run on a k=4
fat-tree: clients write and read back (low capacity: the controller splits),
then the busiest primary is killed (r=2: a fail-over). Afterwards PromQL over
Prometheus' HTTP API must show what happened: the splits and the fail-over,
as many as the controller's REST views and events record; every switch's
MetaFlow entries, as many as `ovs-ofctl dump-flows` shows; the requests the
agents served, as many as the clients made (within what a retried timeout
adds); every query of every panel of deploy/grafana/metaflow.json returns
data over the run; and alerts of deploy/prometheus/alerts.yml fire for real
(`/api/v1/alerts`): the killed server silent past the heartbeat timeout and
its exporter down. The rules' `for:` durations (a minute and more) are cut
to a second in a test-time copy, so the test need not wait minutes; the
expressions are the file's. At the end the monitoring plots are drawn from
Prometheus' range API (`benchmarks.monitoring_plots`).
"""

from __future__ import annotations

import os
import re
import time
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from benchmarks import monitoring_plots
from benchmarks.scale import planned_tables
from client_lib.api import metrics as m
from client_lib.api.rest import REST
from mininet_scenarios.metaflow_net import MetaFlowNet
from nat_agent.ports import listen_port
from tests.e2e.test_metaflow_e2e import wait_for
from tests.integration.test_prometheus_rules import PROMETHEUS, panel_queries
from tests.integration.test_prometheus_scrape import Prometheus
from topology import builders

warnings.filterwarnings("ignore", category=DeprecationWarning)
AGENT_METRICS_PORT = 9003
"""Every agent's metrics port, on its own management address (as in deploy/examples/)."""
FIRED = {"MetaFlowServerSilent", "MetaFlowTargetDown"}
"""The alerts the kill must fire."""


def _rules_firing_fast(tmp_path: Path) -> Path:
    """deploy/prometheus/alerts.yml with every `for:` cut to 1 s (same expressions)."""
    rules = tmp_path / "alerts.yml"
    rules.write_text(re.sub(r"(?m)^(\s+for:) \S+$", r"\1 1s", (PROMETHEUS / "alerts.yml").read_text()))
    return rules


@pytest.fixture
def fabric(tmp_path: Path) -> Iterator[tuple[MetaFlowNet, Prometheus]]:
    controller_metrics = listen_port()
    graph = builders.fat_tree(4, servers=8)
    with MetaFlowNet(graph, capacity=600, workdir=tmp_path,
                     controller_args=["--bootstrap", "preallocate:2", "--sync-rate", "200",
                                      "--metrics-port", str(controller_metrics)],
                     agent_args=["--metrics-port", str(AGENT_METRICS_PORT)]) as mf:
        scenario = mf.running
        targets = {"metaflow-controller": [f"{scenario.mgmt.root_ip}:{controller_metrics}"],
                   "metaflow-agent": [f"{scenario.mgmt_ips[node]}:{AGENT_METRICS_PORT}"
                                      for node in mf.hosts("storage")]}
        prometheus = Prometheus(tmp_path / "prometheus", targets, _rules_firing_fast(tmp_path))
        try:
            yield mf, prometheus
        finally:
            prometheus.close()


@pytest.mark.timeout(300)
def test_prometheus_sees_the_splits_the_fail_over_the_tables_and_the_requests(
        fabric: tuple[MetaFlowNet, Prometheus], tmp_path: Path) -> None:
    mf, prometheus = fabric
    agents = len(mf.hosts("storage"))
    assert prometheus.until('count(up{job=~"metaflow-.*"} == 1)', agents + 1) == agents + 1, \
        prometheus.query("up")

    started = time.time()

    # Writes and reads: the controller splits by capacity. What the agents
    # served is what the clients made: a write or a read the client timed out
    # and retried may have been served twice, nothing else.
    results = mf.run_clients(250, tmp_path)
    assert all(r["errors"] == 0 and r["read_back"] == r["written"] == 250 for r in results), results
    resent = sum(r["timeouts"] for r in results)
    for command, made in (("set", sum(r["written"] for r in results)),
                          ("get", sum(r["read_back"] for r in results))):
        expr = f'sum({m.REQUESTS.name}{{command="{command}",outcome="served"}})'
        served = prometheus.until(expr, made)
        assert served is not None and made <= served <= made + resent, (command, made, served, resent)
    wait_for(lambda: len(mf.view(REST.splits).splits) >= 2, 30)

    # The busiest primary dies: its backups take over, the blocks are
    # re-replicated (slowly: --sync-rate), and the alerts fire.
    servers = mf.view(REST.servers).servers
    victim = max((n for n, s in servers.items() if s.state == "busy"), key=lambda n: servers[n].keys)
    mf.kill_agent(victim)
    wait_for(lambda: [e for e in mf.events("takeover") if e["server"] == victim], 30)
    firing = wait_for(lambda: FIRED <= (names := _firing(prometheus)) and names, 60)
    assert not mf.events("DATA-LOST")
    wait_for(mf.replicated, 90)

    # Clients write again after the fail-over (the rates of the panels are
    # over the last minute: they need requests in it).
    results = mf.run_clients(100, tmp_path, start=1000)
    assert all(r["errors"] == 0 and r["read_back"] == r["written"] == 100 for r in results), results

    # Splits and fail-overs, as the controller's REST views and events count
    # them (asked again at each poll: a split may still follow the writes).
    def splits() -> int:
        return len(mf.view(REST.splits).splits)

    def takeovers() -> int:
        return len(mf.events("takeover"))

    ended = f'sum({m.OPERATIONS.name}{{kind="%s",result="ok"}})'
    moved = f'sum({m.MOVES.name}{{kind="split",result="ok"}})'
    failed = f'{m.SERVERS.name}{{state="failed"}}'

    def agreed(expr: str, count: Callable[[], int]) -> tuple[float | None, list[int]]:
        """Prometheus's value of `expr` once it equals `count()` read at the
        same poll, and every count read. (Asked once more after `until`
        agreed, a split finishing in between failed a CI run: 2 == 2 at the
        poll, then 3.)"""
        counted: list[int] = []

        def want() -> int:
            counted.append(count())
            return counted[-1]
        return prometheus.until(expr, want), counted

    for expr, count in ((ended % "split", splits), (moved, splits), (ended % "failover", takeovers),
                        (failed, takeovers)):
        got, counted = agreed(expr, count)
        assert got == counted[-1], (expr, got, counted)
    assert prometheus.value(m.DATA_LOST.name) == 0

    # Every switch's entries, as Open vSwitch holds them (the fabric is quiet now).
    deadline = time.monotonic() + 30
    while (scraped := _entries(prometheus)) != (held := _tables(mf)) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert scraped == held, _table_difference(mf, {d for d, n in held.items() if scraped.get(d) != n})

    # Every query of every dashboard panel returns data over the run, as the
    # dashboard asks for it (a range, a point a second).
    now = time.time()
    empty = [(title, expr) for title, expr in panel_queries()
             if not monitoring_plots.query_range(prometheus.url, expr, started, now, 1.0)]
    assert not empty, f"panels whose query returns nothing: {empty}"

    out = Path(os.environ.get("METAFLOW_MONITORING_PNG", tmp_path / "monitoring.png"))
    drawn = monitoring_plots.plot(prometheus.url, started, time.time(), out)
    assert out.stat().st_size > 10_000 and all(drawn.values()), {t: len(s) for t, s in drawn.items()}
    print(f"\nfired {sorted(firing)}; {splits()} splits, {takeovers()} take-overs; plots in {out}")


def _firing(prometheus: Prometheus) -> set[str]:
    """The alerts firing now, by name (`/api/v1/alerts`)."""
    data = prometheus.api("alerts")
    assert isinstance(data, dict)
    return {a["labels"]["alertname"] for a in data["alerts"] if a["state"] == "firing"}


def _tables(mf: MetaFlowNet) -> dict[str, int]:
    """MetaFlow entries per switch (dpid), read from Open vSwitch."""
    return {str(dpid): len(table) for dpid, table in mf.switch_tables().items()}


def _table_difference(mf: MetaFlowNet, dpids: set[str]) -> dict[str, dict[str, list[str]]]:
    """For the switches whose count differs: the entries only the switch
    holds and those only the controller's planner has."""
    plan = planned_tables(mf.view(REST.flows).switches)
    held = mf.switch_tables()
    out = {}
    for dpid in sorted(dpids):
        mine, theirs = held.get(int(dpid), {}), plan.get(int(dpid), {})
        out[dpid] = {"switch only": [str(e) for match, e in mine.items() if theirs.get(match) != e],
                     "planner only": [str(e) for match, e in theirs.items() if mine.get(match) != e]}
    return out


def _entries(prometheus: Prometheus) -> dict[str, int]:
    """MetaFlow entries per switch (dpid) in the controller's last scrape."""
    return {str(r["metric"]["switch"]): int(float(r["value"][1]))  # type: ignore[index]
            for r in prometheus.query(m.SWITCH_ENTRIES.name)}
