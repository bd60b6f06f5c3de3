"""`metaflow-fs MOUNTPOINT`: the file system of `client_lib.fs.core`, mounted
through FUSE (low-level and inode-based like the core).

This is only the shim: it turns FUSE's requests (`client_lib.fs.fuse_protocol`,
read and answered by `client_lib.fs.fuse_session`) into calls of the core,
run in worker threads (the core blocks on the network; the threads let one
mount serve many processes at once), and the core's answers and errors into
FUSE's. A lookup or getattr that one record answers, and a close with
nothing to write, it answers on its trio loop instead: a worker thread's
two hops cost more than such a request (`client_lib.fs.mount_reads`). File
locks go through the service (`client_lib.fs.locks`), so every mount sees
them. It needs the ``fs`` extra (trio) and ``fusermount3`` (Debian's fuse3).

Without ``--via`` every request goes to its key's MetaDataID, through the
switches, as any MetaFlow client's does; ``--via HOST:PORT`` sends them all
to one agent (a standalone agent on loopback). The mount ends cleanly on
SIGTERM or SIGINT (buffered writes pushed, then unmounted) and when
``fusermount3 -u MOUNTPOINT`` unmounts it.

What one client sees of another's changes: the kernel keeps names for
``--entry-timeout`` and attributes for ``--attr-timeout`` seconds (defaults
1 s), so another mount's create, rename or chmod shows within that long;
file contents are close-to-open (written at close or fsync, and the page
cache dropped at every open). 0 makes every lookup and stat ask the servers.
A directory's new mtime and ctime are written `TIMES_DELAY` after the entry
change that moved them (this mount shows them at once).
"""

from __future__ import annotations

import argparse
import contextlib
import errno
import logging
import math
import os
import signal
import sys
from collections.abc import Awaitable, Callable, Iterator, Sequence
from typing import TypeVar

import trio

from client_lib import sdnotify
from client_lib.client import MetaFlowClient, host_port
from client_lib.config import ROLES, add_config_flag, parse, rereader
from client_lib.ctl import add_connection, client_from, connection_options
from client_lib.errors import InvalidArgument, MetaFlowError, NamespaceError
from client_lib.fs import fuse_protocol as proto
from client_lib.fs import locks
from client_lib.fs.central import CentralRecords
from client_lib.fs.core import FileSystem, Read
from client_lib.fs.filedata import CHUNK_SIZE, ChecksumMismatch, FileData
from client_lib.fs.fuse_session import FuseError, MountError, Session, mount, unmount
from client_lib.fs.inode import ROOT, Attributes
from client_lib.fs.locks import LockTable
from client_lib.fs.mount_reads import CentralReads, Reads, TrioMetaFlowClient
from client_lib.fs.namespace import Namespace
from client_lib.mdid import NAME_MAX
from client_lib.reload import Outcome, Reloader, compare

log = logging.getLogger("metaflow.fs")
T = TypeVar("T")

MOUNT_DEADLINE = 30.0
MOUNT_ATTEMPTS = 1000
"""A request's defaults on the mount: retried (pauses capped at 0.5 s) for
up to 30 s before the call fails with EIO."""

TIMES_DELAY = 0.01
"""Seconds from the first directory time owed to the write of all those owed
then: a directory that takes many entries meanwhile gets one write of its
times, and another mount sees them this much (and a request) late."""

REDIS_PORT = 6379
"""``--central-redis``'s port when it names none: redis-server's own."""

LOCK_POLL_FIRST, LOCK_POLL_MAX = 0.005, 0.2
"""Seconds between a waiting lock's tries (F_SETLKW, flock without
LOCK_NB): the first pause, doubled up to the last."""

RENAME_NOREPLACE, RENAME_EXCHANGE = 1, 2
"""renameat2(2)'s flags, which RENAME2 passes on."""

FSNAME = "metaflow"
"""The mount's source and subtype: it shows as ``metaflow`` of type ``fuse.metaflow``."""

MOUNT_OPTIONS = ("default_permissions", "nosuid", "nodev", "noatime", f"fsname={FSNAME}", f"subtype={FSNAME}")
"""The kernel checks permissions from the mode bits (no ACCESS requests);
set-user-ID bits and device nodes are kept but not honoured (libfuse's
defaults); no atime updates (none are written on reads)."""


