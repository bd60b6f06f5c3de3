"""The agent's admin API: the routes of `client_lib.api.admin` (``ADMIN``), served on aiohttp.

Who calls it: the controller (roles, syncs, migrations), other agents (the
``/import`` routes of a migration), the operator's `metaflowctl`, and tests,
all through `client_lib.api.clients`. This module is the shim between
aiohttp and the sans-I/O `Dispatcher`: one catch-all handler reads the
request, lets the dispatcher authenticate, route and decode it, runs the
handler for its route with the typed body, and sends back what the
dispatcher makes of the result or the exception. Every route declared in
``ADMIN.ALL`` has exactly one handler here (checked at start).

Authentication (`client_lib.api.auth`): every request must be signed with
the cluster's secret (``--secret-file``); one that is unsigned, signed
with another secret, too old or replayed gets 401 and changes nothing.
With ``--open-reads`` the routes that change nothing (``/health``,
``/blocks``, ``POST /count``, ``POST /ops``, ``/stats``, ``GET
/migrations``, ``GET /syncs``) also answer unsigned callers. Responses
are signed, so a caller knows it reached an agent of its cluster.

Where it listens: ``--admin`` (default ``127.0.0.1:9001``, loopback only).
In a deployment it is the management address; never the data network,
where every client can reach port 9000 by design: signatures keep
strangers from changing anything, but a port they cannot reach is also
one they cannot flood.

The term fence (`nat_agent.fence`): a call that carries a leader
controller's term (signed, `Call.term`) lower than the highest the agent has
seen is refused 409 before its handler runs, whatever the route; a higher
one is kept (and saved) first.

Statuses (`client_lib.server.api.status_of`): 400 malformed or impossible
request, 401 not signed, 404 unknown migration or import, 409 from an
older leader (the term fence), or contradicts the current ownership
(`OwnershipError`: an assignment older than the epoch held, a sync of a
block this agent is not the primary of at that epoch) or a migration's
state, 502 the other agent of a migration failed or is not
of this cluster (`MigrationError`).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from aiohttp import web

from client_lib.api.admin import (
    ADMIN,
    Assigned,
    BlocksReport,
    Counts,
    Discarded,
    DisownReply,
    DumpPage,
    Health,
    Importing,
    ImportProgress,
    Loaded,
    MigrationList,
    MigrationReport,
    OpsReport,
    Stats,
    SyncList,
    SyncReport,
    decode_records,
)
from client_lib.api.auth import Verifier
from client_lib.api.route import Route
from client_lib.cidr import Block
from client_lib.server.api import MAX_BODY, Call, Dispatcher
from nat_agent.agent import Agent
from nat_agent.migration import Migrator
from nat_agent.ops_meter import OpsMeter
from nat_agent.store import Record
from nat_agent.syncs import Syncs

StatsSource = Callable[[], Stats]
Loader = Callable[[Block, int, Sequence[Record]], Awaitable[int]]
"""Writes a restore's records through the replicated write path (`MetadataService.load`)."""
Handler = Callable[[Call], Awaitable[object]]


