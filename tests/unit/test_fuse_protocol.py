"""FUSE's wire protocol as `client_lib.fs.fuse_protocol` encodes it, checked
without a mount or ``/dev/fuse``.

The contract is the kernel's own header, ``linux/fuse.h``: the kernel reads
our replies and writes our requests with exactly those structs, and a field
one word off is not an error anywhere, only wrong attributes, a lock on the
wrong range or a silently truncated reply. So the first half of this file
compiles a small C program against the header (with ``cc``; tmp_path) and
compares, for every struct.Struct of the module, its size with the struct's
``sizeof`` and each of its fields with the C member at that position (offset,
width, signedness), and the opcodes, capability bits and flags with the
header's values. The installed header is newer than the protocol we speak
(7.31); where a struct grew since, the 7.31 size is the offset of the first
member added (``fuse_init_in.flags2``, ``fuse_setxattr_in.setxattr_flags``).
No compiler is a failure, not a skip: ``make test`` installs one.

The second half checks the codec itself: `parse`, `fields` and `names` on
requests built here, and every reply encoder by unpacking its bytes again
(times split into seconds and nanoseconds, dirents padded to 8 bytes as the
header's FUSE_DIRENT_ALIGN says, INIT granting only what the kernel offered).
"""

from __future__ import annotations

import json
import re
import shutil
import stat
import struct
import subprocess
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from client_lib.fs import fuse_protocol as fp
from client_lib.fs.fuse_protocol import Attr, Init, ProtocolError

# -- the layouts against linux/fuse.h ------------------------------------------------------

_ATTR_FIELDS = ["ino", "size", "blocks", "atime", "mtime", "ctime", "atimensec", "mtimensec", "ctimensec",
                "mode", "nlink", "uid", "gid", "rdev", "blksize", "flags"]
_LOCK_FIELDS = ["lk.start", "lk.end", "lk.type", "lk.pid"]

