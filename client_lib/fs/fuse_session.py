"""A FUSE session on trio: the mount made with ``fusermount3``, requests read
from ``/dev/fuse`` and handed to a handler, its replies written back.

The I/O half of `client_lib.fs.fuse_protocol`. As pyfuse3 does, a pool of
worker tasks takes turns reading the device (one reads while the others
answer what they read), and a worker that finds every other busy starts
another, up to `MAX_WORKERS`: a slow request (a write waiting on its
server) never holds up a lookup behind it.

FUSE_INTERRUPT: the kernel sends it when the caller of a request got a
signal. Only waits that may last (a blocking lock) register for it
(`Session.interruptible`); every other request is short and finishes.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import logging
import os
import re
import shutil
import socket
import subprocess
from collections.abc import Awaitable, Callable, Iterator, Sequence

import trio

from client_lib.fs import fuse_protocol as proto

__all__ = ["FuseError", "MountError", "Session"]

log = logging.getLogger("metaflow.fs")

MAX_WRITE = 1 << 20
"""Bytes of the largest write the kernel sends in one request (and of a
read it asks for): 256 pages, with FUSE_MAX_PAGES."""
READ_BUFFER = MAX_WRITE + 4096
"""A request's largest size: a write's data with its header and fuse_write_in."""
MAX_WORKERS = 64
"""Requests answered at once, at most; the kernel queues the rest."""

REQUEST_LOGGED = re.compile(r"FUSE (\w+) unique \d+ node")
"""What ``--debug`` logs for every request read, its opcode's name the
group (counted by `benchmarks.fs_requests`)."""

Handler = Callable[[proto.Request], Awaitable[bytes | None]]
"""Answers one request: its encoded reply, or None for a request that takes
none (FORGET); raises `FuseError` for an errno reply."""


class FuseError(Exception):
    """A request's answer is this errno."""

    def __init__(self, errno_: int) -> None:
        super().__init__(os.strerror(errno_))
        self.errno = errno_


class MountError(Exception):
    """``fusermount3`` could not mount (its message)."""


def fusermount() -> str:
    found = shutil.which("fusermount3")
    if found is None:
        raise MountError("fusermount3 is not installed (Debian: apt install fuse3)")
    return found


