"""FUSE's wire protocol (``linux/fuse.h``) without I/O: the requests the
kernel writes to ``/dev/fuse`` parsed, and the replies encoded.

Why our own instead of pyfuse3's: pyfuse3 (over libfuse's low-level API)
has no handler for record locks, ``flock``, ``fallocate`` or the flags of
``setxattr``, and hides FUSE_INTERRUPT, which a lock wait needs. The
protocol itself is small and stable: fixed little-endian structs after a
40-byte header, each opcode's layout below. As redis-py keeps its RESP
parser apart from its sockets, this module only turns bytes into values
and back; `client_lib.fs.fuse_session` reads and writes the device, and
`client_lib.fs.mount` answers the requests.

We speak protocol 7.31 (Linux 5.4 and later), whatever newer minor the
kernel offers: every struct below has its 7.31 size, which
``tests/unit/test_fuse_protocol.py`` checks against the kernel's own header
with a C compiler.
"""

from __future__ import annotations

import enum
import struct
from dataclasses import dataclass
from typing import NamedTuple

__all__ = ["MAJOR", "MINOR", "ROOT_ID", "Attr", "Cap", "Init", "Op", "ProtocolError", "Request", "attr_reply",
           "create_reply", "data_reply", "dirent", "direntplus", "entry_reply", "error_reply", "fields",
           "init_reply", "lock_reply", "names", "open_reply", "parse", "parse_init", "statfs_reply",
           "write_reply", "xattr_size_reply"]
"""With the struct layouts (``*_IN``, ``*_OUT``) and flag values below, which `fields` reads."""

MAJOR, MINOR = 7, 31
"""The protocol version we answer INIT with (module docstring)."""
ROOT_ID = 1
"""The root directory's node id."""


class Op(enum.IntEnum):
    """FUSE's opcodes (``enum fuse_opcode``)."""

    LOOKUP = 1
    FORGET = 2
    GETATTR = 3
    SETATTR = 4
    READLINK = 5
    SYMLINK = 6
    MKNOD = 8
    MKDIR = 9
    UNLINK = 10
    RMDIR = 11
    RENAME = 12
    LINK = 13
    OPEN = 14
    READ = 15
    WRITE = 16
    STATFS = 17
    RELEASE = 18
    FSYNC = 20
    SETXATTR = 21
    GETXATTR = 22
    LISTXATTR = 23
    REMOVEXATTR = 24
    FLUSH = 25
    INIT = 26
    OPENDIR = 27
    READDIR = 28
    RELEASEDIR = 29
    FSYNCDIR = 30
    GETLK = 31
    SETLK = 32
    SETLKW = 33
    ACCESS = 34
    CREATE = 35
    INTERRUPT = 36
    BMAP = 37
    DESTROY = 38
    IOCTL = 39
    POLL = 40
    NOTIFY_REPLY = 41
    BATCH_FORGET = 42
    FALLOCATE = 43
    READDIRPLUS = 44
    RENAME2 = 45
    LSEEK = 46
    COPY_FILE_RANGE = 47


class Cap(enum.IntFlag):
    """The INIT flags we use (``FUSE_*`` capability bits)."""

    ASYNC_READ = 1 << 0
    POSIX_LOCKS = 1 << 1
    ATOMIC_O_TRUNC = 1 << 3
    EXPORT_SUPPORT = 1 << 4
    BIG_WRITES = 1 << 5
    FLOCK_LOCKS = 1 << 10
    AUTO_INVAL_DATA = 1 << 12
    DO_READDIRPLUS = 1 << 13
    ASYNC_DIO = 1 << 15
    PARALLEL_DIROPS = 1 << 18
    MAX_PAGES = 1 << 22


# Flags inside requests and replies.
FATTR_MODE, FATTR_UID, FATTR_GID, FATTR_SIZE = 1, 2, 4, 8
FATTR_ATIME, FATTR_MTIME, FATTR_ATIME_NOW, FATTR_MTIME_NOW = 16, 32, 128, 256
FUSE_LK_FLOCK = 1
"""fuse_lk_in.lk_flags: the lock is a BSD flock, not a POSIX record lock."""
FUSE_RELEASE_FLOCK_UNLOCK = 2
"""fuse_release_in.release_flags: drop the file's flock with it."""

