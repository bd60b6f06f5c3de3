"""Run the real `metaflow-agent` daemon as a subprocess.

Tests, benchmarks and scenarios talk to the daemon exactly as the controller
and clients will: RESP on its data port, HTTP on its admin port. Stopping it
sends SIGTERM and returns the exit code, and the context manager insists on
0, because a clean shutdown (rules removed, store closed) is part of what is
being checked.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def http(method: str, url: str, body: dict | None = None, timeout: float = 30.0) -> tuple[int, dict]:
    """(status, JSON body) of one admin call; HTTP errors are returned, not raised."""
    data = json.dumps(body).encode() if body is not None else None
    request = urllib.request.Request(url, data=data, method=method,
                                     headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            return response.status, json.loads(response.read() or b"{}")
    except urllib.error.HTTPError as err:
        return err.code, json.loads(err.read() or b"{}")


_HTTP_IN_NETNS = (
    "import json, sys; from mininet_scenarios.daemons import http; "
    "print(json.dumps(http(sys.argv[1], sys.argv[2], json.loads(sys.argv[3]), timeout=2)))"
)


class AgentProcess:
    """One daemon on loopback (or inside a namespace via `netns`)."""

    def __init__(self, store: str, *extra: str, own: list[str] | None = None, name: str | None = None,
                 rewrite: str = "none", host: str = "127.0.0.1", admin_host: str = "127.0.0.1",
                 port: int | None = None, admin_port: int | None = None, netns=None,
                 admin_from_here: bool = False, log_path: Path | None = None) -> None:
        """`netns` (anything with ``command(*argv)`` and ``run(*argv, ...)``,
        like `mininet_scenarios.netns_pair.Namespace`) runs the agent inside
        that network namespace, and every admin call too unless
        `admin_from_here`: then `admin_host` is reachable from this process
        (a management network) and is called directly, as a controller would."""
        self.netns = netns
        self.admin_from_here = admin_from_here
        self.port = port or free_port()
        self.admin_port = admin_port or free_port()
        self.host = host
        self.admin_url = f"http://{admin_host}:{self.admin_port}"
        self.name = name or f"agent{self.port}"
        self.log_path = log_path
        self.argv = [*(netns.command() if netns else []), sys.executable, "-m", "nat_agent.daemon",
                     "--name", self.name, "--store", store, "--rewrite", rewrite,
                     "--listen", f"{host}:{self.port}", "--admin", f"{admin_host}:{self.admin_port}",
                     *[arg for block in own or [] for arg in ("--own", block)], *extra]
        self.proc: subprocess.Popen | None = None
        self._terminated = False
        self._log = None

    def start(self, timeout: float = 20.0) -> AgentProcess:
        return self.launch().wait_ready(timeout)

    def launch(self) -> AgentProcess:
        """Start the process without waiting for it: several agents then
        start in parallel, each followed by `wait_ready`."""
        self._log = open(self.log_path, "ab") if self.log_path else subprocess.DEVNULL
        self.proc = subprocess.Popen(self.argv, cwd=ROOT, stdout=self._log, stderr=self._log)
        self._terminated = False
        return self

    def wait_ready(self, timeout: float = 20.0) -> AgentProcess:
        """Wait until /health answers 200; kill the agent and raise if it exits or times out."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"agent exited with {self.proc.returncode} at start: {self.log()[-2000:]}")
            try:
                status, _ = self.call("GET", "/health")
                if status == 200:
                    return self
            except (OSError, RuntimeError):
                pass
            time.sleep(0.05)
        self.kill()
        raise RuntimeError(f"agent did not come up in {timeout} s: {self.log()[-2000:]}")

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path and self.log_path.exists() else ""

    def call(self, method: str, path: str, body: dict | None = None) -> tuple[int, dict]:
        if self.netns is None or self.admin_from_here:
            return http(method, self.admin_url + path, body)
        out = self.netns.run(sys.executable, "-c", _HTTP_IN_NETNS, method, self.admin_url + path,
                             json.dumps(body), check=False, cwd=ROOT)
        if out.returncode:
            raise RuntimeError(out.stderr[-500:])
        status, reply = json.loads(out.stdout)
        return status, reply

    def terminate(self) -> None:
        """Send SIGTERM once, without waiting: stop several agents in parallel,
        then `stop` each. Only once, because a second SIGTERM that arrives
        after the event loop has closed would kill the agent mid-shutdown."""
        if self.proc is not None and not self._terminated and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            self._terminated = True

    def stop(self, timeout: float = 20.0) -> int:
        """SIGTERM and wait; returns the exit code (0 for a clean shutdown)."""
        if self.proc is None:
            return 0
        self.terminate()
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            raise
        finally:
            self._close_log()

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGKILL)
            self.proc.wait()
        self._close_log()

    def _close_log(self) -> None:
        if self._log not in (None, subprocess.DEVNULL):
            self._log.close()
            self._log = None

    def __enter__(self) -> AgentProcess:
        return self.start()

    def __exit__(self, *exc) -> None:
        if exc[0] is None:
            assert self.stop() == 0, f"agent did not exit cleanly: {self.log()[-2000:]}"
        else:
            self.kill()
