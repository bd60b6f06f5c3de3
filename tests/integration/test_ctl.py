"""`metaflowctl get|put|del|stat` against a real agent."""

from __future__ import annotations

import json
import subprocess
import sys

from mininet_scenarios.daemons import ROOT, AgentProcess


def ctl(proc: AgentProcess, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "controller.ctl", *args, "--via", f"{proc.host}:{proc.port}"],
                          cwd=ROOT, capture_output=True, text=True, timeout=30)


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
        assert ctl(proc, "del", "/raw").returncode == 0
        missing = ctl(proc, "get", "/raw")
        assert missing.returncode == 1 and "not found: /raw -> 100." in missing.stderr
        bad = ctl(proc, "get", "relative/path")
        assert bad.returncode == 2 and "must be absolute" in bad.stderr
