"""The file system a mount serves (`client_lib.fs.core`), in memory: file
contents through the write buffer against a bytearray, open-file semantics
(reclaim at last release, create of an existing name), readdir's ids, and
what a mount does when another client moved an inode away."""

from __future__ import annotations

import errno
import os
import stat
import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from client_lib import NamespaceError
from client_lib.fs.core import (
    FALLOC_FL_KEEP_SIZE,
    FALLOC_FL_PUNCH_HOLE,
    FALLOC_FL_ZERO_RANGE,
    FileSystem,
    Read,
)
from client_lib.fs.filedata import FileData, chunk_key
from client_lib.fs.inode import Attributes
from client_lib.fs.namespace import Namespace
from client_lib.fs.xattrs import XATTR_CREATE, XATTR_REPLACE, xattr_key
from tests.fs_model import MemoryRecords

ROOT = 1
CHUNK = 16


def _fs(records: MemoryRecords | None = None, buffer_limit: int = 40, ticking: bool = False) -> FileSystem:
    """A formatted file system over `records`; `ticking`: its clocks move
    a microsecond at every reading, so that every change shows in the times."""
    records = records if records is not None else MemoryRecords()
    ticks = iter(range(1_000, 10**12, 1_000))
    clock = (lambda: next(ticks)) if ticking else time.time_ns
    ns = Namespace(records, root=ROOT, clock=clock)
    ns.format()
    return FileSystem(ns, FileData(records, chunk_size=CHUNK), buffer_limit=buffer_limit, clock=clock)


def _chunks(fs: FileSystem, ino: int) -> list[bytes]:
    records = fs.data.client.records   # type: ignore[attr-defined]
    prefix = chunk_key(ino, 0).rsplit("/", 1)[0].encode()
    return sorted(k for k in records if k.startswith(prefix))


ops = st.lists(st.one_of(
    st.tuples(st.just("write"), st.integers(0, 150), st.binary(min_size=1, max_size=60)),
    st.tuples(st.just("read"), st.integers(0, 160), st.integers(0, 80)),
    st.tuples(st.just("truncate"), st.integers(0, 150), st.just(0)),
    st.tuples(st.just("flush"), st.just(0), st.just(0)),
    st.tuples(st.just("reopen"), st.just(0), st.just(0)),
    st.tuples(st.sampled_from(["allocate", "punch", "zero", "zero-keep"]), st.integers(0, 150),
              st.integers(1, 70))), max_size=40)

FALLOCATE_MODES = {"allocate": 0, "punch": FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE,
                   "zero": FALLOC_FL_ZERO_RANGE, "zero-keep": FALLOC_FL_ZERO_RANGE | FALLOC_FL_KEEP_SIZE}


@given(ops=ops)
@settings(max_examples=200)
def test_contents_through_the_buffer_match_a_bytearray(ops: list) -> None:
    """Writes at any offset (contiguous ones buffered, others pushing the
    buffer), reads, truncates, fallocate's growth, punched holes and zeroed
    ranges, flushes and reopen (release, then open: the size comes back
    from the entry) give what a bytearray gives."""
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
        elif op in FALLOCATE_MODES:
            fs.fallocate(fh, offset, arg, FALLOCATE_MODES[op])
            end = offset + arg
            if op != "allocate":
                model[offset:min(end, len(model))] = bytes(max(0, min(end, len(model)) - offset))
            if op in ("allocate", "zero"):
                model += bytes(max(0, end - len(model)))
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