LAYOUTS: dict[str, tuple[str, str, list[str]]] = {
    # Python name: (C struct, C expression of its 7.31 size, the C members of the
    # Python struct's fields in order; a prefix where the rest is unused words).
    "HEADER": ("fuse_in_header", "sizeof(struct fuse_in_header)",
               ["len", "opcode", "unique", "nodeid", "uid", "gid", "pid", "total_extlen", "padding"]),
    "OUT_HEADER": ("fuse_out_header", "sizeof(struct fuse_out_header)", ["len", "error", "unique"]),
    "ATTR": ("fuse_attr", "sizeof(struct fuse_attr)", _ATTR_FIELDS),
    "ENTRY_OUT": ("fuse_entry_out", "sizeof(struct fuse_entry_out)",
                  ["nodeid", "generation", "entry_valid", "attr_valid", "entry_valid_nsec", "attr_valid_nsec"]
                  + [f"attr.{name}" for name in _ATTR_FIELDS]),
    "ATTR_OUT": ("fuse_attr_out", "sizeof(struct fuse_attr_out)",
                 ["attr_valid", "attr_valid_nsec", "dummy"] + [f"attr.{name}" for name in _ATTR_FIELDS]),
    "INIT_IN": ("fuse_init_in", "offsetof(struct fuse_init_in, flags2)",
                ["major", "minor", "max_readahead", "flags"]),
    "INIT_OUT": ("fuse_init_out", "sizeof(struct fuse_init_out)",
                 ["major", "minor", "max_readahead", "flags", "max_background", "congestion_threshold",
                  "max_write", "time_gran", "max_pages", "map_alignment"]),
    "OPEN_IN": ("fuse_open_in", "sizeof(struct fuse_open_in)", ["flags", "open_flags"]),
    "OPEN_OUT": ("fuse_open_out", "sizeof(struct fuse_open_out)", ["fh", "open_flags", "padding"]),
    "SETATTR_IN": ("fuse_setattr_in", "sizeof(struct fuse_setattr_in)",
                   ["valid", "padding", "fh", "size", "lock_owner", "atime", "mtime", "ctime", "atimensec",
                    "mtimensec", "ctimensec", "mode", "unused4", "uid", "gid", "unused5"]),
    "MKNOD_IN": ("fuse_mknod_in", "sizeof(struct fuse_mknod_in)", ["mode", "rdev", "umask", "padding"]),
    "MKDIR_IN": ("fuse_mkdir_in", "sizeof(struct fuse_mkdir_in)", ["mode", "umask"]),
    "RENAME_IN": ("fuse_rename_in", "sizeof(struct fuse_rename_in)", ["newdir"]),
    "RENAME2_IN": ("fuse_rename2_in", "sizeof(struct fuse_rename2_in)", ["newdir", "flags", "padding"]),
    "LINK_IN": ("fuse_link_in", "sizeof(struct fuse_link_in)", ["oldnodeid"]),
    "READ_IN": ("fuse_read_in", "sizeof(struct fuse_read_in)",
                ["fh", "offset", "size", "read_flags", "lock_owner", "flags", "padding"]),
    "WRITE_IN": ("fuse_write_in", "sizeof(struct fuse_write_in)",
                 ["fh", "offset", "size", "write_flags", "lock_owner", "flags", "padding"]),
    "WRITE_OUT": ("fuse_write_out", "sizeof(struct fuse_write_out)", ["size", "padding"]),
    "RELEASE_IN": ("fuse_release_in", "sizeof(struct fuse_release_in)",
                   ["fh", "flags", "release_flags", "lock_owner"]),
    "FLUSH_IN": ("fuse_flush_in", "sizeof(struct fuse_flush_in)", ["fh", "unused", "padding", "lock_owner"]),
    "FSYNC_IN": ("fuse_fsync_in", "sizeof(struct fuse_fsync_in)", ["fh", "fsync_flags", "padding"]),
    "SETXATTR_IN": ("fuse_setxattr_in", "offsetof(struct fuse_setxattr_in, setxattr_flags)",
                    ["size", "flags"]),
    "GETXATTR_IN": ("fuse_getxattr_in", "sizeof(struct fuse_getxattr_in)", ["size", "padding"]),
    "GETXATTR_OUT": ("fuse_getxattr_out", "sizeof(struct fuse_getxattr_out)", ["size", "padding"]),
    "LK_IN": ("fuse_lk_in", "sizeof(struct fuse_lk_in)",
              ["fh", "owner", *_LOCK_FIELDS, "lk_flags", "padding"]),
    "LK_OUT": ("fuse_lk_out", "sizeof(struct fuse_lk_out)", _LOCK_FIELDS),
    "CREATE_IN": ("fuse_create_in", "sizeof(struct fuse_create_in)",
                  ["flags", "mode", "umask", "open_flags"]),
    "INTERRUPT_IN": ("fuse_interrupt_in", "sizeof(struct fuse_interrupt_in)", ["unique"]),
    "FORGET_IN": ("fuse_forget_in", "sizeof(struct fuse_forget_in)", ["nlookup"]),
    "BATCH_FORGET_IN": ("fuse_batch_forget_in", "sizeof(struct fuse_batch_forget_in)", ["count", "dummy"]),
    "FORGET_ONE": ("fuse_forget_one", "sizeof(struct fuse_forget_one)", ["nodeid", "nlookup"]),
    "FALLOCATE_IN": ("fuse_fallocate_in", "sizeof(struct fuse_fallocate_in)",
                     ["fh", "offset", "length", "mode", "padding"]),
    "STATFS_OUT": ("fuse_kstatfs", "sizeof(struct fuse_kstatfs)",
                   ["blocks", "bfree", "bavail", "files", "ffree", "bsize", "namelen", "frsize", "padding"]
                   + [f"spare[{i}]" for i in range(6)]),
    "DIRENT": ("fuse_dirent", "offsetof(struct fuse_dirent, name)", ["ino", "off", "namelen", "type"]),
}

