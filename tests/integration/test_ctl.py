"""`metaflowctl get|put|del|stat` against a real agent, and its errors."""

from __future__ import annotations

import json
import subprocess
import sys
import time

import pytest

from client_lib import mdid
from mininet_scenarios.daemons import ROOT, AgentProcess
from tests.integration.resp_peer import Peer, resp, silent
from tests.two_servers import HIGH, LOW


def metaflowctl(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "controller.ctl", *args],
                          cwd=ROOT, capture_output=True, text=True, timeout=30, check=False)


def ctl(proc: AgentProcess, *args: str) -> subprocess.CompletedProcess[str]:
    return metaflowctl(*args, "--via", f"{proc.host}:{proc.port}")


def test_put_stat_get_del(tmp_path):
    with AgentProcess(f"leveldb:{tmp_path / 'db'}", own=["100.64.0.0/10"]) as proc:
        out = ctl(proc, "put", "/data/set1/part-0", "--size", "1000")
        assert out.returncode == 0 and out.stdout.startswith("stored /data/set1/part-0 -> 100.")
        out = ctl(proc, "stat", "/data//set1/part-0")
        assert out.returncode == 0
        meta = json.loads(out.stdout.split("\n", 1)[1])
        assert meta["path"] == "/data/set1/part-0" and meta["size"] == 1000 and meta["kind"] == "file"
        assert ctl(proc, "put", "/data/set1", "--dir").returncode == 0
        assert json.loads(ctl(proc, "get", "/data/set1").stdout)["kind"] == "dir"
        assert ctl(proc, "put", "/raw", "--value", "plain text").returncode == 0
        assert ctl(proc, "get", "/raw").stdout.strip() == "plain text"
        not_metadata = ctl(proc, "stat", "/raw")
        assert not_metadata.returncode == 2
        assert not_metadata.stderr.startswith("metaflowctl stat: not a metadata object")
        assert ctl(proc, "del", "/raw").returncode == 0
        missing = ctl(proc, "get", "/raw")
        assert missing.returncode == 1 and "not found: /raw -> 100." in missing.stderr
        bad = ctl(proc, "get", "relative/path")
        assert bad.returncode == 2 and "must be absolute" in bad.stderr


@pytest.mark.parametrize("args, message", [
    (["get", "/a", "--space", "nonsense"], "metaflowctl get: space 'nonsense' is not a CIDR block"),
    (["put", "/a", "--port", "0", "--via", "127.0.0.1"], "metaflowctl put: port must be in 1..65535"),
    (["del", "/a", "--via", "127.0.0.1:x"], "metaflowctl del: via '127.0.0.1:x'"),
    (["stat", "/a", "--deadline", "0"], "metaflowctl stat: deadline must be a positive number"),
    (["put", "/f", "--size", "-1", "--via", "127.0.0.1:1"], "metaflowctl put: size must be at least 0"),
    (["get", "/a", "--route", "100.64.0.0/11=127.0.0.1"],
     "metaflowctl get: the routes leave 100.96.0.0 of 100.64.0.0/10 uncovered"),
    (["get", "/a", "--route", "100.64.0.0/10=127.0.0.1", "--via", "127.0.0.1"],
     "metaflowctl get: give --via or --route, not both"),
])
def test_bad_arguments_are_one_line_errors_in_the_family(args, message):
    out = metaflowctl(*args)
    assert out.returncode == 2 and out.stderr.startswith(message), out.stderr
    assert "Traceback" not in out.stderr


def test_deadline_bounds_a_request_to_a_server_that_never_answers():
    with Peer(silent) as peer:
        started = time.monotonic()
        out = metaflowctl("get", "/a", "--via", peer.via, "--deadline", "1")
        elapsed = time.monotonic() - started
    assert out.returncode == 2, out.stderr
    assert out.stderr.startswith("metaflowctl get: /a (deadline 1 s): gave up after 1 attempts: timeout")
    assert elapsed < 1 + 5  # the interpreter's start on a busy machine; 10 x 2 s without a deadline


def test_server_errors_are_reported_not_raised():
    with Peer(resp(lambda _c: b"-ERR value too large\r\n")) as peer:
        out = metaflowctl("put", "/a", "--value", "x", "--via", peer.via)
    assert out.returncode == 2 and out.stderr == "metaflowctl put: ERR value too large\n"


def test_routes_send_each_path_to_the_agent_that_owns_its_id(
        two_servers: tuple[AgentProcess, AgentProcess]) -> None:
    """``--route``: the switches' table without a fabric. Every path is
    stored on the agent whose half holds its ID, and read back through
    the routes; asked directly, the other agent does not serve it."""
    low, high = two_servers
    routes = ["--route", f"{LOW}={low.host}:{low.port}", "--route", f"{HIGH}={high.host}:{high.port}"]
    paths = [f"/routes/{n}" for n in range(8)]
    assert {LOW.contains(mdid(p)) for p in paths} == {True, False}   # both halves are used
    for path in paths:
        assert metaflowctl("put", path, "--value", path, *routes).returncode == 0
        assert metaflowctl("get", path, *routes).stdout.strip() == path
        owner, other = (low, high) if LOW.contains(mdid(path)) else (high, low)
        assert ctl(owner, "get", path).stdout.strip() == path
        assert "MOVED" in ctl(other, "get", path, "--deadline", "0.3").stderr
