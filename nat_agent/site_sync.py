"""`metaflow-site-sync`: a site's propagation agent, for the ``replicated``
strategy of several sites (issue 29; the multi-site paper's synchronization
agent, one per site here rather than one for the deployment).

A writer in the site queues each update here (``QUEUE key value``, the value
stamped, `client_lib.stamps`) and writes its own site's copy itself; the
agent's answer comes once the update is on disk (`nat_agent.site_queue`,
one sync shared by every writer waiting). One pusher thread per site, this
one included, then writes the queued updates into that site, in queue order,
as a compare-and-set of stamps (`client_lib.stamps.step`): a site's copy is
only ever replaced by a newer one, so resending is harmless and every site
ends with the newest copy. A site it cannot reach (a WAN link down, the site
gone) keeps its backlog, retried with backoff, while the other sites go on;
nothing queued is dropped until every site has applied it, across restarts
of the agent.

Commands (RESP, port `SITE_SYNC_PORT`; anyone who may write the site's
entries may queue, as anyone may SET on port 9000):

    QUEUE key value [key value ...]   +OK once queued on disk
    BACKLOG                           per site, the updates it has not applied
    PING

    metaflow-site-sync --layout sites.toml --site east --queue /var/lib/metaflow/east.sqlite
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import signal
import sys
import threading
from collections import Counter
from collections.abc import Awaitable, Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Protocol

from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector

from client_lib import sdnotify
from client_lib.api import metrics as m
from client_lib.client import Destination, MetaFlowClient, RetryPolicy, Route, host_port
from client_lib.config import ROLES, add_config_flag, checked, parse
from client_lib.constants import MAX_KEY, MAX_VALUE, METAFLOW_PORT, SITE_SYNC_PORT
from client_lib.errors import InvalidArgument, MetaFlowError
from client_lib.mdid import normalize_key
from client_lib.resp import OK, ErrorReply, Reply
from client_lib.routes import parse_route, static_route
from client_lib.site_client import read_layout
from client_lib.sites import Site, SiteLayout
from client_lib.stamps import Step, stamp_of, step
from client_lib.version import add_version_flag
from nat_agent.connection import Client, Connection, PythonPathHost
from nat_agent.metrics_endpoint import MetricsEndpoint, counter_family, gauge_family
from nat_agent.resp_commands import encode_reply
from nat_agent.serving import serve
from nat_agent.site_queue import SiteQueue, Update

log = logging.getLogger("metaflow.site_sync")

QUEUE_MAX_PAIRS = 512
"""The most updates one QUEUE command carries."""


class Copies(Protocol):
    """One site's copies, as `apply_update` writes them (a `MetaFlowClient` over the site's prefix)."""

    def get(self, path: bytes) -> bytes | None: ...
    def create(self, path: bytes, value: bytes) -> bool: ...
    def compare_and_set(self, path: bytes, old: bytes, new: bytes) -> bool: ...


def apply_update(client: Copies, key: bytes, value: bytes) -> Step:
    """Bring one site's copy of `key` up to stamped `value`, by compare-and-set
    (a writer or another agent may write it meanwhile: then look again); what
    it took."""
    while True:
        current = client.get(key)
        needed = step(current, value)
        if needed is Step.KEEP:
            return needed
        if needed is Step.CREATE and client.create(key, value):
            return needed
        if needed is Step.REPLACE and current is not None and client.compare_and_set(key, current, value):
            return needed


class Pusher(threading.Thread):
    """Sends one site the queue's updates, in order, until `stop` is set."""

    def __init__(self, site: Site, client: MetaFlowClient, queue: SiteQueue, stop: threading.Event, *,
                 batch: int, workers: int, backoff_cap: float) -> None:
        super().__init__(name=f"push-{site.name}", daemon=True)
        self.site, self.client, self.queue, self.stop = site, client, queue, stop
        self.batch, self.backoff_cap = batch, backoff_cap
        self.wake = threading.Event()
        self.applied: Counter[str] = Counter()
        self.failures = 0
        self._pool = ThreadPoolExecutor(workers, thread_name_prefix=f"push-{site.name}")

    def run(self) -> None:
        delay = 0.0
        while not self.stop.is_set():
            self.wake.clear()
            last, updates = self.queue.due(self.site.name, self.batch)
            if not updates:
                self.wake.wait(1.0)
                continue
            try:
                # Keys are distinct in a batch (`due` keeps each key's last), so
                # they may go at once; a failure retries the whole batch.
                for taken in self._pool.map(self._apply, updates):
                    self.applied[taken.value] += 1
            except (MetaFlowError, OSError) as exc:
                self.failures += 1
                delay = min(self.backoff_cap, max(0.05, 2 * delay))
                log.warning("site %s: %s; %d updates wait, retrying in %.2f s",
                            self.site.name, exc, self.queue.backlog()[self.site.name], delay)
                self.stop.wait(delay)
                continue
            delay = 0.0
            self.queue.done(self.site.name, last)

    def _apply(self, update: Update) -> Step:
        return apply_update(self.client, update[1], update[2])

    def close(self) -> None:
        self._pool.shutdown(wait=True, cancel_futures=True)
        self.client.close()


