"""`metaflowctl snapshot DIR` and `metaflowctl restore DIR`: a cluster's records to files and back.

Snapshot. The controller's REST API says which live server is the primary
of which block (``GET /metaflow/servers``); each block is then read from
its primary's admin API page by page (``POST /dump``), all pages at the
epoch the first one answered. A block that moves on meanwhile (a split, a
migration, a fail-over: the agent refuses the next page, 409) is dropped
and the controller is asked again after a pause; blocks already read that are still
blocks of the cluster are kept, the others (split or merged since) are
read again, so the snapshot's blocks always partition the space. What a
block's copy holds: every write acknowledged before its read began, and
perhaps some made while it ran (each page reads the store at one moment);
the blocks are read one after another, not all at one instant, so a
snapshot taken while clients write is consistent per block, and exact when
they are quiet. The format is `controller.snapshot_format`'s.

Restore. Every file is checked first (size, SHA-256, every record), then
the cluster: it must serve the snapshot's MetaDataID space and hold no
records at all, unless ``--force`` (then records of the snapshot overwrite
the same keys and everything else stays). Records go in batches to the
current primary of their MetaDataID (``POST /load``), which writes them as
SETs, replicated to the block's set; a batch refused because its block
moved (splits start as servers fill up) is sent again where the agents say
it went now. Last, the records of every snapshot block are counted in the
cluster (``POST /count``) and must be as many (at least as many with
``--force``).

Exit status: 0 done, 2 an error (printed with what to do about it).
"""

from __future__ import annotations

import argparse
import bisect
import sys
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import TypeVar

from client_lib.api.admin import (
    ADMIN,
    CountRequest,
    DumpRequest,
    Health,
    LoadRequest,
    encode_records,
)
from client_lib.api.auth import load_secret
from client_lib.api.clients import ApiClient, LeaderClient
from client_lib.api.rest import REST
from client_lib.api.route import Route
from client_lib.cidr import Block
from client_lib.errors import ApiError, Conflict, MetaFlowError, NotFound
from controller.snapshot_format import (
    BLOCKS,
    FORMAT,
    VERSION,
    BlockEntry,
    BlockWriter,
    Manifest,
    Record,
    SnapshotError,
    missing,
    read_manifest,
    records,
    verify,
    write_manifest,
)
from controller.status import DEFAULT_CONTROLLER

PAGE = 2000
"""Records per ``POST /dump`` page."""
BATCH = 500
"""Records per ``POST /load`` call."""
RETRIES = 10
"""Times a snapshot asks the controller again after blocks moved under it."""
MAX_PAUSE_S = 5.0
"""The longest a snapshot waits before it asks again (0.5 s more each time)."""
SETTLE_S = 60.0
"""How long a restore keeps re-sending a refused batch (its block moving)
before it gives up."""

Req = TypeVar("Req")
Resp = TypeVar("Resp")

Agents = Callable[[str], ApiClient]
"""A client for an agent's admin URL."""
Say = Callable[[str], None]


@dataclass(frozen=True)
class Primary:
    """Where one block is written and read: its primary's name and admin API."""

    block: Block
    server: str
    admin_url: str


def primaries(controller: ApiClient) -> list[Primary]:
    """Every block of a live server, by the controller's word, in order."""
    servers = controller.call(REST.servers).servers
    return sorted((Primary(block, name, info.admin_url) for name, info in servers.items()
                   if not info.failed for block in info.blocks), key=lambda p: p.block)


def _healths(controller: ApiClient, agents: Agents) -> list[Health]:
    """Every live server's own account (space, keys, roles with epochs)."""
    servers = controller.call(REST.servers).servers
    if not servers:
        raise SnapshotError("the controller knows no server yet")
    return [_ask(agents, name, info.admin_url, ADMIN.health)
            for name, info in sorted(servers.items()) if not info.failed]


def _ask(agents: Agents, server: str, admin_url: str, route: Route[Req, Resp],
         body: Req | None = None) -> Resp:
    """An agent's answer; an agent out of reach (or failing) is an error
    that names it. 409 and 404 (the block is not there) are the caller's."""
    try:
        return agents(admin_url).call(route, body)
    except (Conflict, NotFound):
        raise
    except ApiError as exc:
        raise SnapshotError(f"server {server}: {exc}") from None


# -- snapshot ----------------------------------------------------------------------


class Moved(Exception):
    """A block changed hands while it was read: ask the controller again."""


