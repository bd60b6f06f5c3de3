"""Moving blocks to another agent without losing an acknowledged write.

The sending side drives it, in two steps so that the controller can swap
the flow entries in between:

1. `prepare`: freeze writes to the blocks (clients get TRYAGAIN and retry),
   stream every key of them to the target's admin API, where they sit unserved.
2. `commit` (after the controller's barrier): the target starts serving, then
   the source stops serving (MOVED for stragglers) and deletes its copy.

Anything that fails before the target confirms it serves ends in `abort`:
the source unfreezes and keeps serving, the target drops its partial copy.
Nothing is deleted at the source until the target owns the blocks, so no
failure loses data; the one ambiguous case (the target's confirmation is
lost) is resolved towards the source by asking the target to give the
blocks back.
"""

from __future__ import annotations

import base64
import logging
import time
import uuid
from dataclasses import dataclass, field

import aiohttp

from client_lib.cidr import Block
from nat_agent.agent import Agent

log = logging.getLogger("metaflow.agent.migration")

BATCH = 500


class MigrationError(RuntimeError):
    """A migration that could not proceed; the source still owns its blocks."""


# What talking to another agent can raise; each means "the peer did not do it".
_PEER_ERRORS = (aiohttp.ClientError, OSError, TimeoutError, ValueError, MigrationError)


@dataclass
class Migration:
    id: str
    blocks: list[Block]
    target: str                      # the target agent's admin URL
    state: str = "copying"           # copying -> copied -> committed | aborted
    keys: int = 0
    error: str | None = None
    started: float = field(default_factory=time.monotonic)
    finished: float | None = None

    def report(self) -> dict:
        return {"id": self.id, "blocks": [str(b) for b in self.blocks], "target": self.target,
                "state": self.state, "keys": self.keys, "error": self.error,
                "seconds": round((self.finished or time.monotonic()) - self.started, 4)}


def encode_records(records: list[tuple[int, str, bytes]]) -> list[list]:
    return [[ident, path, base64.b64encode(value).decode("ascii")] for ident, path, value in records]


def decode_records(rows: list) -> list[tuple[int, str, bytes]]:
    try:
        return [(int(ident), str(path), base64.b64decode(value, validate=True)) for ident, path, value in rows]
    except (TypeError, ValueError) as exc:
        raise ValueError(f"malformed records: {exc}") from None


class Migrator:
    """The sending side of migrations, for one agent."""

    def __init__(self, agent: Agent, timeout: float = 30.0) -> None:
        self.agent = agent
        self.migrations: dict[str, Migration] = {}
        self._timeout = aiohttp.ClientTimeout(total=timeout)
        self._session: aiohttp.ClientSession | None = None

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    async def _call(self, method: str, url: str, body: dict | None = None) -> dict:
        if self._session is None:
            self._session = aiohttp.ClientSession(timeout=self._timeout)
        async with self._session.request(method, url, json=body) as response:
            reply = await response.json(content_type=None)
            if response.status >= 300:
                raise MigrationError(f"{method} {url}: HTTP {response.status}: "
                                     f"{reply.get('error') if isinstance(reply, dict) else reply}")
            return reply

    def get(self, ident: str) -> Migration:
        try:
            return self.migrations[ident]
        except KeyError:
            raise KeyError(f"no migration {ident!r}") from None

    async def prepare(self, blocks: list[Block], target: str) -> Migration:
        ownership = self.agent.ownership
        if not blocks:
            raise ValueError("nothing to migrate: no blocks given")
        if not ownership.owns_all(blocks):
            raise ValueError(f"cannot migrate {', '.join(map(str, blocks))}: not all owned here")
        busy = [f for f in ownership.frozen for b in blocks if f.covers(b) or b.covers(f)]
        if busy:
            raise ValueError(f"{busy[0]} is already being migrated")
        target = target.rstrip("/")
        migration = Migration(uuid.uuid4().hex[:12], list(blocks), target)
        self.migrations[migration.id] = migration
        ownership.freeze(blocks)
        log.info("migration %s: %s -> %s, writes frozen", migration.id,
                 ", ".join(map(str, blocks)), target)
        await self.agent.inflight.drain()
        try:
            await self._call("POST", f"{target}/import/{migration.id}/begin",
                             {"blocks": [str(b) for b in blocks]})
            for block in blocks:
                async for batch in self.agent.store.scan(block.first, block.last, BATCH):
                    await self._call("POST", f"{target}/import/{migration.id}/records",
                                     {"records": encode_records(batch)})
                    migration.keys += len(batch)
        except _PEER_ERRORS as exc:
            await self._abort(migration, f"copy failed: {exc}")
            raise MigrationError(f"migration {migration.id} aborted: copy failed: {exc}") from None
        migration.state = "copied"
        log.info("migration %s: %d keys copied", migration.id, migration.keys)
        return migration

    async def commit(self, ident: str) -> Migration:
        migration = self.get(ident)
        if migration.state != "copied":
            raise ValueError(f"migration {ident} is {migration.state}, not copied")
        try:
            reply = await self._call("POST", f"{migration.target}/own",
                                     {"blocks": [str(b) for b in migration.blocks],
                                      "migration": migration.id})
        except _PEER_ERRORS as exc:
            await self._give_back(migration)
            await self._abort(migration, f"cut-over failed: {exc}")
            raise MigrationError(f"migration {ident} aborted: cut-over failed: {exc}") from None
        hint = reply.get("data_address")
        await self.agent.disown(migration.blocks, delete=True, moved_to=hint)
        migration.state = "committed"
        migration.finished = time.monotonic()
        log.info("migration %s committed in %.3f s", ident, migration.finished - migration.started)
        return migration

    async def abort(self, ident: str) -> Migration:
        migration = self.get(ident)
        if migration.state in ("committed", "aborted"):
            raise ValueError(f"migration {ident} is already {migration.state}")
        await self._abort(migration, "aborted by request")
        return migration

    async def _give_back(self, migration: Migration) -> None:
        """The target may have taken the blocks even though we did not hear it:
        ask it to release them, so only the source serves them."""
        try:
            await self._call("POST", f"{migration.target}/disown",
                             {"blocks": [str(b) for b in migration.blocks], "delete": True})
        except _PEER_ERRORS as exc:
            log.error("migration %s: could not make sure the target released %s: %s; "
                      "both may own them until the controller resolves it", migration.id,
                      ", ".join(map(str, migration.blocks)), exc)

    async def _abort(self, migration: Migration, reason: str) -> None:
        self.agent.ownership.unfreeze(migration.blocks)
        migration.state = "aborted"
        migration.error = reason
        migration.finished = time.monotonic()
        log.warning("migration %s aborted (%s); this agent keeps serving %s", migration.id,
                    reason, ", ".join(map(str, migration.blocks)))
        try:
            await self._call("POST", f"{migration.target}/import/{migration.id}/discard", {})
        except _PEER_ERRORS as exc:
            log.info("migration %s: target did not confirm the discard: %s", migration.id, exc)
