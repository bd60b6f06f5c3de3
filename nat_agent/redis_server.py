"""A redis-server process of our own: started in a directory, stopped by its PID.

The agent's ``redis-server:DIR`` store and the tests need a real Redis
without relying on a system service. This module starts one with every
setting on the command line (no config file, so the host's
``/etc/redis/redis.conf`` never leaks in), waits until it answers PING, and
stops exactly the process it started: SIGTERM first, so Redis flushes its
append-only file and removes its socket, SIGKILL if it does not exit in time.
"""

from __future__ import annotations

import ctypes
import os
import signal
import socket
import subprocess
import time
from pathlib import Path
from types import TracebackType
from typing import IO

from nat_agent.ports import listen_port

__all__ = ["RedisServer", "RedisServerError", "RedisServerExited"]

# sun_path is 108 bytes on Linux, including the terminating NUL.
_MAX_SOCKET_PATH = 107
_LOG_NAME = "redis.log"
_LOG_TAIL_LINES = 20
_APPENDFSYNC = ("always", "everysec", "no")


class RedisServerError(RuntimeError):
    """The server could not be started (the message carries its log tail)."""


class RedisServerExited(RedisServerError):
    """The server exited before it answered PING: it may have been killed
    just as it became ready, which a keeper counts as one more death."""

    def __init__(self, message: str, status: int) -> None:
        super().__init__(message)
        self.status = status