def snapshot(root: Path, controller: ApiClient, agents: Agents, say: Say, page: int = PAGE,
             retries: int = RETRIES) -> Manifest:
    """Write a snapshot of the cluster to `root` (absent or empty) and return its manifest."""
    if root.exists() and any(root.iterdir()):
        raise SnapshotError(f"{root} is not empty: a snapshot goes into a new directory")
    (root / BLOCKS).mkdir(parents=True, exist_ok=True)
    space = _healths(controller, agents)[0].space
    done: dict[Block, BlockEntry] = {}
    for attempt in range(retries + 1):
        owners = primaries(controller)
        current = {p.block for p in owners}
        for block in [b for b in done if b not in current]:
            say(f"  {block} was split or merged since it was read: reading its parts again")
            (root / done.pop(block).file).unlink()
        try:
            for owner in owners:
                if owner.block not in done:
                    done[owner.block] = _read_block(root, owner, agents, page)
                    entry = done[owner.block]
                    say(f"  {entry.block} from {entry.server} at epoch {entry.epoch}: "
                        f"{entry.records} records")
            break
        except Moved as exc:
            if attempt == retries:
                raise SnapshotError(f"blocks kept moving while they were read ({exc}); "
                                    f"gave up after {retries} retries: try again when the "
                                    "cluster is calmer (no split or migration running)") from None
            pause = min(MAX_PAUSE_S, 0.5 * (attempt + 1))
            say(f"  {exc}: asking the controller again in {pause:g} s")
            time.sleep(pause)   # its view follows the move once the operation has finished
    gaps = missing(space, list(done))
    if gaps:
        raise SnapshotError(f"no live server holds {', '.join(map(str, gaps[:4]))} "
                            "(a server failed and was not taken over?): the snapshot would be incomplete")
    entries = sorted(done.values(), key=lambda e: e.block)
    manifest = Manifest(FORMAT, VERSION, datetime.now(UTC).isoformat(timespec="seconds"),
                        controller.base_url, space, sum(e.records for e in entries), entries)
    write_manifest(root, manifest)
    return manifest


def _read_block(root: Path, owner: Primary, agents: Agents, page: int) -> BlockEntry:
    """Every page of `owner.block` at the epoch of the first, into its file."""
    writer = BlockWriter(root, owner.block)
    try:
        epoch: int | None = None
        after: tuple[int, str] | None = None
        while True:
            try:
                got = _ask(agents, owner.server, owner.admin_url, ADMIN.dump,
                           DumpRequest(owner.block, epoch, after, page))
            except (Conflict, NotFound) as exc:
                raise Moved(f"{owner.block} moved while it was read from {owner.server}: {exc}") from None
            epoch = got.epoch
            writer.add(got.records)
            if not got.more or not got.records:
                return writer.finish(owner.server, epoch)
            after = (got.records[-1][0], got.records[-1][1])
    except BaseException:
        writer.discard()
        raise


# -- restore -----------------------------------------------------------------------


@dataclass(frozen=True)
class Target:
    """A primary block with its epoch, as its agent holds it."""

    block: Block
    epoch: int
    server: str
    admin_url: str


def targets(healths: Iterable[Health]) -> list[Target]:
    """Every block some agent holds as its primary, in order."""
    return sorted((Target(r.block, r.epoch, h.name, h.admin_url) for h in healths if not h.suspended
                   for r in h.roles if r.primary), key=lambda r: r.block)


def target_of(table: list[Target], ident: int) -> Target | None:
    """The target whose block holds `ident` (`table` in order, disjoint)."""
    at = bisect.bisect_right([r.block.first for r in table], ident) - 1
    return table[at] if at >= 0 and table[at].block.contains(ident) else None


class Restorer:
    """Sends records to the primaries of their IDs, following the blocks as they move."""

    def __init__(self, controller: ApiClient, agents: Agents, say: Say) -> None:
        self.controller = controller
        self.agents = agents
        self.say = say
        self.table: list[Target] = []
        self.refreshes = 0

    def refresh(self) -> list[Health]:
        healths = _healths(self.controller, self.agents)
        self.table = targets(healths)
        self.refreshes += 1
        return healths

    def load(self, batch: list[Record]) -> None:
        """Write `batch`, each record at its ID's primary; what was refused
        (its block moved) goes again to where the agents then say it is."""
        deadline = time.monotonic() + SETTLE_S
        left = batch
        while left:
            refused: list[Record] = []
            for target, part in self._by_target(left):
                try:
                    _ask(self.agents, target.server, target.admin_url, ADMIN.load,
                         LoadRequest(target.block, target.epoch, encode_records(part)))
                except (Conflict, NotFound) as exc:
                    if time.monotonic() > deadline:
                        raise SnapshotError(f"{target.block} kept moving for {SETTLE_S:g} s; "
                                            f"last refusal: {exc}") from None
                    refused += part
            left = refused
            if left:
                time.sleep(0.2)
                self.refresh()

    def _by_target(self, batch: list[Record]) -> list[tuple[Target, list[Record]]]:
        parts: dict[Target, list[Record]] = {}
        for record in batch:
            target = target_of(self.table, record[0])
            if target is None:
                raise SnapshotError(f"no server is the primary of {record[0]:#x} (is the B-tree built?)")
            parts.setdefault(target, []).append(record)
        return list(parts.items())

    def count(self, block: Block) -> int:
        """Records the cluster's primaries hold in `block` now."""
        total = 0
        for target in self.table:
            first, last = max(target.block.first, block.first), min(target.block.last, block.last)
            if first <= last:
                total += _ask(self.agents, target.server, target.admin_url, ADMIN.count,
                              CountRequest([(first, last)])).counts[0]
        return total