class SyncCollector(Collector):
    """The agent's families (`client_lib.api.metrics.SITE_SYNC`), read at scrape time."""

    def __init__(self, service: SyncService) -> None:
        self.service = service

    def collect(self) -> Iterator[Metric]:
        queued = counter_family(m.SITE_QUEUED)
        queued.add_metric([], self.service.queued)
        yield queued
        backlog = gauge_family(m.SITE_BACKLOG)
        for site, count in self.service.queue.backlog().items():
            backlog.add_metric([site], count)
        yield backlog
        applied, failures = counter_family(m.SITE_APPLIED), counter_family(m.SITE_PUSH_FAILURES)
        for pusher in self.service.pushers:
            for taken in Step:
                applied.add_metric([pusher.site.name, taken.value], pusher.applied[taken.value])
            failures.add_metric([pusher.site.name], pusher.failures)
        yield applied
        yield failures


class SyncService(PythonPathHost):
    """The agent: its queue, its pushers and the `nat_agent.connection.Host`
    of its clients' connections."""

    max_bulk = MAX_VALUE

    def __init__(self, layout: SiteLayout, queue: SiteQueue, clients: dict[str, MetaFlowClient], *,
                 batch: int = 256, workers: int = 8, backoff_cap: float = 2.0) -> None:
        super().__init__()
        self.layout, self.queue = layout, queue
        self.stop_pushing = threading.Event()
        self.pushers = [Pusher(site, clients[site.name], queue, self.stop_pushing, batch=batch,
                               workers=workers, backoff_cap=backoff_cap) for site in layout.sites]
        self._server: asyncio.AbstractServer | None = None
        self._pending: list[tuple[list[tuple[bytes, bytes]], asyncio.Future[None]]] = []
        self._committing = False
        self.queued = 0
        self._commands: dict[bytes, Callable[[list[bytes]], Awaitable[Reply]]] = {
            b"PING": self._ping, b"QUEUE": self._queue, b"BACKLOG": self._backlog}

    async def start(self, host: str, port: int) -> int:
        for pusher in self.pushers:
            pusher.start()
        self._server = await asyncio.get_running_loop().create_server(
            lambda: Connection(self), host, port, backlog=1024, reuse_address=True)
        return int(self._server.sockets[0].getsockname()[1])

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
            self.close_connections()
            await self._server.wait_closed()
        while self._committing:   # what was acknowledged is on disk; let the last commit end
            await asyncio.sleep(0.01)
        self.stop_pushing.set()
        for pusher in self.pushers:
            pusher.wake.set()
        for pusher in self.pushers:
            await asyncio.to_thread(pusher.join)
            pusher.close()
        self.queue.close()

    async def execute(self, command: list[bytes], conn: Client) -> bytes:
        handler = self._commands.get(command[0].upper())
        if handler is None:
            name = command[0][:64].decode("utf-8", "replace")
            return encode_reply(ErrorReply(f"ERR unknown command '{name}' (QUEUE, BACKLOG, PING)"))
        self.stats[command[0].decode().lower()] += 1
        try:
            return encode_reply(await handler(command[1:]))
        except InvalidArgument as exc:
            return encode_reply(ErrorReply(f"ERR {exc}"))
        except Exception as exc:   # a bug, or the disk: this request fails, not the agent
            log.exception("%s failed", command[0][:64])
            return encode_reply(ErrorReply(f"ERR not queued: {exc!r}"))

    async def _ping(self, args: list[bytes]) -> Reply:
        return b"PONG"

    async def _backlog(self, args: list[bytes]) -> Reply:
        return [x for site, count in (await asyncio.to_thread(self.queue.backlog)).items()
                for x in (site.encode(), count)]

    async def _queue(self, args: list[bytes]) -> Reply:
        if not args or len(args) % 2 or len(args) > 2 * QUEUE_MAX_PAIRS:
            raise InvalidArgument(f"QUEUE takes 1 to {QUEUE_MAX_PAIRS} key-value pairs")
        pairs = []
        for key, value in zip(args[::2], args[1::2], strict=True):
            if len(key) > MAX_KEY:
                raise InvalidArgument(f"a key of {len(key)} bytes exceeds the limit of {MAX_KEY}")
            if normalize_key(key) != key:
                raise InvalidArgument(f"key {key[:64]!r} is not normalized")
            if stamp_of(value) is None:
                raise InvalidArgument(f"the value of {key[:64]!r} has no stamp (client_lib.stamps)")
            pairs.append((key, value))
        done = asyncio.get_running_loop().create_future()
        self._pending.append((pairs, done))
        if not self._committing:
            asyncio.get_running_loop().create_task(self._commit())
            self._committing = True
        await done
        return OK

    async def _commit(self) -> None:
        """Queue everything waiting in one transaction, as long as writers
        keep coming (a group commit: one sync for all of them)."""
        try:
            while self._pending:
                waiting, self._pending = self._pending, []
                try:
                    await asyncio.to_thread(self.queue.append, [p for pairs, _ in waiting for p in pairs])
                except Exception as exc:
                    for _, done in waiting:
                        done.set_exception(exc)
                    continue
                self.queued += sum(len(pairs) for pairs, _ in waiting)
                for _, done in waiting:
                    done.set_result(None)
                for pusher in self.pushers:
                    pusher.wake.set()
        finally:
            self._committing = False


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="metaflow-site-sync", description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--layout", required=True, metavar="FILE",
                   help="the sites' layout (TOML: space, and a [[site]] row per site)")
    p.add_argument("--site", required=True, metavar="NAME", help="the site this agent serves")
    p.add_argument("--queue", required=True, metavar="PATH", help="the SQLite file of the queue (created)")
    p.add_argument("--listen", default=f"0.0.0.0:{SITE_SYNC_PORT}", metavar="HOST:PORT",
                   help="where the site's writers queue their updates")
    p.add_argument("--metrics-port", type=int, default=0, metavar="PORT",
                   help="serve Prometheus metrics (GET /metrics) on the --listen host at this port; 0: none")
    p.add_argument("--route", action="append", default=[], metavar="CIDR=HOST[:PORT]",
                   help="instead of the network: the agent serving CIDR (repeat to cover the whole space)")
    p.add_argument("--batch", type=int, default=256, metavar="N",
                   help="updates read from the queue at a time, per site")
    p.add_argument("--workers", type=int, default=8, metavar="N",
                   help="updates written into one site at once")
    p.add_argument("--timeout", type=float, default=5.0, metavar="SECONDS",
                   help="the deadline of one write into a site, retries included")
    p.add_argument("--fast-open", action="store_true",
                   help="send each new connection's first write in its SYN (TCP Fast Open; docs/sites.md)")
    p.add_argument("--backoff-cap", type=float, default=2.0, metavar="SECONDS",
                   help="the longest pause before writing again into a site that failed")
    p.add_argument("--log-level", default="INFO", choices=("DEBUG", "INFO", "WARNING", "ERROR"))
    add_version_flag(p)
    add_config_flag(p)
    return p