CONSTANT_PREFIXES = ("FATTR_", "FUSE_", "FOPEN_")
"""The module's flag constants named as in the header."""
DIRENT_NAME_LENGTHS = range(0, 33)


def _layout(name: str) -> struct.Struct:
    layout = getattr(fp, name)
    assert isinstance(layout, struct.Struct)
    return layout


def _codes(layout: struct.Struct) -> list[str]:
    """The format's one code per field: "<QII8I" gives Q, I, I and eight I."""
    assert layout.format[0] == "<", f"{layout.format!r} is not little-endian without padding"
    codes: list[str] = []
    for count, code in re.findall(r"(\d*)([a-zA-Z?])", layout.format[1:]):
        codes += [code] * (int(count) if count else 1)
    return codes


def _python_field(codes: list[str], index: int) -> list[int]:
    """[offset, width, signed] of field `index`, as C's offsetof, sizeof and (type)-1 < 0 give it."""
    code = codes[index]
    return [struct.calcsize("<" + "".join(codes[:index])), struct.calcsize("<" + code), int(code.islower())]


def _constants() -> dict[str, int]:
    """Every value of the module that the header defines too, by its C name."""
    named = {f"FUSE_{op.name}": int(op) for op in fp.Op}
    named |= {f"FUSE_{name}": int(cap) for name, cap in fp.Cap.__members__.items()}
    named |= {name: value for name, value in vars(fp).items()
              if name.startswith(CONSTANT_PREFIXES) and isinstance(value, int)}
    return named


def _c_program() -> str:
    entries: list[tuple[str, str, str]] = []  # JSON key, printf format of the value, its arguments
    for name, (c_struct, size, members) in LAYOUTS.items():
        entries.append((f"size:{name}", "%lld", f"(long long)({size})"))
        for member in members:
            lvalue = f"((struct {c_struct} *)0)->{member}"
            entries.append((f"field:{name}:{member}", "[%lld, %lld, %d]",
                            f"(long long)offsetof(struct {c_struct}, {member}), (long long)sizeof({lvalue}), "
                            f"(int)((__typeof__({lvalue}))-1 < 0)"))
    for constant in [*_constants(), "FUSE_KERNEL_VERSION", "FUSE_KERNEL_MINOR_VERSION", "FUSE_ROOT_ID",
                     "FUSE_NAME_OFFSET_DIRENTPLUS"]:
        entries.append((f"const:{constant}", "%lld", f"(long long)({constant})"))
    for n in DIRENT_NAME_LENGTHS:
        entries.append((f"dirent_size:{n}", "%lld", f"(long long)FUSE_DIRENT_ALIGN(FUSE_NAME_OFFSET + {n})"))
        entries.append((f"direntplus_size:{n}", "%lld",
                        f"(long long)FUSE_DIRENT_ALIGN(FUSE_NAME_OFFSET_DIRENTPLUS + {n})"))
    lines = [f'    printf("%s\\"{key}\\": {form}", sep, {args}); sep = ",\\n";'
             for key, form, args in entries]
    return "\n".join([
        "#include <stddef.h>", "#include <stdio.h>", "#include <linux/fuse.h>", "",
        "int main(void) {", '    const char *sep = "";', '    printf("{\\n");', *lines,
        '    printf("\\n}\\n");', "    return 0;", "}", ""])


@pytest.fixture(scope="module")
def kernel(tmp_path_factory: pytest.TempPathFactory) -> dict[str, object]:
    """What the C compiler reads in linux/fuse.h: sizes, [offset, width,
    signed] of fields, constants and dirent sizes, by key."""
    cc = shutil.which("cc")
    if cc is None:
        pytest.fail("no C compiler (cc) on PATH: the FUSE structs are checked against linux/fuse.h with one "
                    "(`make test` installs build-essential)")
    directory: Path = tmp_path_factory.mktemp("fuse_h")
    source, binary = directory / "fuse_layouts.c", directory / "fuse_layouts"
    source.write_text(_c_program())
    built = subprocess.run([cc, "-std=gnu11", "-Werror=format", "-o", str(binary), str(source)],
                           capture_output=True, text=True)
    if built.returncode != 0:
        pytest.fail(f"cc could not compile {source} against linux/fuse.h:\n{built.stderr}")
    ran = subprocess.run([str(binary)], capture_output=True, text=True, check=True)
    values = json.loads(ran.stdout)
    assert isinstance(values, dict)
    return values