def restore(root: Path, controller: ApiClient, agents: Agents, say: Say, force: bool = False,
            batch: int = BATCH) -> Manifest:
    """Load the snapshot in `root` into the cluster; its manifest."""
    manifest = read_manifest(root)
    say(f"checking {len(manifest.blocks)} block files ({manifest.records} records, "
        f"taken {manifest.created})")
    verify(root, manifest)
    restorer = Restorer(controller, agents, say)
    healths = restorer.refresh()
    other = [h.name for h in healths if h.space != manifest.space]
    if other:
        raise SnapshotError(f"the snapshot is of the space {manifest.space}; "
                            f"{', '.join(other)} serve{'s' if len(other) == 1 else ''} {healths[0].space}")
    held = sum(h.keys for h in healths)
    if held and not force:
        raise SnapshotError(f"the cluster holds {held} records already: restore into an empty cluster, "
                            "or pass --force to write the snapshot's over what is there")
    written = 0
    for entry in manifest.blocks:
        for part in records(root, entry, batch):
            restorer.load(part)
            written += len(part)
        say(f"  {entry.block}: {entry.records} records written ({written} of {manifest.records})")
    _check_counts(restorer, manifest, force)
    return manifest


def _check_counts(restorer: Restorer, manifest: Manifest, force: bool) -> None:
    """Every block of the snapshot holds as many records in the cluster as
    in the snapshot (at least as many with `force`), asked again for a while
    if not: a block may be between two servers (a split's copy) for a moment."""
    deadline = time.monotonic() + SETTLE_S
    while True:
        restorer.refresh()
        short = [(e, n) for e in manifest.blocks
                 if (n := restorer.count(e.block)) != e.records and not (force and n > e.records)]
        if not short:
            return
        if time.monotonic() > deadline:
            entry, found = short[0]
            raise SnapshotError(f"{len(short)} blocks do not hold what the snapshot does, e.g. "
                                f"{entry.block}: {found} records in the cluster, {entry.records} "
                                "in the snapshot")
        time.sleep(0.5)


# -- the commands ----------------------------------------------------------------


def add_arguments(p: argparse.ArgumentParser, command: str) -> Callable[[argparse.Namespace], int]:
    """`command`'s arguments (snapshot or restore); how to run it."""
    p.add_argument("dir", type=Path, help="the snapshot's directory")
    p.add_argument("--controller", default=DEFAULT_CONTROLLER, metavar="URL[,URL...]",
                   help=f"the controller's REST API (default {DEFAULT_CONTROLLER}); several, "
                        "separated by commas: the controllers of which one leads")
    p.add_argument("--secret-file", required=True, metavar="FILE",
                   help="the cluster's secret: records are read and written only with it")
    p.add_argument("--timeout", type=float, default=30.0, help="seconds per API call")
    if command == "snapshot":
        p.add_argument("--page", type=_positive, default=PAGE, help=f"records per read (default {PAGE})")
        p.add_argument("--retries", type=_positive, default=RETRIES,
                       help=f"times to ask the controller again when blocks move (default {RETRIES})")
        return run_snapshot
    p.add_argument("--force", action="store_true",
                   help="write into a cluster that holds records already (the snapshot's keys are "
                        "overwritten, the others stay)")
    p.add_argument("--batch", type=_positive, default=BATCH, help=f"records per write call (default {BATCH})")
    return run_restore


def _positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, not {value}")
    return value


def _say(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


def _run(args: argparse.Namespace, work: Callable[[ApiClient, Agents], Manifest], done: str) -> int:
    started = time.monotonic()
    try:
        secret = load_secret(args.secret_file)
        controller = LeaderClient(args.controller, secret, timeout=args.timeout)
        manifest = work(controller, lambda url: ApiClient(url, secret, timeout=args.timeout))
    except (MetaFlowError, OSError) as exc:
        print(f"metaflowctl {args.command}: {exc}", file=sys.stderr)
        return 2
    print(f"{done} {manifest.records} records in {len(manifest.blocks)} blocks "
          f"({args.dir}) in {time.monotonic() - started:.1f} s")
    return 0


def run_snapshot(args: argparse.Namespace) -> int:
    _say(f"snapshot of {args.controller}'s cluster into {args.dir}")
    return _run(args, lambda c, a: snapshot(args.dir, c, a, _say, args.page, args.retries), "snapshot:")


def run_restore(args: argparse.Namespace) -> int:
    _say(f"restore of {args.dir} into {args.controller}'s cluster")
    return _run(args, lambda c, a: restore(args.dir, c, a, _say, args.force, args.batch), "restored")
