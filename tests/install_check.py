"""`make check-install`'s proof that an agent installed from the wheel serves.

Run by the venv the wheel was installed into (``VENV/bin/python
tests/install_check.py VENV``), so that what it imports is the installed
distribution, not the work tree. It starts that venv's `metaflow-agent`
twice, each time over a new LevelDB store that owns the whole space, on
loopback ports of its own, and sends a SET and a GET with `redis-cli`:

1. as installed: both must be answered by the compiled lane, counted in
   INFO's ``compiled_requests`` (``--fsync always``: under the default
   ``batch`` the lane leaves writes to Python, which waits for the group
   commit);
2. with the extension deleted from the venv: the agent must say once that
   it serves through Python, and answer both there (no ``compiled_requests``).

Not a pytest module: it needs a venv of its own (tests/integration/
test_optional_extension.py is the same check on the work tree, in `make test`).
"""

from __future__ import annotations

import argparse
import socket
import subprocess
import tempfile
import time
from pathlib import Path

import nat_agent  # the installed package, where the extension is
from client_lib.constants import DEFAULT_SPACE_CIDR
from nat_agent.extension import PYTHON_PATH_NOTICE

START_TIMEOUT = 30.0
"""Seconds an agent may take to answer PING."""
COUNTERS = ("cmd_set", "cmd_get", "compiled_requests")
"""INFO's counts of SETs and GETs answered (on either path), and of the lane's answers."""
BY_BOTH = {"cmd_set": 1, "cmd_get": 1}
"""How one SET and one GET move the counts of either path."""


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _cli(port: int, *args: str) -> str:
    out = subprocess.run(["redis-cli", "-h", "127.0.0.1", "-p", str(port), *args],
                         capture_output=True, text=True, timeout=10)
    return out.stdout.strip() if out.returncode == 0 else f"redis-cli failed: {out.stderr.strip()}"


def _info(port: int) -> dict[str, str]:
    pairs = (line.split(":", 1) for line in _cli(port, "INFO").splitlines() if ":" in line)
    return {key: value for key, value in pairs}


def serve_once(bin_dir: Path, work: Path) -> tuple[dict[str, int], str]:
    """Start the agent, SET and GET one key, stop it: how far that moved its
    INFO counters (the readiness PINGs are the lane's too), and its log."""
    port = _free_port()
    secret = work / "secret"
    subprocess.run([str(bin_dir / "metaflowctl"), "secret", str(secret)], check=True, capture_output=True)
    log_path = work / "agent.log"
    argv = [str(bin_dir / "metaflow-agent"), "--name", "check-install", "--store", f"leveldb:{work / 'db'}",
            "--fsync", "always", "--rewrite", "none", "--listen", f"127.0.0.1:{port}",
            "--admin", f"127.0.0.1:{_free_port()}", "--replication", f"127.0.0.1:{_free_port()}",
            "--secret-file", str(secret), "--own", DEFAULT_SPACE_CIDR]
    with open(log_path, "wb") as log:
        agent = subprocess.Popen(argv, stdout=log, stderr=log)
    try:
        deadline = time.monotonic() + START_TIMEOUT
        while _cli(port, "PING") != "PONG":
            if agent.poll() is not None or time.monotonic() > deadline:
                raise SystemExit(f"the agent did not come up:\n{log_path.read_text()}")
            time.sleep(0.1)
        before = _info(port)
        replies = (_cli(port, "SET", "/check-install", "served"), _cli(port, "GET", "/check-install"))
        if replies != ("OK", "served"):
            raise SystemExit(f"SET and GET answered {replies}")
        after = _info(port)
    finally:
        agent.terminate()
        agent.wait(timeout=30)
    moved = {name: int(after.get(name, 0)) - int(before.get(name, 0)) for name in COUNTERS}
    return moved, log_path.read_text()


def _fail(what: str, moved: dict[str, int], log: str) -> None:
    raise SystemExit(f"{what}: INFO counters moved by {moved}\n{log}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("venv", type=Path, help="a venv that installed metaflow-sdn[agent] from the wheel")
    venv = parser.parse_args().venv.resolve()
    bin_dir = venv / "bin"
    package = Path(nat_agent.__file__).resolve().parent
    if venv not in package.parents:
        raise SystemExit(f"nat_agent is imported from {package}, not from {venv} (PYTHONPATH?)")
    extension = sorted(package.glob("_fastpath*.so"))
    if not extension:
        raise SystemExit(f"the wheel installed no extension into {package}")
    with tempfile.TemporaryDirectory(prefix="install-check-") as tmp:
        work = Path(tmp, "compiled")
        work.mkdir()
        moved, log = serve_once(bin_dir, work)
        if moved != {**BY_BOTH, "compiled_requests": 2} or PYTHON_PATH_NOTICE in log:
            _fail("SET and GET were not both answered by the compiled lane", moved, log)
        print(f"  agent with {extension[0].name}: SET and GET answered by the compiled lane ({moved})")
        for path in extension:
            path.unlink()
        work = Path(tmp, "python")
        work.mkdir()
        moved, log = serve_once(bin_dir, work)
        if moved != {**BY_BOTH, "compiled_requests": 0} or log.count(PYTHON_PATH_NOTICE) != 1:
            _fail("SET and GET were not both answered by the Python path, said once", moved, log)
        notice = next(line for line in log.splitlines() if PYTHON_PATH_NOTICE in line)
        print(f"  agent without it: SET and GET answered by the Python path ({moved}); it logged:",
              notice.split(": ", 1)[1])


if __name__ == "__main__":
    main()
