"""The nemesis's faults other than kill -9, each a context manager that undoes exactly what it did.

* `paused`: processes stopped (SIGSTOP) inside the block, continued (SIGCONT)
  after: alive, holding their sockets and leases, answering nothing.
* `cut_off`: a Mininet host cut from some addresses (the controller's, on the
  management network) by iptables rules in the host's own namespace, inserted
  first in INPUT and OUTPUT with a comment naming the scenario, and deleted
  one by one by the same specification: nothing else in the namespace (the
  agent's own rules) is touched, and the data network is not cut at all.
* `slow_disk`: a process's writes to the block device that holds a directory
  throttled by the kernel, so its syncs really wait: a cgroup (v1 blkio) with
  ``blkio.throttle.write_iops_device``, the process and its children moved in
  and back out. A sync is a few write requests, so ``iops`` of 10 makes each
  sync take about 0.3 s instead of a few milliseconds. (Device-mapper's delay
  target would do it too, but this kernel has no device-mapper; the blkio
  throttle needs no loop device and can be put on a running agent.)
"""

from __future__ import annotations

import os
import signal
import subprocess
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from mininet_scenarios.hostns import HostNamespace

BLKIO = Path("/sys/fs/cgroup/blkio")
"""cgroup v1's block I/O controller (cgroup v2's io.max would do the same)."""


class HasProcess(Protocol):
    """An `AgentProcess`, a `ControllerProcess`: anything with a subprocess that may run."""

    @property
    def proc(self) -> subprocess.Popen[bytes] | None: ...


def running_pid(process: HasProcess) -> int | None:
    proc = process.proc
    return proc.pid if proc is not None and proc.poll() is None else None


@contextmanager
def paused(processes: Iterable[HasProcess]) -> Iterator[list[int]]:
    """The processes stopped (SIGSTOP) inside the block; yields their PIDs.
    Those not running are left out."""
    stopped: list[int] = []
    try:
        for process in processes:
            pid = running_pid(process)
            if pid is not None:
                os.kill(pid, signal.SIGSTOP)
                stopped.append(pid)
        yield stopped
    finally:
        for pid in stopped:
            os.kill(pid, signal.SIGCONT)


def cut_rules(addresses: Iterable[str], tag: str) -> list[list[str]]:
    """The iptables rule specifications (chain first) that drop every packet
    to and from `addresses`, each marked with the comment `tag`."""
    rules = []
    for address in sorted(set(addresses)):
        mark = ["-m", "comment", "--comment", tag, "-j", "DROP"]
        rules += [["INPUT", "-s", address, *mark], ["OUTPUT", "-d", address, *mark]]
    return rules


def port_rules(ports: Iterable[int], tag: str) -> list[list[str]]:
    """The iptables rule specifications that drop every TCP packet to and from
    the loopback `ports` (a service listening there, such as one of etcd's
    client ports), each marked with the comment `tag`. On loopback a packet
    passes OUTPUT and then INPUT: INPUT alone cuts both directions."""
    mark = ["-m", "comment", "--comment", tag, "-j", "DROP"]
    return [["INPUT", "-i", "lo", "-p", "tcp", f"--{side}", str(port), *mark]
            for port in sorted(set(ports)) for side in ("dport", "sport")]


class OwnNamespace(HostNamespace):
    """The namespaces this process runs in (the machine's, where the
    controllers and etcd run): commands run as they are, not through
    `mnexec`, which may not enter PID 1's namespaces from a container."""

    def __init__(self) -> None:
        super().__init__("the root namespace", os.getpid())

    def command(self, *argv: str) -> list[str]:
        return list(argv)


ROOT_NS = OwnNamespace()


@contextmanager
def cut_off(hosts: Iterable[HostNamespace], addresses: Iterable[str], tag: str) -> Iterator[None]:
    """Every host in `hosts` cut from `addresses` inside the block (`cut_rules`
    in its namespace); the rules go again after, even on an error."""
    with dropped(hosts, cut_rules(addresses, tag)):
        yield


@contextmanager
def dropped(hosts: Iterable[HostNamespace], rules: list[list[str]]) -> Iterator[None]:
    """`rules` (`cut_rules`, `port_rules`) inserted first in each host's
    namespace inside the block, and deleted one by one by the same
    specification after, even on an error."""
    added: list[tuple[HostNamespace, list[str]]] = []
    try:
        for host in hosts:
            for rule in rules:
                host.run("iptables", "-w", "-I", rule[0], "1", *rule[1:])
                added.append((host, rule))
        yield
    finally:
        failures = []
        for host, rule in reversed(added):
            done = host.run("iptables", "-w", "-D", *rule, check=False)
            if done.returncode:
                failures.append(f"{host.name}: iptables -D {' '.join(rule)}: {done.stderr.strip()}")
        if failures:
            raise RuntimeError("could not remove the cut: " + "; ".join(failures))


def device_of(path: Path) -> str:
    """``major:minor`` of the block device holding `path`, as blkio takes it;
    a clear error for a file system on no block device (tmpfs), which no
    block throttle can slow."""
    dev = os.stat(path).st_dev
    major, minor = os.major(dev), os.minor(dev)
    if not Path(f"/sys/dev/block/{major}:{minor}").exists():
        raise ValueError(f"{path} is on device {major}:{minor}, which is no block device (tmpfs?): "
                         "its syncs cannot be slowed")
    return f"{major}:{minor}"


def process_tree(pid: int) -> list[int]:
    """`pid` and its descendants (an agent and the redis-server it started)."""
    out, todo = [], [pid]
    while todo:
        current = todo.pop()
        out.append(current)
        for task in Path(f"/proc/{current}/task").glob("*"):
            try:
                todo += [int(child) for child in (task / "children").read_text().split()]
            except OSError:
                pass   # a thread or process that just ended
    return out


@dataclass
class Throttle:
    """What `slow_disk` did: the device, the limit, and how many writes went through it slowed."""

    device: str
    write_iops: int
    writes: int = 0


@contextmanager
def slow_disk(process: HasProcess, directory: Path, write_iops: int, name: str) -> Iterator[Throttle]:
    """`process` (and its children) write at most `write_iops` requests a
    second to the device holding `directory`, inside the block; `name`: the
    cgroup's, unique to the run. The process goes back to the root cgroup
    after, and the cgroup is removed."""
    pid = running_pid(process)
    if pid is None:
        raise RuntimeError(f"no running process to slow down: {process}")
    if not (BLKIO / "blkio.throttle.write_iops_device").exists():
        raise RuntimeError(f"{BLKIO} has no blkio throttle: this kernel cannot slow a disk per process")
    throttle = Throttle(device_of(directory), write_iops)
    group = BLKIO / name
    group.mkdir()
    pids: list[int] = []
    try:
        (group / "blkio.throttle.write_iops_device").write_text(f"{throttle.device} {write_iops}\n")
        for member in process_tree(pid):
            (group / "cgroup.procs").write_text(f"{member}\n")
            pids.append(member)
        yield throttle
    finally:
        throttle.writes = _writes(group, throttle.device)
        for member in pids:
            try:
                (BLKIO / "cgroup.procs").write_text(f"{member}\n")
            except ProcessLookupError:
                pass   # it ended meanwhile
        group.rmdir()


def _writes(group: Path, device: str) -> int:
    """Write requests to `device` the cgroup's throttle has seen."""
    for line in (group / "blkio.throttle.io_serviced").read_text().splitlines():
        words = line.split()
        if len(words) == 3 and words[0] == device and words[1] == "Write":
            return int(words[2])
    return 0