class RedisServer:
    """One redis-server process with its data, log and socket in ``directory``.

    ``unix_socket`` is a socket path to listen on; ``port`` a TCP port on
    127.0.0.1, 0 meaning a free one chosen at start. At least one is needed.
    Persistence is append-only (``appendonly yes``, RDB snapshots off), in
    ``directory``; ``appendfsync`` is Redis's: ``always`` (fsync before any
    reply that follows a write), ``everysec`` (Redis's default) or ``no``;
    ``appendonly=False`` keeps nothing at all (the benchmarks' "no
    persistence"). ``replica_of``: the TCP port of a redis-server on
    127.0.0.1 to replicate (``replicaof``).
    """

    def __init__(
        self,
        directory: str | os.PathLike[str],
        *,
        unix_socket: str | os.PathLike[str] | None = None,
        port: int | None = None,
        executable: str = "redis-server",
        start_timeout: float = 10.0,
        stop_timeout: float = 10.0,
        appendfsync: str = "everysec",
        appendonly: bool = True,
        replica_of: int | None = None,
    ) -> None:
        if unix_socket is None and port is None:
            raise ValueError("a redis-server needs a unix socket, a TCP port, or both")
        if appendfsync not in _APPENDFSYNC:
            raise ValueError(f"appendfsync must be one of {', '.join(_APPENDFSYNC)}, not {appendfsync!r}")
        self.appendfsync = appendfsync
        self.appendonly = appendonly
        self.replica_of = replica_of
        # Absolute, because the server runs in `directory` and we do not.
        self.unix_socket = None if unix_socket is None else Path(unix_socket).absolute()
        if self.unix_socket is not None and len(bytes(self.unix_socket)) > _MAX_SOCKET_PATH:
            raise ValueError(
                f"unix socket path {str(self.unix_socket)!r} is longer than "
                f"{_MAX_SOCKET_PATH} bytes; choose a shorter directory"
            )
        self.directory = Path(directory)
        self.port = port
        self.executable = executable
        self.start_timeout = start_timeout
        self.stop_timeout = stop_timeout
        self._process: subprocess.Popen[bytes] | None = None
        self._log: IO[bytes] | None = None
        self._log_start = 0

    @property
    def pid(self) -> int | None:
        """The PID of the running server, None when stopped."""
        return None if self._process is None else self._process.pid

    @property
    def url(self) -> str:
        """A ``redis://`` URL (TCP preferred) or a ``unix://`` one."""
        if self.port:
            return f"redis://127.0.0.1:{self.port}"
        return f"unix://{self.unix_socket}"

    def start(self) -> RedisServer:
        """Start the server and return once it answers PING."""
        return self.launch().wait_ready()

    def launch(self) -> RedisServer:
        """Start the process without waiting for it to answer (quick).

        The calling *thread* is the server's parent for ``PR_SET_PDEATHSIG``:
        the server is stopped when that thread ends. So launch from a thread
        that lives as long as the server should (the event loop's, not a
        worker's), and wait in a worker if need be.
        """
        if self._process is not None:
            raise RedisServerError(f"redis-server {self.pid} is already running")
        self.directory.mkdir(parents=True, exist_ok=True)
        if self.unix_socket is not None and _answers_ping(self.unix_socket):
            raise RedisServerError(f"a redis-server already listens on {self.unix_socket}")
        if self.port == 0:
            self.port = listen_port()
        self._log = open(self.directory / _LOG_NAME, "ab")
        self._log_start = self._log.tell()
        try:
            self._process = subprocess.Popen(
                self._command(),
                cwd=self.directory,
                stdin=subprocess.DEVNULL,
                stdout=self._log,
                stderr=subprocess.STDOUT,
                preexec_fn=_die_with_parent,
            )
        except OSError as exc:
            self._close_log()
            raise RedisServerError(f"cannot run {self.executable!r}: {exc}") from exc
        return self

    def wait_ready(self) -> RedisServer:
        """Block until the launched server answers PING; if it exits or stays
        silent for ``start_timeout``, stop it and raise `RedisServerError`."""
        try:
            self._wait_until_ready()
        except BaseException:
            self.stop()
            raise
        return self

    def _command(self) -> list[str]:
        command = [
            self.executable,
            "--dir", str(self.directory.resolve()),
            "--daemonize", "no",
            "--logfile", "",  # stdout, which is our log file
            "--appendonly", "yes" if self.appendonly else "no",
            "--appendfsync", self.appendfsync,
            "--save", "",
            "--port", str(self.port or 0),
        ]
        if self.port:
            command += ["--bind", "127.0.0.1"]
        if self.replica_of is not None:
            command += ["--replicaof", "127.0.0.1", str(self.replica_of)]
        if self.unix_socket is not None:
            command += ["--unixsocket", str(self.unix_socket), "--unixsocketperm", "700"]
        return command

    def _wait_until_ready(self) -> None:
        assert self._process is not None
        address: Path | int | None = self.unix_socket if self.unix_socket is not None else self.port
        assert address is not None  # __init__ insists on one of them
        deadline = time.monotonic() + self.start_timeout
        while not _answers_ping(address):
            if self._process.poll() is not None:
                raise RedisServerExited(
                    f"redis-server exited with status {self._process.returncode} "
                    f"during start-up; log tail:\n{self._log_tail()}",
                    self._process.returncode,
                )
            if time.monotonic() > deadline:
                raise RedisServerError(
                    f"redis-server {self._process.pid} did not answer PING within "
                    f"{self.start_timeout} s; log tail:\n{self._log_tail()}"
                )
            time.sleep(0.02)

    def reap(self) -> int | None:
        """After the process has died: collect its exit status (negative: the
        signal) and forget it, so that `start` may run again. None if it is
        still running."""
        if self._process is None or self._process.poll() is None:
            return None
        status = self._process.returncode
        self.stop()  # removes the socket a killed server leaves, closes the log
        return status

    def _log_tail(self) -> str:
        """The last lines this start wrote to the log (not earlier runs')."""
        with open(self.directory / _LOG_NAME, "rb") as log:
            log.seek(self._log_start)
            lines = log.read().decode("utf-8", "replace").splitlines()
        return "\n".join(lines[-_LOG_TAIL_LINES:]) or "(empty)"

    def stop(self) -> None:
        """Stop the server this object started (only that PID); idempotent."""
        process, self._process = self._process, None
        if process is not None and process.poll() is None:
            process.send_signal(signal.SIGTERM)
            try:
                process.wait(self.stop_timeout)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        if process is not None and self.unix_socket is not None:
            # A killed server leaves its socket behind; a clean one removed it.
            self.unix_socket.unlink(missing_ok=True)
        self._close_log()

    def _close_log(self) -> None:
        if self._log is not None:
            self._log.close()
            self._log = None

    def __enter__(self) -> RedisServer:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()


def _answers_ping(address: Path | int) -> bool:
    """Whether a Redis at a unix socket path or 127.0.0.1 port answers PING.

    A server still loading its append-only file answers ``-LOADING``, which
    counts as not ready.
    """
    family, target = ((socket.AF_UNIX, str(address)) if isinstance(address, Path)
                      else (socket.AF_INET, ("127.0.0.1", address)))
    try:
        with socket.socket(family, socket.SOCK_STREAM) as conn:
            conn.settimeout(1.0)
            conn.connect(target)
            conn.sendall(b"PING\r\n")
            return conn.recv(64).startswith(b"+PONG")
    except OSError:
        return False


_PR_SET_PDEATHSIG = 1


def _die_with_parent() -> None:
    """In the child, before exec: SIGTERM when the thread that started us
    ends (with its process). An agent killed with SIGKILL cannot stop its
    redis-server itself; the kernel does it, so nothing outlives the agent."""
    ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)
