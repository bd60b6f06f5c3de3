"""`metaflow-controller` as a process: bad flags, its signed REST API, a clean SIGTERM."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from client_lib.api.auth import write_secret
from client_lib.api.clients import ApiClient
from client_lib.api.rest import REST, Heartbeat
from client_lib.errors import ApiError, AuthError, NotFound
from controller.rest import REST_BACKLOG
from mininet_scenarios.daemons import ROOT
from nat_agent.ports import listen_port


def _controller(*args: str) -> list[str]:
    return [sys.executable, "-m", "controller.launcher", *args]


@pytest.mark.parametrize(("args", "message"), [
    (["--secret-file", "/nonexistent/secret"], "cannot read the secret file"),
    (["--space", "10.0.0.1/8"], "--space"),
    (["--bootstrap", "preallocate:0"], "bootstrap must be"),
    (["--heartbeat-timeout", "0"], "--heartbeat-timeout must be positive"),
])
def test_bad_flags_exit_2_with_the_reason(tmp_path: Path, args: list[str], message: str) -> None:
    secret = write_secret(tmp_path / "secret")
    argv = ["--secret-file", str(secret), *args] if args[0] != "--secret-file" else args
    out = subprocess.run(_controller(*argv), cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert out.returncode == 2 and message in out.stderr, out.stderr


def test_a_secret_is_required(tmp_path: Path) -> None:
    out = subprocess.run(_controller(), cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert out.returncode == 2 and "--secret-file" in out.stderr


def test_signed_rest_and_a_clean_shutdown(tmp_path: Path) -> None:
    secret = write_secret(tmp_path / "secret")
    rest_port = listen_port()
    log = open(tmp_path / "controller.log", "wb")
    proc = subprocess.Popen(_controller("--secret-file", str(secret), "--of-port", str(listen_port()),
                                        "--rest-port", str(rest_port)), cwd=ROOT, stdout=log, stderr=log)
    try:
        api = ApiClient(f"http://127.0.0.1:{rest_port}", secret.read_bytes().strip(), timeout=5)
        deadline = time.monotonic() + 30
        while True:
            try:
                tree = api.call(REST.tree)
                break
            except ApiError:
                running = time.monotonic() < deadline and proc.poll() is None
                assert running, (tmp_path / "controller.log").read_text()
                time.sleep(0.2)
        assert not tree.built
        # the listener queues a takeover's burst of registrations (`REST_BACKLOG`): ss shows a
        # listening socket's backlog as its Send-Q
        listening = subprocess.run(["ss", "-ltnH", f"sport = :{rest_port}"], capture_output=True,
                                   text=True, check=True).stdout.split()
        assert int(listening[2]) == min(REST_BACKLOG, int(Path("/proc/sys/net/core/somaxconn").read_text()))
        with pytest.raises(AuthError):
            ApiClient(f"http://127.0.0.1:{rest_port}", None).call(REST.tree)
        with pytest.raises(NotFound):   # a heartbeat from a server never registered: register again
            api.call(REST.heartbeat, Heartbeat(0, [], []), name="nobody")
        with pytest.raises(NotFound):
            api.call(REST.split, name="nobody")
    finally:
        stopping = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        code = proc.wait(15)
        stopped = time.monotonic() - stopping
        log.close()
    assert code == 0, (tmp_path / "controller.log").read_text()
    # A stop once waited 5 s for os-ken's event loop (which never ends) as if it were ours.
    assert stopped < 4, f"SIGTERM to exit took {stopped:.1f} s"
