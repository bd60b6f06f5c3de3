"""The storage server's metadata store: one interface over LevelDB and Redis.

A record is a file's metadata value under its normalized absolute path. Each
path has one MetaDataID (``mdid``), computed by the caller with
``client_lib.mdid``; the stores never hash anything, they only keep records
ordered by ``(mdid, path bytes)``. That order is what the rest of the agent
needs: the controller plans splits by asking how many keys fall between two
IDs, and a migration streams an ID range to another server, so both stores
count and scan any inclusive ID range ``[first, last]`` in O(log n + k).

The shared encoding, used as the LevelDB key and as the Redis index member,
is ``record_key = be(mdid) + path``: the mdid big-endian in ``width // 8``
bytes (so byte order equals numeric order, for 32-bit and 128-bit spaces
alike) followed by the path in UTF-8 with ``surrogateescape`` (the same bytes
``client_lib.mdid`` hashes, so a name taken from ``os.fsdecode`` round-trips).

The API is async so that the asyncio service treats both stores alike, even
though the LevelDB store does its (fast, in-process) work synchronously.

Contract relied on by both stores: a given path always comes with the same
mdid. (The Redis store keys values by path alone.)

Durability (``--fsync``, `FsyncMode`) is chosen per store when it is opened.
In every mode a store call that changed something has handed the change to
the kernel (or to redis-server) before it returns, so killing the agent
loses nothing; the mode decides what a power loss can take:

* ``always``: each write is on disk (fsync/fdatasync done) before its call
  returns;
* ``batch`` (the default): the same promise, by group commit: a write waits
  for one sync that covers it, and the writes that arrive while a sync is
  running share the next one;
* ``off``: nothing waits for the disk; the OS (LevelDB) or redis-server's
  ``appendfsync everysec`` writes it back later.
"""

from __future__ import annotations

import threading
from abc import ABC, abstractmethod
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass
from types import TracebackType
from typing import Any, ClassVar, Literal

from client_lib.cidr import WIDTHS
from nat_agent.group_commit import SyncLedger
from nat_agent.latency import Latency

__all__ = [
    "DEFAULT_FSYNC",
    "FSYNC_MODES",
    "FsyncMode",
    "Record",
    "RecordAccess",
    "KeyRange",
    "Store",
    "Condition",
    "IfEqual",
    "InDirectory",
    "Removal",
    "check_batch",
    "check_fsync",
    "check_width",
    "condition_holds",
    "decode_mdid",
    "decode_path",
    "encode_mdid",
    "entry_bounds",
    "encode_path",
    "key_range",
    "record_key",
    "scan_start",
    "split_record_key",
]

Record = tuple[int, str, bytes]
"""``(mdid, path, value)``: one metadata record as scans return it."""

@dataclass(frozen=True)
class IfEqual:
    """`Store.put_if` writes only if the record holds exactly `value` (SET
    IFEQ, as Valkey has it): a compare-and-set, so a retried update cannot
    overwrite a newer one."""

    value: bytes


@dataclass(frozen=True)
class InDirectory:
    """`Store.put_if` writes only if the record is absent and the header
    record of its directory (the record `directory`, at the same mdid: see
    ``client_lib.mdid.entry_key``) is present: a create that cannot land in
    a directory that does not exist or is being removed (`remove_directory`)."""

    directory: str


Condition = Literal["absent", "present"] | IfEqual | InDirectory
"""When `Store.put_if` writes: only if the record is absent (SET NX),
present (SET XX), holds a given value (SET IFEQ), or is absent from a
directory that exists (ECREATE)."""

Removal = Literal["removed", "absent", "not-empty"]
"""What `Store.remove_directory` did."""


FsyncMode = Literal["always", "batch", "off"]
"""What a store waits for before a write returns (see the module docstring)."""

FSYNC_MODES: tuple[FsyncMode, ...] = ("always", "batch", "off")

DEFAULT_FSYNC: FsyncMode = "batch"
"""An acknowledged write must survive a power loss, or a file system built on
this service can lose files' metadata when a room goes dark: replication
covers one server, not every replica at once. ``batch`` promises what
``always`` does at the cost of one sync per group of concurrent writes
instead of one per write, and a lone write waits for one sync either way."""


def check_fsync(mode: str) -> FsyncMode:
    """Validate an ``--fsync`` mode."""
    for known in FSYNC_MODES:
        if mode == known:
            return known
    raise ValueError(f"fsync mode must be one of {', '.join(FSYNC_MODES)}, not {mode!r}")


def condition_holds(when: Condition | None, old: bytes | None, header: bool = False) -> bool:
    """Whether a conditional write may go ahead, given the record's value
    (None: absent) and, for `InDirectory`, whether its directory's header
    is present; `when` None is unconditional."""
    if isinstance(when, IfEqual):
        return old == when.value
    if isinstance(when, InDirectory):
        return old is None and header
    return when is None or (old is not None) == (when == "present")


