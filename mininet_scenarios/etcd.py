"""Run a one-member etcd (Debian's `etcd-server` 3.4) for controllers that
elect a leader (`--etcd`): tests, the takeover scenario, the failover
benchmark and `make demo-ha` start it the same way.

    with EtcdProcess(tmp_path / "etcd") as etcd:
        ... metaflow-controller --etcd {etcd.url} ...

Client and peer ports are free loopback ports unless given, so several run
side by side. The election timeout is short (`ELECTION_TIMEOUT_MS`): etcd
grants no lease shorter than 1.5 election timeouts (rounded up to whole
seconds), and the controllers' 1 s lease needs one of at most 666 ms. A
one-member cluster never holds an election, so a short timeout costs
nothing here; a real three-member cluster on a LAN takes the same settings
(docs/ha.md).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
import urllib.request
from pathlib import Path
from types import TracebackType

from nat_agent.ports import listen_port

ETCD = os.environ.get("METAFLOW_ETCD", "/usr/bin/etcd")
HEARTBEAT_MS = 50
ELECTION_TIMEOUT_MS = 500
START_WAIT_S = 20.0


class EtcdProcess:
    def __init__(self, data_dir: Path, client_port: int | None = None, peer_port: int | None = None,
                 host: str = "127.0.0.1", name: str = "metaflow", extra_clients: int = 0) -> None:
        """`extra_clients`: more client ports, one per controller, so that one
        controller can be cut from etcd (a packet filter on its port) while
        the others still reach it (the nemesis's partitions)."""
        self.data_dir, self.host, self.name = data_dir, host, name
        self.client_port = client_port or listen_port(host)
        self.client_ports = [self.client_port, *(listen_port(host) for _ in range(extra_clients))]
        self.peer_port = peer_port or listen_port(host)
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return self.urls[0]

    @property
    def urls(self) -> list[str]:
        """Every client URL etcd listens on (`extra_clients`)."""
        return [f"http://{self.host}:{port}" for port in self.client_ports]

    def command(self) -> list[str]:
        peer = f"http://{self.host}:{self.peer_port}"
        return [ETCD, "--name", self.name, "--data-dir", str(self.data_dir),
                "--listen-client-urls", ",".join(self.urls), "--advertise-client-urls", ",".join(self.urls),
                "--listen-peer-urls", peer, "--initial-advertise-peer-urls", peer,
                "--initial-cluster", f"{self.name}={peer}",
                "--heartbeat-interval", str(HEARTBEAT_MS), "--election-timeout", str(ELECTION_TIMEOUT_MS)]

    def start(self) -> EtcdProcess:
        self.data_dir.parent.mkdir(parents=True, exist_ok=True)
        log = open(self.data_dir.with_suffix(".log"), "ab")
        self.proc = subprocess.Popen(self.command(), stdout=log, stderr=log)
        log.close()
        deadline = time.monotonic() + START_WAIT_S
        while not self.healthy():
            if self.proc.poll() is not None or time.monotonic() > deadline:
                said = self.data_dir.with_suffix(".log").read_text()[-2000:]
                raise RuntimeError(f"etcd did not start: {said}")
            time.sleep(0.1)
        return self

    def healthy(self) -> bool:
        try:
            with urllib.request.urlopen(f"{self.url}/health", timeout=1) as answer:
                return bool(json.loads(answer.read()).get("health") == "true")
        except (OSError, ValueError):
            return False

    def signal(self, signum: int) -> None:
        """SIGSTOP / SIGCONT (a paused coordination service), SIGKILL."""
        assert self.proc is not None
        self.proc.send_signal(signum)

    def stop(self) -> int:
        if self.proc is None or self.proc.poll() is not None:
            return self.proc.returncode if self.proc else 0
        self.proc.send_signal(signal.SIGCONT)
        self.proc.terminate()
        return self.proc.wait(15)

    def __enter__(self) -> EtcdProcess:
        return self.start()

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()
