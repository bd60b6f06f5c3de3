"""The daemons under a service manager: each started with ``NOTIFY_SOCKET``
naming a socket this test listens on, as systemd does for ``Type=notify``.

READY=1 must come after, never before, the daemon serves. The moment it
arrives the test stops the daemon (SIGSTOP), so it cannot go on to bind or
mount afterwards, and checks from outside what the kernel shows: the ports
accept connections (a stopped process's listening socket still completes
the handshake), the mount is in the mount table. Then it lets the daemon go
on and uses it for real. SIGHUP (with no configuration file: nothing to
re-read) leaves it serving; SIGTERM sends STOPPING=1 and ends it cleanly.
"""

from __future__ import annotations

import os
import secrets
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from client_lib.api.auth import load_secret, write_secret
from client_lib.api.clients import ApiClient
from client_lib.api.rest import REST
from client_lib.constants import DEFAULT_SPACE_CIDR
from client_lib.sdnotify import ENV
from mininet_scenarios.daemons import ROOT, AgentProcess
from mininet_scenarios.fs_mount import FuseMount, mounted
from nat_agent.ports import listen_port

WAIT_S = 30.0


class Manager:
    """The service manager's end: an abstract-namespace datagram socket."""

    def __init__(self) -> None:
        self.name = f"@metaflow-supervision-{secrets.token_hex(8)}"
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.sock.bind("\0" + self.name[1:])
        self.seen: list[dict[str, str]] = []

    def until(self, key: str, proc: subprocess.Popen[bytes], timeout: float = WAIT_S) -> dict[str, str]:
        """The first message that sets `key`, as soon as it arrives; the daemon must stay up meanwhile."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            assert proc.poll() is None, f"the daemon exited with {proc.returncode} before {key}"
            message = self.next(min(0.2, max(0.01, deadline - time.monotonic())))
            if message is not None and key in message:
                return message
        raise AssertionError(f"no {key}=1 within {timeout} s; seen {self.seen}")

    def next(self, timeout: float) -> dict[str, str] | None:
        self.sock.settimeout(timeout)
        try:
            data = self.sock.recv(4096)
        except TimeoutError:
            return None
        message = dict(line.split("=", 1) for line in data.decode().split("\n"))
        self.seen.append(message)
        return message

    def close(self) -> None:
        self.sock.close()


@pytest.fixture
def manager(monkeypatch: pytest.MonkeyPatch) -> Iterator[Manager]:
    """A manager the daemons started by the test report to (they inherit the environment)."""
    made = Manager()
    monkeypatch.setenv(ENV, made.name)
    yield made
    made.close()


def _accepts(port: int) -> bool:
    try:
        socket.create_connection(("127.0.0.1", port), timeout=2).close()
    except OSError:
        return False
    return True


def _ping(port: int) -> bytes:
    with socket.create_connection(("127.0.0.1", port), timeout=5) as conn:
        conn.sendall(b"PING\r\n")
        return conn.recv(64)


def _frozen_at_ready(manager: Manager, proc: subprocess.Popen[bytes]) -> dict[str, str]:
    """Wait for READY=1 and stop the daemon where it stands (SIGCONT lets it go on)."""
    message = manager.until("READY", proc)
    os.kill(proc.pid, signal.SIGSTOP)
    assert not any("READY" in m for m in manager.seen[:-1])
    return message


def _wait_for_log(path: Path, text: str, proc: subprocess.Popen[bytes]) -> None:
    deadline = time.monotonic() + WAIT_S
    while text not in path.read_text(errors="replace"):
        assert proc.poll() is None and time.monotonic() < deadline, path.read_text(errors="replace")[-3000:]
        time.sleep(0.05)


def _controller(secret: Path, of_port: int, rest_port: int, log: Path,
                env: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
    with open(log, "ab") as out:
        return subprocess.Popen([sys.executable, "-m", "controller.launcher", "--secret-file", str(secret),
                                 "--of-port", str(of_port), "--rest-port", str(rest_port)],
                                cwd=ROOT, stdout=out, stderr=out, env=env)


def _stopped_cleanly(manager: Manager, proc: subprocess.Popen[bytes]) -> None:
    proc.send_signal(signal.SIGTERM)
    manager.until("STOPPING", proc, timeout=15)
    assert proc.wait(30) == 0


def test_the_controller_is_ready_once_openflow_and_rest_listen(manager: Manager, tmp_path: Path) -> None:
    secret = write_secret(tmp_path / "secret")
    of_port, rest_port, log = listen_port(), listen_port(), tmp_path / "controller.log"
    proc = _controller(secret, of_port, rest_port, log)
    try:
        ready = _frozen_at_ready(manager, proc)
        try:
            assert _accepts(of_port) and _accepts(rest_port)
        finally:
            os.kill(proc.pid, signal.SIGCONT)
        assert ready["STATUS"] == f"OpenFlow on 127.0.0.1:{of_port}, REST on 127.0.0.1:{rest_port}"
        api = ApiClient(f"http://127.0.0.1:{rest_port}", load_secret(secret), timeout=5)
        assert not api.call(REST.tree).built
        proc.send_signal(signal.SIGHUP)
        _wait_for_log(log, "nothing to re-read", proc)
        assert not api.call(REST.tree).built   # still serving
        _stopped_cleanly(manager, proc)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_a_standalone_agent_is_ready_once_port_9000_serves(manager: Manager, tmp_path: Path) -> None:
    log = tmp_path / "agent.log"
    agent = AgentProcess(f"leveldb:{tmp_path / 'db'}", own=[DEFAULT_SPACE_CIDR], log_path=log)
    proc = agent.launch().proc
    assert proc is not None
    try:
        ready = _frozen_at_ready(manager, proc)
        try:
            assert _accepts(agent.port)
        finally:
            os.kill(proc.pid, signal.SIGCONT)
        assert ready["STATUS"] == f"serving on 127.0.0.1:{agent.port}"
        assert _ping(agent.port) == b"+PONG\r\n"
        proc.send_signal(signal.SIGHUP)
        _wait_for_log(log, "nothing to re-read", proc)
        assert _ping(agent.port) == b"+PONG\r\n"
        _stopped_cleanly(manager, proc)
    finally:
        agent.kill()


def test_an_agent_with_a_controller_is_ready_once_registered(manager: Manager, tmp_path: Path) -> None:
    """Serving but not yet registered (the controller is not up): not ready;
    ready once the controller has it in its registry."""
    secret = write_secret(tmp_path / "secret")
    of_port, rest_port = listen_port(), listen_port()
    url = f"http://127.0.0.1:{rest_port}"
    agent = AgentProcess(f"leveldb:{tmp_path / 'db'}", "--controller", url, "--data-ip", "127.0.0.1",
                         secret_file=secret, log_path=tmp_path / "agent.log")
    proc = agent.launch().proc
    assert proc is not None
    controller = None
    try:
        agent.wait_ready()   # its admin API answers: every part of it is up
        assert _ping(agent.port) == b"+PONG\r\n"
        time.sleep(1.0)
        while manager.next(0.1) is not None:   # everything sent so far
            pass
        assert not any("READY" in m for m in manager.seen)
        assert manager.seen[-1]["STATUS"] == (f"serving on 127.0.0.1:{agent.port}; "
                                              f"registering with the controller at {url}")
        env = {k: v for k, v in os.environ.items() if k != ENV}   # the controller reports elsewhere
        controller = _controller(secret, of_port, rest_port, tmp_path / "controller.log", env)
        ready = manager.until("READY", proc)
        servers = ApiClient(url, load_secret(secret), timeout=5).call(REST.servers).servers
        assert agent.name in servers, servers
        assert ready["STATUS"].endswith(f"registered with the controller at {url}")
        _stopped_cleanly(manager, proc)
    finally:
        agent.kill()
        if controller is not None:
            controller.send_signal(signal.SIGTERM)
            controller.wait(30)


def test_the_mount_is_ready_once_it_answers(manager: Manager, tmp_path: Path,
                                           standalone_agent: AgentProcess) -> None:
    mount = FuseMount(tmp_path / "mnt", via=f"127.0.0.1:{standalone_agent.port}",
                      root=secrets.randbits(62) | 2, log_path=tmp_path / "fs.log")
    mount.path.mkdir()
    with open(tmp_path / "fs.log", "ab") as out:
        mount.proc = proc = subprocess.Popen(mount.argv, cwd=ROOT, stdout=out, stderr=out)
    try:
        ready = _frozen_at_ready(manager, proc)
        try:
            assert mounted(mount.path, proc.pid)
        finally:
            os.kill(proc.pid, signal.SIGCONT)
        assert ready["STATUS"] == f"mounted on {mount.path}"
        (mount.path / "a").write_text("written")
        proc.send_signal(signal.SIGHUP)
        _wait_for_log(tmp_path / "fs.log", "nothing to re-read", proc)
        assert (mount.path / "a").read_text() == "written" and mount.mounted()
        _stopped_cleanly(manager, proc)
        assert not mount.mounted()
    finally:
        mount.kill()


def _controller_with_file(config: Path, log: Path) -> subprocess.Popen[bytes]:
    with open(log, "ab") as out:
        return subprocess.Popen([sys.executable, "-m", "controller.launcher", "--config", str(config)],
                                cwd=ROOT, stdout=out, stderr=out)


def test_sighup_rereads_the_controllers_file_applies_what_it_can_and_keeps_serving_on_a_bad_edit(
        manager: Manager, tmp_path: Path) -> None:
    """The file is re-read over the command line: a live setting is applied,
    one that needs a restart is named and not applied, and an edit that does
    not validate is refused with the file and key while the controller serves on."""
    secret = write_secret(tmp_path / "secret")
    of_port, rest_port, log = listen_port(), listen_port(), tmp_path / "controller.log"
    config = tmp_path / "controller.toml"
    base = f'role = "controller"\nsecret-file = "{secret}"\nof-port = {of_port}\nrest-port = {rest_port}\n'
    config.write_text(base + "load-poll = 1.0\n")
    proc = _controller_with_file(config, log)
    try:
        manager.until("READY", proc)
        api = ApiClient(f"http://127.0.0.1:{rest_port}", load_secret(secret), timeout=5)
        config.write_text(base + "load-poll = 2.5\nlog-level = \"DEBUG\"\n")
        proc.send_signal(signal.SIGHUP)
        _wait_for_log(log, "reload: applied", proc)
        applied = next(line for line in log.read_text().splitlines() if "reload: applied" in line)
        assert "load_poll_s 1.0 -> 2.5" in applied and "log_level 'INFO' -> 'DEBUG'" in applied
        config.write_text(base.replace(f"of-port = {of_port}", f"of-port = {listen_port()}")
                          + "load-poll = 2.5\nlog-level = \"DEBUG\"\n")
        proc.send_signal(signal.SIGHUP)
        _wait_for_log(log, "only applied by a restart", proc)
        assert "of_port" in log.read_text().split("only applied by a restart")[-1].splitlines()[0]
        assert _accepts(of_port)   # the running port stays
        config.write_text(base + "load-poll = -3\n")
        proc.send_signal(signal.SIGHUP)
        _wait_for_log(log, "reload refused", proc)
        refused = next(line for line in log.read_text().splitlines() if "reload refused" in line)
        assert str(config) in refused and "load-poll" in refused
        assert not api.call(REST.tree).built   # still serving
        _stopped_cleanly(manager, proc)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