def from_args(args: argparse.Namespace) -> tuple[SiteLayout, Destination, Route | None]:
    """The checked layout, listening address and route (`InvalidArgument` naming the flag)."""
    layout = checked("--layout", read_layout, args.layout)
    checked("--site", layout.named, args.site)
    for flag, value in (("--batch", args.batch), ("--workers", args.workers)):
        if not 1 <= value <= 4096:
            raise InvalidArgument(f"{flag} must be from 1 to 4096, not {value}")
    for flag, value in (("--timeout", args.timeout), ("--backoff-cap", args.backoff_cap)):
        if not 0 < value <= 3600:
            raise InvalidArgument(f"{flag} must be above 0 and at most 3600 seconds, not {value}")
    listen = checked("--listen", lambda text: host_port(text, SITE_SYNC_PORT), args.listen)
    if not 0 <= args.metrics_port <= 65535:
        raise InvalidArgument(f"--metrics-port must be 0 (none) or a port number, not {args.metrics_port}")
    route = None
    if args.route:
        entries = [checked("--route", lambda text: parse_route(text, METAFLOW_PORT), text)
                   for text in args.route]
        route = checked("--route", lambda _: static_route(entries, layout.space), "")
    return layout, listen, route


def _clients(layout: SiteLayout, route: Route | None, timeout: float,
             fast_open: bool) -> dict[str, MetaFlowClient]:
    retry = RetryPolicy(4, base=0.01, cap=0.5)
    return {site.name: MetaFlowClient(site.prefix, route=route, retry=retry, deadline=timeout,
                                      fast_open=fast_open) for site in layout.sites}