def test_a_file_unlinked_while_open_stays_usable_with_no_links_until_its_last_release() -> None:
    """POSIX: stat, write, read and truncate through the open descriptor,
    which sees a link count of 0; nothing of it reaches the servers' names
    again, and every chunk it wrote, before or after the unlink, goes at the
    last release."""
    fs = _fs()
    records = fs.data.client.records   # type: ignore[attr-defined]
    fh, made = fs.create(ROOT, b"f", 0o600, 0, 0, exclusive=True)
    fs.write(fh, 0, b"before")
    fs.flush(fh)
    fs.unlink(ROOT, b"f")
    chunks = chunk_key(made.ino, 0).rsplit("/", 1)[0].encode()

    def names() -> dict[bytes, bytes]:
        return {k: v for k, v in records.items() if not k.startswith(chunks)}

    unlinked = names()
    assert fs.getattr(made.ino).nlink == 0
    fs.write(fh, 6, b" and after" * 10)
    assert fs.read(fh, 0, 16) == b"before and after"
    fs.flush(fh)
    assert fs.getattr(made.ino).size == 106 and fs.getattr(made.ino).nlink == 0
    assert fs.setattr(made.ino, {"size": 6, "mode": 0o640}).mode == 0o640
    assert fs.getattr(made.ino).size == 6 and fs.read(fh, 0, 100) == b"before"
    fs.write(fh, 200, b"far")
    fs.flush(fh)
    assert names() == unlinked   # no entry comes back, none changes
    fs.release(fh)
    assert _chunks(fs, made.ino) == []
    with pytest.raises(NamespaceError) as gone:
        fs.getattr(made.ino)
    assert gone.value.errno == errno.ESTALE


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


def test_the_root_takes_setattr_and_a_directory_takes_no_hard_link() -> None:
    fs = _fs()
    assert fs.setattr(ROOT, {"mode": 0o700, "mtime_ns": 5}).mode == 0o700
    assert fs.getattr(ROOT).mtime_ns == 5
    made = fs.mkdir(ROOT, b"d", 0o755, 0, 0)
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


@pytest.mark.parametrize(("type_bits", "kind", "rdev"), [
    (stat.S_IFIFO, "fifo", 0), (stat.S_IFSOCK, "socket", 0),
    (stat.S_IFCHR, "chr", os.makedev(1, 3)), (stat.S_IFBLK, "blk", os.makedev(7, 0)),
    (stat.S_IFREG, "file", 0), (0, "file", 0)])
def test_mknod_keeps_special_files_as_inodes(type_bits: int, kind: str, rdev: int) -> None:
    """A FIFO, socket or device node is an entry with its type and device
    number (the kernel does its I/O); mknod of S_IFREG (or no type) makes a
    regular file. Each is looked up, stat'ed and unlinked as a file is."""
    fs = _fs()
    made = fs.mknod(ROOT, b"n", type_bits | 0o640, os.makedev(9, 9) if kind == "file" else rdev, 5, 6)
    assert (made.kind, made.rdev, made.mode, made.uid, made.gid) == (kind, rdev, 0o640, 5, 6)
    assert stat.S_IFMT(made.st_mode) == (type_bits or stat.S_IFREG)
    assert fs.getattr(made.ino) == fs.lookup(ROOT, b"n") == made
    with pytest.raises(NamespaceError) as taken:
        fs.mknod(ROOT, b"n", type_bits | 0o640, rdev, 5, 6)
    assert taken.value.errno == errno.EEXIST
    fs.unlink(ROOT, b"n")
    with pytest.raises(NamespaceError) as gone:
        fs.lookup(ROOT, b"n")
    assert gone.value.errno == errno.ENOENT


def test_mknod_refuses_what_it_does_not_make() -> None:
    fs = _fs()
    for mode in (stat.S_IFDIR | 0o755, stat.S_IFLNK | 0o777, 0o170000 | 0o644):
        with pytest.raises(NamespaceError) as refused:
            fs.mknod(ROOT, b"n", mode, 0, 0, 0)
        assert refused.value.errno == errno.EINVAL, oct(mode)


def test_only_device_nodes_write_a_device_number() -> None:
    """Records of everything but device nodes are byte for byte what they
    were before device nodes: older clients read them."""
    fs = _fs()
    records = fs.data.client.records   # type: ignore[attr-defined]
    _, plain = fs.create(ROOT, b"f", 0o644, 0, 0, exclusive=True)
    fifo = fs.mknod(ROOT, b"p", stat.S_IFIFO | 0o644, 0, 0, 0)
    device = fs.mknod(ROOT, b"c", stat.S_IFCHR | 0o644, os.makedev(1, 3), 0, 0)
    stored = {attributes.ino: raw for raw in records.values() if raw.startswith(b"{")
              for attributes in [Attributes.from_bytes(raw)]}
    assert b"rdev" not in stored[plain.ino] and b"rdev" not in stored[fifo.ino]
    assert Attributes.from_bytes(stored[device.ino]).rdev == os.makedev(1, 3)