def check_width(width: int) -> int:
    """Validate an mdid width; returns its size in bytes."""
    if width not in WIDTHS:
        raise ValueError(f"mdid width must be one of {WIDTHS}, not {width!r}")
    return width // 8


def _check_mdid(mdid: int, width: int) -> int:
    size = check_width(width)
    if not 0 <= mdid < 1 << width:
        raise ValueError(f"mdid {mdid} is outside the {width}-bit space")
    return size


def encode_mdid(mdid: int, width: int) -> bytes:
    """Big-endian, fixed-size encoding, so that byte order is numeric order."""
    return mdid.to_bytes(_check_mdid(mdid, width), "big")


def encode_path(path: str) -> bytes:
    """The path's bytes as ``client_lib.mdid`` sees them (UTF-8, surrogateescape)."""
    return path.encode("utf-8", "surrogateescape")


def decode_path(raw: bytes) -> str:
    """Inverse of `encode_path`; undecodable bytes come back as lone surrogates."""
    return raw.decode("utf-8", "surrogateescape")


def record_key(mdid: int, path: str, width: int) -> bytes:
    """``be(mdid) + path``: the key whose byte order is ``(mdid, path bytes)``."""
    return encode_mdid(mdid, width) + encode_path(path)


def decode_mdid(key: bytes, width: int) -> int:
    """The mdid at the head of a record key (the rest is ignored)."""
    return int.from_bytes(key[: check_width(width)], "big")


def split_record_key(key: bytes, width: int) -> tuple[int, str]:
    """Inverse of `record_key`: ``(mdid, path)``."""
    return decode_mdid(key, width), decode_path(key[check_width(width) :])


@dataclass(frozen=True)
class KeyRange:
    """The record keys of a non-empty inclusive mdid range ``[first, last]``.

    ``start`` is inclusive and ``stop`` exclusive; ``stop`` is None when
    ``last`` is the top of the space, because ``be(last + 1)`` would not fit in
    the fixed width (Redis then uses ``+`` as its upper bound).
    """

    start: bytes
    stop: bytes | None


def key_range(first: int, last: int, width: int) -> KeyRange | None:
    """The keys of ``[first, last]``, or None when ``first > last`` (an empty range).

    Both ends must lie in the space; an ID outside it is a caller's bug, not
    an empty answer.
    """
    start = encode_mdid(first, width)
    _check_mdid(last, width)
    if first > last:
        return None
    stop = None if last == (1 << width) - 1 else encode_mdid(last + 1, width)
    return KeyRange(start, stop)


@dataclass(frozen=True)
class RecordAccess:
    """A store's records as plain synchronous calls on record keys
    (`record_key`), for the compiled request path (`nat_agent._fastpath.FastLane`),
    which answers inside one event-loop callback and so cannot await."""

    get: Callable[[bytes], bytes | None]
    put: Callable[..., None]
    """``put(key, value, **put_options)``."""
    put_options: dict[str, Any] | None
    counted: Callable[[bytes], None]
    """Called with the record key of a record that `put` created (the range index)."""
    uncounted: Callable[[bytes], None]
    """Called with the record key of a record the lane deleted (DEL, DELIFEQ)."""
    group: SyncLedger | None
    """The compiled group commit's ledger (``SyncGroup``) that writes wait
    for and that tells whether a key's last write is not yet synced; None
    if writes never wait."""
    put_batch: Callable[[list[tuple[bytes, bytes]]], None] | None
    """Write ``(key, value)`` pairs as one batch (the worker threads' turn
    under a group commit, which takes the ticket around it); None with no
    `group`."""
    sync_failure: Callable[[str], OSError] | None
    """The error of a write or read whose sync failed for a reason (a
    message), as the store's own path raises it (`GroupCommit.failure`)."""
    index: object | None = None
    """The extension's `MdidIndex` that `counted` and `uncounted` update,
    which the lane then updates directly, without Python and without reading
    a record to tell whether a write creates it; None to call them."""
    order: threading.Lock | None = None
    """A lock (``threading.Lock``) that every write of the records holds from
    before it (or the read a conditional write decides on) until its records
    are counted, so that the index changes in the order the records do: a
    worker's batch lands with the GIL released and is counted after, and a
    DEL on another thread must not find its record in between. The lane
    waits for it (the GIL released meanwhile) only in a turn's write, which
    checks its blocks' roles after taking it; a conditional or single write,
    which checked under the GIL before, takes it only if it is free and
    otherwise declines to the Python path. None: no order kept."""
    native: object | None = None
    """The same records as the extension's own table (`LevelTable`), which
    the lane then reads and writes directly, without Python and with the GIL
    released for a batch, instead of calling `get`, `put` and `put_batch`;
    None if the store has none (plyvel, redis) or a test replaces those calls."""