class MountOperations:
    """FUSE's requests (`client_lib.fs.fuse_protocol`), answered by a `FileSystem`."""

    def __init__(self, fs: FileSystem, *, attr_timeout: float, entry_timeout: float,
                 reads: Reads | None = None, locks: LockTable | None = None) -> None:
        """`reads`: the records read on this event loop, for the lookups and
        getattrs that one record answers (`FileSystem.lookup_read`); None
        sends every call to a worker thread. `locks`: the service's lock
        records (`client_lib.fs.locks`); None answers lock requests ENOSYS,
        and the kernel then keeps locks for this mount alone."""
        self.fs, self.attr_timeout, self.entry_timeout = fs, attr_timeout, entry_timeout
        self.reads, self.locks = reads, locks
        self.session: Session | None = None
        self._token: trio.lowlevel.TrioToken | None = None
        self._wake = trio.Event()
        self._handlers: dict[int, Callable[[proto.Request], Awaitable[bytes | None]]] = {
            proto.Op.LOOKUP: self.lookup, proto.Op.FORGET: self.forget, proto.Op.GETATTR: self.getattr,
            proto.Op.SETATTR: self.setattr, proto.Op.READLINK: self.readlink, proto.Op.SYMLINK: self.symlink,
            proto.Op.MKNOD: self.mknod, proto.Op.MKDIR: self.mkdir, proto.Op.UNLINK: self.unlink,
            proto.Op.RMDIR: self.rmdir, proto.Op.RENAME: self.rename, proto.Op.RENAME2: self.rename,
            proto.Op.LINK: self.link, proto.Op.OPEN: self.open, proto.Op.READ: self.read,
            proto.Op.WRITE: self.write, proto.Op.STATFS: self.statfs, proto.Op.RELEASE: self.release,
            proto.Op.FSYNC: self.fsync, proto.Op.SETXATTR: self.setxattr, proto.Op.GETXATTR: self.getxattr,
            proto.Op.LISTXATTR: self.listxattr, proto.Op.REMOVEXATTR: self.removexattr,
            proto.Op.FLUSH: self.flush, proto.Op.OPENDIR: self.opendir, proto.Op.READDIR: self.readdir,
            proto.Op.READDIRPLUS: self.readdir, proto.Op.RELEASEDIR: self.releasedir,
            proto.Op.FSYNCDIR: self.nothing, proto.Op.ACCESS: self.nothing, proto.Op.DESTROY: self.nothing,
            proto.Op.CREATE: self.create, proto.Op.BATCH_FORGET: self.batch_forget,
            proto.Op.FALLOCATE: self.fallocate,
        }
        if locks is not None:
            self._handlers |= {proto.Op.GETLK: self.getlk, proto.Op.SETLK: self.setlk,
                               proto.Op.SETLKW: self.setlk}

    @property
    def capabilities(self) -> int:
        """The INIT flags this mount asks for (docs/filesystem.md says why each)."""
        caps = (proto.Cap.ASYNC_READ | proto.Cap.ATOMIC_O_TRUNC | proto.Cap.EXPORT_SUPPORT
                | proto.Cap.BIG_WRITES | proto.Cap.AUTO_INVAL_DATA | proto.Cap.DO_READDIRPLUS
                | proto.Cap.ASYNC_DIO | proto.Cap.MAX_PAGES | proto.Cap.PARALLEL_DIROPS)
        if self.locks is not None:
            caps |= proto.Cap.POSIX_LOCKS | proto.Cap.FLOCK_LOCKS
        return int(caps)

    async def handle(self, request: proto.Request) -> bytes | None:
        """One request's reply (`client_lib.fs.fuse_session.Handler`)."""
        handler = self._handlers.get(request.opcode)
        if handler is None:
            raise FuseError(errno.ENOSYS)
        return await handler(request)

    async def _call(self, work: Callable[..., T], *args: object) -> T:
        """Run a core call in a worker thread; its failure as an errno."""
        with _errno(work):
            return await trio.to_thread.run_sync(work, *args)

    async def _answer(self, plan: Attributes | Read | None, work: Callable[..., Attributes],
                      *args: object) -> Attributes:
        """A call the core planned (`FileSystem.getattr_read`): answered
        already, by one record read here, or else by `work` in a thread.
        Why: a worker thread's hops cost more than the read itself (module
        docstring)."""
        if isinstance(plan, Read) and self.reads is not None:
            with _errno(work):
                plan = plan.answer(await self.reads.get(plan.key))
        if isinstance(plan, Attributes):
            return plan
        return await self._call(work, *args)

    def times_owed(self) -> None:
        """Wake `push_times` (`FileSystem.times_owed`; from any thread)."""
        token = self._token
        if token is not None:
            with contextlib.suppress(trio.RunFinishedError):
                token.run_sync_soon(self._woken)

    def _woken(self) -> None:
        self._wake.set()

    async def push_times(self) -> None:
        """Write the directory times the core owes (`FileSystem._entries_changed`)
        `TIMES_DELAY` after the first is owed, in a worker thread, for as
        long as the mount runs; what is owed at unmount, `flush_all` writes."""
        self._token = trio.lowlevel.current_trio_token()
        while True:
            if not self.fs.owes_times():
                await self._wake.wait()
            self._wake = trio.Event()
            await trio.sleep(TIMES_DELAY)
            with contextlib.suppress(FuseError):   # logged: the next round tries again
                await self._call(self.fs.push_directory_times)

    async def renew_locks(self) -> None:
        """Renew the leases of the locks this mount holds, a quarter lease
        apart, for as long as the mount runs (`client_lib.fs.locks`)."""
        assert self.locks is not None
        while True:
            await trio.sleep(self.locks.lease / 4)
            with contextlib.suppress(FuseError):   # logged; the next round tries again
                await self._call(self.locks.renew)

    def _ino(self, nodeid: int) -> int:
        """FUSE's root is inode 1; the namespace's may be another (``--root``)."""
        return self.fs.root if nodeid == proto.ROOT_ID else nodeid

    def _attr(self, attributes: Attributes) -> proto.Attr:
        return proto.Attr(
            ino=proto.ROOT_ID if attributes.ino == self.fs.root else attributes.ino,
            size=attributes.size, blocks=math.ceil(attributes.size / 512),
            atime_ns=attributes.atime_ns, mtime_ns=attributes.mtime_ns, ctime_ns=attributes.ctime_ns,
            mode=attributes.st_mode,
            nlink=attributes.nlink,   # directories 1: no subdirectory count (find assumes none)
            uid=attributes.uid, gid=attributes.gid, rdev=attributes.rdev, blksize=CHUNK_SIZE)

    def _entry(self, request: proto.Request, attributes: Attributes) -> bytes:
        return proto.entry_reply(request.unique, self._attr(attributes), self.entry_timeout,
                                 self.attr_timeout)

    # -- names and attributes ----------------------------------------------------------

    async def lookup(self, request: proto.Request) -> bytes:
        parent, (name,) = self._ino(request.nodeid), proto.names(request.body, 1)
        with _errno(self.fs.lookup):
            plan = self.fs.lookup_read(parent, name)   # a bad name fails here
        return self._entry(request, await self._answer(plan, self.fs.lookup, parent, name))

    async def getattr(self, request: proto.Request) -> bytes:
        ino = self._ino(request.nodeid)
        attributes = await self._answer(self.fs.getattr_read(ino), self.fs.getattr, ino)
        return proto.attr_reply(request.unique, self._attr(attributes), self.attr_timeout)

    async def setattr(self, request: proto.Request) -> bytes:
        (valid, _, _fh, size, _owner, atime, mtime, _ctime, atime_ns, mtime_ns, _ctime_ns, mode, _, uid, gid,
         _) = proto.fields(proto.SETATTR_IN, request.body)
        changes = {}
        if valid & proto.FATTR_MODE:
            changes["mode"] = mode & 0o7777
        if valid & proto.FATTR_UID:
            changes["uid"] = uid
        if valid & proto.FATTR_GID:
            changes["gid"] = gid
        if valid & proto.FATTR_SIZE:
            changes["size"] = size
        now = self.fs.clock()
        if valid & proto.FATTR_ATIME:
            changes["atime_ns"] = now if valid & proto.FATTR_ATIME_NOW else atime * 1_000_000_000 + atime_ns
        if valid & proto.FATTR_MTIME:
            changes["mtime_ns"] = now if valid & proto.FATTR_MTIME_NOW else mtime * 1_000_000_000 + mtime_ns
        attributes = await self._call(self.fs.setattr, self._ino(request.nodeid), changes)
        return proto.attr_reply(request.unique, self._attr(attributes), self.attr_timeout)

    async def readlink(self, request: proto.Request) -> bytes:
        return proto.data_reply(request.unique, await self._call(self.fs.readlink, self._ino(request.nodeid)))

    async def forget(self, request: proto.Request) -> None:
        (count,) = proto.fields(proto.FORGET_IN, request.body)
        self.fs.forget(self._ino(request.nodeid), count)

    async def batch_forget(self, request: proto.Request) -> None:
        (count, _) = proto.fields(proto.BATCH_FORGET_IN, request.body)
        start = proto.BATCH_FORGET_IN.size
        for nodeid, lookups in proto.FORGET_ONE.iter_unpack(
                request.body[start:start + count * proto.FORGET_ONE.size]):
            self.fs.forget(self._ino(nodeid), lookups)

    async def nothing(self, request: proto.Request) -> bytes:
        """ACCESS (``default_permissions``: the kernel checks the mode bits
        itself), FSYNCDIR (a directory change is acknowledged once durable), DESTROY."""
        return proto.data_reply(request.unique)

    async def statfs(self, request: proto.Request) -> bytes:
        """The service does not report a capacity: a large one, so tools that
        check free space go ahead."""
        return proto.statfs_reply(request.unique, blocks=1 << 32, bfree=1 << 31, bavail=1 << 31,
                                  files=1 << 40, ffree=1 << 39, bsize=CHUNK_SIZE, namelen=NAME_MAX,
                                  frsize=4096)

    # -- creating and removing ---------------------------------------------------------

    async def mkdir(self, request: proto.Request) -> bytes:
        mode, _umask = proto.fields(proto.MKDIR_IN, request.body)
        (name,) = proto.names(request.body, 1, proto.MKDIR_IN.size)
        return self._entry(request, await self._call(self.fs.mkdir, self._ino(request.nodeid), name, mode,
                                                     request.uid, request.gid))

    async def symlink(self, request: proto.Request) -> bytes:
        name, target = proto.names(request.body, 2)
        return self._entry(request, await self._call(self.fs.symlink, self._ino(request.nodeid), name, target,
                                                     request.uid, request.gid))

    async def create(self, request: proto.Request) -> bytes:
        flags, mode, _umask, _open_flags = proto.fields(proto.CREATE_IN, request.body)
        (name,) = proto.names(request.body, 1, proto.CREATE_IN.size)
        fh, attributes = await self._call(self.fs.create, self._ino(request.nodeid), name, mode,
                                          request.uid, request.gid, bool(flags & os.O_EXCL),
                                          bool(flags & os.O_TRUNC))
        return proto.create_reply(request.unique, self._attr(attributes), self.entry_timeout,
                                  self.attr_timeout, fh)

    async def mknod(self, request: proto.Request) -> bytes:
        mode, rdev, _umask, _ = proto.fields(proto.MKNOD_IN, request.body)
        (name,) = proto.names(request.body, 1, proto.MKNOD_IN.size)
        return self._entry(request, await self._call(self.fs.mknod, self._ino(request.nodeid), name, mode,
                                                     rdev, request.uid, request.gid))

    async def link(self, request: proto.Request) -> bytes:
        (source,) = proto.fields(proto.LINK_IN, request.body)
        (name,) = proto.names(request.body, 1, proto.LINK_IN.size)
        return self._entry(request, await self._call(self.fs.link, self._ino(source),
                                                     self._ino(request.nodeid), name))

    async def unlink(self, request: proto.Request) -> bytes:
        (name,) = proto.names(request.body, 1)
        await self._call(self.fs.unlink, self._ino(request.nodeid), name)
        return proto.data_reply(request.unique)

    async def rmdir(self, request: proto.Request) -> bytes:
        (name,) = proto.names(request.body, 1)
        await self._call(self.fs.rmdir, self._ino(request.nodeid), name)
        return proto.data_reply(request.unique)

    async def rename(self, request: proto.Request) -> bytes:
        """RENAME, and RENAME2 with its flags (``renameat2``)."""
        if request.opcode == proto.Op.RENAME2:
            new_parent, flags, _ = proto.fields(proto.RENAME2_IN, request.body)
            skip = proto.RENAME2_IN.size
        else:
            (new_parent,), flags, skip = proto.fields(proto.RENAME_IN, request.body), 0, proto.RENAME_IN.size
        if flags & RENAME_EXCHANGE:
            raise FuseError(errno.EINVAL)   # an atomic swap of two names is not built
        name, new_name = proto.names(request.body, 2, skip)
        await self._call(self.fs.rename, self._ino(request.nodeid), name, self._ino(new_parent), new_name,
                         bool(flags & RENAME_NOREPLACE))
        return proto.data_reply(request.unique)

    # -- file contents -----------------------------------------------------------------

    async def open(self, request: proto.Request) -> bytes:
        flags, _ = proto.fields(proto.OPEN_IN, request.body)
        fh = await self._call(self.fs.open, self._ino(request.nodeid), bool(flags & os.O_TRUNC))
        return proto.open_reply(request.unique, fh)

    async def read(self, request: proto.Request) -> bytes:
        fh, offset, size, *_ = proto.fields(proto.READ_IN, request.body)
        return proto.data_reply(request.unique, await self._call(self.fs.read, fh, offset, size))

    async def write(self, request: proto.Request) -> bytes:
        fh, offset, size, *_ = proto.fields(proto.WRITE_IN, request.body)
        data = bytes(request.body[proto.WRITE_IN.size:proto.WRITE_IN.size + size])
        return proto.write_reply(request.unique, await self._call(self.fs.write, fh, offset, data))

    async def flush(self, request: proto.Request) -> bytes:
        """close(2) of a descriptor: its data pushed, and the POSIX locks its
        process held on the file dropped, as POSIX says (the kernel leaves
        that to a file system that keeps its own locks)."""
        fh, _, _, owner = proto.fields(proto.FLUSH_IN, request.body)
        if self.locks is not None and self.locks.holds(self._ino(request.nodeid)):
            await self._call(self.locks.release_owner, self._ino(request.nodeid), owner, locks.POSIX)
        with _errno(self.fs.flush):
            if self.fs.flush_quietly(fh):
                return proto.data_reply(request.unique)
        await self._call(self.fs.flush, fh)
        return proto.data_reply(request.unique)

    async def fsync(self, request: proto.Request) -> bytes:
        fh, _, _ = proto.fields(proto.FSYNC_IN, request.body)
        await self._call(self.fs.flush, fh)
        return proto.data_reply(request.unique)

    async def release(self, request: proto.Request) -> bytes:
        """The last close of an open file description; its flock goes with it."""
        fh, _, release_flags, owner = proto.fields(proto.RELEASE_IN, request.body)
        if self.locks is not None and release_flags & proto.FUSE_RELEASE_FLOCK_UNLOCK:
            await self._call(self.locks.release_owner, self._ino(request.nodeid), owner, locks.FLOCK)
        with _errno(self.fs.release):
            if self.fs.release_quietly(fh):
                return proto.data_reply(request.unique)
        await self._call(self.fs.release, fh)
        return proto.data_reply(request.unique)

    async def fallocate(self, request: proto.Request) -> bytes:
        fh, offset, length, mode, _ = proto.fields(proto.FALLOCATE_IN, request.body)
        await self._call(self.fs.fallocate, fh, offset, length, mode)
        return proto.data_reply(request.unique)

    # -- locks (client_lib.fs.locks) ---------------------------------------------------

    def _wanted(self, request: proto.Request) -> tuple[int, locks.Lock]:
        assert self.locks is not None
        _fh, owner, start, end, lock_type, pid, lk_flags, _ = proto.fields(proto.LK_IN, request.body)
        kind = locks.FLOCK if lk_flags & proto.FUSE_LK_FLOCK else locks.POSIX
        return self._ino(request.nodeid), self.locks.lock(owner, kind, lock_type, start, end, pid)

    async def getlk(self, request: proto.Request) -> bytes:
        """F_GETLK: the first lock in the way, of any mount, or F_UNLCK."""
        assert self.locks is not None
        ino, wanted = self._wanted(request)
        held = await self._call(self.locks.test, ino, wanted)
        if held is None:
            return proto.lock_reply(request.unique, wanted.start, wanted.end, locks.F_UNLCK, 0)
        return proto.lock_reply(request.unique, held.start, held.end, held.type, self.locks.pid_of(held))

    async def setlk(self, request: proto.Request) -> bytes:
        """F_SETLK (EAGAIN when another owner's lock is in the way), F_SETLKW
        (waits, polling the lock's record, until it is free or the caller
        gets a signal: EINTR), and flock(2), both ways."""
        assert self.locks is not None and self.session is not None
        ino, wanted = self._wanted(request)
        if request.opcode == proto.Op.SETLK:
            if await self._call(self.locks.set, ino, wanted) is not None:
                raise FuseError(errno.EAGAIN)
            return proto.data_reply(request.unique)
        with self.session.interruptible(request.unique) as scope:
            pause = LOCK_POLL_FIRST
            while await self._call(self.locks.set, ino, wanted) is not None:
                await trio.sleep(pause)
                pause = min(pause * 2, LOCK_POLL_MAX)
        if scope.cancelled_caught:
            raise FuseError(errno.EINTR)
        return proto.data_reply(request.unique)

    # -- directories -------------------------------------------------------------------

    async def opendir(self, request: proto.Request) -> bytes:
        return proto.open_reply(request.unique, await self._call(self.fs.opendir, self._ino(request.nodeid)))

    async def readdir(self, request: proto.Request) -> bytes:
        """READDIRPLUS (each entry with its attributes, which the kernel keeps
        as a lookup) and plain READDIR, as many entries as fit in `size`."""
        fh, start, size, *_ = proto.fields(proto.READ_IN, request.body)
        page = await self._call(self.fs.readdir, fh, start)
        parent, plus = self.fs.listing_inode(fh), request.opcode == proto.Op.READDIRPLUS
        out = bytearray()
        for name, attributes, ident in page:
            attr = self._attr(attributes)
            piece = (proto.direntplus(attr, self.entry_timeout, self.attr_timeout, ident, name) if plus
                     else proto.dirent(attr.ino, ident, (attr.mode >> 12) & 0o17, name))
            if len(out) + len(piece) > size:
                break
            out += piece
            if plus:
                self.fs.entry_returned(parent, name, attributes)
        return proto.data_reply(request.unique, out)

    async def releasedir(self, request: proto.Request) -> bytes:
        fh, *_ = proto.fields(proto.RELEASE_IN, request.body)
        self.fs.releasedir(fh)
        return proto.data_reply(request.unique)

    # -- extended attributes (client_lib.fs.xattrs) ----------------------------------

    async def getxattr(self, request: proto.Request) -> bytes:
        size, _ = proto.fields(proto.GETXATTR_IN, request.body)
        (name,) = proto.names(request.body, 1, proto.GETXATTR_IN.size)
        return _sized(request, size, await self._call(self.fs.getxattr, self._ino(request.nodeid), name))

    async def setxattr(self, request: proto.Request) -> bytes:
        size, flags = proto.fields(proto.SETXATTR_IN, request.body)
        (name,) = proto.names(request.body, 1, proto.SETXATTR_IN.size)
        start = proto.SETXATTR_IN.size + len(name) + 1
        value = bytes(request.body[start:start + size])
        await self._call(self.fs.setxattr, self._ino(request.nodeid), name, value, flags)
        return proto.data_reply(request.unique)

    async def listxattr(self, request: proto.Request) -> bytes:
        size, _ = proto.fields(proto.GETXATTR_IN, request.body)
        names = await self._call(self.fs.listxattr, self._ino(request.nodeid))
        return _sized(request, size, b"".join(name + b"\0" for name in names))

    async def removexattr(self, request: proto.Request) -> bytes:
        (name,) = proto.names(request.body, 1)
        await self._call(self.fs.removexattr, self._ino(request.nodeid), name)
        return proto.data_reply(request.unique)