@pytest.mark.parametrize("call", ["lookup", "create", "mkdir", "mknod", "unlink", "rename"])
def test_a_name_over_255_bytes_is_enametoolong(call: str) -> None:
    fs = _fs()
    long, fine = b"x" * 256, b"y" * 255
    fs.create(ROOT, fine, 0o644, 0, 0, exclusive=True)
    calls = {"lookup": lambda: fs.lookup(ROOT, long),
             "create": lambda: fs.create(ROOT, long, 0o644, 0, 0, exclusive=True),
             "mkdir": lambda: fs.mkdir(ROOT, long, 0o755, 0, 0),
             "mknod": lambda: fs.mknod(ROOT, long, stat.S_IFIFO | 0o644, 0, 0, 0),
             "unlink": lambda: fs.unlink(ROOT, long),
             "rename": lambda: fs.rename(ROOT, fine, ROOT, long, noreplace=False)}
    with pytest.raises(NamespaceError) as refused:
        calls[call]()
    assert refused.value.errno == errno.ENAMETOOLONG
    assert fs.lookup(ROOT, fine).kind == "file"   # nothing changed


@pytest.mark.parametrize("call", ["create", "mkdir", "mknod", "symlink", "unlink", "rmdir", "rename"])
def test_adding_or_removing_an_entry_moves_its_directorys_mtime_and_ctime(call: str) -> None:
    """POSIX, for the directory a call adds a name to or removes one from,
    the root and any other (whose times live in its parent's entry)."""
    fs = _fs(ticking=True)
    sub = fs.mkdir(ROOT, b"sub", 0o755, 0, 0).ino
    fs.create(sub, b"old", 0o644, 0, 0, exclusive=True)
    fs.mkdir(sub, b"olddir", 0o755, 0, 0)
    before = {d: fs.getattr(d) for d in (ROOT, sub)}
    calls = {"create": lambda: fs.create(sub, b"new", 0o644, 0, 0, exclusive=True),
             "mkdir": lambda: fs.mkdir(sub, b"new", 0o755, 0, 0),
             "mknod": lambda: fs.mknod(sub, b"new", stat.S_IFIFO | 0o644, 0, 0, 0),
             "symlink": lambda: fs.symlink(sub, b"new", b"old", 0, 0),
             "unlink": lambda: fs.unlink(sub, b"old"),
             "rmdir": lambda: fs.rmdir(sub, b"olddir"),
             "rename": lambda: fs.rename(sub, b"old", ROOT, b"moved", noreplace=False)}
    calls[call]()
    changed = {sub, ROOT} if call == "rename" else {sub}
    for directory, was in before.items():
        now = fs.getattr(directory)
        if directory in changed:
            assert now.mtime_ns > was.mtime_ns and now.ctime_ns > was.ctime_ns, (call, directory)
        else:
            assert (now.mtime_ns, now.ctime_ns) == (was.mtime_ns, was.ctime_ns), (call, directory)


def test_a_new_size_is_a_modification_and_the_same_size_is_not() -> None:
    fs = _fs(ticking=True)
    fh, made = fs.create(ROOT, b"f", 0o644, 0, 0, exclusive=True)
    fs.release(fh)
    cut = fs.setattr(made.ino, {"size": 10})
    assert cut.mtime_ns > made.mtime_ns and cut.ctime_ns > made.ctime_ns
    same = fs.setattr(made.ino, {"size": 10})
    assert same.mtime_ns == cut.mtime_ns   # ctime moves with any setattr, as on Linux
    assert fs.setattr(made.ino, {"size": 0, "mtime_ns": 5}).mtime_ns == 5   # an explicit one wins


