"""The three daemons started for real with ``--config FILE``: a bad file exits
2 naming the file and the key, with nothing touched (the ports it would have
bound still free, no store made, nothing mounted); a good file's settings
take effect, and a flag on the command line overrides the file's."""

from __future__ import annotations

import secrets
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from client_lib import MetaFlowClient
from client_lib.api.admin import ADMIN
from client_lib.api.auth import write_secret
from client_lib.api.clients import ApiClient
from client_lib.api.rest import REST
from client_lib.constants import DEFAULT_SPACE_CIDR
from client_lib.errors import ApiError, MetaFlowError
from mininet_scenarios.daemons import ROOT, AgentProcess
from mininet_scenarios.fs_mount import FuseMount
from nat_agent.ports import listen_port


def _free(port: int) -> bool:
    """Whether nothing listens on loopback `port` (a bind would succeed)."""
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def _run(module: str, *argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", module, *argv], cwd=ROOT, capture_output=True, text=True,
                          timeout=60)


@pytest.fixture
def secret(tmp_path: Path) -> Path:
    return write_secret(tmp_path / "secret")


@pytest.mark.parametrize(("bad", "key", "what"), [
    ('workers = "2"', "workers", "must be an integer, not a string"),
    ("workers = 65", "workers", "--workers must be between 0 and 64"),
    ('fsync = "sometimes"', "fsync", "must be one of 'always', 'batch', 'off'"),
    ("own = \"100.64.0.0/10\"", "own", "must be a list"),
    ('listen-port = 9000', "listen-port", "unknown key"),
])
def test_the_agent_refuses_a_bad_file_before_it_opens_anything(tmp_path: Path, secret: Path, bad: str,
                                                                key: str, what: str) -> None:
    ports = [listen_port() for _ in range(3)]
    store = tmp_path / "store"
    config = tmp_path / "agent.toml"
    config.write_text(f'role = "agent"\nsecret-file = "{secret}"\nstore = "leveldb:{store}"\n'
                      f'rewrite = "none"\nlisten = "127.0.0.1:{ports[0]}"\nadmin = "127.0.0.1:{ports[1]}"\n'
                      f'replication = "127.0.0.1:{ports[2]}"\n{bad}\n')
    out = _run("nat_agent.daemon", "--config", str(config))
    assert out.returncode == 2, out.stderr
    assert f"metaflow-agent: error: {config}: key '{key}': " in out.stderr and what in out.stderr, out.stderr
    assert all(_free(port) for port in ports) and not store.exists()


def test_the_agent_runs_with_its_file_and_a_flag_overrides_it(tmp_path: Path, secret: Path) -> None:
    from_file = listen_port()
    config = tmp_path / "agent.toml"
    config.write_text(f'role = "agent"\nname = "from-file"\nlisten = "127.0.0.1:{from_file}"\n'
                      f'capacity = 12345\nworkers = 1\nmax-value = 64\n')
    # AgentProcess gives --name, --listen, --store, --secret-file ... on the command line: they win.
    with AgentProcess(f"leveldb:{tmp_path / 'store'}", "--config", str(config), own=[DEFAULT_SPACE_CIDR],
                      secret_file=secret, log_path=tmp_path / "agent.log") as agent:
        health = agent.call(ADMIN.health)
        assert (health.name, health.data_port, health.capacity) == (agent.name, agent.port, 12345)
        assert _free(from_file)
        with MetaFlowClient(via=f"{agent.host}:{agent.port}") as client:
            client.put("/configured", b"x" * 64)
            assert client.get("/configured") == b"x" * 64
            with pytest.raises(MetaFlowError, match="exceeds the limit of 64 bytes"):   # the file's max-value
                client.put("/configured", b"x" * 65)


def test_the_controller_refuses_a_bad_file_before_it_listens(tmp_path: Path, secret: Path) -> None:
    of_port, rest_port = listen_port(), listen_port()
    config = tmp_path / "controller.toml"
    config.write_text(f'secret-file = "{secret}"\nof-port = {of_port}\nrest-port = {rest_port}\n'
                      "table-budget = -1\n")
    out = _run("controller.launcher", "--config", str(config))
    assert out.returncode == 2, out.stderr
    assert f"metaflow-controller: error: {config}: key 'table-budget': --table-budget must be 0 (no limit) " \
           "or positive, not -1" in out.stderr, out.stderr
    assert _free(of_port) and _free(rest_port)


def test_the_controller_serves_on_the_ports_of_its_file(tmp_path: Path, secret: Path) -> None:
    of_port, rest_port = listen_port(), listen_port()
    config = tmp_path / "controller.toml"
    config.write_text(f'role = "controller"\nsecret-file = "{secret}"\nof-port = {of_port}\n'
                      f'rest-port = {rest_port}\nlog-level = "WARNING"\n')
    log = open(tmp_path / "controller.log", "wb")
    proc = subprocess.Popen([sys.executable, "-m", "controller.launcher", "--config", str(config)], cwd=ROOT,
                            stdout=log, stderr=log)
    try:
        api = ApiClient(f"http://127.0.0.1:{rest_port}", secret.read_bytes().strip(), timeout=5)
        deadline = time.monotonic() + 30
        while True:
            try:
                assert not api.call(REST.tree).built
                break
            except ApiError:
                running = time.monotonic() < deadline and proc.poll() is None
                assert running, (tmp_path / "controller.log").read_text()
                time.sleep(0.2)
        assert not _free(of_port)
    finally:
        proc.send_signal(signal.SIGTERM)
        code = proc.wait(15)
        log.close()
    assert code == 0, (tmp_path / "controller.log").read_text()


def test_the_file_system_refuses_a_bad_file_without_mounting(tmp_path: Path) -> None:
    mountpoint = tmp_path / "mnt"
    mountpoint.mkdir()
    config = tmp_path / "fs.toml"
    config.write_text(f'role = "fs"\nmountpoint = "{mountpoint}"\nentry-timeout = "1s"\n')
    out = _run("client_lib.fs.cli", "--config", str(config))
    assert out.returncode == 2, out.stderr
    assert f"metaflow-fs: error: {config}: key 'entry-timeout': must be a number, not a string" in out.stderr
    assert not mountpoint.is_mount()


def test_the_file_system_mounts_through_the_agent_its_file_names(tmp_path: Path,
                                                                 standalone_agent: AgentProcess) -> None:
    config = tmp_path / "fs.toml"
    # No --via on the command line: without the file's, requests would go to MetaDataIDs nobody routes here.
    config.write_text(f'role = "fs"\nvia = "{standalone_agent.host}:{standalone_agent.port}"\n'
                      f"root = {secrets.randbits(62) | 2}\ndeadline = 5.0\n")
    with FuseMount(tmp_path / "mnt", "--config", str(config), log_path=tmp_path / "fs.log") as fs:
        (fs.path / "hello.txt").write_text("configured\n")
        assert (fs.path / "hello.txt").read_text() == "configured\n"
        assert [p.name for p in fs.path.iterdir()] == ["hello.txt"]
