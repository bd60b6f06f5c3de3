"""The embedded default store: LevelDB, opened by the extension or by plyvel.

The extension's `LevelDB` (`nat_agent/fastpath/src/level.rs`) is preferred:
the compiled lane then reads and writes the records without Python
(`RecordAccess.native`). It has plyvel's method names for what this module
uses, so everything below is written once against either; without the
extension plyvel opens the same directory, in the same format.

Layout inside one LevelDB directory, split by prefixed sub-databases
so that nothing but records ever shows up in a record scan:

* ``r`` + ``be(mdid) + path`` -> value: the records. Keys sort by
  ``(mdid, path bytes)``, so any ID range is one iterator range.
* ``m`` + ``width`` -> the mdid width the records were written with, and
  ``m`` + ``state`` -> the agent's state document (JSON).

LevelDB cannot count a key range without walking it, so the store keeps the
mdids of all records in memory in a sorted multiset (`extension.mdid_index`:
the extension's `MdidIndex`, which the compiled lane updates without Python,
or a `SortedList`), rebuilt at open by one keys-only pass and updated after
every write; `count` is two rank lookups. The extension's also keeps a
128-bit fingerprint of each record key, so a write learns whether it created
a record without reading LevelDB first. The cost is 32 bytes per record (a
Python int per record without the extension), which a metadata server can
afford.

LevelDB calls are made synchronously inside the async methods: LevelDB is
in-process and a call takes microseconds, less than a thread hop would.

Durability (`FsyncMode`). LevelDB hands every write to the kernel before
the call returns (its log is not buffered in the process), so a killed agent
loses nothing in any mode; what a power loss takes depends on ``fsync``:

* ``always``: every write is made with LevelDB's ``sync=True`` (an fdatasync
  of its log), on the event loop, which waits for the disk meanwhile: the
  simplest promise (nothing else runs between a write and its sync), at one
  sync per write. The compiled workers write a turn's SETs as one synced
  batch and reply after it, as Redis's ``appendfsync always`` syncs once per
  round of its event loop.
* ``batch``: writes are made without sync and then wait, by `GroupCommit`,
  for one sync of the log files, in a worker thread, shared by every write
  made before it began. A read of a key whose last write is not yet synced
  waits for that sync too, so no reply shows what a power loss could undo.
  plyvel has no sync call, and a synced marker write is not enough: when the
  memtable fills, LevelDB switches to a new log and closes the old one
  *without* syncing it (db_impl.cc, MakeRoomForWrite), so the marker would
  sync only the new log while the old one's records wait in the page cache
  for a background compaction (seen with strace). So the sync is an
  fdatasync of every ``*.log`` file in the directory (a log that vanished
  meanwhile had been compacted into a synced table first), plus the
  directory itself when a new log has appeared since the last sync.
* ``off``: no sync; the kernel writes the log back within about 30 s.
"""

from __future__ import annotations

import json
import os
import threading
from collections.abc import AsyncIterator, Callable, Sequence
from typing import TYPE_CHECKING, Any, cast

import plyvel

from nat_agent import extension
from nat_agent.group_commit import group_commit
from nat_agent.latency import Latency
from nat_agent.store import (
    DEFAULT_FSYNC,
    Condition,
    FsyncMode,
    InDirectory,
    Record,
    RecordAccess,
    Removal,
    Store,
    check_batch,
    check_fsync,
    check_width,
    condition_holds,
    decode_path,
    encode_path,
    entry_bounds,
    key_range,
    record_key,
    scan_start,
    split_record_key,
)

if TYPE_CHECKING:
    from nat_agent.extension import LevelDB

__all__ = ["LevelDBStore"]