def test_o_trunc_cuts_an_existing_file_and_is_a_modification_even_when_empty() -> None:
    fs = _fs(ticking=True)
    fh, made = fs.create(ROOT, b"f", 0o644, 0, 0, exclusive=True)
    fs.write(fh, 0, b"x" * 50)
    fs.release(fh)
    written = fs.getattr(made.ino)
    fh = fs.open(made.ino, truncate=True)
    assert fs.read(fh, 0, 100) == b""
    fs.release(fh)
    cut = fs.getattr(made.ino)
    assert cut.size == 0 and cut.mtime_ns > written.mtime_ns and cut.ctime_ns > written.ctime_ns
    assert _chunks(fs, made.ino) == []
    fh, again = fs.create(ROOT, b"f", 0o644, 0, 0, exclusive=False, truncate=True)   # O_CREAT|O_TRUNC
    fs.release(fh)
    assert again.size == 0 and again.mtime_ns > cut.mtime_ns
    fh = fs.open(made.ino)   # without O_TRUNC nothing moves
    fs.release(fh)
    assert fs.getattr(made.ino).mtime_ns == again.mtime_ns


def test_hard_links_share_one_inode_until_the_last_name_goes() -> None:
    """Every name shows one inode (number, attributes, contents, link
    count); a change through one shows through the others; the contents go
    with the last name, and not before."""
    fs = _fs()
    records = fs.data.client.records   # type: ignore[attr-defined]
    fh, made = fs.create(ROOT, b"a", 0o644, 0, 0, exclusive=True)
    fs.write(fh, 0, b"shared bytes" * 5)
    fs.release(fh)
    sub = fs.mkdir(ROOT, b"sub", 0o755, 0, 0).ino
    second = fs.link(made.ino, sub, b"b")
    assert second.ino == made.ino and second.nlink == 2 and second.size == 60
    assert fs.lookup(ROOT, b"a") == fs.lookup(sub, b"b") == fs.getattr(made.ino)
    fs.setattr(made.ino, {"mode": 0o600})
    assert fs.lookup(sub, b"b").mode == 0o600 and fs.lookup(ROOT, b"a").mode == 0o600
    third = fs.link(made.ino, ROOT, b"c")
    assert third.nlink == 3 and {name for name, _, _ in fs.readdir(fs.opendir(ROOT), 0)} >= {b"a", b"c"}
    listed = fs.readdir(fs.opendir(ROOT), 0)
    assert all(attributes.nlink == 3 for name, attributes, _ in listed if name != b"sub")
    fs.unlink(ROOT, b"a")
    assert fs.getattr(made.ino).nlink == 2 and _chunks(fs, made.ino)
    fh = fs.open(made.ino)
    assert fs.read(fh, 0, 12) == b"shared bytes"
    fs.release(fh)
    fs.unlink(ROOT, b"c")
    assert fs.getattr(made.ino).nlink == 1 and _chunks(fs, made.ino)
    fs.unlink(sub, b"b")
    assert _chunks(fs, made.ino) == [] and not any(k.startswith(b"/.mf/i/") for k in records)


def test_a_hard_link_to_a_taken_name_fails_and_leaves_the_count() -> None:
    fs = _fs()
    _, made = fs.create(ROOT, b"a", 0o644, 0, 0, exclusive=True)
    fs.create(ROOT, b"taken", 0o644, 0, 0, exclusive=True)
    with pytest.raises(NamespaceError) as taken:
        fs.link(made.ino, ROOT, b"taken")
    assert taken.value.errno == errno.EEXIST
    assert fs.getattr(made.ino).nlink == 1
    assert fs.link(made.ino, ROOT, b"b").nlink == 2


