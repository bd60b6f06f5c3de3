"""Run `metaflow-fs` (the FUSE mount) as a subprocess, on this machine or
in a Mininet host, for tests, benchmarks and scenarios:

    with FuseMount(tmp_path / "mnt", via=f"{agent.host}:{agent.port}") as mount:
        subprocess.run(["tar", "xf", archive, "-C", mount.path], check=True)

Stopping sends SIGTERM and insists on a clean exit and on the mount being
gone, since a clean unmount is part of what is checked; a mount whose
process died or hangs is lazily unmounted (``fusermount3 -uz``), so no test
leaves one behind.

A Mininet host has a mount namespace of its own: a mount made in it is seen
only there, so commands that use it go through `run`.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from types import TracebackType

from mininet_scenarios.daemons import ROOT, NetnsLike

FSTYPE = "fuse.metaflow"


def mounted(path: Path, pid: int | str = "self") -> bool:
    """Whether a metaflow-fs mount sits on `path`, in the mount namespace of
    process `pid` (this one's by default)."""
    target = os.path.realpath(path)
    with open(f"/proc/{pid}/mountinfo") as table:
        for line in table:
            fields = line.split()
            dash = fields.index("-")
            if fields[4] == target and fields[dash + 1] == FSTYPE:
                return True
    return False


class FuseMount:
    """One `metaflow-fs` process and its mount point (created if missing)."""

    def __init__(self, path: Path, *extra: str, via: str | None = None, root: int | None = None,
                 netns: NetnsLike | None = None, log_path: Path | None = None,
                 attr_timeout: float = 1.0, entry_timeout: float = 1.0) -> None:
        self.path = Path(path)
        self.log_path = log_path
        self.netns = netns
        self.argv = [*(netns.command() if netns else []), sys.executable, "-m", "client_lib.fs.cli",
                     str(self.path), "--attr-timeout", str(attr_timeout),
                     "--entry-timeout", str(entry_timeout),
                     *(["--via", via] if via else []), *(["--root", str(root)] if root else []), *extra]
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self, timeout: float = 20.0) -> FuseMount:
        self.path.mkdir(parents=True, exist_ok=True)
        if self.log_path:
            with open(self.log_path, "ab") as out:
                self.proc = subprocess.Popen(self.argv, cwd=ROOT, stdout=out, stderr=out)
        else:
            self.proc = subprocess.Popen(self.argv, cwd=ROOT, stdout=subprocess.DEVNULL,
                                         stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + timeout
        while not self.mounted():
            if self.proc.poll() is not None:
                raise RuntimeError(f"metaflow-fs exited with {self.proc.returncode}: {self.log()[-2000:]}")
            if time.monotonic() > deadline:
                self.kill()
                raise RuntimeError(f"metaflow-fs did not mount in {timeout} s: {self.log()[-2000:]}")
            time.sleep(0.05)
        return self

    def mounted(self) -> bool:
        """Whether the mount is there (in the namespace of the process, if it runs)."""
        if self.proc is not None and self.proc.poll() is None:
            return mounted(self.path, self.proc.pid)
        return self.run("findmnt", "-n", "-t", FSTYPE, "-M", self.path, check=False).returncode == 0

    def run(self, *argv: str | Path, check: bool = True,
            timeout: float = 300) -> subprocess.CompletedProcess[str]:
        """Run a command where the mount is seen (in its host, if it has one)."""
        args = [str(a) for a in argv]
        if self.netns is not None:
            return self.netns.run(*args, check=check, timeout=timeout)
        done = subprocess.run(args, capture_output=True, text=True, timeout=timeout)
        if check and done.returncode:
            raise RuntimeError(f"{' '.join(args)} exited with {done.returncode}: {done.stderr[-2000:]}")
        return done

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path and self.log_path.exists() else ""

    def stop(self, timeout: float = 30.0) -> int:
        """SIGTERM and wait; the exit code (0: pushed what it held and unmounted)."""
        if self.proc is None:
            return 0
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            raise

    def kill(self) -> None:
        """SIGKILL, then a lazy unmount of what it left (the kernel's mount
        outlives a killed FUSE daemon, and answers ENOTCONN)."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        if self.mounted():
            self.run("fusermount3", "-u", "-z", self.path, check=False)

    def __enter__(self) -> FuseMount:
        return self.start()

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        if kind is not None:
            self.kill()
            return
        code = self.stop()
        still = self.mounted()
        if still:
            self.kill()
        assert code == 0 and not still, f"metaflow-fs did not unmount cleanly ({code}): {self.log()[-2000:]}"