def _sized(request: proto.Request, size: int, value: bytes) -> bytes:
    """A getxattr or listxattr answer: the length when asked with size 0,
    ERANGE when the caller's buffer is too small, else the bytes."""
    if not size:
        return proto.xattr_size_reply(request.unique, len(value))
    if len(value) > size:
        raise FuseError(errno.ERANGE)
    return proto.data_reply(request.unique, value)


LIVE_FLAGS = frozenset({"attr_timeout", "entry_timeout"})
"""The flags a running mount takes from a reload (the kernel's caches of
attributes and names); the others shape the mount or its connection."""


def reload(running: argparse.Namespace, new: argparse.Namespace, operations: MountOperations) -> Outcome:
    """Apply the `LIVE_FLAGS` of `new` to the mount and to `running`, which
    then holds the settings in force; the other changes are named for a restart."""
    outcome = compare(vars(running), vars(new), LIVE_FLAGS)
    if "attr_timeout" in outcome.applied:
        operations.attr_timeout = operations.fs.attr_ttl = new.attr_timeout
    if "entry_timeout" in outcome.applied:
        operations.entry_timeout = new.entry_timeout
    for name in outcome.applied:
        setattr(running, name, getattr(new, name))
    return outcome


async def _serve_until_stopped(mountpoint: str, reloader: Reloader[argparse.Namespace],
                               operations: MountOperations, session: Session) -> None:
    """The session's requests, until SIGTERM/SIGINT or an unmount from
    outside; SIGHUP reloads. READY=1 goes to systemd once the mount answers
    a request. Beside them, the pusher of directory times
    (`MountOperations.push_times`) and the renewer of lock leases."""
    async with trio.open_nursery() as nursery:
        nursery.start_soon(operations.push_times)
        if operations.locks is not None:
            nursery.start_soon(operations.renew_locks)

        async def watch() -> None:
            with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT, signal.SIGHUP) as signals:
                async for signum in signals:
                    if signum == signal.SIGHUP:
                        reloader()
                        continue
                    sdnotify.stopping()
                    log.info("signal %d: unmounting", signum)
                    session.terminate()
                    return

        async def announce() -> None:
            # The kernel's first request (FUSE INIT, then this stat's lookups)
            # is answered by the session, running beside this task.
            await trio.to_thread.run_sync(os.stat, mountpoint)
            sdnotify.ready(f"mounted on {mountpoint}")
        nursery.start_soon(watch)
        nursery.start_soon(announce)
        await session.serve()
        nursery.cancel_scope.cancel()