def test_rename_over_a_hard_link_counts_it_down_and_between_two_names_does_nothing() -> None:
    fs = _fs()
    fh, made = fs.create(ROOT, b"a", 0o644, 0, 0, exclusive=True)
    fs.write(fh, 0, b"x" * 20)
    fs.release(fh)
    fs.link(made.ino, ROOT, b"b")
    fs.rename(ROOT, b"a", ROOT, b"b", noreplace=False)   # two names of one inode: POSIX does nothing
    assert fs.lookup(ROOT, b"a").ino == fs.lookup(ROOT, b"b").ino == made.ino
    _, other = fs.create(ROOT, b"other", 0o644, 0, 0, exclusive=True)
    fs.rename(ROOT, b"other", ROOT, b"b", noreplace=False)
    assert fs.lookup(ROOT, b"b").ino == other.ino
    assert fs.getattr(made.ino).nlink == 1 and _chunks(fs, made.ino)   # "a" still names it
    fs.rename(ROOT, b"b", ROOT, b"a", noreplace=False)
    assert _chunks(fs, made.ino) == []


def test_a_linked_inode_is_found_by_number_after_the_name_this_mount_knew_went() -> None:
    records = MemoryRecords()
    fs = _fs(records)
    _, made = fs.create(ROOT, b"a", 0o644, 0, 0, exclusive=True)
    fs.link(made.ino, ROOT, b"b")
    fs.unlink(ROOT, b"b")   # the place this mount remembered last
    assert fs.getattr(made.ino).nlink == 1
    assert fs.setattr(made.ino, {"mode": 0o600}).mode == 0o600
    assert fs.lookup(ROOT, b"a").mode == 0o600


def test_extended_attributes_set_get_list_remove_and_go_with_the_inode() -> None:
    fs = _fs()
    records = fs.data.client.records   # type: ignore[attr-defined]
    _, made = fs.create(ROOT, b"f", 0o644, 0, 0, exclusive=True)
    with pytest.raises(NamespaceError) as none:
        fs.getxattr(made.ino, b"security.capability")
    assert none.value.errno == errno.ENODATA and fs.listxattr(made.ino) == []
    fs.setxattr(made.ino, b"user.a", b"\x00binary\xff")
    fs.setxattr(made.ino, b"user.b", b"")
    fs.setxattr(made.ino, b"user.a", b"again")
    assert fs.getxattr(made.ino, b"user.a") == b"again" and fs.getxattr(made.ino, b"user.b") == b""
    assert fs.listxattr(made.ino) == [b"user.a", b"user.b"]
    fs.removexattr(made.ino, b"user.b")
    with pytest.raises(NamespaceError) as gone:
        fs.removexattr(made.ino, b"user.b")
    assert gone.value.errno == errno.ENODATA and fs.listxattr(made.ino) == [b"user.a"]
    d = fs.mkdir(ROOT, b"d", 0o755, 0, 0)
    fs.setxattr(d.ino, b"user.dir", b"1")
    fs.setxattr(ROOT, b"user.root", b"2")
    assert fs.getxattr(ROOT, b"user.root") == b"2"
    fs.unlink(ROOT, b"f")
    fs.rmdir(ROOT, b"d")
    assert [k for k in records if k.startswith(b"/.mf/x/")] == [xattr_key(ROOT).encode()]


@pytest.mark.parametrize(("name", "value", "code"), [
    (b"", b"v", errno.ERANGE), (b"u" * 256, b"v", errno.ERANGE), (b"user.big", b"v" * 65537, errno.E2BIG)])
def test_extended_attributes_past_their_limits_are_refused_and_change_nothing(name: bytes, value: bytes,
                                                                              code: int) -> None:
    fs = _fs()
    _, made = fs.create(ROOT, b"f", 0o644, 0, 0, exclusive=True)
    with pytest.raises(NamespaceError) as refused:
        fs.setxattr(made.ino, name, value)
    assert refused.value.errno == code and not fs.getattr(made.ino).xattrs


def test_extended_attributes_of_one_inode_hold_64_kib_in_all() -> None:
    fs = _fs()
    _, made = fs.create(ROOT, b"f", 0o644, 0, 0, exclusive=True)
    fs.setxattr(made.ino, b"user.a", b"a" * 60000)
    with pytest.raises(NamespaceError) as full:
        fs.setxattr(made.ino, b"user.b", b"b" * 6000)
    assert full.value.errno == errno.ENOSPC and fs.listxattr(made.ino) == [b"user.a"]


