"""File locks on `metaflow-fs`, for real: two mounts of one file system over
one standalone agent, each its own FUSE connection (as two machines would
be), and ordinary processes taking POSIX (``fcntl``) and BSD (``flock``)
locks through them. A lock one mount holds is in the way on the other; a
waiting lock is taken when the holder lets go, and a signal ends the wait
with EINTR; closing the file drops its locks; a mount killed with its locks
held frees them once their lease runs out (`client_lib.fs.locks`)."""

from __future__ import annotations

import fcntl
import os
import secrets
import struct
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from client_lib.client import MetaFlowClient
from client_lib.fs.fuse_session import MAX_WORKERS
from client_lib.fs.locks import lock_key
from mininet_scenarios.daemons import AgentProcess
from mininet_scenarios.fs_mount import FuseMount

HOLDER = """
import fcntl, sys
kind, path = sys.argv[1], sys.argv[2]
f = open(path, "r+b")
if kind == "flock":
    fcntl.flock(f, fcntl.LOCK_EX)
else:
    fcntl.lockf(f, fcntl.LOCK_EX, 100, 0)
print("locked", flush=True)
sys.stdin.read()   # held until stdin closes
"""
"""A process that takes a lock on a file and holds it until its stdin closes."""

LEASE = 2.0
"""The lock lease of the mount that is killed (seconds)."""


@pytest.fixture
def via(standalone_agent: AgentProcess) -> str:
    return f"{standalone_agent.host}:{standalone_agent.port}"


@pytest.fixture
def root() -> int:
    """A file system of the test's own."""
    return secrets.randbits(62) | 2


@pytest.fixture
def mounts(tmp_path: Path, via: str, root: int) -> Iterator[tuple[FuseMount, FuseMount]]:
    """Two mounts of one file system."""
    with FuseMount(tmp_path / "a", via=via, root=root, log_path=tmp_path / "a.log") as a, \
            FuseMount(tmp_path / "b", via=via, root=root, log_path=tmp_path / "b.log") as b:
        yield a, b


def _hold(kind: str, path: Path) -> subprocess.Popen[str]:
    holder = subprocess.Popen([sys.executable, "-c", HOLDER, kind, str(path)], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True)
    assert holder.stdout is not None and holder.stdout.readline() == "locked\n"
    return holder


def _let_go(holder: subprocess.Popen[str]) -> None:
    assert holder.stdin is not None
    holder.stdin.close()
    assert holder.wait(10) == 0


def _posix_free(path: Path) -> bool:
    """Whether this process can take a write lock on bytes 0-99 (then dropped)."""
    with open(path, "r+b") as f:
        try:
            fcntl.lockf(f, fcntl.LOCK_EX | fcntl.LOCK_NB, 100, 0)
        except BlockingIOError:
            return False
        fcntl.lockf(f, fcntl.LOCK_UN, 100, 0)
        return True


def _flock_free(path: Path) -> bool:
    return subprocess.run(["flock", "-n", str(path), "true"], timeout=30).returncode == 0


def test_a_posix_lock_of_one_mount_is_in_the_way_on_the_other(mounts: tuple[FuseMount, FuseMount],
                                                              via: str) -> None:
    a, b = mounts
    (a.path / "f").write_bytes(b"x" * 200)
    holder = _hold("posix", a.path / "f")
    try:
        assert not _posix_free(b.path / "f")
        with open(b.path / "f", "r+b") as f:   # F_GETLK: who is in the way, from the other mount
            query = struct.pack("hhqqi", fcntl.F_WRLCK, os.SEEK_SET, 50, 10, 0)
            l_type, _, start, length, pid = struct.unpack("hhqqi", fcntl.fcntl(f, fcntl.F_GETLK, query))
            assert (l_type, start, length, pid) == (fcntl.F_WRLCK, 0, 100, 0)
            beyond = struct.pack("hhqqi", fcntl.F_WRLCK, os.SEEK_SET, 100, 50, 0)   # past its range: free
            assert struct.unpack("hhqqi", fcntl.fcntl(f, fcntl.F_GETLK, beyond))[0] == fcntl.F_UNLCK
            fcntl.lockf(f, fcntl.LOCK_EX | fcntl.LOCK_NB, 50, 100)   # and takeable
        assert _flock_free(b.path / "f")   # flock and POSIX locks do not see each other
    finally:
        _let_go(holder)
    assert _posix_free(b.path / "f")   # the holder's exit (its close) dropped it
    with MetaFlowClient(via=via) as client:   # and every close dropped its own: no record is left
        assert client.get(lock_key(os.stat(a.path / "f").st_ino)) is None


