"""The file system a mount serves (`client_lib.fs.core`), in memory: file
contents through the write buffer against a bytearray, open-file semantics
(reclaim at last release, create of an existing name), readdir's ids, and
what a mount does when another client moved an inode away."""

from __future__ import annotations

import errno

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from client_lib import NamespaceError
from client_lib.fs.core import FileSystem
from client_lib.fs.filedata import FileData, chunk_key
from client_lib.fs.namespace import Namespace
from tests.fs_model import MemoryRecords

ROOT = 1
CHUNK = 16


def _fs(records: MemoryRecords | None = None, buffer_limit: int = 40) -> FileSystem:
    records = records if records is not None else MemoryRecords()
    ns = Namespace(records, root=ROOT)
    ns.format()
    return FileSystem(ns, FileData(records, chunk_size=CHUNK), buffer_limit=buffer_limit)


def _chunks(fs: FileSystem, ino: int) -> list[bytes]:
    records = fs.data.client.records   # type: ignore[attr-defined]
    prefix = chunk_key(ino, 0).rsplit("/", 1)[0].encode()
    return sorted(k for k in records if k.startswith(prefix))


ops = st.lists(st.one_of(
    st.tuples(st.just("write"), st.integers(0, 150), st.binary(min_size=1, max_size=60)),
    st.tuples(st.just("read"), st.integers(0, 160), st.integers(0, 80)),
    st.tuples(st.just("truncate"), st.integers(0, 150), st.just(0)),
    st.tuples(st.just("flush"), st.just(0), st.just(0)),
    st.tuples(st.just("reopen"), st.just(0), st.just(0))), max_size=40)


@given(ops=ops)
@settings(max_examples=200)
def test_contents_through_the_buffer_match_a_bytearray(ops: list) -> None:
    """Writes at any offset (contiguous ones buffered, others pushing the
    buffer), reads, truncates, flushes and reopen (release, then open: the
    size comes back from the entry) give what a bytearray gives."""
    fs = _fs()
    fh, made = fs.create(ROOT, b"f", 0o644, 0, 0, exclusive=True)
    model = bytearray()
    for op, offset, arg in ops:
        if op == "write":
            fs.write(fh, offset, arg)
            model[len(model):] = bytes(max(0, offset - len(model)))
            model[offset:offset + len(arg)] = arg
        elif op == "read":
            assert fs.read(fh, offset, arg) == bytes(model[offset:offset + arg])
        elif op == "truncate":
            fs.setattr(made.ino, {"size": offset})
            model[offset:] = b""
            model += bytes(offset - len(model))
        elif op == "flush":
            fs.flush(fh)
            assert fs.ns.lookup(ROOT, b"f").size == len(model)
        else:
            fs.release(fh)
            fh = fs.open(made.ino)
        assert fs.getattr(made.ino).size == len(model)
    fs.release(fh)
    assert fs.ns.lookup(ROOT, b"f").size == len(model)
    fh = fs.open(made.ino)
    assert fs.read(fh, 0, len(model) + 10) == bytes(model)


def test_a_file_unlinked_while_open_keeps_its_chunks_until_its_last_release() -> None:
    fs = _fs()
    fh, made = fs.create(ROOT, b"f", 0o644, 0, 0, exclusive=True)
    fs.write(fh, 0, b"x" * 100)
    fs.flush(fh)
    second = fs.open(made.ino)
    fs.unlink(ROOT, b"f")
    assert fs.read(second, 0, 100) == b"x" * 100 and _chunks(fs, made.ino)
    fs.release(fh)
    assert _chunks(fs, made.ino)
    fs.release(second)
    assert _chunks(fs, made.ino) == []
    with pytest.raises(NamespaceError) as gone:
        fs.lookup(ROOT, b"f")
    assert gone.value.errno == errno.ENOENT


def test_a_file_replaced_by_a_rename_is_reclaimed_and_the_moved_one_is_found() -> None:
    fs = _fs()
    old_fh, old = fs.create(ROOT, b"target", 0o644, 0, 0, exclusive=True)
    fs.write(old_fh, 0, b"old" * 20)
    fs.release(old_fh)
    new_fh, new = fs.create(ROOT, b"tmp", 0o644, 0, 0, exclusive=True)
    fs.write(new_fh, 0, b"new")
    fs.release(new_fh)
    fs.rename(ROOT, b"tmp", ROOT, b"target", noreplace=False)
    assert _chunks(fs, old.ino) == [] and fs.getattr(new.ino).size == 3
    assert fs.lookup(ROOT, b"target").ino == new.ino
    fs.create(ROOT, b"other", 0o644, 0, 0, exclusive=True)
    with pytest.raises(NamespaceError) as exists:
        fs.rename(ROOT, b"target", ROOT, b"other", noreplace=True)
    assert exists.value.errno == errno.EEXIST


