"""Run the real `metaflow-agent` daemon as a subprocess.

Tests, benchmarks and scenarios talk to the daemon exactly as the controller
and clients will: RESP on its data port, the signed admin API on its admin
port through `client_lib.api.clients`, with the typed bodies of
`client_lib.api.admin`:

    with AgentProcess("leveldb:/tmp/a", own=["100.64.0.0/10"]) as agent:
        role = Role(Block.parse("100.64.0.0/12"), 1, True, [agent.member(), backup.member()])
        agent.call(ADMIN.assign, AssignRequest([role]))
        agent.call(ADMIN.commit, id=migration_id)

Every agent has its own replication listener (`replication`, a free
loopback port unless given), so several run side by side on one machine.

Each agent gets a private secret file unless it is given one
(`secret_file=`; agents that migrate to each other, and the controller of a
scenario, must share the cluster's). An agent inside a network namespace
whose admin address is reachable only in there is called through a short
subprocess in that namespace (`python -m mininet_scenarios.daemons`), which
uses the same client. Stopping the daemon sends SIGTERM and returns the exit
code, and the context manager insists on 0, because a clean shutdown (rules
removed, store closed) is part of what is being checked.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import time
import weakref
from pathlib import Path
from types import TracebackType
from typing import IO, Any, Protocol, Self, TypeVar

from client_lib import errors
from client_lib.api import codec
from client_lib.api.admin import ADMIN, Member
from client_lib.api.auth import load_secret, write_secret
from client_lib.api.clients import ApiClient
from client_lib.api.route import Route
from client_lib.errors import ApiError
from client_lib.site_client import Outbox
from nat_agent.ports import listen_port

ROOT = Path(__file__).resolve().parents[1]

Req = TypeVar("Req")
Resp = TypeVar("Resp")


class NetnsLike(Protocol):
    """What `AgentProcess` needs of a namespace (`netns_pair.Namespace`, `hostns.HostNamespace`)."""

    def command(self, *argv: str) -> list[str]: ...

    def run(self, *argv: str, check: bool = True, timeout: float = 60,
            **kwargs: Any) -> subprocess.CompletedProcess[str]: ...


def private_secret() -> Path:
    """A new secret in a new 0600 file of its own; the caller removes it."""
    fd, name = tempfile.mkstemp(prefix="metaflow-secret-")
    os.close(fd)
    return write_secret(name)


_API_ERRORS = {cls.__name__: cls for cls in (ApiError, errors.AuthError, errors.NotFound, errors.Conflict)}


class DaemonProcess:
    """A daemon run as a subprocess: started, waited for until `ready`,
    stopped with SIGTERM (its exit code returned) or killed. Subclasses give
    `argv` and `ready`."""

    what = "daemon"
    argv: list[str]
    log_path: Path | None

    def __init__(self) -> None:
        self.proc: subprocess.Popen[bytes] | None = None
        self._terminated = False
        self._log: IO[bytes] | None = None

    def ready(self) -> bool:
        """Whether the daemon answers yet (may raise: counted as not yet)."""
        raise NotImplementedError

    def start(self, timeout: float = 20.0) -> Self:
        return self.launch().wait_ready(timeout)

    def launch(self) -> Self:
        """Start the process without waiting for it: several daemons then
        start in parallel, each followed by `wait_ready`."""
        self._log = open(self.log_path, "ab") if self.log_path else None  # closed in stop/kill
        out = self._log if self._log is not None else subprocess.DEVNULL
        self.proc = subprocess.Popen(self.argv, cwd=ROOT, stdout=out, stderr=out)
        self._terminated = False
        return self

    def wait_ready(self, timeout: float = 20.0) -> Self:
        """Wait until `ready`; kill the daemon and raise if it exits or times out."""
        assert self.proc is not None, "launch() first"
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"{self.what} exited with {self.proc.returncode} at start: "
                                   f"{self.log()[-2000:]}")
            try:
                if self.ready():
                    return self
            except (errors.MetaFlowError, OSError, RuntimeError):
                pass
            time.sleep(0.05)
        self.kill()
        raise RuntimeError(f"{self.what} did not come up in {timeout} s: {self.log()[-2000:]}")

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path and self.log_path.exists() else ""

    def terminate(self) -> None:
        """Send SIGTERM once, without waiting: stop several daemons in parallel,
        then `stop` each. Only once, because a second SIGTERM that arrives
        after the event loop has closed would kill the daemon mid-shutdown."""
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
        if self._log is not None:
            self._log.close()
            self._log = None

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        if kind is None:
            assert self.stop() == 0, f"{self.what} did not exit cleanly: {self.log()[-2000:]}"
        else:
            self.kill()


class AgentProcess(DaemonProcess):
    """One agent on loopback (or inside a namespace via `netns`)."""

    what = "agent"

    def __init__(self, store: str, *extra: str, own: list[str] | None = None, name: str | None = None,
                 rewrite: str = "none", host: str = "127.0.0.1", admin_host: str = "127.0.0.1",
                 port: int | None = None, admin_port: int | None = None, netns: NetnsLike | None = None,
                 admin_from_here: bool = False, log_path: Path | None = None,
                 secret_file: Path | None = None, replication_port: int | None = None) -> None:
        """`netns` runs the agent inside that network namespace, and every
        admin call too unless `admin_from_here`: then `admin_host` is
        reachable from this process (a management network) and is called
        directly, as a controller would. `secret_file`: the cluster's secret;
        by default a private one, removed when this object goes away."""
        self.netns = netns
        self.admin_from_here = netns is None or admin_from_here
        self.port = port or listen_port()
        self.admin_port = admin_port or listen_port()
        self.host = host
        self.admin_url = f"http://{admin_host}:{self.admin_port}"
        self.replication = f"{admin_host}:{replication_port or listen_port()}"
        self.name = name or f"agent{self.port}"
        self.log_path = log_path
        if secret_file is None:
            secret_file = private_secret()
            weakref.finalize(self, secret_file.unlink, missing_ok=True)
        self.secret_file = Path(secret_file)
        self.secret = load_secret(self.secret_file)
        self.argv = [*(netns.command() if netns else []), sys.executable, "-m", "nat_agent.daemon",
                     "--name", self.name, "--store", store, "--rewrite", rewrite,
                     "--listen", f"{host}:{self.port}", "--admin", f"{admin_host}:{self.admin_port}",
                     "--replication", self.replication, "--secret-file", str(self.secret_file),
                     *[arg for block in own or [] for arg in ("--own", block)], *extra]
        super().__init__()

    def member(self, synced: bool = True) -> Member:
        """This agent as a member of a replica set (what a controller assigns)."""
        return Member(self.name, self.replication, synced)

    @property
    def admin(self) -> ApiClient:
        """A client of this agent's admin API, signed with its secret; only
        when the admin address is reachable from this process (else `call`)."""
        if not self.admin_from_here:
            raise RuntimeError(f"{self.admin_url} is reachable only inside the agent's namespace; use call()")
        return ApiClient(self.admin_url, self.secret)

    def call(self, route: Route[Req, Resp], body: Req | None = None, **params: str) -> Resp:
        """One admin call: the route's typed response, or an `ApiError` of
        the `MetaFlowError` family, wherever the agent runs."""
        if self.admin_from_here:
            return self.admin.call(route, body, **params)
        assert self.netns is not None
        name = next(n for n, r in vars(ADMIN).items() if r is route)
        out = self.netns.run(sys.executable, "-m", "mininet_scenarios.daemons", self.admin_url,
                             str(self.secret_file), name, codec.dumps(body).decode(), json.dumps(params),
                             check=False, cwd=ROOT)
        if out.returncode:
            raise RuntimeError(f"admin call {route} in the namespace failed: {out.stderr[-1000:]}")
        answer = json.loads(out.stdout)
        if "error" in answer:
            raise _API_ERRORS.get(answer["kind"], ApiError)(answer["error"], answer["status"])
        return codec.from_json(route.response, answer["ok"], strict=False)

    def ready(self) -> bool:
        self.call(ADMIN.health)
        return True


class SiteSyncProcess(DaemonProcess):
    """A site's propagation agent (`metaflow-site-sync`), its queue in
    `queue`, listening on `host`:`port` (inside `netns` if given, and then
    reached from here at `reach`); `route` (``CIDR=HOST:PORT`` each) stands
    in for the network. `outbox` talks to it as a writer does."""

    what = "site-sync"

    def __init__(self, layout: Path, site: str, queue: Path, *, port: int, host: str = "127.0.0.1",
                 reach: str | None = None, netns: NetnsLike | None = None, route: list[str] | None = None,
                 log_path: Path | None = None, extra: tuple[str, ...] = ()) -> None:
        super().__init__()
        self.port, self.log_path = port, log_path
        self.argv = [*(netns.command() if netns else []), sys.executable, "-m", "nat_agent.site_sync",
                     "--layout", str(layout), "--site", site, "--queue", str(queue),
                     "--listen", f"{host}:{port}",
                     *[arg for entry in route or [] for arg in ("--route", entry)], *extra]
        self.outbox = Outbox((reach or host, port), timeout=5.0)

    def ready(self) -> bool:
        return self.outbox.call("PING") is not None

    def backlog(self) -> dict[str, int]:
        """Per site, the updates it has not applied yet."""
        reply = self.outbox.call("BACKLOG")
        assert isinstance(reply, list)
        return {reply[i].decode(): int(reply[i + 1]) for i in range(0, len(reply), 2)}

    def wait_drained(self, timeout: float = 30.0) -> None:
        """Until every site has applied every queued update (or raise)."""
        deadline = time.monotonic() + timeout
        while (left := self.backlog()) and any(left.values()):
            if time.monotonic() > deadline:
                raise RuntimeError(f"{self.what}: still {left} after {timeout} s: {self.log()[-2000:]}")
            time.sleep(0.05)

    def launch(self) -> Self:
        self.outbox.close()   # a connection to the last run is dead
        return super().launch()


def _call_in_namespace(argv: list[str]) -> None:
    """``python -m mininet_scenarios.daemons URL SECRET_FILE ROUTE BODY PARAMS``:
    one admin call, its answer as JSON on stdout (``{"ok": ...}`` or
    ``{"error", "status", "kind"}``), for `AgentProcess.call` in a namespace."""
    url, secret_file, name, body, params = argv
    route: Route[Any, Any] = getattr(ADMIN, name)
    request = codec.loads(route.request, body.encode()) if route.request is not None else None
    try:
        result = ApiClient(url, load_secret(secret_file)).call(route, request, **json.loads(params))
        answer: dict[str, object] = {"ok": codec.to_json(result)}
    except ApiError as exc:
        answer = {"error": str(exc), "status": exc.status, "kind": type(exc).__name__}
    print(json.dumps(answer))


if __name__ == "__main__":
    _call_in_namespace(sys.argv[1:])
