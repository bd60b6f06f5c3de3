"""The agent's admin API (HTTP+JSON, port 9001 on the management address), declared once.

The controller drives ownership, replication and migrations through it,
and agents call each other's ``/import`` routes to move blocks. The agent
serves exactly these routes (`nat_agent.admin`); everyone else calls them
through `client_lib.api.clients`. Every route needs the cluster's
signature; the ones marked read-only may be opened to unsigned callers with
the agent's ``--open-reads``.

Roles. Every block an agent holds has a `Role`: it is the block's primary
(the one server the switches send the block's IDs to; it answers clients
while ``serving``) or one of its backups, in the block's replica set at an
epoch. ``POST /assign`` gives roles; an assignment with an older epoch than
the one held is refused (409), so a stale decision can never undo a newer
one. A primary acknowledges a write only once every synced member of the
set has applied it (over the replication stream, `client_lib.constants.
REPLICATION_PORT`); a backup applies the stream only from the primary of
its epoch, which fences a deposed primary.

Re-replication. ``POST /syncs`` asks a primary to bring a new member of a
block's set up to date: it streams new writes to it at once and copies the
block's records in the background (throttled); ``GET /syncs`` reports
progress. A member is ``synced`` once the copy is done.

Migrations, as the sending agent runs them (`nat_agent.migration`):

1. ``POST /migrations`` freezes writes to the blocks, checks that every
   target answers with the cluster's signature, copies every record to each
   of them (``/import/{id}/begin``, ``/records``), and answers once copied.
   The copied migration holds a lease of ``lease_s`` seconds: if nobody
   commits or aborts it by then, the agent aborts it by itself and serves
   the blocks again, so a controller that died never leaves a block frozen.
2. The controller assigns the targets their roles (``/assign`` with the
   migration id, which keeps the imported records) and moves the flows.
3. ``POST /migrations/{id}/commit`` then stops serving and deletes here.
4. ``POST /migrations/{id}/abort`` unfreezes, and the targets discard their copies.

A restarted controller lists ``GET /migrations`` on every agent and
finishes or aborts what it finds.

Backups (`metaflowctl snapshot` and ``restore``, `controller.backup`).
``POST /dump`` reads one page of a block's records from its primary, at
the epoch the first page answered: once the block moved on (a new epoch,
another primary, a migration committed), the next page is refused (409)
and the reader starts the block again. ``POST /load`` writes records into
blocks this agent is the primary of, through the same replicated write path
as a client's SET, so every member of the set gets them. Both always need
the signature: they carry the records themselves.
"""

from __future__ import annotations

import base64
from dataclasses import dataclass, field
from typing import Any

from client_lib.api.route import Route
from client_lib.cidr import Block
from client_lib.errors import InvalidArgument

# -- bodies --------------------------------------------------------------------


@dataclass(frozen=True)
class Member:
    """One server of a block's replica set."""

    name: str
    replication: str
    """host:port of its replication listener."""
    synced: bool = True
    """False while it catches up: it gets every new write, but the primary
    does not wait for it, and it cannot be promoted."""


@dataclass(frozen=True)
class Role:
    """What one agent is for one block, in the block's replica set at `epoch`.

    `members` is the whole set, primary first (this agent among them). A
    primary answers clients only while `serving`: between the fence of a
    fail-over and the flows that route to it, it holds the role but waits."""

    block: Block
    epoch: int
    primary: bool
    members: list[Member]
    serving: bool = True


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
    roles: list[Role] = field(default_factory=list)
    suspended: bool = False
    """Restarted and not yet told what to hold: serves nothing."""


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


OPS_BUCKET_BITS = 16
"""Agents count requests per 1/2**16th of the ID space (one per ID in a
smaller space): below `ops_resolution`, `/ops` counts are shares, not counts."""


def ops_resolution(space: Block) -> int:
    """The longest prefix length whose `/ops` count is exact."""
    return min(space.width, space.plen + OPS_BUCKET_BITS)


@dataclass(frozen=True)
class OpsReport:
    """Requests the agent served in each asked-for inclusive ID range over its
    last `seconds` (a sliding window of about `nat_agent`'s
    `OPS_WINDOW_S`): the per-range load a switch entry is too coarse to
    give, for splitting and moving by load. Counted per 1/65,536th of the ID
    space; a range that cuts such a bucket gets its share pro rata."""

    counts: list[int]
    seconds: float

    def rates(self) -> list[float]:
        """Requests a second in each range (a window of no length counts as 1 s)."""
        return [n / (self.seconds or 1.0) for n in self.counts]


@dataclass(frozen=True)
class Stats:
    """Counters of the metadata service and of the address rewrite."""

    service: dict[str, int]
    rewrite: dict[str, object]


@dataclass(frozen=True)
class AssignRequest:
    """Take `roles` (a role with an older epoch than the one held for that
    block: 409, nothing changes). Records already in a newly held block are
    wiped as stale, unless `migration` brought them. `exclusive`: these are
    all the roles this agent may hold; drop every other block and delete its
    records (a restarted controller's word, or a returning server's)."""

    roles: list[Role]
    migration: str | None = None
    exclusive: bool = False