def test_every_layout_of_the_module_is_checked() -> None:
    structs = {name for name, value in vars(fp).items() if isinstance(value, struct.Struct)}
    assert structs == set(LAYOUTS)


@pytest.mark.parametrize("name", sorted(LAYOUTS))
def test_layout_size_is_the_kernels(kernel: dict[str, object], name: str) -> None:
    _, size, _ = LAYOUTS[name]
    assert _layout(name).size == kernel[f"size:{name}"], f"{name} against {size}"


@pytest.mark.parametrize("name", sorted(LAYOUTS))
def test_layout_fields_are_the_kernels(kernel: dict[str, object], name: str) -> None:
    """Each field of the Python struct has the offset, width and
    signedness of the C member at its position."""
    c_struct, _, members = LAYOUTS[name]
    codes = _codes(_layout(name))
    assert len(members) <= len(codes), f"more C members listed than {name} has fields"
    ours = {member: _python_field(codes, i) for i, member in enumerate(members)}
    theirs = {member: kernel[f"field:{name}:{member}"] for member in members}
    assert ours == theirs, f"{name} against struct {c_struct} ([offset, width, signed] by member)"


def test_opcodes_capabilities_and_flags_are_the_kernels(kernel: dict[str, object]) -> None:
    constants = _constants()
    assert len(constants) > len(fp.Op) + len(fp.Cap)  # the FATTR_ and other flags were found
    assert constants == {name: kernel[f"const:{name}"] for name in constants}


def test_version_and_root(kernel: dict[str, object]) -> None:
    minor = kernel["const:FUSE_KERNEL_MINOR_VERSION"]
    assert isinstance(minor, int)
    assert fp.MAJOR == kernel["const:FUSE_KERNEL_VERSION"]
    assert fp.MINOR <= minor
    assert fp.ROOT_ID == kernel["const:FUSE_ROOT_ID"]


@pytest.mark.parametrize("namelen", DIRENT_NAME_LENGTHS)
def test_dirent_lengths_are_the_kernels(kernel: dict[str, object], namelen: int) -> None:
    """A READDIR(PLUS) entry is as long as FUSE_DIRENT_SIZE (FUSE_DIRENTPLUS_SIZE)
    says: the kernel steps from one to the next by it."""
    name = b"n" * namelen
    assert len(fp.dirent(5, 1, 8, name)) == kernel[f"dirent_size:{namelen}"]
    assert len(fp.direntplus(_ATTR, 1.0, 1.0, 1, name)) == kernel[f"direntplus_size:{namelen}"]
    assert fp.ENTRY_OUT.size + fp.DIRENT.size == kernel["const:FUSE_NAME_OFFSET_DIRENTPLUS"]


# -- requests ------------------------------------------------------------------------------

u16 = st.integers(0, 2**16 - 1)
u32 = st.integers(0, 2**32 - 1)
u64 = st.integers(0, 2**64 - 1)


def _request(opcode: int, unique: int, nodeid: int, uid: int, gid: int, pid: int, body: bytes) -> bytes:
    return fp.HEADER.pack(fp.HEADER.size + len(body), opcode, unique, nodeid, uid, gid, pid, 0, 0) + body


