"""`metaflow-fs MOUNTPOINT`: the file system of `client_lib.fs.core`, mounted
through FUSE (pyfuse3, low-level and inode-based like the core).

This is only the shim: it turns FUSE's requests into calls of the core, run
in worker threads (the core blocks on the network; the threads let one
mount serve many processes at once), and the core's answers and errors into
FUSE's. A lookup or getattr that one record answers, and a close with
nothing to write, it answers on its trio loop instead: a worker thread's
two hops cost more than such a request (`client_lib.fs.mount_reads`). It
needs the ``fs`` extra (pyfuse3, trio) and libfuse3.

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
from collections.abc import Callable, Iterator, Sequence
from typing import TypeVar

import pyfuse3
import trio

from client_lib import sdnotify
from client_lib.client import MetaFlowClient, host_port
from client_lib.config import ROLES, add_config_flag, parse, rereader
from client_lib.ctl import add_connection, client_from, connection_options
from client_lib.errors import InvalidArgument, MetaFlowError, NamespaceError
from client_lib.fs.central import CentralRecords
from client_lib.fs.core import FileSystem, Read
from client_lib.fs.filedata import CHUNK_SIZE, ChecksumMismatch, FileData
from client_lib.fs.inode import ROOT, Attributes
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

FSNAME = "metaflow"
"""The mount's source and subtype: it shows as ``metaflow`` of type ``fuse.metaflow``."""


