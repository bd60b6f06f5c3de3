"""CPU time from /proc, for "microseconds of CPU per operation" figures.

Why /proc rather than timers in the daemons: it counts everything a process
costs, kernel time included (the system calls, and the softirq work the
kernel charges to whichever process was running: packet receive, netfilter),
and it works on any process we started, whatever it is written in.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

TICK = os.sysconf("SC_CLK_TCK")


def pid_of(proc: subprocess.Popen[Any] | None) -> int:
    """The pid of a harness's process (whose `proc` is None until it starts)."""
    if proc is None:
        raise RuntimeError("the process has not been started")
    return proc.pid


def cpu_seconds(pid: int) -> float:
    """utime + stime of a live process (all its threads); 0 once it is gone."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (FileNotFoundError, ProcessLookupError):
        return 0.0
    return (int(fields[11]) + int(fields[12])) / TICK


def children(pid: int) -> list[int]:
    """Direct children (a redis-server under its agent, a NAT worker)."""
    try:
        text = Path(f"/proc/{pid}/task/{pid}/children").read_text()
    except FileNotFoundError:
        return []
    return [int(p) for p in text.split()]


def with_descendants(pids: Iterable[int]) -> list[int]:
    out, todo = [], list(pids)
    while todo:
        pid = todo.pop()
        out.append(pid)
        todo.extend(children(pid))
    return out


def machine_busy_seconds() -> float:
    """All CPUs' non-idle time since boot (every process, ours or not)."""
    fields = [int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    idle = fields[3] + fields[4]
    return (sum(fields[:8]) - idle) / TICK


class CpuMeter:
    """CPU seconds per named group of processes, between two snapshots.
    Children are looked up at each snapshot, so a group follows restarts
    of its helpers."""

    def __init__(self, groups: Mapping[str, Iterable[int]]) -> None:
        self.groups = {name: list(pids) for name, pids in groups.items()}

    def snapshot(self) -> dict[str, float]:
        out = {name: sum(cpu_seconds(p) for p in with_descendants(pids))
               for name, pids in self.groups.items()}
        out["machine"] = machine_busy_seconds()
        return out

    @staticmethod
    def delta(before: dict[str, float], after: dict[str, float]) -> dict[str, float]:
        return {name: after[name] - before[name] for name in before}
