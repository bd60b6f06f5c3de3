"""An agent's Prometheus exporter: what its parts already count, read at scrape time.

Nothing here runs on the request path. The service's `stats` (which the
compiled path adds its served requests to, under the GIL, once per batch),
its `failures` and its `latencies` (the Python path's seconds with the
compiled lane's histograms added: one family, both paths), the
replicator's and the replica listener's counters, the syncs, the
migrations and the ownership are read when Prometheus asks, on the event
loop (the metrics port is an aiohttp site of its own), so no state is read
from another thread except the lane's histograms, atomics read without a
lock. Every family is declared in `client_lib.api.metrics`.

The compiled lane answers only what it serves (it leaves every MOVED,
TRYAGAIN, refusal and error to the Python path, which words and counts
them), so its requests are all `served`: counted in `stats` per command,
timed in its histograms.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily
from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector

from client_lib.api import metrics as m
from nat_agent.metrics_endpoint import MetricsEndpoint, counter_family, gauge_family
from nat_agent.migration import Migrator
from nat_agent.replica import ReplicaServer
from nat_agent.service import MetadataService
from nat_agent.syncs import Syncs

OUTCOMES = ("moved", "tryagain", "refused", "error")
"""A command's outcomes other than served (`MetadataService.failures`)."""
REJECTIONS = ("unknown_commands", "unsupported_commands", "oversized_arguments", "protocol_errors")
CONNECTION_EVENTS = {"opened": "connections", "refused": "refused_connections",
                     "reclaimed": "reclaimed_connections", "timed_out": "timeouts",
                     "dropped": "dropped_connections"}
"""The connections' events, by the service's stats counter each is read from."""
REPLICATION_OUTCOMES = ("streamed", "acknowledged", "not_acknowledged", "resent", "degraded", "fenced",
                        "worker_records")
REPLICA_RECORDS = ("applied", "copied", "copies_skipped")


class AgentCollector(Collector):
    """One agent's families; `keys` and `size` are set by the scrape (the store
    counts and measures itself asynchronously: a Redis store asks its server)."""

    def __init__(self, service: MetadataService, replica: ReplicaServer, syncs: Syncs,
                 migrator: Migrator) -> None:
        self.service, self.replica, self.syncs, self.migrator = service, replica, syncs, migrator
        self.keys = 0
        self.size = 0

    def collect(self) -> Iterator[Metric]:
        service = self.service
        stats, failures = service.stats, service.failures
        requests = counter_family(m.REQUESTS)
        for command, counter in service.counters().items():
            failed = {o: failures[counter, o] for o in OUTCOMES}
            requests.add_metric([command, "served"],
                                stats[counter] - failed["moved"] - failed["tryagain"] - failed["error"])
            for outcome, count in failed.items():
                requests.add_metric([command, outcome], count)
        yield requests
        compiled = counter_family(m.COMPILED_REQUESTS)
        compiled.add_metric([], stats["compiled_requests"])
        yield compiled
        seconds = HistogramMetricFamily(m.REQUEST_SECONDS.name, m.REQUEST_SECONDS.help,
                                        labels=m.REQUEST_SECONDS.labels)
        latencies = service.latencies()
        for command, counter in service.counters().items():
            latency = latencies[counter]
            seconds.add_metric([command], latency.cumulative(), latency.total)
        yield seconds
        yield _from(counter_family(m.REJECTED), stats, {reason: reason for reason in REJECTIONS})
        yield _from(counter_family(m.CONNECTIONS), stats, CONNECTION_EVENTS)
        yield GaugeMetricFamily(m.CONNECTIONS_OPEN.name, m.CONNECTIONS_OPEN.help,
                                value=service.open_connections())
        yield GaugeMetricFamily(m.KEYS.name, m.KEYS.help, value=self.keys)
        yield GaugeMetricFamily(m.STORE_BYTES.name, m.STORE_BYTES.help, value=self.size)
        roles = service.ownership.roles
        held = gauge_family(m.BLOCKS_HELD)
        held.add_metric(["primary"], sum(r.primary for r in roles))
        held.add_metric(["backup"], sum(not r.primary for r in roles))
        yield held
        replicator = service.replicator
        yield _from(counter_family(m.REPLICATION), replicator.stats, {o: o for o in REPLICATION_OUTCOMES})
        yield GaugeMetricFamily(m.REPLICATION_WRITING.name, m.REPLICATION_WRITING.help,
                                value=len(replicator.writing))
        queue, lag = gauge_family(m.REPLICATION_QUEUE), gauge_family(m.REPLICATION_LAG)
        for address, backlog in sorted(replicator.queues().items()):
            queue.add_metric([address], backlog.waiting)
            lag.add_metric([address], backlog.oldest_s)
        yield queue
        yield lag
        yield _from(counter_family(m.REPLICA_APPLIED), self.replica.stats,
                    {how: how for how in REPLICA_RECORDS})
        yield _states(m.SYNCS, [r.state for r in self.syncs.reports()])
        yield _states(m.MIGRATIONS, [r.state for r in self.migrator.reports()])
        synced = HistogramMetricFamily(m.DISK_SYNC_SECONDS.name, m.DISK_SYNC_SECONDS.help)
        syncs = service.store.disk_syncs()
        if syncs is not None:
            synced.add_metric([], syncs.cumulative(), syncs.total)
        yield synced


def _from(family: CounterMetricFamily, counts: Counter[str], labels: dict[str, str]) -> CounterMetricFamily:
    """`family` with one sample per label, read from its counter in `counts`."""
    for label, key in labels.items():
        family.add_metric([label], counts[key])
    return family


def _states(family: m.Family, states: list[str]) -> GaugeMetricFamily:
    out = gauge_family(family)
    for state, count in sorted(Counter(states).items()):
        out.add_metric([state], count)
    return out


class AgentMetrics(MetricsEndpoint):
    """The registry of one agent, served on its metrics port from the event loop."""

    def __init__(self, service: MetadataService, replica: ReplicaServer, syncs: Syncs,
                 migrator: Migrator) -> None:
        self.collector = AgentCollector(service, replica, syncs, migrator)
        super().__init__(self.collector)

    async def refresh(self) -> None:
        store = self.collector.service.store
        self.collector.keys = await store.total()
        self.collector.size = await store.size_bytes()