_RECORDS = b"r"
_META = b"m"
_WIDTH_KEY = b"width"
_STATE_KEY = b"state"
# How LevelDB is opened. Measured with `redis-benchmark -c 50` SET/GET of
# 250-byte records on 100,000 random paths (LevelDB's defaults beside these,
# one run): GETs 38,300 against 46,600/s, SETs 22,300 against 27,300/s.
_OPEN_OPTIONS: dict[str, Any] = {
    # Metadata records are small and a read is a point lookup: a block-cache
    # miss spent more time in snappy than the lookup itself (a quarter of
    # the agent's CPU under GETs), to save disk a metadata server has.
    "compression": None,
    # Creates look up paths that do not exist yet: a filter answers those
    # from memory instead of reading a block of every level.
    "bloom_filter_bits": 10,
    # The default 8 MiB holds about 30,000 records' blocks; redis keeps
    # every record in memory, and this is still far from that.
    "lru_cache_size": 128 << 20,
    # The default 4 MiB memtable flushes and compacts every ~15,000 writes,
    # on the same two cores that serve; a larger one does it 8 times less
    # often (the price: up to 32 MiB of log replayed at open).
    "write_buffer_size": 32 << 20,
}
_LOG_SUFFIX = ".log"
"""LevelDB's write-ahead logs are ``NNNNNN.log`` (its info log is ``LOG``)."""


def _open(path: str) -> LevelDB:
    """The directory's LevelDB: the extension's if it has one, else plyvel's
    (typed as the extension's, whose methods it has)."""
    if extension.LEVELDB is not None:
        return extension.LEVELDB(path, create_if_missing=True, **_OPEN_OPTIONS)
    return cast("LevelDB", plyvel.DB(path, create_if_missing=True, **_OPEN_OPTIONS))