def mount(mountpoint: str, options: Sequence[str]) -> int:
    """Mount a FUSE file system on `mountpoint`; the open ``/dev/fuse`` that
    serves it. ``fusermount3`` makes the mount (as root, or setuid for a
    user) and hands the device back over a socket (``_FUSE_COMMFD``), as
    libfuse does."""
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    with ours, theirs:
        process = subprocess.Popen(
            [fusermount(), "-o", ",".join(options), "--", mountpoint],
            env={**os.environ, "_FUSE_COMMFD": str(theirs.fileno())}, pass_fds=(theirs.fileno(),),
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        theirs.close()
        _, fds, _, _ = socket.recv_fds(ours, 1, 1)
        _, err = process.communicate()
    if not fds:
        raise MountError(err.decode(errors="replace").strip() or f"fusermount3 exited {process.returncode}")
    fd = fds[0]
    os.set_blocking(fd, False)
    fcntl.fcntl(fd, fcntl.F_SETFD, fcntl.FD_CLOEXEC)
    return fd


def unmount(mountpoint: str) -> None:
    """Detach the mount (lazily: a process still inside keeps what it holds)."""
    subprocess.run([fusermount(), "-u", "-q", "-z", "--", mountpoint], check=False,
                   stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


class Session:
    """One mounted file system's requests, served by `handler` (module docstring)."""

    def __init__(self, fd: int, handler: Handler, capabilities: int, *, debug: bool = False) -> None:
        """`capabilities`: the INIT flags to ask for (`fuse_protocol.Cap`);
        `debug`: log every request and its errno."""
        self.fd, self.handler, self.capabilities, self.debug = fd, handler, capabilities, debug
        self._read_lock = trio.Lock()
        self._idle = self._workers = 0
        self._in_flight: set[int] = set()
        self._interrupted: set[int] = set()
        self._waits: dict[int, trio.CancelScope] = {}
        self._scope: trio.CancelScope | None = None
        self._nursery: trio.Nursery | None = None

    async def serve(self) -> None:
        """Answer requests until the mount goes (unmounted from outside) or `terminate`."""
        with trio.CancelScope() as self._scope:
            async with trio.open_nursery() as self._nursery:
                self._start_worker(self._nursery)

    def terminate(self) -> None:
        """End `serve` (from the event loop's thread)."""
        if self._scope is not None:
            self._scope.cancel()

    @contextlib.contextmanager
    def interruptible(self, unique: int) -> Iterator[trio.CancelScope]:
        """A scope that a FUSE_INTERRUPT of request `unique` cancels (check
        ``cancelled_caught`` after it: the caller then answers EINTR). The
        wait in it does not count against `MAX_WORKERS`: however many
        processes wait for locks, a worker is left to read the request that
        frees them."""
        with trio.CancelScope() as scope:
            self._waits[unique] = scope
            if unique in self._interrupted:
                scope.cancel()
            self._workers -= 1
            if not self._idle and self._nursery is not None:
                self._start_worker(self._nursery)
            try:
                yield scope
            finally:
                del self._waits[unique]
                self._workers += 1

    def _start_worker(self, nursery: trio.Nursery) -> None:
        self._workers += 1
        self._idle += 1
        nursery.start_soon(self._worker, nursery)

    async def _worker(self, nursery: trio.Nursery) -> None:
        while True:
            async with self._read_lock:
                buffer = await self._read()
            if buffer is None:   # unmounted
                nursery.cancel_scope.cancel()
                return
            self._idle -= 1
            if not self._idle and self._workers < MAX_WORKERS:
                self._start_worker(nursery)
            try:
                await self._answer(buffer)
            finally:
                self._idle += 1

    async def _read(self) -> bytes | None:
        """The next request; None once the file system is unmounted."""
        while True:
            try:
                buffer = os.read(self.fd, READ_BUFFER)
            except BlockingIOError:
                await trio.lowlevel.wait_readable(self.fd)
                continue
            except OSError as exc:
                if exc.errno in (errno.EINTR, errno.ENOENT):   # ENOENT: the request was withdrawn
                    continue
                if exc.errno == errno.ENODEV:
                    return None
                raise
            return buffer

    async def _answer(self, buffer: bytes) -> None:
        try:
            request = proto.parse(buffer)
        except proto.ProtocolError as exc:
            log.error("FUSE: %s", exc)
            return
        if self.debug:   # the line REQUEST_LOGGED matches
            log.debug("FUSE %s unique %d node %d pid %d", _name(request.opcode), request.unique,
                      request.nodeid, request.pid)
        if request.opcode == proto.Op.INTERRUPT:
            self._interrupt(request)
            return
        if request.opcode == proto.Op.INIT:
            self._write(self._init(request))
            return
        self._in_flight.add(request.unique)
        try:
            reply = await self.handler(request)
        except FuseError as exc:
            if self.debug:
                log.debug("FUSE %s unique %d: %s", _name(request.opcode), request.unique, exc)
            reply = proto.error_reply(request.unique, exc.errno)
        except proto.ProtocolError as exc:
            log.error("FUSE %s: %s", _name(request.opcode), exc)
            reply = proto.error_reply(request.unique, errno.EIO)
        except Exception:   # the mount's handlers answer their own failures; this one ends nothing
            log.exception("FUSE %s failed", _name(request.opcode))
            reply = proto.error_reply(request.unique, errno.EIO)
        finally:
            self._in_flight.discard(request.unique)
            self._interrupted.discard(request.unique)
        if reply is not None:
            self._write(reply)

    def _init(self, request: proto.Request) -> bytes:
        offered = proto.parse_init(request.body)
        if offered.major != proto.MAJOR or offered.minor < proto.MINOR:
            log.error("FUSE: the kernel speaks %d.%d; this mount needs %d.%d", offered.major, offered.minor,
                      proto.MAJOR, proto.MINOR)
            return proto.error_reply(request.unique, errno.EPROTO)
        log.debug("FUSE INIT: kernel %d.%d, flags %#x; asked %#x", offered.major, offered.minor,
                  offered.flags, self.capabilities & offered.flags)
        return proto.init_reply(request.unique, offered, flags=self.capabilities, max_write=MAX_WRITE,
                                max_readahead=MAX_WRITE)

    def _interrupt(self, request: proto.Request) -> None:
        (unique,) = proto.fields(proto.INTERRUPT_IN, request.body)
        scope = self._waits.get(unique)
        if scope is not None:
            scope.cancel()
        elif unique in self._in_flight:
            self._interrupted.add(unique)

    def _write(self, reply: bytes) -> None:
        try:
            os.write(self.fd, reply)
        except OSError as exc:
            # ENOENT: the kernel gave up on the request (its caller was
            # killed); ENODEV: the mount went meanwhile.
            if exc.errno not in (errno.ENOENT, errno.ENODEV):
                log.error("FUSE reply not written: %s", exc)


def _name(opcode: int) -> str:
    try:
        return proto.Op(opcode).name
    except ValueError:
        return f"opcode {opcode}"
