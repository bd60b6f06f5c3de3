"""The embedded default store: LevelDB through plyvel.

Layout inside one LevelDB directory, split by plyvel prefixed sub-databases
so that nothing but records ever shows up in a record scan:

* ``r`` + ``be(mdid) + path`` -> value: the records. Keys sort by
  ``(mdid, path bytes)``, so any ID range is one iterator range.
* ``m`` + ``width`` -> the mdid width the records were written with, and
  ``m`` + ``state`` -> the agent's state document (JSON).

LevelDB cannot count a key range without walking it, so the store keeps the
mdids of all records in memory in a sorted multiset, rebuilt at open by one
keys-only pass and updated after every write; `count` is two bisects. The
cost is one Python int per record, which a metadata server can afford.

plyvel calls are made synchronously inside the async methods: LevelDB is
in-process and a call takes microseconds, less than a thread hop would.
"""

from __future__ import annotations

import json
import os
from collections.abc import AsyncIterator, Sequence
from typing import Any, cast

import plyvel
from sortedcontainers import SortedList

from nat_agent.store import (
    Condition,
    Record,
    Store,
    check_batch,
    check_width,
    condition_holds,
    decode_mdid,
    key_range,
    record_key,
    split_record_key,
)

__all__ = ["LevelDBStore"]

_RECORDS = b"r"
_META = b"m"
_WIDTH_KEY = b"width"
_STATE_KEY = b"state"


class LevelDBStore(Store):
    """Records in a LevelDB directory, with an in-memory index for counting."""

    kind = "leveldb"

    def __init__(self, path: str | os.PathLike[str], width: int) -> None:
        """Open the directory ``path``, creating it (and its parents) if missing.

        Raises ``ValueError`` if the directory holds records of another
        width: their keys would be misread as different IDs.
        """
        check_width(width)
        self.width = width
        self.path = os.fspath(path)
        os.makedirs(self.path, exist_ok=True)  # LevelDB creates only the last level
        self._db = plyvel.DB(self.path, create_if_missing=True)
        try:
            self._records = self._db.prefixed_db(_RECORDS)
            self._meta = self._db.prefixed_db(_META)
            self._check_stored_width()
            self._mdids = SortedList(
                decode_mdid(key, width) for key in self._records.iterator(include_value=False)
            )
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

    async def get(self, mdid: int, path: str) -> bytes | None:
        return cast(bytes | None, self._records.get(record_key(mdid, path, self.width)))

    async def put(self, mdid: int, path: str, value: bytes) -> None:
        key = record_key(mdid, path, self.width)
        self._write(mdid, key, value, self._records.get(key) is None)

    async def put_if(
        self, mdid: int, path: str, value: bytes, when: Condition | None = None
    ) -> tuple[bool, bytes | None]:
        """Atomic without a lock: nothing else runs between the read and the
        write, since plyvel is called synchronously on the event loop."""
        key = record_key(mdid, path, self.width)
        old = cast(bytes | None, self._records.get(key))
        if not condition_holds(when, old is not None):
            return False, old
        self._write(mdid, key, value, old is None)
        return True, old

    def _write(self, mdid: int, key: bytes, value: bytes, is_new: bool) -> None:
        """Write a record, and count its mdid if it is new."""
        self._records.put(key, value)
        if is_new:
            self._mdids.add(mdid)

    async def delete(self, mdid: int, path: str) -> bool:
        key = record_key(mdid, path, self.width)
        if self._records.get(key) is None:
            return False
        self._records.delete(key)
        self._mdids.remove(mdid)
        return True

    async def exists(self, mdid: int, path: str) -> bool:
        return self._records.get(record_key(mdid, path, self.width)) is not None

    async def count(self, first: int, last: int) -> int:
        if key_range(first, last, self.width) is None:
            return 0
        return self._mdids.bisect_right(last) - self._mdids.bisect_left(first)

    async def scan(self, first: int, last: int, batch: int = 1000) -> AsyncIterator[list[Record]]:
        """Records from one LevelDB iterator, i.e. one consistent snapshot."""
        check_batch(batch)
        bounds = key_range(first, last, self.width)
        if bounds is None:
            return
        chunk: list[Record] = []
        with self._records.iterator(start=bounds.start, stop=bounds.stop) as rows:
            for key, value in rows:
                chunk.append((*split_record_key(key, self.width), value))
                if len(chunk) == batch:
                    yield chunk
                    chunk = []
        if chunk:
            yield chunk

    async def put_many(self, records: Sequence[Record]) -> None:
        # Encode everything first, so a bad mdid rejects the batch before any write.
        rows = [(record_key(mdid, path, self.width), mdid, value) for mdid, path, value in records]
        new: dict[bytes, int] = {}  # keyed, so a duplicate in the batch counts once
        with self._records.write_batch(transaction=True) as batch:
            for key, mdid, value in rows:
                if self._records.get(key) is None:
                    new[key] = mdid
                batch.put(key, value)
        self._mdids.update(new.values())

    async def delete_range(self, first: int, last: int) -> int:
        bounds = key_range(first, last, self.width)
        if bounds is None:
            return 0
        removed = 0
        with (
            self._records.write_batch(transaction=True) as batch,
            self._records.iterator(
                start=bounds.start, stop=bounds.stop, include_value=False
            ) as keys,
        ):
            for key in keys:
                batch.delete(key)
                removed += 1
        del self._mdids[self._mdids.bisect_left(first) : self._mdids.bisect_right(last)]
        return removed

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
        if not self._db.closed:
            self._db.close()
