"""The agent's admin API: HTTP + JSON on the management address (port 9001).

Only the controller (and tests, and an operator with curl) talk to it, over
the management network, never through the switches under test. This module
is the HTTP shim: it parses and validates, calls `Agent` / `Migrator`, and
maps their exceptions to status codes (400 bad input, 404 unknown migration,
409 a conflict with the current ownership, 502 the other agent failed).

    GET  /health                      identity, owned and frozen blocks, key total
    GET  /blocks                      owned blocks with key counts
    GET  /count?first=A&last=B        keys in an ID range (addresses or integers)
    GET  /count?block=CIDR
    POST /count     {"ranges": [[A, B], ...]}          many ranges at once
    GET  /stats                       service (and rewrite) counters
    POST /own       {"blocks": [...], "migration": id?}
    POST /disown    {"blocks": [...], "delete": true, "moved_to": "ip:port"?}
    POST /migrations {"blocks": [...], "target": URL, "commit": false}
    GET  /migrations
    POST /migrations/{id}/commit | /migrations/{id}/abort
    POST /import/{id}/begin {"blocks"} | /import/{id}/records {"records"} | /import/{id}/discard
"""

from __future__ import annotations

import ipaddress
import json
import logging
from typing import Awaitable, Callable

from aiohttp import web

from client_lib.cidr import Block
from nat_agent.agent import Agent
from nat_agent.migration import MigrationError, Migrator, decode_records
from nat_agent.ownership import OwnershipError

log = logging.getLogger("metaflow.agent.admin")

StatsSource = Callable[[], dict]


class BadRequest(ValueError):
    pass


def _blocks(body: dict, space_width: int) -> list[Block]:
    raw = body.get("blocks")
    if not isinstance(raw, list) or not all(isinstance(b, str) for b in raw):
        raise BadRequest('"blocks" must be a list of CIDR strings')
    try:
        blocks = [Block.parse(b) for b in raw]
    except ValueError as exc:
        raise BadRequest(f"bad block: {exc}") from None
    if any(b.width != space_width for b in blocks):
        raise BadRequest(f"blocks must be {space_width}-bit prefixes")
    return blocks


def _id(value: object) -> int:
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    if isinstance(value, str):
        try:
            return int(value) if value.isdigit() else int(ipaddress.ip_address(value))
        except ValueError:
            pass
    raise BadRequest(f"not an ID or address: {value!r}")


@web.middleware
async def _errors(request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]):
    """One place that turns exceptions into JSON errors with the right status."""
    try:
        return await handler(request)
    except web.HTTPException:
        raise
    except (BadRequest, json.JSONDecodeError) as exc:
        status, message = 400, str(exc)
    except KeyError as exc:
        status, message = 404, str(exc.args[0] if exc.args else exc)
    except OwnershipError as exc:
        status, message = 409, str(exc)
    except MigrationError as exc:
        status, message = 502, str(exc)
    except ValueError as exc:
        status, message = 409, str(exc)
    log.warning("%s %s -> %d: %s", request.method, request.path, status, message)
    return web.json_response({"error": message}, status=status)