def test_flock_across_mounts_waits_for_the_holder_and_a_signal_ends_the_wait(
        mounts: tuple[FuseMount, FuseMount]) -> None:
    a, b = mounts
    (a.path / "g").write_bytes(b"")
    holder = _hold("flock", a.path / "g")
    try:
        assert not _flock_free(b.path / "g")
        started = time.monotonic()
        # flock -w 1: a blocking flock that SIGALRM interrupts after 1 s (EINTR, exit 1)
        timed_out = subprocess.run(["flock", "-w", "1", str(b.path / "g"), "true"], timeout=30)
        assert timed_out.returncode == 1 and 0.9 < time.monotonic() - started < 10
        waiter = subprocess.Popen(["flock", str(b.path / "g"), "echo", "got it"], stdout=subprocess.PIPE,
                                  text=True)
        time.sleep(0.5)
        assert waiter.poll() is None   # still waiting
    finally:
        _let_go(holder)
    out, _ = waiter.communicate(timeout=30)
    assert waiter.returncode == 0 and out == "got it\n"
    assert _flock_free(a.path / "g")


def test_the_locks_of_a_killed_mount_expire_with_their_lease(mounts: tuple[FuseMount, FuseMount], via: str,
                                                            root: int, tmp_path: Path) -> None:
    _, b = mounts
    doomed = FuseMount(tmp_path / "c", "--lock-lease", str(LEASE), via=via, root=root).start()
    try:
        (doomed.path / "h").write_bytes(b"y" * 200)
        posix = _hold("posix", doomed.path / "h")
        flock = _hold("flock", doomed.path / "h")
    finally:
        doomed.kill()   # the mount dies with both locks held; its holders are left on a dead mount
    killed = time.monotonic()
    for holder in (posix, flock):
        holder.kill()
        holder.wait(10)
    assert not _posix_free(b.path / "h") and not _flock_free(b.path / "h")
    while not (_posix_free(b.path / "h") and _flock_free(b.path / "h")):
        assert time.monotonic() - killed < LEASE + 10, "a dead mount's locks outlived their lease"
        time.sleep(0.2)
    assert time.monotonic() - killed >= LEASE * 0.5   # not dropped early: they expired


def test_more_waiting_locks_than_the_mount_has_workers_leave_it_answering(
        mounts: tuple[FuseMount, FuseMount]) -> None:
    """Each waiting lock holds a request of the mount's for as long as it
    waits; past `MAX_WORKERS` of them the mount must still read the rest."""
    a, b = mounts
    (a.path / "w").write_bytes(b"")
    holder = _hold("flock", a.path / "w")
    waiters: list[subprocess.Popen[bytes]] = []
    try:
        waiters += [subprocess.Popen(["flock", str(b.path / "w"), "true"]) for _ in range(MAX_WORKERS + 6)]
        time.sleep(1.0)
        assert all(w.poll() is None for w in waiters)
        (b.path / "still-answering").write_text("yes")   # the mount still serves other calls
        assert (b.path / "still-answering").read_text() == "yes"
    finally:
        _let_go(holder)
        for w in waiters:
            w.wait(60)
    assert [w.returncode for w in waiters] == [0] * len(waiters)


def test_a_mount_stopped_cleanly_drops_its_locks_at_once(mounts: tuple[FuseMount, FuseMount], via: str,
                                                         root: int, tmp_path: Path) -> None:
    _, b = mounts
    leaving = FuseMount(tmp_path / "d", via=via, root=root).start()   # the default 20 s lease
    try:
        (leaving.path / "k").write_bytes(b"z" * 200)
        posix = _hold("posix", leaving.path / "k")
        flock = _hold("flock", leaving.path / "k")
        assert not _posix_free(b.path / "k") and not _flock_free(b.path / "k")
        assert leaving.stop() == 0   # SIGTERM while both are held
        assert _posix_free(b.path / "k") and _flock_free(b.path / "k")   # not a lease later: now
    finally:
        leaving.kill()
    for holder in (posix, flock):
        holder.kill()
        holder.wait(10)