def _read(fs: FileSystem, plan: object) -> Attributes | None:
    """What the mount's event loop makes of a plan: its answer, or None (the thread's call)."""
    if isinstance(plan, Read):
        return plan.answer(fs.data.client.get(plan.key))
    assert plan is None or isinstance(plan, Attributes)
    return plan


def test_lookups_and_getattrs_planned_as_one_read_answer_what_the_calls_answer() -> None:
    fs = _fs()
    sub = fs.mkdir(ROOT, b"sub", 0o755, 0, 0)
    fh, made = fs.create(sub.ino, b"f", 0o644, 0, 0, exclusive=True)
    fs.release(fh)
    assert _read(fs, fs.lookup_read(sub.ino, b"f")) == fs.lookup(sub.ino, b"f") == made
    assert _read(fs, fs.getattr_read(made.ino)) == fs.getattr(made.ino)
    assert _read(fs, fs.getattr_read(ROOT)) == fs.getattr(ROOT)
    with pytest.raises(NamespaceError) as missing:
        _read(fs, fs.lookup_read(sub.ino, b"nothing"))
    assert missing.value.errno == errno.ENOENT
    with pytest.raises(NamespaceError) as long:
        fs.lookup_read(sub.ino, b"n" * 256)   # a bad name fails before any read
    assert long.value.errno == errno.ENAMETOOLONG
    assert fs.getattr_read(424242) is None   # never looked up here: the call finds out


def test_a_plan_leaves_hard_links_and_moved_inodes_to_the_calls() -> None:
    fs = _fs()
    fh, made = fs.create(ROOT, b"f", 0o644, 0, 0, exclusive=True)
    fs.release(fh)
    fs.link(made.ino, ROOT, b"g")
    assert _read(fs, fs.lookup_read(ROOT, b"g")) is None   # the inode's own record holds it
    assert fs.lookup(ROOT, b"g").nlink == 2
    other = Namespace(fs.ns.client, root=ROOT)   # another client replaces what this mount saw
    other.unlink(ROOT, "f")
    other.create(ROOT, "f")
    assert _read(fs, fs.getattr_read(made.ino)) is None   # a new inode at the old place


def test_a_flush_or_release_with_nothing_to_send_is_done_at_once() -> None:
    fs = _fs(buffer_limit=1000)
    fh, made = fs.create(ROOT, b"f", 0o644, 0, 0, exclusive=True)
    assert fs.flush_quietly(fh) and fs.release_quietly(fh)
    with pytest.raises(NamespaceError):   # released: the handle is gone
        fs.flush_quietly(fh)
    fh = fs.open(made.ino)
    fs.write(fh, 0, b"buffered")
    assert not fs.flush_quietly(fh) and not fs.release_quietly(fh)   # the data must go first
    fs.flush(fh)
    assert fs.flush_quietly(fh)
    second = fs.open(made.ino)
    fs.unlink(ROOT, b"f")   # open twice, unlinked: the last close reclaims the chunks
    assert fs.release_quietly(second)
    assert not fs.release_quietly(fh)
    fs.release(fh)
    assert _chunks(fs, made.ino) == []


def test_directory_times_owed_are_shown_at_once_and_written_once_for_many_changes() -> None:
    """With a pusher (the mount's), an entry change owes its directory's
    times instead of writing them: this mount shows them at once, the
    record gets them when pushed, one write for every change meanwhile."""
    records = MemoryRecords()
    fs = _fs(records, ticking=True)
    calls: list[int] = []
    fs.times_owed = lambda: calls.append(1)
    sub = fs.mkdir(ROOT, b"sub", 0o755, 0, 0)   # the root owes its times now
    assert calls == [1] and fs.owes_times()
    before = fs.ns.lookup(ROOT, "sub")
    writes = records.writes
    for n in range(5):
        fs.release(fs.create(sub.ino, b"f%d" % n, 0o644, 0, 0, exclusive=True)[0])
    assert records.writes - writes == 5 and calls == [1]   # the entries only; no second wake
    shown = fs.getattr(sub.ino)
    assert shown.mtime_ns > before.mtime_ns and shown.ctime_ns == shown.mtime_ns
    assert fs.ns.lookup(ROOT, "sub").mtime_ns == before.mtime_ns   # not written yet
    fs.push_directory_times()
    assert not fs.owes_times() and records.writes - writes == 5 + 2   # sub's entry, the root's header
    stored = fs.ns.lookup(ROOT, "sub")
    assert (stored.mtime_ns, stored.ctime_ns) == (shown.mtime_ns, shown.ctime_ns)
    assert fs.getattr(sub.ino) == stored


