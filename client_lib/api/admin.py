"""The agent's admin API (HTTP+JSON, port 9001 on the management address), declared once.

The controller drives ownership and migrations through it, and agents call
each other's ``/import`` routes to move blocks. The agent serves exactly
these routes (`nat_agent.admin`); everyone else calls them through
`client_lib.api.clients`. Every route needs the cluster's signature; the
ones marked read-only may be opened to unsigned callers with the agent's
``--open-reads``.

Migrations, as the sending agent runs them (`nat_agent.migration`):

1. ``POST /migrations`` freezes writes to the blocks, checks that the target
   answers with the cluster's signature, copies every record to it
   (``/import/{id}/begin``, ``/records``), and answers once copied. The
   copied migration holds a lease of ``lease_s`` seconds: if nobody commits
   or aborts it by then, the agent aborts it by itself and serves the
   blocks again, so a controller that died never leaves a block frozen.
2. ``POST /migrations/{id}/commit`` makes the target serve (``/own`` with
   the migration id), then stops serving and deletes here.
3. ``POST /migrations/{id}/abort`` unfreezes, and the target discards its copy.

A restarted controller lists ``GET /migrations`` on every agent and
finishes or aborts what it finds.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from client_lib.api.route import Route
from client_lib.cidr import Block

# -- bodies --------------------------------------------------------------------


@dataclass(frozen=True)
class Health:
    """Who this agent is and what it holds; also the readiness probe."""

    status: str
    name: str
    store: str
    space: Block
    data_ip: str | None
    data_mac: str | None
    data_port: int
    admin_url: str
    capacity: int
    keys: int
    owned: list[Block]
    frozen: list[Block]
    imports: list[str]
    uptime_s: float


@dataclass(frozen=True)
class BlockKeys:
    block: Block
    keys: int
    frozen: bool


@dataclass(frozen=True)
class BlocksReport:
    blocks: list[BlockKeys]
    total: int


@dataclass(frozen=True)
class CountRequest:
    """Inclusive MetaDataID ranges ``[first, last]``, as integers."""

    ranges: list[tuple[int, int]]


@dataclass(frozen=True)
class Counts:
    counts: list[int]


@dataclass(frozen=True)
class Stats:
    """Counters of the metadata service and of the address rewrite."""

    service: dict[str, int]
    rewrite: dict[str, object]


@dataclass(frozen=True)
class OwnRequest:
    """Serve `blocks`; with `migration`, keep the records that import brought."""

    blocks: list[Block]
    migration: str | None = None


@dataclass(frozen=True)
class OwnReply:
    owned: list[Block]
    added: list[Block]
    data_address: str | None


@dataclass(frozen=True)
class DisownRequest:
    """Stop serving `blocks` (answer MOVED, with `moved_to` as the hint) and,
    with `delete`, drop their records."""

    blocks: list[Block]
    delete: bool = True
    moved_to: str | None = None


@dataclass(frozen=True)
class DisownReply:
    owned: list[Block]
    released: list[Block]


@dataclass(frozen=True)
class MigrateRequest:
    """Move `blocks` to the agent whose admin API is `target`.

    `lease_s`: seconds the migration may stay copied without a commit or an
    abort; then it aborts by itself. `commit`: commit at once after the copy (no
    flows to change in between, e.g. an operator's manual move)."""

    blocks: list[Block]
    target: str
    lease_s: float = 60.0
    commit: bool = False


@dataclass(frozen=True)
class MigrationReport:
    """`state`: copying -> copied -> committed | aborted."""

    id: str
    blocks: list[Block]
    target: str
    state: str
    keys: int
    error: str | None
    seconds: float
    lease_left_s: float | None = None


@dataclass(frozen=True)
class MigrationList:
    migrations: list[MigrationReport]


@dataclass(frozen=True)
class ImportBegin:
    blocks: list[Block]


@dataclass(frozen=True)
class Importing:
    importing: list[Block]


@dataclass(frozen=True)
class ImportRecords:
    """``[mdid, path, base64(value)]`` rows (`nat_agent.migration` encodes them)."""

    records: list[tuple[int, str, str]]


@dataclass(frozen=True)
class ImportProgress:
    records: int


@dataclass(frozen=True)
class Discarded:
    discarded: str


# -- routes --------------------------------------------------------------------


class ADMIN:
    """The routes, by name (a namespace, not instantiated)."""

    health: Route[None, Health] = Route(
        "GET", "/health", None, Health, changes=False,
        summary="identity, owned and frozen blocks, key total")
    blocks: Route[None, BlocksReport] = Route(
        "GET", "/blocks", None, BlocksReport, changes=False,
        summary="owned blocks with key counts")
    count = Route(
        "POST", "/count", CountRequest, Counts, changes=False,
        summary="keys in each inclusive ID range")
    stats: Route[None, Stats] = Route(
        "GET", "/stats", None, Stats, changes=False,
        summary="service and rewrite counters")
    own = Route("POST", "/own", OwnRequest, OwnReply, changes=True, summary="start serving blocks")
    disown = Route(
        "POST", "/disown", DisownRequest, DisownReply, changes=True,
        summary="stop serving blocks (and delete their records)")
    migrations: Route[None, MigrationList] = Route(
        "GET", "/migrations", None, MigrationList, changes=False,
        summary="every migration this agent sends, with its state")
    migration: Route[None, MigrationReport] = Route(
        "GET", "/migrations/{id}", None, MigrationReport, changes=False,
        summary="one migration")
    migrate = Route(
        "POST", "/migrations", MigrateRequest, MigrationReport, changes=True,
        summary="freeze blocks and copy them to another agent", waits=True)
    commit: Route[None, MigrationReport] = Route(
        "POST", "/migrations/{id}/commit", None, MigrationReport, changes=True,
        summary="the target serves; this agent deletes", waits=True)
    abort: Route[None, MigrationReport] = Route(
        "POST", "/migrations/{id}/abort", None, MigrationReport, changes=True,
        summary="unfreeze; the target discards its copy")
    import_begin = Route(
        "POST", "/import/{id}/begin", ImportBegin, Importing, changes=True,
        summary="receiving side: prepare for blocks")
    import_records = Route(
        "POST", "/import/{id}/records", ImportRecords, ImportProgress, changes=True,
        summary="receiving side: a batch of records")
    import_discard: Route[None, Discarded] = Route(
        "POST", "/import/{id}/discard", None, Discarded, changes=True,
        summary="receiving side: drop an unfinished import")

    ALL: tuple[Route[Any, Any], ...] = ()


ADMIN.ALL = tuple(v for v in vars(ADMIN).values() if isinstance(v, Route))