def test_create_of_an_existing_name_opens_it_unless_exclusive() -> None:
    fs = _fs()
    fh, made = fs.create(ROOT, b"f", 0o600, 0, 0, exclusive=True)
    fs.write(fh, 0, b"kept")
    fs.release(fh)
    again, same = fs.create(ROOT, b"f", 0o600, 0, 0, exclusive=False)
    assert same.ino == made.ino and fs.read(again, 0, 10) == b"kept"
    with pytest.raises(NamespaceError) as taken:
        fs.create(ROOT, b"f", 0o600, 0, 0, exclusive=True)
    assert taken.value.errno == errno.EEXIST
    fs.mkdir(ROOT, b"d", 0o755, 0, 0)
    with pytest.raises(NamespaceError) as directory:
        fs.create(ROOT, b"d", 0o600, 0, 0, exclusive=False)
    assert directory.value.errno == errno.EISDIR


def test_readdir_ids_continue_where_the_kernel_stopped() -> None:
    """600 entries over pages of 256; the kernel takes only some of a page
    and asks again after the last id it took."""
    fs = _fs()
    names = sorted(b"n%03d" % i for i in range(600))
    for name in names:
        fs.create(ROOT, name, 0o644, 0, 0, exclusive=True)
    fh = fs.opendir(ROOT)
    seen, start = [], 0
    while page := fs.readdir(fh, start):
        taken = page[:100]     # the kernel's buffer filled after 100 entries
        for name, attributes, _ in taken:
            fs.entry_returned(fs.listing_inode(fh), name, attributes)
            seen.append(name)
        start = taken[-1][2]
    fs.releasedir(fh)
    assert seen == names


def test_an_inode_another_client_moved_is_stale_until_looked_up_again() -> None:
    records = MemoryRecords()
    mine, theirs = _fs(records), _fs(records)
    made = mine.mkdir(ROOT, b"d", 0o755, 0, 0)
    theirs.lookup(ROOT, b"d")
    theirs.rename(ROOT, b"d", ROOT, b"e", noreplace=False)
    with pytest.raises(NamespaceError) as stale:
        mine.getattr(made.ino)
    assert stale.value.errno == errno.ESTALE
    assert mine.lookup(ROOT, b"e").ino == made.ino and mine.getattr(made.ino).kind == "dir"


def test_the_root_takes_setattr_and_hard_links_are_refused() -> None:
    fs = _fs()
    assert fs.setattr(ROOT, {"mode": 0o700, "mtime_ns": 5}).mode == 0o700
    assert fs.getattr(ROOT).mtime_ns == 5
    _, made = fs.create(ROOT, b"f", 0o644, 0, 0, exclusive=True)
    with pytest.raises(NamespaceError) as refused:
        fs.link(made.ino, ROOT, b"g")
    assert refused.value.errno == errno.EPERM


def test_attributes_answer_getattr_for_their_ttl_and_own_writes_show_at_once() -> None:
    records = MemoryRecords()
    now = [0.0]
    mine = _fs(records)
    mine.attr_ttl, mine.monotonic = 1.0, lambda: now[0]
    theirs = _fs(records)
    fh, made = mine.create(ROOT, b"f", 0o644, 0, 0, exclusive=True)
    theirs.lookup(ROOT, b"f")
    theirs.setattr(made.ino, {"mode": 0o600})
    mine.write(fh, 0, b"abc")
    assert mine.getattr(made.ino).mode == 0o644 and mine.getattr(made.ino).size == 3   # cached, own size
    now[0] = 1.5
    assert mine.getattr(made.ino).mode == 0o600 and mine.getattr(made.ino).size == 3   # read again


def test_a_chunk_assumed_new_that_exists_is_merged_not_replaced() -> None:
    """`known_size` lets a growing file create chunks without reading them;
    a chunk another writer made meanwhile is read-modify-written instead."""
    records = MemoryRecords()
    data, other = FileData(records, chunk_size=CHUNK), FileData(records, chunk_size=CHUNK)
    other.write(7, 0, b"x" * 10)
    data.write(7, 4, b"yy", known_size=0)
    assert data.read(7, 0, 16, 10) == b"xxxxyyxxxx"
