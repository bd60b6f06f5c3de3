"""The extension's LevelDB (`nat_agent/fastpath/src/level.rs`) against plyvel, its oracle.

The store is written once against plyvel's method names and runs on
either, so the extension's classes must answer every call the store makes
as plyvel does: the same streams of puts, deletes, batches, reads and range
scans on two prefixes, fed to both, give the same answers. And the two must
share the on-disk format, in both directions, snappy-compressed tables
included (stores written before `compression=None`), since an agent
upgraded to the extension opens the directory plyvel wrote.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import plyvel
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from nat_agent._fastpath import LevelDB

PREFIXES = (b"r", b"m")
KEYS = st.binary(min_size=0, max_size=4)
BOUNDS = st.one_of(st.none(), KEYS)
OPS = st.lists(st.one_of(
    st.tuples(st.just("put"), st.sampled_from(PREFIXES), KEYS, st.binary(max_size=8)),
    st.tuples(st.just("delete"), st.sampled_from(PREFIXES), KEYS),
    st.tuples(st.just("batch"), st.sampled_from(PREFIXES),
              st.lists(st.tuples(KEYS, st.one_of(st.none(), st.binary(max_size=8))), max_size=5)),
    st.tuples(st.just("get"), st.sampled_from(PREFIXES), KEYS),
    st.tuples(st.just("scan"), st.sampled_from(PREFIXES), BOUNDS, BOUNDS, st.booleans(), st.booleans()),
), max_size=40)


def _run(db: Any, ops: list[tuple[Any, ...]]) -> list[object]:
    """Apply `ops` to a plyvel-like `db`; what each read answered."""
    tables = {prefix: db.prefixed_db(prefix) for prefix in PREFIXES}
    answers: list[object] = []
    for op, prefix, *args in ops:
        table = tables[prefix]
        if op == "put":
            table.put(args[0], args[1], sync=False)
        elif op == "delete":
            table.delete(args[0])
        elif op == "batch":
            batch = table.write_batch(sync=False)
            for key, value in args[0]:
                if value is None:
                    batch.delete(key)
                else:
                    batch.put(key, value)
            batch.write()
        elif op == "get":
            answers.append(table.get(args[0]))
        else:
            start, stop, include_start, include_value = args
            with table.iterator(start=start, stop=stop, include_start=include_start,
                                include_value=include_value) as rows:
                answers.append(list(rows))
    return answers


@settings(max_examples=150, deadline=None)
@given(ops=OPS)
def test_the_extension_answers_as_plyvel_does(tmp_path_factory: pytest.TempPathFactory,
                                              ops: list[tuple[Any, ...]]) -> None:
    tmp = tmp_path_factory.mktemp("level")
    oracle = plyvel.DB(str(tmp / "plyvel"), create_if_missing=True)
    ours = LevelDB(str(tmp / "ours"), create_if_missing=True)
    try:
        assert _run(ours, ops) == _run(oracle, ops)
        # and the whole database, prefixes included, is the same
        with ours.prefixed_db(b"").iterator() as rows:
            assert list(rows) == list(oracle.iterator())
    finally:
        ours.close()
        oracle.close()


@pytest.mark.parametrize("compression", [None, "snappy"])
def test_each_opens_what_the_other_wrote(tmp_path: Path, compression: str | None) -> None:
    """Tables on disk (compacted out of the memtable), then the log's tail."""
    records = {f"/d/{i}".encode(): bytes(range(256)) * (i % 3 + 1) for i in range(2000)}
    written = plyvel.DB(str(tmp_path / "a"), create_if_missing=True, compression=compression)
    for key, value in records.items():
        written.put(key, value)
    written.compact_range()
    written.put(b"/tail", b"in the log")
    written.close()
    ours = LevelDB(str(tmp_path / "a"), compression=compression)
    table = ours.prefixed_db(b"")
    assert all(table.get(key) == value for key, value in records.items())
    assert table.get(b"/tail") == b"in the log"
    table.put(b"/ours", b"by the extension")
    ours.compact_range()
    ours.close()
    again = plyvel.DB(str(tmp_path / "a"))
    try:
        assert again.get(b"/ours") == b"by the extension"
        assert sum(1 for _ in again.iterator()) == len(records) + 2
    finally:
        again.close()


def test_a_directory_opens_once(tmp_path: Path) -> None:
    """LevelDB's lock: a second handle is refused while one is open. (Not
    across the two copies of LevelDB in one process: each keeps its own
    table of the files this process locked, and the fcntl lock under it is
    the process's. So `leveldb_store._open` picks one of them per process,
    never both.)"""
    ours = LevelDB(str(tmp_path / "db"), create_if_missing=True)
    try:
        with pytest.raises(OSError, match="lock"):
            LevelDB(str(tmp_path / "db"))
    finally:
        ours.close()
    plyvel.DB(str(tmp_path / "db")).close()   # and once closed, it opens again


def test_closing_cuts_off_live_iterators_and_later_calls(tmp_path: Path) -> None:
    """A scan suspended across awaits may outlive its store: closing the
    database first ends its iterators, which then say so, not crash."""
    db = LevelDB(str(tmp_path / "db"), create_if_missing=True)
    table = db.prefixed_db(b"r")
    for i in range(10):
        table.put(b"%d" % i, b"v")
    rows = table.iterator(include_value=False)
    assert next(rows) == b"0"
    finished = table.iterator()
    assert len(list(finished)) == 10
    db.close()
    assert db.closed
    db.close()   # a second close does nothing
    with pytest.raises(RuntimeError, match="closed"):
        next(rows)
    assert list(finished) == []   # it had ended before: still ended
    with pytest.raises(RuntimeError, match="closed"):
        table.get(b"0")
    with pytest.raises(RuntimeError, match="closed"):
        table.write_batch().write()


def test_bad_options_and_paths_are_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="compression"):
        LevelDB(str(tmp_path / "db"), create_if_missing=True, compression="zstd")
    with pytest.raises(OSError, match="does not exist"):
        LevelDB(str(tmp_path / "missing"))
    with pytest.raises(OSError, match="NUL"):
        LevelDB(str(tmp_path / "a\0b"), create_if_missing=True)
