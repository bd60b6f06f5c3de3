"""The LevelDB store's record index without the extension: a `SortedList`.

The store keeps the mdid of every record in a sorted multiset, so that
counting an ID range is two bisects (`nat_agent.leveldb_store`). The
extension's `MdidIndex` (`nat_agent/fastpath/src/index.rs`) is that
multiset in Rust, which the compiled lane updates without Python, and it
also keeps a fingerprint of every record key, so that it can tell a new
record from an old one itself (`knows_keys`). This is the same methods over
`sortedcontainers.SortedList`, for an install without the extension, and the
oracle `tests/unit/test_mdid_index.py` holds the compiled one to. It keeps
no keys: its caller says which records are new (each `add` counts one).
"""

from __future__ import annotations

from collections.abc import Iterable

from sortedcontainers import SortedList

__all__ = ["SortedMdids"]


class SortedMdids:
    """A sorted multiset of the mdids of record keys, with range counts (`MdidIndex`'s methods)."""

    knows_keys = False
    """Whether `add` of a key already counted is ignored (the compiled
    index's): here every `add` counts, so the caller reads the store first."""

    def __init__(self, id_bytes: int, keys: Iterable[bytes] = ()) -> None:
        self._id_bytes = id_bytes
        self._ids = SortedList(self._id(key) for key in keys)

    def _id(self, key: bytes) -> int:
        if len(key) < self._id_bytes:
            raise ValueError("a record key shorter than its mdid")
        return int.from_bytes(key[: self._id_bytes], "big")

    def add(self, key: bytes) -> None:
        """A record of `key` was created."""
        self._ids.add(self._id(key))

    def remove(self, key: bytes) -> None:
        """The record of `key` was deleted; ValueError if none of its mdid is counted."""
        self._ids.remove(self._id(key))

    def update(self, keys: Iterable[bytes]) -> None:
        """Records of each of `keys` were created."""
        self._ids.update([self._id(key) for key in keys])

    def remove_keys(self, keys: Iterable[bytes]) -> int:
        """The records of `keys` were deleted; how many were counted."""
        removed = 0
        for mdid in [self._id(key) for key in keys]:
            if mdid in self._ids:
                self._ids.remove(mdid)
                removed += 1
        return removed

    def count(self, first: int, last: int) -> int:
        """Records counted with an ID in ``first..last`` (inclusive; 0 if `first > last`)."""
        return max(0, self._ids.bisect_right(last) - self._ids.bisect_left(first))

    def __len__(self) -> int:
        return len(self._ids)