async def run(args: argparse.Namespace, layout: SiteLayout, listen: Destination, route: Route | None) -> None:
    queue = SiteQueue(Path(args.queue), [site.name for site in layout.sites])
    clients = _clients(layout, route, args.timeout, args.fast_open)
    service = SyncService(layout, queue, clients, batch=args.batch, workers=args.workers,
                          backoff_cap=args.backoff_cap)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    loop.add_signal_handler(signal.SIGHUP, lambda: _reread(args.layout, layout))
    port = await service.start(*listen)
    metrics = MetricsEndpoint(SyncCollector(service))
    if args.metrics_port:
        await metrics.start(listen[0], args.metrics_port)
    serving = f"site {args.site}: queueing on {listen[0]}:{port}, pushing to {len(layout.sites)} sites"
    log.info("%s", serving)
    sdnotify.ready(serving)
    try:
        await stop.wait()
    finally:
        sdnotify.stopping()
        await metrics.stop()
        await service.stop()
        log.info("stopped; backlog on disk is kept for the next start")


def _reread(path: str, running: SiteLayout) -> None:
    """SIGHUP: read the layout again and say whether it changed; a changed
    one is not applied (the queue's cursors are per site): restart."""
    try:
        now = read_layout(path)
    except InvalidArgument as exc:
        log.error("reload: %s; still running with the layout read at start", exc)
        return
    if now == running:
        log.info("reload: the layout is unchanged")
        sdnotify.status("layout unchanged")
    else:
        log.warning("reload: %s changed; restart to apply it (running with the layout read at start)", path)
        sdnotify.status("the layout changed: restart to apply it")


def main(argv: Sequence[str] | None = None) -> int:
    args, (layout, listen, route) = parse(ROLES["site-sync"], parser(), argv, from_args)
    return serve(run(args, layout, listen, route), args.log_level, log)


if __name__ == "__main__":
    sys.exit(main())
