"""The LevelDB store's record index: the compiled `MdidIndex` against its
oracle, `SortedMdids` (a `SortedList`).

The store's own use of either: records created (each `add` of a key the
store does not hold) and deleted, in batches and ranges, over record keys
whose mdids pile up in few values (duplicates, chunks that split past two
thousand IDs and empty again) or spread over 128 bits. Both give the same
answer at every step: each count of a random range, each length, each
removal's result. The compiled one also tells new records from old itself:
a key added twice is counted once.
"""

from __future__ import annotations

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from nat_agent._fastpath import MdidIndex
from nat_agent.mdid_index import SortedMdids
from nat_agent.store import record_key

pytestmark = pytest.mark.timeout(120)

WIDTH = 128
ID_BYTES = WIDTH // 8
NARROW = st.integers(0, 300)
WIDE = st.integers(0, (1 << WIDTH) - 1)
KEYS = st.builds(lambda mdid, name: record_key(mdid, f"/{name}", WIDTH), st.one_of(NARROW, WIDE),
                 st.sampled_from("abcdefgh"))

OPERATIONS = st.one_of(
    st.tuples(st.just("add"), KEYS),
    st.tuples(st.just("remove"), KEYS),
    st.tuples(st.just("update"), st.lists(KEYS, max_size=50)),
    st.tuples(st.just("remove_keys"), st.lists(KEYS, max_size=50)),
    st.tuples(st.just("count"), NARROW, NARROW),
    st.tuples(st.just("count"), WIDE, WIDE),
)


class Store:
    """The two indexes beside the set of keys a store would hold, used as
    the store uses them: only new records are added, only held ones removed."""

    def __init__(self, keys: list[bytes]) -> None:
        self.held = set(keys)
        self.compiled, self.oracle = MdidIndex(ID_BYTES, iter(keys)), SortedMdids(ID_BYTES, self.held)

    def apply(self, operation: tuple) -> None:
        name, *args = operation
        if name == "count":
            assert self.compiled.count(*args) == self.oracle.count(*args), operation
        elif name in ("add", "update"):
            new = [k for k in (args[0] if name == "update" else [args[0]]) if k not in self.held]
            self.compiled.update(new + new[:1])   # a key again: not counted twice
            self.oracle.update(set(new))
            self.held |= set(new)
        else:
            gone = [k for k in (args[0] if name == "remove_keys" else [args[0]]) if k in self.held]
            gone = list(dict.fromkeys(gone))
            assert self.compiled.remove_keys(gone) == self.oracle.remove_keys(gone) == len(gone)
            self.held -= set(gone)
        assert len(self.compiled) == len(self.oracle) == len(self.held), operation


@settings(max_examples=150, deadline=None)
@given(st.lists(KEYS, max_size=400), st.lists(OPERATIONS, max_size=60))
def test_the_compiled_index_counts_as_the_sorted_list(start: list[bytes], operations: list[tuple]) -> None:
    store = Store(start)
    for operation in operations:
        store.apply(operation)
    assert store.compiled.count(0, (1 << WIDTH) - 1) == len(store.held)


def test_many_records_split_and_empty_chunks_as_the_sorted_list_counts() -> None:
    """Past what hypothesis draws: 20,000 records added one by one (chunks
    split at 2,000), then removed one by one and in ranges that empty chunks."""
    rng = random.Random(27)
    keys = list({record_key(rng.randrange(50_000), f"/{i}", WIDTH) for i in range(20_000)})
    compiled, oracle = MdidIndex(ID_BYTES), SortedMdids(ID_BYTES)
    for key in keys:
        compiled.add(key)
        oracle.add(key)
    for first in range(0, 50_000, 997):
        assert compiled.count(first, first + 3_000) == oracle.count(first, first + 3_000)
    for key in keys[::3]:
        compiled.remove(key)
        oracle.remove(key)
    rest = keys[1::3] + keys[2::3]
    for start in range(0, len(rest), 1_500):
        batch = rest[start:start + 1_000]
        assert compiled.remove_keys(batch) == oracle.remove_keys(batch)
        assert compiled.count(0, 50_000) == len(oracle) == len(compiled)
    assert [compiled.count(i, i + 99) for i in range(0, 50_000, 100)] == \
        [oracle.count(i, i + 99) for i in range(0, 50_000, 100)]


def test_the_compiled_index_tells_new_records_from_old() -> None:
    """What lets the lane write without reading first: a key is counted once
    however often it is added, and again once deleted and added again."""
    key, other = record_key(7, "/a", WIDTH), record_key(7, "/b", WIDTH)
    index = MdidIndex(ID_BYTES, [key, key])
    assert len(index) == 1 and index.knows_keys and not SortedMdids.knows_keys
    index.add(key)
    index.add(other)
    assert index.count(7, 7) == 2
    index.remove(key)
    with pytest.raises(ValueError, match="not in the index"):
        index.remove(key)
    assert index.remove_keys([key, other, other]) == 1
    index.add(key)
    assert len(index) == 1 and index.count(0, 6) == 0


def test_bad_input_is_refused_and_changes_nothing() -> None:
    index = MdidIndex(ID_BYTES, [record_key(1, "/x", WIDTH), record_key(2, "/y", WIDTH)])
    with pytest.raises(ValueError, match="shorter than its mdid"):
        index.add(b"short")
    with pytest.raises(TypeError):
        index.update([record_key(4, "/z", WIDTH), "not bytes"])  # type: ignore[list-item]
    with pytest.raises(ValueError, match="mdids of 0 bytes"):
        MdidIndex(0)
    assert len(index) == 2 and index.count(0, 10) == 2