HEADER = struct.Struct("<IIQQIIIHH")
"""fuse_in_header: len, opcode, unique, nodeid, uid, gid, pid, total_extlen, padding."""
OUT_HEADER = struct.Struct("<IiQ")
"""fuse_out_header: len, error (negative errno), unique."""
ATTR = struct.Struct("<QQQQQQIIIIIIIIII")
"""fuse_attr: ino, size, blocks, atime, mtime, ctime, their nsecs, mode,
nlink, uid, gid, rdev, blksize, flags."""
ENTRY_OUT = struct.Struct("<QQQQII" + ATTR.format[1:])
"""fuse_entry_out: nodeid, generation, entry_valid, attr_valid and their nsecs, then fuse_attr."""
ATTR_OUT = struct.Struct("<QII" + ATTR.format[1:])
"""fuse_attr_out: attr_valid, attr_valid_nsec, dummy, then fuse_attr."""
INIT_IN = struct.Struct("<IIII")
INIT_OUT = struct.Struct("<IIIIHHIIHH8I")
"""fuse_init_out: major, minor, max_readahead, flags, max_background,
congestion_threshold, max_write, time_gran, max_pages, map_alignment, and unused words."""
OPEN_IN = struct.Struct("<II")
OPEN_OUT = struct.Struct("<QII")
SETATTR_IN = struct.Struct("<IIQQQQQQIIIIIIII")
"""fuse_setattr_in: valid, padding, fh, size, lock_owner, atime, mtime, ctime,
atimensec, mtimensec, ctimensec, mode, unused4, uid, gid, unused5."""
MKNOD_IN = struct.Struct("<IIII")
MKDIR_IN = struct.Struct("<II")
RENAME_IN = struct.Struct("<Q")
RENAME2_IN = struct.Struct("<QII")
LINK_IN = struct.Struct("<Q")
READ_IN = struct.Struct("<QQIIQII")
"""fuse_read_in: fh, offset, size, read_flags, lock_owner, flags, padding."""
WRITE_IN = struct.Struct("<QQIIQII")
WRITE_OUT = struct.Struct("<II")
RELEASE_IN = struct.Struct("<QIIQ")
"""fuse_release_in: fh, flags, release_flags, lock_owner."""
FLUSH_IN = struct.Struct("<QIIQ")
"""fuse_flush_in: fh, unused, padding, lock_owner."""
FSYNC_IN = struct.Struct("<QII")
SETXATTR_IN = struct.Struct("<II")
GETXATTR_IN = struct.Struct("<II")
GETXATTR_OUT = struct.Struct("<II")
LK_IN = struct.Struct("<QQQQIIII")
"""fuse_lk_in: fh, owner, then fuse_file_lock (start, end, type, pid), lk_flags, padding."""
LK_OUT = struct.Struct("<QQII")
CREATE_IN = struct.Struct("<IIII")
"""fuse_create_in: flags, mode, umask, open_flags."""
INTERRUPT_IN = struct.Struct("<Q")
FORGET_IN = struct.Struct("<Q")
BATCH_FORGET_IN = struct.Struct("<II")
FORGET_ONE = struct.Struct("<QQ")
FALLOCATE_IN = struct.Struct("<QQQII")
"""fuse_fallocate_in: fh, offset, length, mode, padding."""
STATFS_OUT = struct.Struct("<QQQQQIIII6I")
"""fuse_kstatfs: blocks, bfree, bavail, files, ffree, bsize, namelen, frsize, padding, spare."""
DIRENT = struct.Struct("<QQII")
"""fuse_dirent before its name: ino, off, namelen, type."""


class ProtocolError(Exception):
    """The kernel wrote something this module cannot read (a short request):
    the session answers it EIO, or ends if it is the INIT."""


@dataclass(frozen=True, slots=True)
class Request:
    """One request: its header's fields and the bytes after the header."""

    opcode: int
    unique: int
    nodeid: int
    uid: int
    gid: int
    pid: int
    body: memoryview


class Init(NamedTuple):
    """What the kernel offered in its INIT."""

    major: int
    minor: int
    max_readahead: int
    flags: int


class Attr(NamedTuple):
    """An inode's attributes as fuse_attr carries them (times in ns)."""

    ino: int
    size: int
    blocks: int
    atime_ns: int
    mtime_ns: int
    ctime_ns: int
    mode: int
    nlink: int
    uid: int
    gid: int
    rdev: int
    blksize: int


def parse(buffer: bytes) -> Request:
    """One request as read from the device (a read returns exactly one)."""
    if len(buffer) < HEADER.size:
        raise ProtocolError(f"a request of {len(buffer)} bytes is shorter than its header")
    length, opcode, unique, nodeid, uid, gid, pid, _extlen, _pad = HEADER.unpack_from(buffer)
    if length != len(buffer):
        raise ProtocolError(f"request {unique} says {length} bytes but {len(buffer)} were read")
    return Request(opcode, unique, nodeid, uid, gid, pid, memoryview(buffer)[HEADER.size:])


def fields(layout: struct.Struct, body: memoryview) -> tuple[int, ...]:
    """The fixed part of a request's body."""
    if len(body) < layout.size:
        raise ProtocolError(f"a body of {len(body)} bytes is shorter than its {layout.size}-byte struct")
    return layout.unpack_from(body)


