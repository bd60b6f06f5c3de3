"""``GET /metrics`` for the agent-side daemons: one Prometheus registry
served from the event loop (an aiohttp site of its own), its collectors
read at scrape time. `refresh` runs first, for what a collector needs
measured asynchronously (an agent's store counts itself)."""

from __future__ import annotations

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, disable_created_metrics, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from client_lib.api.metrics import Family


def counter_family(family: Family) -> CounterMetricFamily:
    """An empty sample set of a declared counter (prometheus_client adds ``_total`` itself)."""
    return CounterMetricFamily(family.name.removesuffix("_total"), family.help, labels=family.labels)


def gauge_family(family: Family) -> GaugeMetricFamily:
    return GaugeMetricFamily(family.name, family.help, labels=family.labels)


class MetricsEndpoint:
    """Serves `collector` on a metrics port."""

    def __init__(self, collector: Collector) -> None:
        disable_created_metrics()   # a `_created` series per counter doubles the series for nothing we use
        self.registry = CollectorRegistry()
        self.registry.register(collector)
        self._runner: web.AppRunner | None = None

    async def refresh(self) -> None:
        """Before each scrape: what the collector reads that needs awaiting."""

    async def scrape(self) -> bytes:
        """One scrape, in Prometheus' text format."""
        await self.refresh()
        return generate_latest(self.registry)

    async def _handle(self, request: web.Request) -> web.Response:
        return web.Response(body=await self.scrape(), headers={"Content-Type": CONTENT_TYPE_LATEST})

    async def start(self, host: str, port: int) -> None:
        """Serve ``GET /metrics`` on `host:port`; a port that is taken raises OSError."""
        app = web.Application()
        app.router.add_get("/metrics", self._handle)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        await web.TCPSite(self._runner, host, port).start()

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