class AdminApi:
    def __init__(self, agent: Agent, migrator: Migrator, stats: StatsSource) -> None:
        self.agent = agent
        self.migrator = migrator
        self.stats = stats
        self.app = web.Application(middlewares=[_errors], client_max_size=64 << 20)
        route = self.app.router
        route.add_get("/health", self.health)
        route.add_get("/blocks", self.blocks)
        route.add_get("/count", self.count)
        route.add_post("/count", self.count_many)
        route.add_get("/stats", self.get_stats)
        route.add_post("/own", self.own)
        route.add_post("/disown", self.disown)
        route.add_get("/migrations", self.migrations)
        route.add_post("/migrations", self.migrate)
        route.add_post("/migrations/{id}/commit", self.commit)
        route.add_post("/migrations/{id}/abort", self.abort)
        route.add_post("/import/{id}/begin", self.import_begin)
        route.add_post("/import/{id}/records", self.import_records)
        route.add_post("/import/{id}/discard", self.import_discard)
        self._runner: web.AppRunner | None = None

    async def start(self, host: str, port: int) -> int:
        self._runner = web.AppRunner(self.app, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, host, port, reuse_address=True)
        await site.start()
        return site._server.sockets[0].getsockname()[1]

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    @staticmethod
    async def _body(request: web.Request) -> dict:
        if not request.can_read_body:
            return {}
        body = await request.json()
        if not isinstance(body, dict):
            raise BadRequest("the request body must be a JSON object")
        return body

    # -- reads -------------------------------------------------------------

    async def health(self, request: web.Request) -> web.Response:
        return web.json_response(await self.agent.health())

    async def blocks(self, request: web.Request) -> web.Response:
        report = await self.agent.blocks_report()
        return web.json_response({"blocks": report, "total": sum(b["keys"] for b in report)})

    async def count(self, request: web.Request) -> web.Response:
        query = request.query
        if "block" in query:
            try:
                block = Block.parse(query["block"])
            except ValueError as exc:
                raise BadRequest(f"bad block: {exc}") from None
            first, last = block.first, block.last
        elif "first" in query and "last" in query:
            first, last = _id(query["first"]), _id(query["last"])
        else:
            raise BadRequest("give ?block=CIDR or ?first=ID&last=ID")
        return web.json_response({"first": first, "last": last,
                                  "keys": await self.agent.count(first, last)})

    async def count_many(self, request: web.Request) -> web.Response:
        ranges = (await self._body(request)).get("ranges")
        if not isinstance(ranges, list) or not all(isinstance(r, list) and len(r) == 2 for r in ranges):
            raise BadRequest('"ranges" must be a list of [first, last] pairs')
        return web.json_response({"counts": [await self.agent.count(_id(a), _id(b)) for a, b in ranges]})

    async def get_stats(self, request: web.Request) -> web.Response:
        return web.json_response(self.stats())

    async def migrations(self, request: web.Request) -> web.Response:
        return web.json_response({"migrations": [m.report() for m in self.migrator.migrations.values()]})

    # -- ownership ---------------------------------------------------------

    async def own(self, request: web.Request) -> web.Response:
        body = await self._body(request)
        added = await self.agent.own(_blocks(body, self.agent.space.width), body.get("migration"))
        ident = self.agent.identity
        return web.json_response({"owned": [str(b) for b in self.agent.ownership.owned],
                                  "added": [str(b) for b in added],
                                  "data_address": f"{ident.data_ip}:{ident.data_port}" if ident.data_ip else None})

    async def disown(self, request: web.Request) -> web.Response:
        body = await self._body(request)
        released = await self.agent.disown(_blocks(body, self.agent.space.width),
                                           delete=bool(body.get("delete", True)),
                                           moved_to=body.get("moved_to"))
        return web.json_response({"owned": [str(b) for b in self.agent.ownership.owned],
                                  "released": [str(b) for b in released]})

    # -- migrations (sending side) -------------------------------------------

    async def migrate(self, request: web.Request) -> web.Response:
        body = await self._body(request)
        target = body.get("target")
        if not isinstance(target, str) or not target.startswith("http"):
            raise BadRequest('"target" must be the target agent\'s admin URL (http://host:port)')
        migration = await self.migrator.prepare(_blocks(body, self.agent.space.width), target)
        if body.get("commit"):
            migration = await self.migrator.commit(migration.id)
        return web.json_response(migration.report())

    async def commit(self, request: web.Request) -> web.Response:
        return web.json_response((await self.migrator.commit(request.match_info["id"])).report())

    async def abort(self, request: web.Request) -> web.Response:
        return web.json_response((await self.migrator.abort(request.match_info["id"])).report())

    # -- migrations (receiving side) ------------------------------------------

    async def import_begin(self, request: web.Request) -> web.Response:
        blocks = _blocks(await self._body(request), self.agent.space.width)
        await self.agent.import_begin(request.match_info["id"], blocks)
        return web.json_response({"importing": [str(b) for b in blocks]})

    async def import_records(self, request: web.Request) -> web.Response:
        rows = (await self._body(request)).get("records")
        if not isinstance(rows, list):
            raise BadRequest('"records" must be a list of [id, path, base64 value]')
        try:
            records = decode_records(rows)
        except ValueError as exc:
            raise BadRequest(str(exc)) from None
        total = await self.agent.import_records(request.match_info["id"], records)
        return web.json_response({"records": total})

    async def import_discard(self, request: web.Request) -> web.Response:
        await self.agent.import_discard(request.match_info["id"])
        return web.json_response({"discarded": request.match_info["id"]})