@given(opcode=u32, unique=u64, nodeid=u64, uid=u32, gid=u32, pid=u32, body=st.binary(max_size=200))
def test_parse_round_trips(opcode: int, unique: int, nodeid: int, uid: int, gid: int, pid: int,
                           body: bytes) -> None:
    request = fp.parse(_request(opcode, unique, nodeid, uid, gid, pid, body))
    assert (request.opcode, request.unique, request.nodeid, request.uid, request.gid, request.pid) == (
        opcode, unique, nodeid, uid, gid, pid)
    assert bytes(request.body) == body


@given(buffer=st.binary(max_size=fp.HEADER.size - 1))
def test_parse_refuses_a_buffer_shorter_than_the_header(buffer: bytes) -> None:
    with pytest.raises(ProtocolError):
        fp.parse(buffer)


@given(body=st.binary(max_size=100), length=u32)
def test_parse_refuses_a_length_other_than_the_buffers(body: bytes, length: int) -> None:
    buffer = fp.HEADER.pack(length, int(fp.Op.LOOKUP), 7, 1, 0, 0, 0, 0, 0) + body
    if length == len(buffer):
        assert bytes(fp.parse(buffer).body) == body
    else:
        with pytest.raises(ProtocolError):
            fp.parse(buffer)


def test_parse_refuses_a_buffer_one_byte_longer_than_its_length() -> None:
    buffer = _request(int(fp.Op.GETATTR), 9, 1, 0, 0, 0, bytes(16))   # a fuse_getattr_in
    assert fp.parse(buffer).opcode == fp.Op.GETATTR
    with pytest.raises(ProtocolError):
        fp.parse(buffer + b"\0")
    with pytest.raises(ProtocolError):
        fp.parse(buffer[:-1])


@pytest.mark.parametrize("name", sorted(LAYOUTS))
def test_fields_refuses_a_short_body(name: str) -> None:
    layout = _layout(name)
    values = tuple(range(1, len(_codes(layout)) + 1))
    packed = layout.pack(*values)
    assert fp.fields(layout, memoryview(packed + b"name\0")) == values
    with pytest.raises(ProtocolError):
        fp.fields(layout, memoryview(packed[:-1]))


def test_parse_init() -> None:
    body = fp.INIT_IN.pack(7, 38, 131072, int(fp.Cap.ASYNC_READ | fp.Cap.POSIX_LOCKS))
    assert fp.parse_init(memoryview(body)) == Init(7, 38, 131072, 3)
    with pytest.raises(ProtocolError):
        fp.parse_init(memoryview(body[:12]))


name_st = st.binary(max_size=40).map(lambda name: name.replace(b"\0", b""))


@given(skip=st.binary(max_size=24), parts=st.lists(name_st, min_size=1, max_size=4),
       trailing=st.binary(max_size=8))
def test_names_splits_nul_terminated_names_after_the_skip(skip: bytes, parts: list[bytes],
                                                          trailing: bytes) -> None:
    body = skip + b"".join(part + b"\0" for part in parts) + trailing
    assert fp.names(memoryview(body), len(parts), len(skip)) == parts
    unterminated = skip + b"\0".join(parts)  # the last name has no NUL
    with pytest.raises(ProtocolError):
        fp.names(memoryview(unterminated), len(parts), len(skip))
    with pytest.raises(ProtocolError):
        fp.names(memoryview(body), len(parts) + 1 + trailing.count(b"\0"), len(skip))


def test_names_of_a_rename() -> None:
    body = fp.RENAME_IN.pack(42) + b"old\0new\0"
    assert fp.fields(fp.RENAME_IN, memoryview(body)) == (42,)
    assert fp.names(memoryview(body), 2, fp.RENAME_IN.size) == [b"old", b"new"]
    assert fp.names(memoryview(b"one\0"), 1) == [b"one"]
    with pytest.raises(ProtocolError):
        fp.names(memoryview(body[:-1]), 2, fp.RENAME_IN.size)


# -- replies -------------------------------------------------------------------------------

_ATTR = Attr(ino=12, size=4097, blocks=9, atime_ns=1_700_000_000_123_456_789, mtime_ns=5, ctime_ns=10**9,
             mode=stat.S_IFREG | 0o644, nlink=1, uid=1000, gid=100, rdev=0, blksize=4096)