class AdminApi:
    def __init__(self, agent: Agent, migrator: Migrator, syncs: Syncs, stats: StatsSource,
                 meter: OpsMeter, loader: Loader, verifier: Verifier, open_reads: bool = False) -> None:
        """`meter`: the service's requests per ID (`MetadataService.ops`)."""
        self.agent = agent
        self.migrator = migrator
        self.syncs = syncs
        self.stats = stats
        self.meter = meter
        self.loader = loader
        self.dispatcher = Dispatcher(ADMIN.ALL, verifier, open_reads)
        self.handlers: dict[Route[Any, Any], Handler] = {
            ADMIN.health: self.health, ADMIN.blocks: self.blocks, ADMIN.count: self.count,
            ADMIN.ops: self.ops, ADMIN.stats: self.get_stats,
            ADMIN.assign: self.assign, ADMIN.disown: self.disown,
            ADMIN.sync: self.sync, ADMIN.syncs: self.list_syncs,
            ADMIN.migrations: self.migrations, ADMIN.migration: self.migration,
            ADMIN.migrate: self.migrate, ADMIN.commit: self.commit, ADMIN.abort: self.abort,
            ADMIN.import_begin: self.import_begin, ADMIN.import_records: self.import_records,
            ADMIN.import_discard: self.import_discard,
            ADMIN.dump: self.dump, ADMIN.load: self.load,
        }
        if set(self.handlers) != set(ADMIN.ALL):
            unserved = [str(r) for r in ADMIN.ALL if r not in self.handlers]
            raise TypeError(f"admin routes without a handler: {unserved}")
        # aiohttp refuses a larger body (413) before the dispatcher sees it.
        self.app = web.Application(client_max_size=MAX_BODY)
        self.app.router.add_route("*", "/{tail:.*}", self._serve)
        self._runner: web.AppRunner | None = None

    async def start(self, host: str, port: int) -> int:
        """Listen on host:port (0: any free port); returns the port."""
        self._runner = web.AppRunner(self.app, access_log=None)
        await self._runner.setup()
        await web.TCPSite(self._runner, host, port, reuse_address=True).start()
        return int(self._runner.addresses[0][1])

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    async def _serve(self, request: web.Request) -> web.Response:
        body = await request.read()
        call = self.dispatcher.resolve(request.method, request.path, request.query_string,
                                       request.headers, body)
        if isinstance(call, Call):
            try:
                await self.agent.admit_term(call.term, str(call.route))
                response = self.dispatcher.reply(call, await self.handlers[call.route](call))
            except Exception as exc:
                response = self.dispatcher.fail(call, exc)
        else:
            response = call
        return web.Response(status=response.status, body=response.body, headers=response.headers)

    # -- reads -------------------------------------------------------------

    async def health(self, call: Call) -> Health:
        return await self.agent.health()

    async def blocks(self, call: Call) -> BlocksReport:
        return await self.agent.blocks_report()

    async def count(self, call: Call) -> Counts:
        return Counts([await self.agent.count(first, last) for first, last in call.body.ranges])

    async def ops(self, call: Call) -> OpsReport:
        ranges = call.body.ranges
        for first, last in ranges:
            self.agent.check_range(first, last)
        window = self.meter.window()
        return OpsReport([window.ops(first, last) for first, last in ranges], round(window.seconds, 3))

    async def get_stats(self, call: Call) -> Stats:
        return self.stats()

    async def migrations(self, call: Call) -> MigrationList:
        return MigrationList(self.migrator.reports())

    async def migration(self, call: Call) -> MigrationReport:
        return self.migrator.get(call.params["id"]).report()

    # -- ownership ---------------------------------------------------------

    async def assign(self, call: Call) -> Assigned:
        return Assigned(await self.agent.assign(call.body), self.agent.identity.data_address)

    async def disown(self, call: Call) -> DisownReply:
        body = call.body
        released = await self.agent.disown(body.blocks, delete=body.delete, moved_to=body.moved_to)
        return DisownReply(self.agent.ownership.owned, released)

    # -- re-replication ------------------------------------------------------

    async def sync(self, call: Call) -> SyncReport:
        return self.syncs.start(call.body).report()

    async def list_syncs(self, call: Call) -> SyncList:
        return SyncList(self.syncs.reports())

    # -- migrations (sending side) -------------------------------------------

    async def migrate(self, call: Call) -> MigrationReport:
        return (await self.migrator.migrate(call.body)).report()

    async def commit(self, call: Call) -> MigrationReport:
        return (await self.migrator.commit(call.params["id"])).report()

    async def abort(self, call: Call) -> MigrationReport:
        return (await self.migrator.abort(call.params["id"])).report()

    # -- migrations (receiving side) ------------------------------------------

    async def import_begin(self, call: Call) -> Importing:
        await self.agent.import_begin(call.params["id"], call.body.blocks)
        return Importing(call.body.blocks)

    async def import_records(self, call: Call) -> ImportProgress:
        records = decode_records(call.body.records)
        return ImportProgress(await self.agent.import_records(call.params["id"], records))

    async def import_discard(self, call: Call) -> Discarded:
        await self.agent.import_discard(call.params["id"])
        return Discarded(call.params["id"])

    # -- snapshots and restores ----------------------------------------------

    async def dump(self, call: Call) -> DumpPage:
        body = call.body
        return await self.agent.dump(body.block, body.epoch, body.after, body.limit)

    async def load(self, call: Call) -> Loaded:
        body = call.body
        return Loaded(await self.loader(body.block, body.epoch, decode_records(body.records)))