@dataclass(frozen=True)
class Assigned:
    roles: list[Role]
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
    """Copy `blocks` to the agents whose admin APIs are `targets` (the new
    replica set, primary first).

    `lease_s`: seconds the migration may stay copied without a commit or an
    abort; then it aborts by itself."""

    blocks: list[Block]
    targets: list[str]
    lease_s: float = 60.0


@dataclass(frozen=True)
class MigrationReport:
    """`state`: copying -> copied -> committed | aborted."""

    id: str
    blocks: list[Block]
    targets: list[str]
    state: str
    keys: int
    error: str | None
    seconds: float
    lease_left_s: float | None = None


@dataclass(frozen=True)
class MigrationList:
    migrations: list[MigrationReport]


@dataclass(frozen=True)
class SyncRequest:
    """Bring `member` (in this primary's set for `block` at `epoch`, not yet
    synced) up to date, copying at most `rate` records a second."""

    block: Block
    epoch: int
    member: str
    rate: int = 5000


@dataclass(frozen=True)
class SyncReport:
    """`state`: copying -> synced | failed (with `error`)."""

    block: Block
    epoch: int
    member: str
    state: str
    records: int
    error: str | None
    seconds: float


@dataclass(frozen=True)
class SyncList:
    syncs: list[SyncReport]


@dataclass(frozen=True)
class ImportBegin:
    blocks: list[Block]


@dataclass(frozen=True)
class Importing:
    importing: list[Block]


RecordRow = tuple[int, str, str]
"""A record on the wire: ``[mdid, path, base64(value)]`` (`encode_records`)."""


def encode_records(records: list[tuple[int, str, bytes]]) -> list[RecordRow]:
    """``(mdid, path, value)`` records as rows for JSON."""
    return [(ident, path, base64.b64encode(value).decode("ascii")) for ident, path, value in records]


def decode_records(rows: list[RecordRow]) -> list[tuple[int, str, bytes]]:
    """Inverse of `encode_records`; a value that is not base64 is bad input."""
    try:
        return [(ident, path, base64.b64decode(value, validate=True)) for ident, path, value in rows]
    except ValueError as exc:
        raise InvalidArgument(f"malformed records: a value is not base64: {exc}") from None


@dataclass(frozen=True)
class ImportRecords:
    """A batch of a migration's records."""

    records: list[RecordRow]


@dataclass(frozen=True)
class DumpRequest:
    """One page of `block`'s records, read from its primary, in ``(mdid, path
    bytes)`` order. `epoch` None on the first page (the answer says which
    epoch it read at); every later page names that epoch, and is refused
    (409) once this agent is not the block's primary at it. `after`: the
    last ``(mdid, path)`` of the previous page."""

    block: Block
    epoch: int | None = None
    after: tuple[int, str] | None = None
    limit: int = 1000


@dataclass(frozen=True)
class DumpPage:
    """`more`: the page is full, ask again after its last record."""

    block: Block
    epoch: int
    records: list[RecordRow]
    more: bool


@dataclass(frozen=True)
class LoadRequest:
    """Write `records` (each inside `block`) as a client's SET would, with
    this agent the primary of the block at `epoch` (409 otherwise, or while
    a migration has the block frozen: the caller asks where it went and
    sends the batch again)."""

    block: Block
    epoch: int
    records: list[RecordRow]


@dataclass(frozen=True)
class Loaded:
    records: int


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
    ops = Route(
        "POST", "/ops", CountRequest, OpsReport, changes=False,
        summary="requests served in each inclusive ID range over the last few seconds")
    stats: Route[None, Stats] = Route(
        "GET", "/stats", None, Stats, changes=False,
        summary="service and rewrite counters")
    assign = Route(
        "POST", "/assign", AssignRequest, Assigned, changes=True,
        summary="take roles (primary or backup) in blocks' replica sets")
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
        summary="the targets hold the blocks now: stop serving them here and delete", waits=True)
    abort: Route[None, MigrationReport] = Route(
        "POST", "/migrations/{id}/abort", None, MigrationReport, changes=True,
        summary="unfreeze; the target discards its copy")
    sync = Route(
        "POST", "/syncs", SyncRequest, SyncReport, changes=True,
        summary="a primary brings a new member of a block's set up to date (in the background)")
    syncs: Route[None, SyncList] = Route(
        "GET", "/syncs", None, SyncList, changes=False,
        summary="the syncs this primary runs or ran, with their state")
    import_begin = Route(
        "POST", "/import/{id}/begin", ImportBegin, Importing, changes=True,
        summary="receiving side: prepare for blocks")
    import_records = Route(
        "POST", "/import/{id}/records", ImportRecords, ImportProgress, changes=True,
        summary="receiving side: a batch of records")
    import_discard: Route[None, Discarded] = Route(
        "POST", "/import/{id}/discard", None, Discarded, changes=True,
        summary="receiving side: drop an unfinished import")
    dump = Route(
        "POST", "/dump", DumpRequest, DumpPage, changes=False, private=True,
        summary="one page of a block's records, from its primary at one epoch (a snapshot)")
    load = Route(
        "POST", "/load", LoadRequest, Loaded, changes=True, waits=True,
        summary="write records into blocks held here as primary, replicated (a restore)")

    ALL: tuple[Route[Any, Any], ...] = ()


ADMIN.ALL = tuple(v for v in vars(ADMIN).values() if isinstance(v, Route))