times = st.integers(0, 2**62)
attrs = st.builds(Attr, ino=u64, size=u64, blocks=u64, atime_ns=times, mtime_ns=times, ctime_ns=times,
                  mode=u32, nlink=u32, uid=u32, gid=u32, rdev=u32, blksize=u32)
timeouts = st.floats(0, 10**6)


def _payload(reply: bytes, unique: int) -> bytes:
    """The payload of a successful reply, whose header is checked."""
    length, error, echoed = fp.OUT_HEADER.unpack_from(reply)
    assert (length, error, echoed) == (len(reply), 0, unique)
    return reply[fp.OUT_HEADER.size:]


def _check_attr(fields: tuple[int, ...], attr: Attr) -> None:
    """fuse_attr's fields against `attr`: each time as seconds and
    nanoseconds below a second, nothing in the flags."""
    ino, size, blocks, atime, mtime, ctime, atimensec, mtimensec, ctimensec = fields[:9]
    assert (ino, size, blocks) == (attr.ino, attr.size, attr.blocks)
    for seconds, nanos, ns in ((atime, atimensec, attr.atime_ns), (mtime, mtimensec, attr.mtime_ns),
                               (ctime, ctimensec, attr.ctime_ns)):
        assert 0 <= nanos < 10**9
        assert seconds * 10**9 + nanos == ns
    assert fields[9:] == (attr.mode, attr.nlink, attr.uid, attr.gid, attr.rdev, attr.blksize, 0)


def _check_timeout(seconds: int, nanos: int, timeout: float) -> None:
    assert seconds == int(timeout)
    assert 0 <= nanos < 10**9
    assert abs(seconds * 10**9 + nanos - timeout * 1e9) <= 2


@given(unique=u64, errno=st.integers(1, 4095))
def test_error_reply(unique: int, errno: int) -> None:
    reply = fp.error_reply(unique, errno)
    assert len(reply) == 16
    assert fp.OUT_HEADER.unpack(reply) == (16, -errno, unique)


@given(unique=u64, payload=st.binary(max_size=300))
def test_data_reply_length_is_the_whole_reply(unique: int, payload: bytes) -> None:
    reply = fp.data_reply(unique, payload)
    assert len(reply) == fp.OUT_HEADER.size + len(payload)
    assert _payload(reply, unique) == payload
    assert fp.data_reply(unique) == fp.OUT_HEADER.pack(16, 0, unique)


@given(unique=u64, attr=attrs, entry_timeout=timeouts, attr_timeout=timeouts)
def test_entry_reply_unpacks_to_the_attributes(unique: int, attr: Attr, entry_timeout: float,
                                               attr_timeout: float) -> None:
    payload = _payload(fp.entry_reply(unique, attr, entry_timeout, attr_timeout), unique)
    assert len(payload) == fp.ENTRY_OUT.size
    nodeid, generation, entry_s, attr_s, entry_ns, attr_ns, *attr_fields = fp.ENTRY_OUT.unpack(payload)
    assert (nodeid, generation) == (attr.ino, 0)
    _check_timeout(entry_s, entry_ns, entry_timeout)
    _check_timeout(attr_s, attr_ns, attr_timeout)
    _check_attr(tuple(attr_fields), attr)


@given(unique=u64, attr=attrs, attr_timeout=timeouts)
def test_attr_reply_unpacks_to_the_attributes(unique: int, attr: Attr, attr_timeout: float) -> None:
    payload = _payload(fp.attr_reply(unique, attr, attr_timeout), unique)
    assert len(payload) == fp.ATTR_OUT.size
    attr_s, attr_ns, dummy, *attr_fields = fp.ATTR_OUT.unpack(payload)
    assert dummy == 0
    _check_timeout(attr_s, attr_ns, attr_timeout)
    _check_attr(tuple(attr_fields), attr)


