"""The group commit's sync of a LevelDB directory's logs, under strace.

`SyncGroup` (``durable.rs``, ``logs.rs``) keeps the directory's stream and
its logs open, and at each sync reads the directory again and opens only a
log it has not seen. What each sync must do, read from the system calls a
process makes around it (strace ``-y`` names each descriptor's file):

* the first: open the directory and list it, open the log, fdatasync it,
  fsync the directory;
* one with nothing new: list the open stream again, fdatasync the open log,
  and open nothing;
* after LevelDB starts a new log (a memtable switch, which closes the old
  one unsynced): list, open the new one only, fdatasync both, fsync the
  directory;
* after the old log is removed (compacted): list, fdatasync the one left,
  no directory sync (no log is new).
"""

from __future__ import annotations

import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

pytestmark = pytest.mark.timeout(60)

SCRIPT = textwrap.dedent("""
    import os, sys
    from client_lib.api.metrics import REQUEST_BUCKETS
    from nat_agent._fastpath import Histogram, SyncGroup

    directory = sys.argv[1]
    def log(name, data=b"x"):
        with open(os.path.join(directory, name), "ab") as f:
            f.write(data)
    group = SyncGroup(seconds=Histogram(REQUEST_BUCKETS), directory=directory, suffix=".log")
    def sync(step):
        os.write(2, f"step {step}\\n".encode())
        ticket = group.begin([b"k"])
        group.end(ticket)
        group.sync_through(ticket)
        os.write(2, b"step -\\n")  # between syncs: the script's own calls
    log("000003.log"); log("MANIFEST-000002")
    sync("first")
    log("000003.log")
    sync("nothing new")
    log("000005.log"); log("000003.log")
    sync("new log")
    os.unlink(os.path.join(directory, "000003.log")); log("000005.log")
    sync("old log gone")
    os.write(2, b"step end\\n")
""")

CALL = re.compile(r"^(?:\d+ +)?(openat|getdents64|fdatasync|fsync)\((.*)$")
STEP = re.compile(r'write\(2<.*?, "step ([^"\\]*)')


def trace_steps(tmp_path: Path) -> dict[str, list[str]]:
    """Each step's calls: ``name path`` (the descriptor's or the opened path)."""
    directory = tmp_path / "db"
    directory.mkdir()
    trace = tmp_path / "trace"
    subprocess.run(["strace", "-f", "-y", "-qq", "-o", str(trace),
                    "-e", "trace=openat,getdents64,fdatasync,fsync,write",
                    sys.executable, "-c", SCRIPT, str(directory)], check=True, timeout=50)
    steps: dict[str, list[str]] = {}
    step = None
    for line in trace.read_text().splitlines():
        if (marker := STEP.search(line)) is not None:
            step = marker.group(1)
            steps[step] = []
            continue
        call = CALL.match(line)
        if step is None or call is None or str(directory) not in call.group(2):
            continue
        name, args = call.groups()
        path = re.search(r'"([^"]*)"' if name == "openat" else r"<([^>]*)>", args)
        assert path is not None, line
        steps[step].append(f"{name} {Path(path.group(1)).name}")
    del steps["-"]
    return steps


def opened_or_synced(calls: list[str]) -> list[str]:
    """A step's calls but its listing (``getdents64`` of the kept stream)."""
    return [call for call in calls if call != "getdents64 db"]


def test_the_directory_and_its_logs_stay_open_between_syncs(tmp_path: Path) -> None:
    steps = trace_steps(tmp_path)
    assert set(steps) == {"first", "nothing new", "new log", "old log gone", "end"}
    first = steps["first"]
    assert "getdents64 db" in first
    assert opened_or_synced(first) == ["openat db", "openat 000003.log", "fdatasync 000003.log", "fsync db"]
    nothing_new = steps["nothing new"]
    assert "getdents64 db" in nothing_new   # listed at every sync: no watch to miss a new log
    assert opened_or_synced(nothing_new) == ["fdatasync 000003.log"]
    new = steps["new log"]
    assert "getdents64 db" in new
    assert opened_or_synced(new) == ["openat 000005.log", "fdatasync 000003.log", "fdatasync 000005.log",
                                     "fsync db"]
    gone = steps["old log gone"]
    assert "getdents64 db" in gone
    assert opened_or_synced(gone) == ["fdatasync 000005.log"]