class MountOperations(pyfuse3.Operations):
    """FUSE's requests, answered by a `FileSystem`."""

    enable_writeback_cache = False   # every write reaches the core: close-to-open needs it

    def __init__(self, fs: FileSystem, *, attr_timeout: float, entry_timeout: float,
                 reads: Reads | None = None) -> None:
        """`reads`: the records read on this event loop, for the lookups and
        getattrs that one record answers (`FileSystem.lookup_read`); None
        sends every call to a worker thread."""
        super().__init__()
        self.fs, self.attr_timeout, self.entry_timeout = fs, attr_timeout, entry_timeout
        self.reads = reads
        self._token: trio.lowlevel.TrioToken | None = None
        self._wake = trio.Event()

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
            with contextlib.suppress(pyfuse3.FUSEError):   # logged: the next round tries again
                await self._call(self.fs.push_directory_times)

    def _ino(self, inode: int) -> int:
        """FUSE's root is inode 1; the namespace's may be another (``--root``)."""
        return self.fs.root if inode == pyfuse3.ROOT_INODE else inode

    def _entry(self, attributes: Attributes) -> pyfuse3.EntryAttributes:
        entry = pyfuse3.EntryAttributes()
        entry.st_ino = pyfuse3.ROOT_INODE if attributes.ino == self.fs.root else attributes.ino
        entry.generation = 0
        entry.entry_timeout = self.entry_timeout
        entry.attr_timeout = self.attr_timeout
        entry.st_mode = attributes.st_mode
        entry.st_nlink = attributes.nlink   # directories 1: no subdirectory count (find assumes none)
        entry.st_uid, entry.st_gid = attributes.uid, attributes.gid
        entry.st_rdev = attributes.rdev
        entry.st_size = attributes.size
        entry.st_blksize = CHUNK_SIZE
        entry.st_blocks = math.ceil(attributes.size / 512)
        entry.st_atime_ns, entry.st_mtime_ns = attributes.atime_ns, attributes.mtime_ns
        entry.st_ctime_ns = attributes.ctime_ns
        return entry

    # -- names and attributes ----------------------------------------------------------

    async def lookup(self, parent_inode: int, name: bytes,
                     ctx: pyfuse3.RequestContext) -> pyfuse3.EntryAttributes:
        parent = self._ino(parent_inode)
        with _errno(self.fs.lookup):
            plan = self.fs.lookup_read(parent, name)   # a bad name fails here
        return self._entry(await self._answer(plan, self.fs.lookup, parent, name))

    async def getattr(self, inode: int, ctx: pyfuse3.RequestContext) -> pyfuse3.EntryAttributes:
        ino = self._ino(inode)
        return self._entry(await self._answer(self.fs.getattr_read(ino), self.fs.getattr, ino))

    async def setattr(self, inode: int, attr: pyfuse3.EntryAttributes, fields: pyfuse3.SetattrFields,
                      fh: int | None, ctx: pyfuse3.RequestContext) -> pyfuse3.EntryAttributes:
        changes = {}
        if fields.update_mode:
            changes["mode"] = attr.st_mode & 0o7777
        if fields.update_uid:
            changes["uid"] = attr.st_uid
        if fields.update_gid:
            changes["gid"] = attr.st_gid
        if fields.update_size:
            changes["size"] = attr.st_size
        if fields.update_atime:
            changes["atime_ns"] = attr.st_atime_ns
        if fields.update_mtime:
            changes["mtime_ns"] = attr.st_mtime_ns
        return self._entry(await self._call(self.fs.setattr, self._ino(inode), changes))

    async def readlink(self, inode: int, ctx: pyfuse3.RequestContext) -> bytes:
        return await self._call(self.fs.readlink, self._ino(inode))

    async def forget(self, inode_list: Sequence[tuple[int, int]]) -> None:
        for inode, count in inode_list:
            self.fs.forget(self._ino(inode), count)

    async def access(self, inode: int, mode: int, ctx: pyfuse3.RequestContext) -> bool:
        return True   # default_permissions: the kernel checks the mode bits itself

    async def statfs(self, ctx: pyfuse3.RequestContext) -> pyfuse3.StatvfsData:
        """The service does not report a capacity: a large one, so tools that
        check free space go ahead."""
        stats = pyfuse3.StatvfsData()
        stats.f_bsize, stats.f_frsize = CHUNK_SIZE, 4096
        stats.f_blocks, stats.f_bfree, stats.f_bavail = 1 << 32, 1 << 31, 1 << 31
        stats.f_files, stats.f_ffree, stats.f_favail = 1 << 40, 1 << 39, 1 << 39
        stats.f_namemax = NAME_MAX
        return stats

    # -- creating and removing ---------------------------------------------------------

    async def mkdir(self, parent_inode: int, name: bytes, mode: int,
                    ctx: pyfuse3.RequestContext) -> pyfuse3.EntryAttributes:
        return self._entry(await self._call(self.fs.mkdir, self._ino(parent_inode), name, mode,
                                            ctx.uid, ctx.gid))

    async def symlink(self, parent_inode: int, name: bytes, target: bytes,
                      ctx: pyfuse3.RequestContext) -> pyfuse3.EntryAttributes:
        return self._entry(await self._call(self.fs.symlink, self._ino(parent_inode), name, target,
                                            ctx.uid, ctx.gid))

    async def create(self, parent_inode: int, name: bytes, mode: int, flags: int,
                     ctx: pyfuse3.RequestContext) -> tuple[pyfuse3.FileInfo, pyfuse3.EntryAttributes]:
        fh, attributes = await self._call(self.fs.create, self._ino(parent_inode), name, mode,
                                          ctx.uid, ctx.gid, bool(flags & os.O_EXCL), bool(flags & os.O_TRUNC))
        return pyfuse3.FileInfo(fh=fh), self._entry(attributes)

    async def mknod(self, parent_inode: int, name: bytes, mode: int, rdev: int,
                    ctx: pyfuse3.RequestContext) -> pyfuse3.EntryAttributes:
        return self._entry(await self._call(self.fs.mknod, self._ino(parent_inode), name, mode, rdev,
                                            ctx.uid, ctx.gid))

    async def link(self, inode: int, new_parent_inode: int, new_name: bytes,
                   ctx: pyfuse3.RequestContext) -> pyfuse3.EntryAttributes:
        return self._entry(await self._call(self.fs.link, self._ino(inode), self._ino(new_parent_inode),
                                            new_name))

    async def unlink(self, parent_inode: int, name: bytes, ctx: pyfuse3.RequestContext) -> None:
        await self._call(self.fs.unlink, self._ino(parent_inode), name)

    async def rmdir(self, parent_inode: int, name: bytes, ctx: pyfuse3.RequestContext) -> None:
        await self._call(self.fs.rmdir, self._ino(parent_inode), name)

    async def rename(self, parent_inode_old: int, name_old: bytes, parent_inode_new: int, name_new: bytes,
                     flags: int, ctx: pyfuse3.RequestContext) -> None:
        if flags & pyfuse3.RENAME_EXCHANGE:
            raise pyfuse3.FUSEError(errno.EINVAL)   # an atomic swap of two names is not built
        await self._call(self.fs.rename, self._ino(parent_inode_old), name_old,
                         self._ino(parent_inode_new), name_new, bool(flags & pyfuse3.RENAME_NOREPLACE))

    # -- file contents -----------------------------------------------------------------

    async def open(self, inode: int, flags: int, ctx: pyfuse3.RequestContext) -> pyfuse3.FileInfo:
        return pyfuse3.FileInfo(fh=await self._call(self.fs.open, self._ino(inode), bool(flags & os.O_TRUNC)))

    async def read(self, fh: int, off: int, size: int) -> bytes:
        return await self._call(self.fs.read, fh, off, size)

    async def write(self, fh: int, off: int, buf: bytes) -> int:
        return await self._call(self.fs.write, fh, off, buf)

    async def flush(self, fh: int) -> None:
        with _errno(self.fs.flush):
            if self.fs.flush_quietly(fh):
                return
        await self._call(self.fs.flush, fh)

    async def fsync(self, fh: int, datasync: bool) -> None:
        await self._call(self.fs.flush, fh)

    async def release(self, fh: int) -> None:
        with _errno(self.fs.release):
            if self.fs.release_quietly(fh):
                return
        await self._call(self.fs.release, fh)

    # -- directories -------------------------------------------------------------------

    async def opendir(self, inode: int, ctx: pyfuse3.RequestContext) -> int:
        return await self._call(self.fs.opendir, self._ino(inode))

    async def readdir(self, fh: int, start_id: int, token: pyfuse3.ReaddirToken) -> None:
        page = await self._call(self.fs.readdir, fh, start_id)
        parent = self.fs.listing_inode(fh)
        for name, attributes, ident in page:
            if not pyfuse3.readdir_reply(token, name, self._entry(attributes), ident):
                return
            self.fs.entry_returned(parent, name, attributes)

    async def releasedir(self, fh: int) -> None:
        self.fs.releasedir(fh)

    async def fsyncdir(self, fh: int, datasync: bool) -> None:
        """Nothing to do: a directory change is acknowledged once durable."""

    # -- extended attributes (client_lib.fs.xattrs) ----------------------------------

    async def getxattr(self, inode: int, name: bytes, ctx: pyfuse3.RequestContext) -> bytes:
        return await self._call(self.fs.getxattr, self._ino(inode), name)

    async def setxattr(self, inode: int, name: bytes, value: bytes, ctx: pyfuse3.RequestContext) -> None:
        await self._call(self.fs.setxattr, self._ino(inode), name, value)

    async def listxattr(self, inode: int, ctx: pyfuse3.RequestContext) -> Sequence[bytes]:
        return await self._call(self.fs.listxattr, self._ino(inode))

    async def removexattr(self, inode: int, name: bytes, ctx: pyfuse3.RequestContext) -> None:
        await self._call(self.fs.removexattr, self._ino(inode), name)


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
                               operations: MountOperations) -> None:
    """pyfuse3's loop, ended by SIGTERM/SIGINT or an unmount from outside;
    SIGHUP reloads. READY=1 goes to systemd once the mount answers a request.
    Beside it, the pusher of directory times (`MountOperations.push_times`)."""
    async with trio.open_nursery() as nursery:
        nursery.start_soon(operations.push_times)
        async def watch() -> None:
            with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT, signal.SIGHUP) as signals:
                async for signum in signals:
                    if signum == signal.SIGHUP:
                        reloader()
                        continue
                    sdnotify.stopping()
                    log.info("signal %d: unmounting", signum)
                    pyfuse3.terminate()
                    return

        async def announce() -> None:
            # The kernel's first request (FUSE INIT, then this stat's lookups)
            # is answered by pyfuse3.main, running beside this task.
            await trio.to_thread.run_sync(os.stat, mountpoint)
            sdnotify.ready(f"mounted on {mountpoint}")
        nursery.start_soon(watch)
        nursery.start_soon(announce)
        await pyfuse3.main()
        nursery.cancel_scope.cancel()