def test_an_mtime_set_by_hand_wins_over_one_owed_and_unmount_writes_the_rest() -> None:
    fs = _fs(ticking=True)
    fs.times_owed = lambda: None
    sub = fs.mkdir(ROOT, b"sub", 0o755, 0, 0)
    fs.release(fs.create(sub.ino, b"f", 0o644, 0, 0, exclusive=True)[0])
    assert fs.setattr(sub.ino, {"mtime_ns": 5}).mtime_ns == 5   # touch -d: owed times dropped
    fs.flush_all()   # the root's owed times are written, sub's are not
    assert fs.ns.lookup(ROOT, "sub").mtime_ns == 5 and not fs.owes_times()
    assert fs.ns.root_attributes().mtime_ns > sub.mtime_ns


def test_fallocate_deletes_the_whole_chunks_of_a_hole_and_refuses_what_it_does_not_keep() -> None:
    fs = _fs()
    fh, made = fs.create(ROOT, b"f", 0o644, 0, 0, exclusive=True)
    fs.write(fh, 0, bytes(range(1, 81)))   # five chunks of 16 bytes
    fs.flush(fh)
    assert len(_chunks(fs, made.ino)) == 5
    fs.fallocate(fh, 8, 40, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE)   # chunks 1 and 2 whole
    assert len(_chunks(fs, made.ino)) == 3
    assert fs.read(fh, 0, 80) == bytes(range(1, 9)) + bytes(40) + bytes(range(49, 81))
    for mode, code in [(FALLOC_FL_PUNCH_HOLE, errno.EOPNOTSUPP),   # Linux wants KEEP_SIZE with it
                       (0x08, errno.EOPNOTSUPP),                   # FALLOC_FL_COLLAPSE_RANGE
                       (0x20, errno.EOPNOTSUPP)]:                  # FALLOC_FL_INSERT_RANGE
        with pytest.raises(NamespaceError) as refused:
            fs.fallocate(fh, 0, 16, mode)
        assert refused.value.errno == code
    for offset, length in [(-1, 10), (0, 0)]:
        with pytest.raises(NamespaceError) as bad:
            fs.fallocate(fh, offset, length, 0)
        assert bad.value.errno == errno.EINVAL
    assert fs.getattr(made.ino).size == 80


def test_setxattr_create_and_replace_check_what_the_record_holds() -> None:
    fs = _fs()
    _, made = fs.create(ROOT, b"f", 0o644, 0, 0, exclusive=True)
    with pytest.raises(NamespaceError) as missing:
        fs.setxattr(made.ino, b"user.a", b"1", XATTR_REPLACE)
    assert missing.value.errno == errno.ENODATA
    assert not fs.getattr(made.ino).xattrs   # refused before anything was written
    fs.setxattr(made.ino, b"user.a", b"1", XATTR_CREATE)
    with pytest.raises(NamespaceError) as exists:
        fs.setxattr(made.ino, b"user.a", b"2", XATTR_CREATE)
    assert exists.value.errno == errno.EEXIST
    with pytest.raises(NamespaceError) as other:
        fs.setxattr(made.ino, b"user.b", b"2", XATTR_REPLACE)
    assert other.value.errno == errno.ENODATA
    fs.setxattr(made.ino, b"user.a", b"3", XATTR_REPLACE)
    assert fs.getxattr(made.ino, b"user.a") == b"3" and fs.listxattr(made.ino) == [b"user.a"]
