"""The file system a FUSE mount serves, without FUSE: inode-numbered
operations over `Namespace` (metadata) and `FileData` (contents).

Why a core apart from the mount (`client_lib.fs.mount`): as faucet keeps its
logic out of its os-ken shim, this holds every decision, stays synchronous
and standard-library only, and is tested in memory; the shim only converts
types and runs calls in threads.

What FUSE asks and the namespace does not know:

* **Inodes to names.** FUSE names objects by inode; the namespace keeps an
  object's attributes in its entry, named (parent, name). Every reply that
  hands the kernel an inode (lookup, readdir-plus, create, mkdir, ...)
  records where it lives; `forget` drops it. Another client's rename makes
  a recorded place stale: the inode found there differs or is gone, and
  the call fails with ESTALE until the kernel looks the name up again.
* **Open files.** Writes are buffered per inode (`buffer_limit` bytes of
  contiguous data) and pushed when the buffer fills, on a read of that
  inode, and on flush, fsync and release, which also write the size and
  mtime into the entry: close-to-open consistency, as NFS gives. `fsync`
  returns once the data and attributes were acknowledged, that is held by
  every replica and synced as the agents' ``--fsync`` policy says.
* **Unlinked while open.** A file unlinked (or replaced by a rename) while
  this mount has it open stays readable and writable through its open
  descriptors, with a link count of 0 (its attributes are then this
  mount's alone), as POSIX says; its chunks are reclaimed at its last release.
* **Attributes for `attr_ttl`.** What an inode's attributes were when this
  mount last read or wrote them answers a getattr for `attr_ttl` seconds
  (the mount's ``--attr-timeout``, which the kernel applies to its own
  cache too): the kernel asks again after every write, which would
  otherwise cost a request each time.
"""

from __future__ import annotations

import contextlib
import errno
import itertools
import logging
import stat
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from typing import Any

from client_lib.errors import MetaFlowError, NamespaceError
from client_lib.fs import xattrs
from client_lib.fs.filedata import CHUNK_SIZE, FileData
from client_lib.fs.inode import SPECIAL, Attributes, directory_key, kind_of
from client_lib.fs.namespace import Namespace

__all__ = ["DirectoryPage", "FileSystem", "Read"]

log = logging.getLogger("metaflow.fs")

DirectoryPage = list[tuple[bytes, Attributes, int]]
"""(name, attributes, the id to continue after this entry)."""

_PAGE = 256

FALLOC_FL_KEEP_SIZE, FALLOC_FL_PUNCH_HOLE, FALLOC_FL_ZERO_RANGE = 0x01, 0x02, 0x10
"""fallocate(2)'s modes that `FileSystem.fallocate` keeps (``linux/falloc.h``)."""
_FALLOCATE_MODES = FALLOC_FL_KEEP_SIZE | FALLOC_FL_PUNCH_HOLE | FALLOC_FL_ZERO_RANGE


@dataclass(frozen=True)
class Read:
    """A call answered by one record, read by the caller: the mount reads it
    on its event loop instead of sending the call to a worker thread. `key`
    is the record to read; `answer` turns it into the call's answer, or
    None where the call's own method must answer (more reads are needed:
    a rename in flight, a hard-linked inode, an entry that moved)."""

    key: str | bytes
    answer: Callable[[bytes | None], Attributes | None]


@dataclass
class _OpenFile:
    """What this mount knows of a regular file it has open."""

    ino: int
    size: int
    mtime_ns: int
    opens: int = 0
    stored: int = 0                 # bytes the servers may hold chunks of (beyond: none yet)
    dirty: bool = False             # size or mtime not written to the entry yet
    pending_at: int = 0             # offset of the buffered bytes
    pending: bytearray = field(default_factory=bytearray)
    lock: threading.Lock = field(default_factory=threading.Lock)


@dataclass
class _Listing:
    """An open directory: the names that readdir's ids stand for."""

    ino: int
    names: dict[int, bytes] = field(default_factory=dict)
    ids: itertools.count[int] = field(default_factory=lambda: itertools.count(1))