class Store(ABC):
    """Metadata records ordered by ``(mdid, path bytes)``, plus one state document.

    Every mdid argument must lie in ``[0, 2**width - 1]`` (else ``ValueError``).
    Ranges are inclusive; ``first > last`` is an empty range. The state
    document (the agent's owned blocks) lives beside the records but is never
    counted, scanned or deleted as one.
    """

    kind: ClassVar[str]
    """``"leveldb"`` or ``"redis"``."""
    width: int
    """Bits of an mdid: 32 or 128."""
    fsync: FsyncMode
    """What a write waits for before it returns."""

    def record_access(self) -> RecordAccess | None:
        """Synchronous access to the records, if this store has it (an
        in-process store); None sends every request through the Python path."""
        return None

    @abstractmethod
    async def get(self, mdid: int, path: str) -> bytes | None:
        """The value, or None if there is no such record."""

    @abstractmethod
    async def put(self, mdid: int, path: str, value: bytes) -> None:
        """Create or overwrite a record; value and range index change atomically."""

    @abstractmethod
    async def put_if(
        self, mdid: int, path: str, value: bytes, when: Condition | None = None
    ) -> tuple[bool, bytes | None]:
        """Write the record if `when` holds, atomically with the check;
        returns (whether it was written, the value it had before)."""

    @abstractmethod
    async def entries(self, mdid: int, directory: str, after: str, limit: int) -> list[tuple[str, bytes]]:
        """Up to `limit` entries of `directory` (records ``directory NUL name``
        at `mdid`, see ``client_lib.mdid.entry_key``) whose name sorts after
        `after` (bytewise; "" for the first page), as ``(name, value)`` in name
        order: one range scan, since they are adjacent in the stores' order."""

    @abstractmethod
    async def remove_directory(self, mdid: int, directory: str) -> Removal:
        """Delete the header record `directory` if it has no entries, atomically
        with the check: "removed", "absent" (no header), or "not-empty"
        (nothing changed)."""

    @abstractmethod
    async def delete(self, mdid: int, path: str, if_equal: bytes | None = None) -> bool:
        """Remove a record (only if it holds exactly `if_equal`, when given:
        Valkey's DELIFEQ, atomic with the check); True if it was removed."""

    @abstractmethod
    async def exists(self, mdid: int, path: str) -> bool:
        """Whether the record exists."""

    @abstractmethod
    async def count(self, first: int, last: int) -> int:
        """How many records have ``first <= mdid <= last``, in O(log n)."""

    @abstractmethod
    def scan(self, first: int, last: int, batch: int = 1000,
             after: tuple[int, str] | None = None) -> AsyncIterator[list[Record]]:
        """The records of ``[first, last]`` in ``(mdid, path bytes)`` order.

        Yields non-empty lists of at most ``batch`` records, so a migration can
        stream a block without holding it in memory. `after` ``(mdid, path)``
        resumes strictly after that record (present or not), so a reader can
        page through a block across calls (``POST /dump``), even within one
        directory, whose entries all share its mdid.
        """

    @abstractmethod
    async def put_many(self, records: Sequence[Record]) -> None:
        """Write records as one atomic batch; a later duplicate wins, as with `put`."""

    @abstractmethod
    async def delete_range(self, first: int, last: int) -> int:
        """Remove every record of ``[first, last]``; returns how many were removed."""

    @abstractmethod
    async def size_bytes(self) -> int:
        """Bytes the store takes, as an operator sizes it: an embedded store's
        files on disk, a Redis server's memory (`client_lib.api.metrics.STORE_BYTES`)."""

    def disk_syncs(self) -> Latency | None:
        """How long the syncs shared by concurrent writes took (``--fsync batch``
        on a store that syncs itself); None where the store has none."""
        return None

    @abstractmethod
    async def total(self) -> int:
        """How many records the store holds."""

    @abstractmethod
    async def load_state(self) -> dict[str, Any] | None:
        """The state document last saved, or None if none was."""

    @abstractmethod
    async def save_state(self, state: dict[str, Any]) -> None:
        """Replace the state document (small, JSON-serializable)."""

    @abstractmethod
    async def close(self) -> None:
        """Release the store (and stop a redis-server it started); idempotent."""

    async def __aenter__(self) -> Store:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()


def entry_bounds(mdid: int, directory: str, after: str, width: int) -> tuple[bytes, bytes]:
    """The record keys of `directory`'s entries after `after`: from the key of
    ``directory NUL after`` (exclusive when `after` is a name) to the first
    key past every ``directory NUL ...`` (exclusive)."""
    head = record_key(mdid, directory, width)
    return head + b"\0" + encode_path(after), head + b"\1"


def scan_start(bounds: KeyRange, after: tuple[int, str] | None, width: int) -> tuple[bytes, bool]:
    """Where both `scan`s start: the range's first key (inclusive), or the
    record key of `after` (exclusive) when that lies further on."""
    if after is None:
        return bounds.start, True
    resume = record_key(*after, width)
    return (resume, False) if resume >= bounds.start else (bounds.start, True)


def check_batch(batch: int) -> None:
    """Shared by both `scan`s: a batch of zero records would never advance."""
    if batch < 1:
        raise ValueError(f"batch must be at least 1, not {batch}")