@contextlib.contextmanager
def _errno(work: Callable[..., object]) -> Iterator[None]:
    """A core call's failure as FUSE's errno. An error that is not the core's
    own is logged in full and answered EIO."""
    try:
        yield
    except NamespaceError as exc:
        raise FuseError(exc.errno) from None
    except ChecksumMismatch as exc:
        log.error("%s", exc)
        raise FuseError(errno.EIO) from None
    except MetaFlowError as exc:   # the service could not be reached in time
        log.warning("%s failed: %s", getattr(work, "__name__", work), exc)
        raise FuseError(errno.EIO) from None
    except Exception:
        log.exception("%s failed", getattr(work, "__name__", work))
        raise FuseError(errno.EIO) from None


def _drop_locks(lock_table: LockTable) -> None:
    """A clean unmount's last step: this mount's locks dropped at once; if
    the service cannot be reached, they are left to expire with their lease."""
    try:
        lock_table.release_all()
    except MetaFlowError as exc:
        log.warning("this mount's locks are left to expire with their lease: %s", exc)


def _redis_address(text: str) -> tuple[str, int]:
    try:
        return host_port(text, REDIS_PORT)
    except InvalidArgument as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def parser() -> argparse.ArgumentParser:
    """Every flag of `metaflow-fs`, declared once: `parse_args` reads a
    command line with it and docs/reference/flags.md is generated from it."""
    p = argparse.ArgumentParser(prog="metaflow-fs", description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("mountpoint", help="an existing, empty directory")
    add_connection(p)
    # A file system waits out a fail-over (about a second) rather than fail
    # a write with EIO: as NFS's hard mounts, within a generous deadline.
    p.set_defaults(deadline=MOUNT_DEADLINE, attempts=MOUNT_ATTEMPTS)
    p.add_argument("--root", type=int, default=ROOT,
                   help="inode of the namespace's root directory, made if absent (default 1)")
    p.add_argument("--attr-timeout", type=float, default=1.0, help="seconds the kernel keeps attributes")
    p.add_argument("--entry-timeout", type=float, default=1.0, help="seconds the kernel keeps names")
    p.add_argument("--central-redis", metavar="HOST[:PORT]", default=None,
                   type=_redis_address,
                   help="keep every record in this one redis-server instead of MetaFlow (the baseline "
                        "a central metadata server is; the connection arguments are then unused)")
    p.add_argument("--lock-lease", type=float, default=locks.LEASE,
                   help="seconds a file lock of this mount outlives its last renewal, if the mount dies")
    p.add_argument("--allow-other", action="store_true", help="let other users than the mounting one in")
    p.add_argument("--debug", action="store_true", help="log every failure in full, and every FUSE request")
    add_config_flag(p)
    return p


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    """The flags over the ``--config`` file, checked (`from_args`); anything wrong exits 2."""
    return parse(ROLES["fs"], parser(), argv, from_args)[1]


def from_args(args: argparse.Namespace) -> argparse.Namespace:
    """The parsed flags checked; InvalidArgument names the flag that is wrong."""
    for flag in ("attr_timeout", "entry_timeout"):
        if getattr(args, flag) < 0:
            raise InvalidArgument(f"--{flag.replace('_', '-')} must not be negative")
    if not 0 < args.lock_lease <= 3600:
        raise InvalidArgument("--lock-lease must be above 0 and at most 3600 seconds")
    if not 2 <= args.root < 1 << 63 and args.root != ROOT:
        raise InvalidArgument("--root must be 1 or an inode number from 2 to 2**63 - 1")
    connection_options(args)   # a bad --route table is refused now, not at the first request
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    logging.basicConfig(level=logging.DEBUG if args.debug else logging.INFO,
                        format="%(asctime)s metaflow-fs %(levelname)s %(message)s")
    client: MetaFlowClient | CentralRecords
    reads: Reads
    if args.central_redis:
        client, reads = CentralRecords(*args.central_redis), CentralReads(*args.central_redis)
    else:
        client = client_from(args)
        reads = TrioMetaFlowClient(args.space, **connection_options(args))
    namespace = Namespace(client, root=args.root)
    try:
        namespace.format()
    except MetaFlowError as exc:
        print(f"metaflow-fs: cannot reach the file system's root: {exc}", file=sys.stderr)
        return 2
    fs = FileSystem(namespace, FileData(client), attr_ttl=args.attr_timeout)
    lock_table = LockTable(client, lease=args.lock_lease)
    operations = MountOperations(fs, attr_timeout=args.attr_timeout, entry_timeout=args.entry_timeout,
                                 reads=reads, locks=lock_table)
    fs.times_owed = operations.times_owed
    options = [*MOUNT_OPTIONS, *(["allow_other"] if args.allow_other else [])]
    try:
        fd = mount(args.mountpoint, options)
    except MountError as exc:
        print(f"metaflow-fs: cannot mount on {args.mountpoint}: {exc}", file=sys.stderr)
        return 2
    session = operations.session = Session(fd, operations.handle, operations.capabilities,
                                           debug=args.debug)
    log.info("mounted on %s (root inode %d)", args.mountpoint, args.root)
    reloader: Reloader[argparse.Namespace] = Reloader(log, rereader(ROLES["fs"], parser, argv, from_args),
                                                      lambda new: reload(args, new, operations))
    try:
        trio.run(_serve_until_stopped, args.mountpoint, reloader, operations, session)
        fs.flush_all()
        _drop_locks(lock_table)
    finally:
        unmount(args.mountpoint)
        os.close(fd)
        client.close()
        reads.close()
    log.info("unmounted %s", args.mountpoint)
    return 0


if __name__ == "__main__":
    sys.exit(main())