@pytest.mark.parametrize(("timeout", "split"), [
    (0, (0, 0)), (0.0, (0, 0)), (1.5, (1, 500_000_000)), (0.25, (0, 250_000_000)), (2.75, (2, 750_000_000)),
    (1, (1, 0)), (3600, (3600, 0)), (86400.5, (86400, 500_000_000)),
])
def test_timeouts_split_into_seconds_and_nanoseconds(timeout: float, split: tuple[int, int]) -> None:
    entry_fields = fp.ENTRY_OUT.unpack(_payload(fp.entry_reply(1, _ATTR, timeout, timeout), 1))
    assert (entry_fields[2], entry_fields[4]) == split  # entry_valid, entry_valid_nsec
    assert (entry_fields[3], entry_fields[5]) == split  # attr_valid, attr_valid_nsec
    attr_fields = fp.ATTR_OUT.unpack(_payload(fp.attr_reply(1, _ATTR, timeout), 1))
    assert attr_fields[:2] == split


def test_entry_and_attr_timeouts_are_not_swapped() -> None:
    entry_fields = fp.ENTRY_OUT.unpack(_payload(fp.entry_reply(3, _ATTR, 1.5, 7.25), 3))
    assert entry_fields[2:6] == (1, 7, 500_000_000, 250_000_000)


@given(unique=u64, attr=attrs, fh=u64)
def test_create_reply_is_an_entry_then_the_open_file(unique: int, attr: Attr, fh: int) -> None:
    payload = _payload(fp.create_reply(unique, attr, 1.5, 2.0, fh), unique)
    assert len(payload) == fp.ENTRY_OUT.size + fp.OPEN_OUT.size
    assert payload[:fp.ENTRY_OUT.size] == fp.entry(attr, 1.5, 2.0)
    assert fp.ENTRY_OUT.unpack_from(payload)[0] == attr.ino
    assert fp.OPEN_OUT.unpack_from(payload, fp.ENTRY_OUT.size) == (fh, 0, 0)


@given(unique=u64, fh=u64, open_flags=u32)
def test_open_reply(unique: int, fh: int, open_flags: int) -> None:
    assert fp.OPEN_OUT.unpack(_payload(fp.open_reply(unique, fh, open_flags), unique)) == (fh, open_flags, 0)


@given(unique=u64, written=u32)
def test_write_reply(unique: int, written: int) -> None:
    assert fp.WRITE_OUT.unpack(_payload(fp.write_reply(unique, written), unique)) == (written, 0)


@given(unique=u64, size=u32)
def test_xattr_size_reply(unique: int, size: int) -> None:
    assert fp.GETXATTR_OUT.unpack(_payload(fp.xattr_size_reply(unique, size), unique)) == (size, 0)


@given(unique=u64, start=u64, end=u64, lock_type=st.integers(0, 2), pid=u32)
def test_lock_reply(unique: int, start: int, end: int, lock_type: int, pid: int) -> None:
    payload = _payload(fp.lock_reply(unique, start, end, lock_type, pid), unique)
    assert fp.LK_OUT.unpack(payload) == (start, end, lock_type, pid)


@given(unique=u64, values=st.lists(u64, min_size=5, max_size=5), sizes=st.lists(u32, min_size=3, max_size=3))
def test_statfs_reply(unique: int, values: list[int], sizes: list[int]) -> None:
    blocks, bfree, bavail, files, ffree = values
    bsize, namelen, frsize = sizes
    reply = fp.statfs_reply(unique, blocks=blocks, bfree=bfree, bavail=bavail, files=files, ffree=ffree,
                            bsize=bsize, namelen=namelen, frsize=frsize)
    assert fp.STATFS_OUT.unpack(_payload(reply, unique)) == (*values, *sizes, 0, *(0,) * 6)