def names(body: memoryview, count: int, skip: int = 0) -> list[bytes]:
    """The `count` NUL-terminated names after the first `skip` bytes."""
    parts = bytes(body[skip:]).split(b"\0", count)
    if len(parts) <= count:
        raise ProtocolError(f"expected {count} NUL-terminated names")
    return parts[:count]


def parse_init(body: memoryview) -> Init:
    return Init(*fields(INIT_IN, body))


# -- replies ---------------------------------------------------------------------------


def data_reply(unique: int, payload: bytes | bytearray | memoryview = b"") -> bytes:
    """A successful reply carrying `payload` (empty for the calls that return nothing)."""
    return OUT_HEADER.pack(OUT_HEADER.size + len(payload), 0, unique) + payload


def error_reply(unique: int, errno: int) -> bytes:
    return OUT_HEADER.pack(OUT_HEADER.size, -errno, unique)


def _split(seconds: float) -> tuple[int, int]:
    whole = int(seconds)
    return whole, int((seconds - whole) * 1e9)


def _attr_fields(attr: Attr) -> tuple[int, ...]:
    a, m, c = (divmod(ns, 1_000_000_000) for ns in (attr.atime_ns, attr.mtime_ns, attr.ctime_ns))
    return (attr.ino, attr.size, attr.blocks, a[0], m[0], c[0], a[1], m[1], c[1], attr.mode, attr.nlink,
            attr.uid, attr.gid, attr.rdev, attr.blksize, 0)


def entry(attr: Attr, entry_timeout: float, attr_timeout: float) -> bytes:
    """fuse_entry_out: a name's inode, kept by the kernel for the timeouts."""
    entry_s, entry_ns = _split(entry_timeout)
    attr_s, attr_ns = _split(attr_timeout)
    return ENTRY_OUT.pack(attr.ino, 0, entry_s, attr_s, entry_ns, attr_ns, *_attr_fields(attr))


def entry_reply(unique: int, attr: Attr, entry_timeout: float, attr_timeout: float) -> bytes:
    return data_reply(unique, entry(attr, entry_timeout, attr_timeout))


def attr_reply(unique: int, attr: Attr, attr_timeout: float) -> bytes:
    seconds, nanos = _split(attr_timeout)
    return data_reply(unique, ATTR_OUT.pack(seconds, nanos, 0, *_attr_fields(attr)))


def open_reply(unique: int, fh: int, open_flags: int = 0) -> bytes:
    return data_reply(unique, OPEN_OUT.pack(fh, open_flags, 0))


def create_reply(unique: int, attr: Attr, entry_timeout: float, attr_timeout: float, fh: int) -> bytes:
    return data_reply(unique, entry(attr, entry_timeout, attr_timeout) + OPEN_OUT.pack(fh, 0, 0))


def write_reply(unique: int, written: int) -> bytes:
    return data_reply(unique, WRITE_OUT.pack(written, 0))


def xattr_size_reply(unique: int, size: int) -> bytes:
    """The answer to a getxattr or listxattr of size 0: how big the value is."""
    return data_reply(unique, GETXATTR_OUT.pack(size, 0))


def lock_reply(unique: int, start: int, end: int, lock_type: int, pid: int) -> bytes:
    return data_reply(unique, LK_OUT.pack(start, end, lock_type, pid))


def statfs_reply(unique: int, *, blocks: int, bfree: int, bavail: int, files: int, ffree: int,
                 bsize: int, namelen: int, frsize: int) -> bytes:
    return data_reply(unique, STATFS_OUT.pack(blocks, bfree, bavail, files, ffree, bsize, namelen, frsize,
                                              0, *(0,) * 6))


def _padded(name: bytes) -> bytes:
    return name + bytes(-len(name) % 8)


def dirent(ino: int, offset: int, kind: int, name: bytes) -> bytes:
    """One fuse_dirent of a READDIR reply; `kind` is the DT_* type, `offset`
    what the next READDIR after this entry passes."""
    return DIRENT.pack(ino, offset, len(name), kind) + _padded(name)


def direntplus(attr: Attr, entry_timeout: float, attr_timeout: float, offset: int, name: bytes) -> bytes:
    """One fuse_direntplus of a READDIRPLUS reply: the entry_out, then the dirent."""
    return entry(attr, entry_timeout, attr_timeout) + dirent(attr.ino, offset, (attr.mode >> 12) & 0o17, name)


def init_reply(unique: int, offered: Init, *, flags: int, max_write: int, max_readahead: int) -> bytes:
    """The answer to INIT: our version, and of the `flags` the ones the
    kernel offered; the kernel's own limit of background requests (0)."""
    pages = max_write // 4096
    return data_reply(unique, INIT_OUT.pack(MAJOR, MINOR, min(max_readahead, offered.max_readahead),
                                            flags & offered.flags, 0, 0, max_write, 1, pages, 0, *(0,) * 8))
