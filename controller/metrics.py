"""The controller's Prometheus exporter: the shim's side of `controller.telemetry`.

What the core keeps as state is read when Prometheus scrapes, on the
decision loop (`read`, which runs `controller.views.gauges` there), so the
decision code changes nothing for it; what happens and is gone (operations
and moves ending, flow mods and barriers, switch errors) is counted here as
the core's `Recorder` and by the shim (`controller.app`). Every family is
declared in `client_lib.api.metrics`; this module owns prometheus_client.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Histogram,
    disable_created_metrics,
    start_http_server,
)
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector

from client_lib.api import metrics as m
from controller.leadership import Leadership
from controller.liveness import OUTCOMES
from controller.telemetry import Gauges

STATES = ("idle", "busy", "failed", "unplaced")


def _counter(family: m.Family, registry: CollectorRegistry) -> Counter:
    return Counter(family.name.removesuffix("_total"), family.help, family.labels, registry=registry)


def _histogram(family: m.Family, registry: CollectorRegistry) -> Histogram:
    return Histogram(family.name, family.help, family.labels, registry=registry, buckets=m.SECONDS_BUCKETS)


class StateCollector(Collector):
    """The core's state as gauges, read at each scrape."""

    def __init__(self, read: Callable[[], Gauges]) -> None:
        self.read = read

    def collect(self) -> Iterator[Metric]:
        g = self.read()
        yield _gauge(m.SWITCHES_CONNECTED, g.switches_connected)
        yield _gauge(m.NETWORK_BUILT, int(g.built))
        yield _gauge(m.REPLICAS, g.replicas)
        yield _labelled(m.SWITCH_ENTRIES, {(str(dpid),): n for dpid, n in g.entries.items()})
        if g.table_budget is not None:
            yield _gauge(m.TABLE_BUDGET, g.table_budget)
        yield _labelled(m.SERVERS, {(state,): sum(s.state == state for s in g.servers.values())
                                    for state in STATES})
        yield _labelled(m.SERVER_KEYS, {(name,): s.keys for name, s in g.servers.items()})
        yield _labelled(m.SERVER_LOAD, {(name,): s.packets_per_s for name, s in g.servers.items()
                                        if s.packets_per_s is not None})
        yield _labelled(m.HEARTBEAT_AGE, {(name,): s.heartbeat_age_s for name, s in g.servers.items()})
        yield _gauge(m.OLDEST_HEARTBEAT, max((s.heartbeat_age_s for s in g.servers.values()
                                              if s.state != "failed"), default=0.0))
        yield _gauge(m.HEARTBEAT_TIMEOUT, g.heartbeat_timeout_s)
        yield _gauge(m.BLOCKS, g.blocks)
        yield _gauge(m.BLOCKS_UNBACKED, g.blocks_without_live_backup)
        yield _gauge(m.BLOCKS_NOT_SERVING, g.blocks_not_serving)
        yield _gauge(m.IMBALANCE, g.imbalance_factor)
        yield _gauge(m.IMBALANCE_THRESHOLD, g.imbalance_threshold)
        lost = CounterMetricFamily(m.DATA_LOST.name.removesuffix("_total"), m.DATA_LOST.help)
        lost.add_metric([], g.data_lost)
        yield lost
        yield _labelled(m.OPERATIONS_RUNNING, {(kind,): n for kind, (n, _) in g.operations.items()})
        yield _labelled(m.OPERATION_AGE, {(kind,): age for kind, (_, age) in g.operations.items()})
        yield _gauge(m.MIGRATION_LEASE, g.migration_lease_s)


class LeadershipCollector(Collector):
    """This controller's leadership (`controller.leadership`), read at each
    scrape off the leadership itself, as the leadership view is."""

    def __init__(self, lead: Leadership) -> None:
        self.lead = lead

    def collect(self) -> Iterator[Metric]:
        yield _gauge(m.LEADER, int(self.lead.leads()))
        yield _gauge(m.TERM, self.lead.term)
        yield _gauge(m.ETCD_REACHABLE, int(self.lead.etcd_reachable))
        takeovers = CounterMetricFamily(m.TAKEOVERS.name.removesuffix("_total"), m.TAKEOVERS.help)
        takeovers.add_metric([], self.lead.takeovers)
        yield takeovers