class LevelDBStore(Store):
    """Records in a LevelDB directory, with an in-memory index for counting."""

    kind = "leveldb"

    def __init__(
        self, path: str | os.PathLike[str], width: int, fsync: FsyncMode = DEFAULT_FSYNC
    ) -> None:
        """Open the directory ``path``, creating it (and its parents) if missing.

        Raises ``ValueError`` if the directory holds records of another
        width: their keys would be misread as different IDs.
        """
        check_width(width)
        self.width = width
        self.fsync = check_fsync(fsync)
        self.path = os.fspath(path)
        self._sync_each = self.fsync == "always"
        self._group = (group_commit(f"LevelDB {self.path}", self._sync_logs, logs=(self.path, _LOG_SUFFIX))
                       if self.fsync == "batch" else None)
        self._logs_synced: frozenset[str] = frozenset()
        os.makedirs(self.path, exist_ok=True)  # LevelDB creates only the last level
        self._db = _open(self.path)
        try:
            self._native = extension.LEVELDB is not None and isinstance(self._db, extension.LEVELDB)
            self._records = self._db.prefixed_db(_RECORDS)
            self._meta = self._db.prefixed_db(_META)
            self._check_stored_width()
            self._mdids = extension.mdid_index(check_width(width),
                                               self._records.iterator(include_value=False))
            self._order = threading.Lock()   # see RecordAccess.order
        except BaseException:
            self._db.close()
            raise

    def _check_stored_width(self) -> None:
        stored = self._meta.get(_WIDTH_KEY)
        if stored is None:
            self._meta.put(_WIDTH_KEY, str(self.width).encode())
        elif int(stored) != self.width:
            raise ValueError(
                f"{self.path} holds {int(stored)}-bit mdids; cannot open it with width {self.width}"
            )

    def _sync_logs(self) -> None:
        """``batch``'s sync, in a worker thread: every write LevelDB has made
        so far is on disk when this returns (see the module docstring).
        Without the extension only: its ``SyncGroup`` does the same itself."""
        logs = frozenset(name for name in os.listdir(self.path) if name.endswith(_LOG_SUFFIX))
        for name in sorted(logs):
            try:
                fd = os.open(os.path.join(self.path, name), os.O_RDONLY)
            except FileNotFoundError:
                continue  # compacted into a synced table and removed meanwhile
            try:
                os.fdatasync(fd)
            finally:
                os.close(fd)
        if logs - self._logs_synced:  # a new log's directory entry must reach the disk too
            fd = os.open(self.path, os.O_RDONLY | os.O_DIRECTORY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
        self._logs_synced = logs

    def _apply(self, keys: list[bytes], write: Callable[[], object]) -> int | None:
        """Make a write of ``keys``; its ticket (``batch``), taken before it
        reaches LevelDB and given back once it has (or failed to): the
        compiled workers read the records from other threads."""
        if self._group is None or not keys:
            write()
            return None
        ticket = self._group.ledger.begin(keys)
        try:
            write()
        finally:
            self._group.ledger.end(ticket)
        return ticket

    async def _durable(self, ticket: int | None) -> None:
        """After the write of ``ticket``: wait for the sync that covers it (``batch``)."""
        if self._group is not None and ticket is not None:
            await self._group.durable(ticket)

    async def _settled(self, key: bytes) -> None:
        """Before answering from ``key``: wait until its last write is synced (``batch``)."""
        if self._group is not None:
            await self._group.settled(key)

    async def get(self, mdid: int, path: str) -> bytes | None:
        key = record_key(mdid, path, self.width)
        value = self._records.get(key)
        await self._settled(key)  # read first: a later write has a later ticket
        return value

    async def put(self, mdid: int, path: str, value: bytes) -> None:
        key = record_key(mdid, path, self.width)
        with self._order:
            ticket = self._write(key, value, self._is_new(key))
        await self._durable(ticket)

    async def put_if(
        self, mdid: int, path: str, value: bytes, when: Condition | None = None
    ) -> tuple[bool, bytes | None]:
        """Atomic: the order lock (`RecordAccess.order`) is held from the read
        to the write and its count, and every other write of the records, the
        compiled workers' (`FastLane`) included, holds it too."""
        key = record_key(mdid, path, self.width)
        with self._order:
            old = self._records.get(key)
            header = isinstance(when, InDirectory) and \
                self._records.get(record_key(mdid, when.directory, self.width)) is not None
            holds = condition_holds(when, old, header)
            ticket = self._write(key, value, old is None) if holds else None
        if not holds:
            await self._settled(key)
            return False, old
        await self._durable(ticket)
        return True, old

    async def entries(self, mdid: int, directory: str, after: str, limit: int) -> list[tuple[str, bytes]]:
        start, stop = entry_bounds(mdid, directory, after, self.width)
        skip = len(start) - len(encode_path(after))   # the name starts here
        found: list[tuple[bytes, bytes]] = []
        with self._records.iterator(start=start, stop=stop) as records:
            for key, value in records:
                if after and key == start:
                    continue
                found.append((key, value))
                if len(found) >= limit:
                    break
        for key, _ in found:
            await self._settled(key)
        return [(decode_path(key[skip:]), value) for key, value in found]

    def record_access(self) -> RecordAccess:
        return RecordAccess(get=self._records.get, put=self._records.put,
                            put_options={"sync": True} if self._sync_each else None,
                            counted=self._mdids.add, uncounted=self._mdids.remove,
                            index=self._mdids if extension.MDID_INDEX is not None else None,
                            group=self._group.ledger if self._group is not None else None,
                            put_batch=self._put_batch if self._group is not None else None,
                            sync_failure=self._group.failure if self._group is not None else None,
                            native=self._records if self._native else None, order=self._order)

    def _put_batch(self, pairs: list[tuple[bytes, bytes]]) -> None:
        """One LevelDB write of ``(key, value)`` pairs: `put_many`'s, and a
        worker's turn's (`RecordAccess.put_batch`)."""
        batch = self._records.write_batch(sync=self._sync_each)
        for key, value in pairs:
            batch.put(key, value)
        batch.write()

    def _is_new(self, key: bytes) -> bool:
        """Whether a write of `key` may create its record, so that `_write`
        counts it: the compiled index tells that itself (it counts a key
        once), so no read then; else whether the store has none."""
        return self._mdids.knows_keys or self._records.get(key) is None

    def _write(self, key: bytes, value: bytes, is_new: bool) -> int | None:
        """Write a record, and count it if it is new; its ticket (``batch``)."""
        ticket = self._apply([key], lambda: self._records.put(key, value, sync=self._sync_each))
        if is_new:
            self._mdids.add(key)
        return ticket

    async def delete(self, mdid: int, path: str, if_equal: bytes | None = None) -> bool:
        """Atomic with its check as `put_if` is."""
        key = record_key(mdid, path, self.width)
        with self._order:
            found, ticket = self._delete_now(key, if_equal)
        if not found:
            await self._settled(key)
            return False
        await self._durable(ticket)
        return True

    def _delete_now(self, key: bytes, if_equal: bytes | None) -> tuple[bool, int | None]:
        """`delete`'s look and write, the order lock held: whether the record
        was there (and equal) and so deleted, and the deletion's ticket."""
        old = self._records.get(key)
        if old is None or (if_equal is not None and old != if_equal):
            return False, None
        ticket = self._apply([key], lambda: self._records.delete(key, sync=self._sync_each))
        self._mdids.remove(key)
        return True, ticket

    async def remove_directory(self, mdid: int, directory: str) -> Removal:
        """Atomic as `put_if` is: nothing runs between the look and the delete."""
        start, stop = entry_bounds(mdid, directory, "", self.width)
        key = record_key(mdid, directory, self.width)
        with self._order:
            with self._records.iterator(start=start, stop=stop, include_value=False) as keys:
                if next(keys, None) is not None:
                    return "not-empty"
            found, ticket = self._delete_now(key, None)
        if not found:
            await self._settled(key)
            return "absent"
        await self._durable(ticket)
        return "removed"

    async def exists(self, mdid: int, path: str) -> bool:
        key = record_key(mdid, path, self.width)
        found = self._records.get(key) is not None
        await self._settled(key)
        return found

    async def count(self, first: int, last: int) -> int:
        if key_range(first, last, self.width) is None:
            return 0
        return self._mdids.count(first, last)

    async def scan(self, first: int, last: int, batch: int = 1000,
                   after: tuple[int, str] | None = None) -> AsyncIterator[list[Record]]:
        """Records from one LevelDB iterator, i.e. one consistent snapshot."""
        check_batch(batch)
        bounds = key_range(first, last, self.width)
        if bounds is None:
            return
        start, inclusive = scan_start(bounds, after, self.width)
        chunk: list[Record] = []
        with self._records.iterator(start=start, include_start=inclusive, stop=bounds.stop) as rows:
            for key, value in rows:
                chunk.append((*split_record_key(key, self.width), value))
                if len(chunk) == batch:
                    yield chunk
                    chunk = []
        if chunk:
            yield chunk

    async def put_many(self, records: Sequence[Record]) -> None:
        # Encode everything first, so a bad mdid rejects the batch before any write.
        pairs = [(record_key(mdid, path, self.width), value) for mdid, path, value in records]
        with self._order:
            # a set: a duplicate in the batch counts once
            new = {key for key, _ in pairs if self._is_new(key)}
            ticket = self._apply([key for key, _ in pairs], lambda: self._put_batch(pairs))
            self._mdids.update(new)
        await self._durable(ticket)

    async def delete_range(self, first: int, last: int) -> int:
        bounds = key_range(first, last, self.width)
        if bounds is None:
            return 0
        removed: list[bytes] = []
        batch = self._records.write_batch(sync=self._sync_each)
        with self._order:
            with self._records.iterator(start=bounds.start, stop=bounds.stop, include_value=False) as keys:
                for key in keys:
                    batch.delete(key)
                    removed.append(key)
            ticket = self._apply(removed, batch.write)
            self._mdids.remove_keys(removed)
        await self._durable(ticket)
        return len(removed)

    async def size_bytes(self) -> int:
        with os.scandir(self.path) as files:   # a few dozen files: not worth a thread
            return sum(f.stat().st_size for f in files if f.is_file())

    def disk_syncs(self) -> Latency | None:
        return self._group.seconds if self._group is not None else None

    async def total(self) -> int:
        return len(self._mdids)

    async def load_state(self) -> dict[str, Any] | None:
        raw = self._meta.get(_STATE_KEY)
        return None if raw is None else cast(dict[str, Any], json.loads(raw))

    async def save_state(self, state: dict[str, Any]) -> None:
        # Synced, unlike records: losing the owned blocks would make the agent
        # disown (and answer MOVED for) keys it still holds.
        self._meta.put(_STATE_KEY, json.dumps(state, sort_keys=True).encode(), sync=True)

    async def close(self) -> None:
        if self._db.closed:
            return
        try:
            if self._group is not None:
                await self._group.flush()  # what was written is on disk once closed
        finally:
            if not self._db.closed:
                self._db.close()
