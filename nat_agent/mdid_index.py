"""The LevelDB store's range index without the extension: a `SortedList`.

The store keeps the mdid of every record in a sorted multiset, so that
counting an ID range is two bisects (`nat_agent.leveldb_store`). The
extension's `MdidIndex` (`nat_agent/fastpath/src/index.rs`) is that
multiset in Rust, which the compiled lane updates without Python; this is
the same five methods over `sortedcontainers.SortedList`, for an install
without the extension, and the oracle `tests/unit/test_mdid_index.py`
holds the compiled one to.
"""

from __future__ import annotations

from collections.abc import Iterable

from sortedcontainers import SortedList

__all__ = ["SortedMdids"]


class SortedMdids:
    """A sorted multiset of mdids with range counts (`MdidIndex`'s methods)."""

    def __init__(self, ids: Iterable[int] = ()) -> None:
        self._ids = SortedList(ids)

    def add(self, mdid: int) -> None:
        self._ids.add(mdid)

    def remove(self, mdid: int) -> None:
        """ValueError if `mdid` is not counted."""
        self._ids.remove(mdid)

    def update(self, ids: Iterable[int]) -> None:
        self._ids.update(ids)

    def count(self, first: int, last: int) -> int:
        """IDs counted in ``first..last`` (inclusive; 0 if `first > last`)."""
        return max(0, self._ids.bisect_right(last) - self._ids.bisect_left(first))

    def remove_range(self, first: int, last: int) -> int:
        """Forget every ID in ``first..last``; how many there were."""
        start, stop = self._ids.bisect_left(first), self._ids.bisect_right(last)
        if start >= stop:
            return 0
        del self._ids[start:stop]
        return stop - start

    def __len__(self) -> int:
        return len(self._ids)