class DatagramCollector(Collector):
    """Liveness datagrams by outcome, from the counts `ControllerMetrics.datagram` keeps."""

    def __init__(self, counts: dict[str, int]) -> None:
        self.counts = counts

    def collect(self) -> Iterator[Metric]:
        declared = m.LIVENESS_DATAGRAMS
        family = CounterMetricFamily(declared.name.removesuffix("_total"), declared.help,
                                     labels=declared.labels)
        for outcome, n in list(self.counts.items()):
            family.add_metric([outcome], n)
        yield family


def _gauge(family: m.Family, value: float) -> GaugeMetricFamily:
    return GaugeMetricFamily(family.name, family.help, value=value)


def _labelled(family: m.Family, values: dict[tuple[str, ...], float]) -> GaugeMetricFamily:
    out = GaugeMetricFamily(family.name, family.help, labels=family.labels)
    for labels, value in sorted(values.items()):
        out.add_metric(list(labels), value)
    return out


class ControllerMetrics:
    """The controller's registry: the core's `Recorder`, the shim's counters,
    and the state read at each scrape through `read`."""

    def __init__(self, read: Callable[[], Gauges], lead: Leadership | None = None) -> None:
        """`lead`: this controller's leadership (None: the one controller without etcd)."""
        disable_created_metrics()   # a `_created` series per counter doubles the series for nothing we use
        self.registry = CollectorRegistry()
        self.operations = _counter(m.OPERATIONS, self.registry)
        self.operation_seconds = _histogram(m.OPERATION_SECONDS, self.registry)
        self.moves = _counter(m.MOVES, self.registry)
        self.move_seconds = _histogram(m.MOVE_SECONDS, self.registry)
        self.flow_mods = _counter(m.FLOW_MODS, self.registry)
        self.flow_mods_refused = _counter(m.FLOW_MODS_REFUSED, self.registry)
        self.barrier_seconds = _histogram(m.BARRIER_SECONDS, self.registry)
        self.decision_seconds = Histogram(m.DECISION_SECONDS.name, m.DECISION_SECONDS.help,
                                          m.DECISION_SECONDS.labels, registry=self.registry,
                                          buckets=m.DECISION_BUCKETS)
        self.datagrams = dict.fromkeys(OUTCOMES, 0)
        """Liveness datagrams by outcome: plain integers, which only the liveness thread
        adds to, 8,000 times a second at 2,000 servers (a prometheus_client counter
        takes a lock each time); read at each scrape."""
        self.registry.register(StateCollector(read))
        self.registry.register(DatagramCollector(self.datagrams))
        self.registry.register(LeadershipCollector(lead or Leadership.alone()))

    # -- the core's Recorder -------------------------------------------------------------

    def operation(self, kind: str, seconds: float, ok: bool) -> None:
        self.operations.labels(kind, "ok" if ok else "failed").inc()
        self.operation_seconds.labels(kind).observe(seconds)

    def move(self, kind: str, seconds: float, ok: bool) -> None:
        self.moves.labels(kind, "ok" if ok else "failed").inc()
        self.move_seconds.labels(kind).observe(seconds)

    # -- the shim's events ---------------------------------------------------------------

    def sent(self, dpid: int, flow_mods: int) -> None:
        """`flow_mods` changes went to switch `dpid`. Its refusals start at 0
        here: a rate over a counter that is absent until the first error is
        empty, not 0, and the dashboard's refused line would show no data."""
        self.flow_mods.labels(str(dpid)).inc(flow_mods)
        self.flow_mods_refused.labels(str(dpid))

    def refused(self, dpid: int) -> None:
        """Switch `dpid` answered an OpenFlow error."""
        self.flow_mods_refused.labels(str(dpid)).inc()

    def barrier(self, dpid: int, seconds: float) -> None:
        """A barrier to switch `dpid` came back after `seconds`."""
        self.barrier_seconds.labels(str(dpid)).observe(seconds)

    def decided(self, event: str, seconds: float) -> None:
        """The decision thread spent `seconds` on an event of kind `event`."""
        self.decision_seconds.labels(event).observe(seconds)

    def datagram(self, outcome: str) -> None:
        """A liveness datagram's outcome (`controller.liveness.OUTCOMES`)."""
        self.datagrams[outcome] += 1

    def serve(self, host: str, port: int) -> Callable[[], None]:
        """Serve the registry on `host:port` in a thread of its own; what stops
        it. A port that is taken raises OSError here, at start."""
        server, thread = start_http_server(port, host, self.registry)

        def stop() -> None:
            server.shutdown()
            server.server_close()
            thread.join(timeout=5)
        return stop