class FileSystem:
    """Thread-safe: the mount calls it from many threads at once."""

    def __init__(self, namespace: Namespace, data: FileData, *, buffer_limit: int = 4 * CHUNK_SIZE,
                 attr_ttl: float = 0.0, clock: Callable[[], int] = time.time_ns,
                 monotonic: Callable[[], float] = time.monotonic,
                 times_owed: Callable[[], None] | None = None) -> None:
        """`times_owed`: called (from any thread) when a directory's times
        become owed and none were: whoever passes it calls
        `push_directory_times` soon after (the mount's pusher). None: each
        call writes its directories' times before it returns."""
        self.ns, self.data, self.buffer_limit, self.clock = namespace, data, buffer_limit, clock
        self.attr_ttl, self.monotonic = attr_ttl, monotonic
        self.times_owed = times_owed
        self._owed: dict[int, int] = {}   # directory ino -> the mtime and ctime its record is owed
        self._seen: dict[int, tuple[float, Attributes]] = {}   # ino -> (when, attributes)
        self.root = namespace.root
        self._lock = threading.Lock()
        self._where: dict[int, tuple[int, bytes]] = {}       # ino -> (parent, name)
        self._at: dict[tuple[int, bytes], int] = {}          # the reverse: (parent, name) -> ino
        self._lookups: dict[int, int] = {}                   # ino -> the kernel's count
        self._files: dict[int, _OpenFile] = {}               # open regular files by ino
        self._handles: dict[int, _OpenFile] = {}
        self._listings: dict[int, _Listing] = {}
        self._orphans: dict[int, Attributes] = {}            # unlinked while open: their attributes
        self._fhs = itertools.count(1)

    # -- names and attributes ----------------------------------------------------------

    def lookup(self, parent: int, name: bytes) -> Attributes:
        return self._remember(parent, name, self.ns.lookup(parent, name))

    def lookup_read(self, parent: int, name: bytes) -> Read:
        """`lookup` as one read, when the entry's record alone answers it."""
        key = self.ns.entry_key(parent, name)

        def answer(raw: bytes | None) -> Attributes | None:
            if raw is None:
                raise NamespaceError(errno.ENOENT, f"no entry {name!r} in directory {parent}")
            found = self.ns.plain_entry(key, raw)
            return None if found is None else self._remember(parent, name, found)
        return Read(key, answer)

    def getattr(self, ino: int) -> Attributes:
        known = self._known(ino)
        if known is not None:
            return known
        if ino == self.root:
            return self._current(self._saw(self.ns.root_attributes()))
        found: Attributes | None = None
        place = self._where.get(ino)
        if place is not None:
            with contextlib.suppress(NamespaceError):
                found = self.ns.lookup(*place)
        if found is None or found.ino != ino:
            # A hard-linked inode is found by its number, whatever name is gone.
            found = self.ns.shared_inode(ino)
        if found is None:
            raise NamespaceError(errno.ESTALE, f"inode {ino} is no longer where this mount saw it")
        return self._current(self._saw(found))

    def getattr_read(self, ino: int) -> Attributes | Read | None:
        """`getattr` without I/O of its own: the answer this mount has, or one
        read whose record answers it (the root's header, or the entry where
        this mount saw the inode); None where `getattr` must answer."""
        known = self._known(ino)
        if known is not None:
            return known
        if ino == self.root:
            return Read(directory_key(ino), self._root_answer)
        place = self._where.get(ino)
        if place is None:
            return None
        key = self.ns.entry_key(*place)

        def answer(raw: bytes | None) -> Attributes | None:
            found = self.ns.plain_entry(key, raw)
            return None if found is None or found.ino != ino else self._current(self._saw(found))
        return Read(key, answer)

    def _root_answer(self, raw: bytes | None) -> Attributes | None:
        """The root's attributes from its header (None: `getattr` says it is missing)."""
        return None if raw is None else self._current(self._saw(Attributes.from_bytes(raw)))

    def _known(self, ino: int) -> Attributes | None:
        """A getattr's answer from this mount alone: an inode unlinked while
        open, or one whose attributes it saw less than `attr_ttl` ago."""
        orphan = self._orphans.get(ino)
        if orphan is not None:
            return self._current(orphan)
        seen = self._seen.get(ino)
        if seen is not None and self.monotonic() - seen[0] < self.attr_ttl:
            return self._current(seen[1])
        return None

    def setattr(self, ino: int, changes: dict[str, int]) -> Attributes:
        """Any of mode, uid, gid, size, atime_ns, mtime_ns; a size cuts or
        extends the file's contents first. An mtime given wins over one a
        directory is owed."""
        if "mtime_ns" in changes:
            with self._lock:
                self._owed.pop(ino, None)
        return self._current(self._setattr(ino, changes))

    def _setattr(self, ino: int, changes: dict[str, int]) -> Attributes:
        if ino == self.root:
            changes.pop("size", None)
            return self._saw(self.ns.setattr_root(**changes) if changes else self.ns.root_attributes())
        opened = self._files.get(ino)
        with opened.lock if opened is not None else contextlib.nullcontext():
            if opened is not None:
                self._push_data(opened)
            if ino in self._orphans:
                return self._change_orphan(ino, opened, changes)
            if "size" in changes:
                self._seen.pop(ino, None)   # cutting chunks needs the size on the servers
                current = self.getattr(ino)
                if current.kind == "file":
                    self.data.truncate(ino, current.size, changes["size"])
                if changes["size"] != current.size:   # POSIX: a new size is a modification
                    changes.setdefault("mtime_ns", self.clock())
            return self._write_entry(ino, opened, changes)

    def readlink(self, ino: int) -> bytes:
        attributes = self.getattr(ino)
        if attributes.target is None:
            raise NamespaceError(errno.EINVAL, f"inode {ino} is not a symlink")
        return attributes.target.encode("utf-8", "surrogateescape")

    def forget(self, ino: int, count: int) -> None:
        with self._lock:
            left = self._lookups.get(ino, 0) - count
            if left > 0:
                self._lookups[ino] = left
            elif ino not in self._files:
                self._lookups.pop(ino, None)
                self._unplace(ino)
                self._seen.pop(ino, None)

    # -- creating and removing ---------------------------------------------------------

    def mkdir(self, parent: int, name: bytes, mode: int, uid: int, gid: int) -> Attributes:
        made = self.ns.mkdir(parent, name, mode, uid, gid)
        self._entries_changed(parent)
        return self._remember(parent, name, made)

    def symlink(self, parent: int, name: bytes, target: bytes, uid: int, gid: int) -> Attributes:
        made = self.ns.symlink(parent, name, target.decode("utf-8", "surrogateescape"), uid, gid)
        self._entries_changed(parent)
        return self._remember(parent, name, made)

    def create(self, parent: int, name: bytes, mode: int, uid: int, gid: int,
               exclusive: bool, truncate: bool = False) -> tuple[int, Attributes]:
        """A new file, opened; an existing one is opened instead unless
        `exclusive` (and cut to 0 bytes first if `truncate`, O_TRUNC)."""
        try:
            made = self.ns.create(parent, name, mode, uid, gid)
            self._entries_changed(parent)
            made = self._remember(parent, name, made)
        except NamespaceError as exc:
            if exc.errno != errno.EEXIST or exclusive:
                raise
            made = self.lookup(parent, name)
            if made.kind == "dir":
                raise NamespaceError(errno.EISDIR, f"{name!r} is a directory") from None
            if truncate:
                made = self._cut(made)
        return self._open(made), made

    def mknod(self, parent: int, name: bytes, mode: int, rdev: int, uid: int, gid: int) -> Attributes:
        """A FIFO, socket or device node by its type bits in `mode`; a regular
        file for ``S_IFREG`` (or none), as mknod(2) makes one, not opened."""
        try:
            kind = kind_of(mode) if stat.S_IFMT(mode) else "file"
        except ValueError:
            raise NamespaceError(errno.EINVAL, f"mknod of mode {mode:#o}") from None
        if kind == "file":
            made = self.ns.create(parent, name, mode, uid, gid)
        elif kind in SPECIAL:
            made = self.ns.mknod(parent, name, kind, mode, rdev, uid, gid)
        else:
            raise NamespaceError(errno.EINVAL, f"mknod does not make a {kind}: mkdir or symlink does")
        self._entries_changed(parent)
        return self._remember(parent, name, made)

    def unlink(self, parent: int, name: bytes) -> None:
        left = self.ns.unlink(parent, name)
        self._moved(parent, name)
        self._reclaim(left)
        self._entries_changed(parent)

    def rmdir(self, parent: int, name: bytes) -> None:
        self.ns.rmdir(parent, name)
        self._moved(parent, name)
        self._entries_changed(parent)

    def rename(self, parent: int, name: bytes, new_parent: int, new_name: bytes, noreplace: bool) -> None:
        replaced = self.ns.rename(parent, name, new_parent, new_name, replace_target=not noreplace)
        if replaced is not None:
            self._reclaim(replaced)
        self._moved(new_parent, new_name)
        self._moved(parent, name, (new_parent, new_name))
        self._entries_changed(parent, new_parent)

    def link(self, ino: int, parent: int, name: bytes) -> Attributes:
        """A hard link: a new name for `ino` (not a directory)."""
        made = self.ns.link(parent, name, self._place(ino), ino)
        self._entries_changed(parent)
        return self._remember(parent, name, made)

    # -- extended attributes -------------------------------------------------------------

    def getxattr(self, ino: int, name: bytes) -> bytes:
        """ENODATA without a request for an inode that has none (the usual case)."""
        value = self._xattrs(ino).get(name)
        if value is None:
            raise NamespaceError(errno.ENODATA, f"no extended attribute {name!r}")
        return value

    def listxattr(self, ino: int) -> list[bytes]:
        return sorted(self._xattrs(ino))

    def setxattr(self, ino: int, name: bytes, value: bytes, flags: int = 0) -> None:
        """The inode's flag (and ctime) first, then the record: see
        `client_lib.fs.xattrs`. `flags`: XATTR_CREATE, XATTR_REPLACE."""
        xattrs.set_in({}, name, value)   # a bad name or value fails before anything is written
        if flags & xattrs.XATTR_REPLACE and not self.getattr(ino).xattrs:
            raise NamespaceError(errno.ENODATA, f"no extended attribute {name!r} (XATTR_REPLACE)")
        self.setattr(ino, {"xattrs": 1})
        self.ns.change_xattrs(ino, lambda held: xattrs.set_in(held, name, value, flags))

    def removexattr(self, ino: int, name: bytes) -> None:
        if name not in self._xattrs(ino):
            raise NamespaceError(errno.ENODATA, f"no extended attribute {name!r}")
        self.ns.change_xattrs(ino, lambda held: xattrs.removed(held, name))
        self.setattr(ino, {"xattrs": 1})   # its ctime moves

    def _xattrs(self, ino: int) -> xattrs.XattrMap:
        return self.ns.xattrs(ino) if self.getattr(ino).xattrs else {}

    # -- file contents -----------------------------------------------------------------

    def open(self, ino: int, truncate: bool = False) -> int:
        """Close-to-open: the size comes from the servers, not from a cache.
        `truncate` (O_TRUNC): cut to 0 bytes first, which POSIX counts as a
        modification whatever the size was."""
        self._seen.pop(ino, None)
        attributes = self.getattr(ino)
        return self._open(self._cut(attributes) if truncate else attributes)

    def _cut(self, attributes: Attributes) -> Attributes:
        """O_TRUNC of a regular file: 0 bytes, and a new mtime even if it was empty."""
        if attributes.kind != "file":
            return attributes
        return self.setattr(attributes.ino, {"size": 0, "mtime_ns": self.clock()})

    def _open(self, attributes: Attributes) -> int:
        ino = attributes.ino
        if attributes.kind == "dir":
            raise NamespaceError(errno.EISDIR, f"inode {ino} is a directory")
        with self._lock:
            opened = self._files.get(ino)
            if opened is None:
                opened = self._files[ino] = _OpenFile(ino, attributes.size, attributes.mtime_ns,
                                                      stored=attributes.size)
            opened.opens += 1
            fh = next(self._fhs)
            self._handles[fh] = opened
        return fh

    def read(self, fh: int, offset: int, size: int) -> bytes:
        opened = self._handle(fh)
        with opened.lock:
            self._push_data(opened)
            length = opened.size
        return self.data.read(opened.ino, offset, size, length)

    def write(self, fh: int, offset: int, data: bytes) -> int:
        opened = self._handle(fh)
        with opened.lock:
            if opened.pending and offset == opened.pending_at + len(opened.pending) \
                    and len(opened.pending) + len(data) <= self.buffer_limit:
                opened.pending += data
            else:
                self._push_data(opened)
                opened.pending_at, opened.pending = offset, bytearray(data)
            if len(opened.pending) >= self.buffer_limit:
                self._push_data(opened)
            opened.size = max(opened.size, offset + len(data))
            opened.mtime_ns, opened.dirty = self.clock(), True
        return len(data)

    def fallocate(self, fh: int, offset: int, length: int, mode: int) -> None:
        """``fallocate(2)``: mode 0 grows the file to `offset` + `length` if
        it is shorter (there is no space to reserve: the service has none to
        run out of, and unwritten bytes read as zeros); FALLOC_FL_PUNCH_HOLE
        (with FALLOC_FL_KEEP_SIZE, as Linux requires) and
        FALLOC_FL_ZERO_RANGE make the range read as zeros, its whole chunks
        deleted. The other modes (collapse, insert, unshare) are EOPNOTSUPP.
        The new size and mtime are written as a write's are (close, fsync)."""
        if offset < 0 or length <= 0:
            raise NamespaceError(errno.EINVAL, f"fallocate of {length} bytes at {offset}")
        if mode & ~_FALLOCATE_MODES or (mode & FALLOC_FL_PUNCH_HOLE and not mode & FALLOC_FL_KEEP_SIZE):
            raise NamespaceError(errno.EOPNOTSUPP, f"fallocate mode {mode:#x} is not kept")
        opened = self._handle(fh)
        with opened.lock:
            self._push_data(opened)
            end, changed = offset + length, False
            if mode & (FALLOC_FL_PUNCH_HOLE | FALLOC_FL_ZERO_RANGE) and offset < opened.size:
                self.data.zero(opened.ino, offset, min(end, opened.size) - offset)
                changed = True
            if not mode & FALLOC_FL_KEEP_SIZE and end > opened.size:
                opened.size, changed = end, True
            if changed:
                opened.mtime_ns, opened.dirty = self.clock(), True

    def flush(self, fh: int) -> None:
        """Data, then size and mtime, to the servers (close, fsync)."""
        opened = self._handle(fh)
        with opened.lock:
            self._push_data(opened)
            if opened.dirty and opened.ino in self._orphans:
                self._change_orphan(opened.ino, opened, {"size": opened.size, "mtime_ns": opened.mtime_ns})
            elif opened.dirty:
                self._write_entry(opened.ino, opened, {})

    def release(self, fh: int) -> None:
        opened = self._handle(fh)
        try:
            if opened.ino not in self._orphans:
                self.flush(fh)
        finally:
            if self._closed(fh, opened) is not None:
                self.data.remove(opened.ino, max(opened.size, opened.stored))

    def flush_quietly(self, fh: int) -> bool:
        """Whether `flush` has nothing to send now (nothing buffered, no size
        or mtime unwritten): then it is done, and the mount answers it on its
        event loop; False: call `flush`. It never waits for the file's lock:
        a holder may be sending."""
        opened = self._handle(fh)
        if not opened.lock.acquire(blocking=False):
            return False
        try:
            return not opened.pending and not opened.dirty
        finally:
            opened.lock.release()

    def release_quietly(self, fh: int) -> bool:
        """`release` if it needs no request (as `flush_quietly`, and not the
        last close of a file unlinked while open, whose chunks go then):
        done, True; False: nothing done, call `release`."""
        opened = self._handle(fh)
        if not opened.lock.acquire(blocking=False):
            return False
        try:
            if opened.pending or opened.dirty or (opened.opens == 1 and opened.ino in self._orphans):
                return False
            self._closed(fh, opened)
            return True
        finally:
            opened.lock.release()

    def _closed(self, fh: int, opened: _OpenFile) -> Attributes | None:
        """Forget handle `fh` of `opened`; at the file's last close, the
        attributes it had if it was unlinked while open (its chunks must go)."""
        with self._lock:
            del self._handles[fh]
            opened.opens -= 1
            if opened.opens:
                return None
            del self._files[opened.ino]
            return self._orphans.pop(opened.ino, None)

    def flush_all(self) -> None:
        """Push every open file's buffered data and attributes, and every
        directory time owed (at unmount)."""
        for fh in list(self._handles):
            self.flush(fh)
        self.push_directory_times()

    # -- directories -------------------------------------------------------------------

    def opendir(self, ino: int) -> int:
        if ino != self.root and self.getattr(ino).kind != "dir":
            raise NamespaceError(errno.ENOTDIR, f"inode {ino} is not a directory")
        with self._lock:
            fh = next(self._fhs)
            self._listings[fh] = _Listing(ino)
        return fh

    def readdir(self, fh: int, start: int) -> DirectoryPage:
        """The entries after id `start` (0: from the first); each reply
        carries the id to continue after it. The kernel's lookup count of
        every entry returned goes up by one (readdir-plus)."""
        listing = self._listings.get(fh)
        if listing is None:
            raise NamespaceError(errno.EBADF, f"no open directory {fh}")
        after = listing.names.get(start, b"") if start else b""
        page = []
        for name, attributes in self.ns.readdir(listing.ino, after, _PAGE):
            ident = next(listing.ids)
            listing.names[ident] = name
            page.append((name, self._current(attributes), ident))
        return page

    def entry_returned(self, parent: int, name: bytes, attributes: Attributes) -> None:
        """The kernel took an entry of a readdir page (its lookup count rose)."""
        self._remember(parent, name, attributes)

    def listing_inode(self, fh: int) -> int:
        return self._listings[fh].ino

    def releasedir(self, fh: int) -> None:
        with self._lock:
            self._listings.pop(fh, None)

    # -- helpers -----------------------------------------------------------------------

    def _change_orphan(self, ino: int, opened: _OpenFile | None, changes: dict[str, int]) -> Attributes:
        """`setattr` of a file unlinked while open: its chunks and this
        mount's copy of its attributes; the caller holds `opened.lock`."""
        orphan = self._current(self._orphans[ino])
        now = self.clock()
        if "size" in changes:
            self.data.truncate(ino, orphan.size, changes["size"])
            if changes["size"] != orphan.size:
                changes.setdefault("mtime_ns", now)
        if "mode" in changes:
            changes["mode"] &= 0o7777
        fields: dict[str, Any] = {**asdict(orphan), **changes, "ctime_ns": now, "version": orphan.version + 1}
        new = Attributes(**fields)
        self._orphans[ino] = new
        if opened is not None:
            opened.size, opened.mtime_ns, opened.dirty = new.size, new.mtime_ns, False
            opened.stored = min(opened.stored, new.size)
        return new

    def _entries_changed(self, *directories: int) -> None:
        """POSIX: adding, removing or renaming an entry moves its directory's
        mtime and ctime. That is one more compare-and-set, on the directory's
        entry (the root's header), so with `times_owed` it is owed instead
        (answered by this mount at once, `_current`) and written by
        `push_directory_times` shortly after: one write for the many entries
        a busy directory changes meanwhile, none on the call's path. The
        entry change has been made and stands whatever happens to its
        directory's times (`_push_times`)."""
        now = self.clock()
        if self.times_owed is None:
            for directory in dict.fromkeys(directories):
                self._push_times(directory, now)
            return
        with self._lock:
            first = not self._owed
            for directory in directories:
                self._owed[directory] = now
        if first:
            self.times_owed()

    def push_directory_times(self) -> None:
        """Write every directory time owed (`_entries_changed`); a time owed
        again meanwhile stays owed."""
        with self._lock:
            owed = dict(self._owed)
        for directory, when in owed.items():
            self._push_times(directory, when)
            with self._lock:
                if self._owed.get(directory) == when:
                    del self._owed[directory]

    def owes_times(self) -> bool:
        return bool(self._owed)

    def _push_times(self, directory: int, when: int) -> None:
        """A directory's mtime and ctime moved to `when`. A directory whose
        place this mount no longer knows, that another client removed
        meanwhile, or that cannot be reached now keeps its times (logged)."""
        try:
            self._setattr(directory, {"mtime_ns": when, "ctime_ns": when})
        except (NamespaceError, MetaFlowError) as exc:
            log.warning("directory %d keeps its mtime: %s", directory, exc)

    def _write_entry(self, ino: int, opened: _OpenFile | None, changes: dict[str, int]) -> Attributes:
        """`changes` to a (non-root) inode's entry, with the size and mtime an
        open file has not written yet; the caller holds `opened.lock`."""
        if opened is not None and opened.dirty:
            changes = {"size": opened.size, "mtime_ns": opened.mtime_ns} | changes
        place = self._where.get(ino)
        if place is not None:
            parent, name = place
            new = self._saw(self.ns.setattr(parent, name, **changes))
        else:   # a hard-linked inode is found by its number, whatever name is gone
            try:
                new = self._saw(self.ns.setattr_inode(ino, **changes))
            except NamespaceError as exc:
                if exc.errno != errno.ENOENT:
                    raise
                raise NamespaceError(errno.ESTALE, f"inode {ino} was not looked up here") from None
        if opened is not None:
            opened.size, opened.mtime_ns, opened.dirty = new.size, new.mtime_ns, False
        return new

    def _remember(self, parent: int, name: bytes, attributes: Attributes) -> Attributes:
        ino, place = attributes.ino, (parent, name)
        with self._lock:
            self._unplace(ino)
            self._where[ino], self._at[place] = place, ino
            self._lookups[ino] = self._lookups.get(ino, 0) + 1
        return self._current(self._saw(attributes))

    def _unplace(self, ino: int) -> None:
        """Drop `ino`'s place from both maps; the caller holds `_lock`."""
        place = self._where.pop(ino, None)
        if place is not None and self._at.get(place) == ino:
            del self._at[place]

    def _saw(self, attributes: Attributes) -> Attributes:
        """Attributes just read or written: a getattr's answer for `attr_ttl`."""
        if self.attr_ttl > 0:
            self._seen[attributes.ino] = (self.monotonic(), attributes)
        return attributes

    def _moved(self, parent: int, name: bytes, to: tuple[int, bytes] | None = None) -> None:
        """Entry (parent, name) went away, or moved `to` another place."""
        with self._lock:
            ino = self._at.get((parent, name))
            if ino is None:
                return
            self._seen.pop(ino, None)   # its ctime changed, or it is gone
            self._unplace(ino)
            if to is not None:
                self._where[ino], self._at[to] = to, ino

    def _place(self, ino: int) -> tuple[int, bytes]:
        place = self._where.get(ino)
        if place is None:
            raise NamespaceError(errno.ESTALE, f"inode {ino} was not looked up here")
        return place

    def _current(self, attributes: Attributes) -> Attributes:
        """`attributes` with what this mount has written and not pushed: an
        open file's size and mtime, a directory's owed times."""
        owed = self._owed.get(attributes.ino)
        if owed is not None:
            return replace(attributes, mtime_ns=max(owed, attributes.mtime_ns),
                           ctime_ns=max(owed, attributes.ctime_ns))
        opened = self._files.get(attributes.ino)
        if opened is None or not opened.dirty:
            return attributes
        return replace(attributes, size=opened.size, mtime_ns=opened.mtime_ns)

    def _handle(self, fh: int) -> _OpenFile:
        opened = self._handles.get(fh)
        if opened is None:
            raise NamespaceError(errno.EBADF, f"no open file {fh}")
        return opened

    def _push_data(self, opened: _OpenFile) -> None:
        """Write the buffered bytes; the caller holds `opened.lock`."""
        if opened.pending:
            self.data.write(opened.ino, opened.pending_at, bytes(opened.pending), known_size=opened.stored)
            opened.stored = max(opened.stored, opened.pending_at + len(opened.pending))
            opened.pending = bytearray()

    def _reclaim(self, gone: Attributes) -> None:
        """The chunks of a file that lost its last name: now, or at its last release."""
        if gone.kind != "file" or gone.nlink > 0:
            self._seen.pop(gone.ino, None)   # its ctime and link count moved
            return
        with self._lock:
            if gone.ino in self._files:
                self._orphans[gone.ino] = replace(gone, nlink=0)
                return
        self.data.remove(gone.ino, gone.size)