@contextlib.contextmanager
def _errno(work: Callable[..., object]) -> Iterator[None]:
    """A core call's failure as FUSE's errno. An error that is not the core's
    own is logged and answered EIO: an exception that escapes a handler would
    end pyfuse3's main loop."""
    try:
        yield
    except NamespaceError as exc:
        raise pyfuse3.FUSEError(exc.errno) from None
    except ChecksumMismatch as exc:
        log.error("%s", exc)
        raise pyfuse3.FUSEError(errno.EIO) from None
    except MetaFlowError as exc:   # the service could not be reached in time
        log.warning("%s failed: %s", getattr(work, "__name__", work), exc)
        raise pyfuse3.FUSEError(errno.EIO) from None
    except Exception:
        log.exception("%s failed", getattr(work, "__name__", work))
        raise pyfuse3.FUSEError(errno.EIO) from None


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
    p.add_argument("--allow-other", action="store_true", help="let other users than the mounting one in")
    p.add_argument("--debug", action="store_true", help="log every failure in full, and FUSE's own debug")
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
    operations = MountOperations(fs, attr_timeout=args.attr_timeout, entry_timeout=args.entry_timeout,
                                 reads=reads)
    fs.times_owed = operations.times_owed
    options = set(pyfuse3.default_options) | {f"fsname={FSNAME}", f"subtype={FSNAME}", "noatime"}
    if args.allow_other:
        options.add("allow_other")
    if args.debug:
        options.add("debug")
    try:
        pyfuse3.init(operations, args.mountpoint, options)
    except RuntimeError as exc:
        print(f"metaflow-fs: cannot mount on {args.mountpoint}: {exc}", file=sys.stderr)
        return 2
    log.info("mounted on %s (root inode %d)", args.mountpoint, args.root)
    reloader: Reloader[argparse.Namespace] = Reloader(log, rereader(ROLES["fs"], parser, argv, from_args),
                                                      lambda new: reload(args, new, operations))
    try:
        trio.run(_serve_until_stopped, args.mountpoint, reloader, operations)
        fs.flush_all()
    finally:
        pyfuse3.close(unmount=True)
        client.close()
        reads.close()
    log.info("unmounted %s", args.mountpoint)
    return 0


if __name__ == "__main__":
    sys.exit(main())
