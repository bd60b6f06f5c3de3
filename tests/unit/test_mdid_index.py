"""The LevelDB store's range index: the compiled `MdidIndex` against its
oracle, `SortedMdids` (a `SortedList`).

The same random stream of adds, removes, batch updates and range removes,
over IDs that pile up in few values (duplicates, chunks that split past two
thousand IDs and empty again) or spread over 128 bits, gets the same answer
from both at every step: each count of a random range, each length, each
removal's result.
"""

from __future__ import annotations

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from nat_agent._fastpath import MdidIndex
from nat_agent.mdid_index import SortedMdids

pytestmark = pytest.mark.timeout(120)

NARROW = st.integers(0, 300)
WIDE = st.integers(0, (1 << 128) - 1)

OPERATIONS = st.one_of(
    st.tuples(st.just("add"), NARROW),
    st.tuples(st.just("add"), WIDE),
    st.tuples(st.just("remove"), NARROW),
    st.tuples(st.just("update"), st.lists(NARROW, max_size=3000)),
    st.tuples(st.just("remove_range"), NARROW, NARROW),
    st.tuples(st.just("count"), NARROW, NARROW),
    st.tuples(st.just("count"), WIDE, WIDE),
)


def apply(index: MdidIndex | SortedMdids, operation: tuple) -> object:
    """One operation; its result, or the exception's type."""
    name, *args = operation
    try:
        return getattr(index, name)(*args)
    except ValueError as error:
        return type(error)


@settings(max_examples=150, deadline=None)
@given(st.lists(NARROW, max_size=4000), st.lists(OPERATIONS, max_size=60))
def test_the_compiled_index_answers_as_the_sorted_list(start: list[int], operations: list[tuple]) -> None:
    compiled, oracle = MdidIndex(iter(start)), SortedMdids(start)
    for operation in operations:
        assert apply(compiled, operation) == apply(oracle, operation), operation
        assert len(compiled) == len(oracle)
    assert compiled.count(0, (1 << 128) - 1) == len(oracle)


def test_bad_input_is_refused_and_changes_nothing() -> None:
    index = MdidIndex([1, 2])
    with pytest.raises(ValueError, match="not in the index"):
        index.remove(3)
    with pytest.raises(TypeError):
        index.update([4, "5"])  # type: ignore[list-item]
    with pytest.raises(OverflowError):
        index.add(-1)
    assert len(index) == 2 and index.count(0, 10) == 2


def test_many_ids_split_and_empty_chunks_as_the_sorted_list_counts() -> None:
    """Past what hypothesis draws: 20,000 adds one by one (chunks split at
    2,000), then removes and range removes that empty whole chunks."""
    rng = random.Random(27)
    compiled, oracle = MdidIndex(), SortedMdids()
    ids = [rng.randrange(50_000) for _ in range(20_000)]
    for mdid in ids:
        compiled.add(mdid)
        oracle.add(mdid)
    for first in range(0, 50_000, 997):
        assert compiled.count(first, first + 3_000) == oracle.count(first, first + 3_000)
    for mdid in ids[::3]:
        compiled.remove(mdid)
        oracle.remove(mdid)
    for first in range(0, 50_000, 7_919):
        assert compiled.remove_range(first, first + 5_000) == oracle.remove_range(first, first + 5_000)
        assert compiled.count(0, 50_000) == len(oracle) == len(compiled)
    assert [compiled.count(i, i + 99) for i in range(0, 50_000, 100)] == \
        [oracle.count(i, i + 99) for i in range(0, 50_000, 100)]