@given(ino=u64, offset=u64, kind=st.integers(0, 15), name=st.binary(min_size=1, max_size=255))
def test_dirent_pads_the_name_to_eight_bytes(ino: int, offset: int, kind: int, name: bytes) -> None:
    entry = fp.dirent(ino, offset, kind, name)
    assert len(entry) % 8 == 0
    assert fp.DIRENT.size + len(name) <= len(entry) < fp.DIRENT.size + len(name) + 8
    assert fp.DIRENT.unpack_from(entry) == (ino, offset, len(name), kind)
    assert entry[fp.DIRENT.size:fp.DIRENT.size + len(name)] == name
    assert entry[fp.DIRENT.size + len(name):] == bytes(len(entry) - fp.DIRENT.size - len(name))


@given(attr=attrs, offset=u64, name=st.binary(min_size=1, max_size=255))
def test_direntplus_is_an_entry_then_a_dirent(attr: Attr, offset: int, name: bytes) -> None:
    entry = fp.direntplus(attr, 1.5, 0.25, offset, name)
    assert entry[:fp.ENTRY_OUT.size] == fp.entry(attr, 1.5, 0.25)
    ino, off, namelen, kind = fp.DIRENT.unpack_from(entry, fp.ENTRY_OUT.size)
    assert (ino, off, namelen, kind) == (attr.ino, offset, len(name), (attr.mode >> 12) & 0o17)
    assert entry[fp.ENTRY_OUT.size:] == fp.dirent(attr.ino, offset, kind, name)


@pytest.mark.parametrize(("mode", "dt"), [
    (stat.S_IFREG | 0o644, 8), (stat.S_IFDIR | 0o755, 4), (stat.S_IFLNK | 0o777, 10),
    (stat.S_IFIFO | 0o600, 1), (stat.S_IFCHR, 2), (stat.S_IFBLK, 6), (stat.S_IFSOCK, 12),
])
def test_direntplus_type_is_the_dt_type(mode: int, dt: int) -> None:
    entry = fp.direntplus(_ATTR._replace(mode=mode), 1.0, 1.0, 3, b"x")
    assert fp.DIRENT.unpack_from(entry, fp.ENTRY_OUT.size)[3] == dt


@given(unique=u64, offered_flags=u32, flags=u32, max_write=st.integers(0, 2**24),
       offered_readahead=u32, max_readahead=u32, minor=st.integers(31, 60))
def test_init_reply_grants_only_what_was_offered(unique: int, offered_flags: int, flags: int, max_write: int,
                                                 offered_readahead: int, max_readahead: int,
                                                 minor: int) -> None:
    offered = Init(7, minor, offered_readahead, offered_flags)
    payload = _payload(fp.init_reply(unique, offered, flags=flags, max_write=max_write,
                                     max_readahead=max_readahead), unique)
    assert len(payload) == fp.INIT_OUT.size
    (major, answered_minor, readahead, granted, _background, _congestion, written, _gran, max_pages,
     _alignment, *unused) = fp.INIT_OUT.unpack(payload)
    assert (major, answered_minor) == (fp.MAJOR, fp.MINOR) == (7, 31)
    assert granted == flags & offered_flags
    assert readahead == min(max_readahead, offered_readahead)
    assert written == max_write
    assert max_pages == max_write // 4096
    assert unused == [0] * 8


def test_init_reply_with_the_capabilities_a_mount_asks() -> None:
    asked = fp.Cap.POSIX_LOCKS | fp.Cap.FLOCK_LOCKS | fp.Cap.MAX_PAGES | fp.Cap.DO_READDIRPLUS
    offered = Init(7, 38, 131072, int(fp.Cap.POSIX_LOCKS | fp.Cap.MAX_PAGES | fp.Cap.ASYNC_READ))
    reply = fp.init_reply(5, offered, flags=int(asked), max_write=1 << 20, max_readahead=1 << 20)
    payload = _payload(reply, 5)
    fields = fp.INIT_OUT.unpack(payload)
    assert fields[3] == fp.Cap.POSIX_LOCKS | fp.Cap.MAX_PAGES
    assert fields[2] == 131072
    assert fields[8] == 256
