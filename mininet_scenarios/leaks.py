"""Unique name prefixes, and finding what carries one after a teardown.

Other processes share this machine's OVS, root namespace and process table,
so a scenario names everything it creates with a prefix nobody else uses and
removes exactly that; `leaks` lists what is still there. The prefix is "mf",
this process's PID in base 36 (fixed width, so no two live processes can
collide) and one base-36 digit counting the scenarios of this process.

Mininet hosts live in anonymous network namespaces, which exist as long as
a process is inside them; `leaks` finds them through the namespace inodes
a scenario recorded, and the processes through their command lines:
Mininet's shells carry ``mininet:<node>``, agents ``--name <host>`` and
paths below the scenario's ``<prefix>-*`` temporary directory.
"""

from __future__ import annotations

import itertools
import os
import tempfile
from collections.abc import Iterable
from pathlib import Path

from mininet_scenarios.syscmd import delete_link, ip, link_names, ovs_bridges, vsctl

_DIGITS = "0123456789abcdefghijklmnopqrstuvwxyz"
_counter = itertools.count()


def unique_prefix() -> str:
    """A name prefix no other live process can produce (6-7 characters)."""
    width = len(_base36(int(Path("/proc/sys/kernel/pid_max").read_text())))
    return f"mf{_base36(os.getpid()).rjust(width, '0')}{_DIGITS[next(_counter) % 36]}"


def netns_inode(pid: int) -> int:
    """The inode that identifies the network namespace process `pid` is in."""
    return os.stat(f"/proc/{pid}/ns/net").st_ino


def leaks(prefix: str, netns_inodes: Iterable[int] = ()) -> dict[str, list[str]]:
    """What still exists of a scenario with this prefix, by kind; empty when all is gone.

    Kinds: ``ovs_bridges``, ``interfaces`` (root namespace), ``netns`` (named
    ones with the prefix, and any of `netns_inodes` still held by a process),
    ``processes`` (PID and command line), ``tmpdirs``.
    """
    inodes = set(netns_inodes)
    processes, held = [], []
    for pid, argv in _processes():
        if any(arg.startswith((prefix, f"mininet:{prefix}")) or f"/{prefix}" in arg for arg in argv):
            processes.append(f"{pid} {' '.join(argv)}")
        try:
            inode = netns_inode(pid)
        except OSError:  # gone meanwhile
            continue
        if inode in inodes:
            held.append(f"net:[{inode}] held by {pid} {' '.join(argv)}")
    named = [line.split()[0] for line in ip("netns", "list").splitlines() if line.startswith(prefix)]
    found = {
        "ovs_bridges": [b for b in ovs_bridges() if b.startswith(prefix)],
        "interfaces": [name for name in link_names() if name.startswith(prefix)],
        "netns": named + held,
        "processes": processes,
        "tmpdirs": [str(p) for p in Path(tempfile.gettempdir()).glob(f"{prefix}-*")],
    }
    return {kind: names for kind, names in found.items() if names}


def sweep(prefix: str) -> list[str]:
    """Delete OVS bridges, then root-namespace interfaces, named with `prefix`; returns them.

    A safety net after a teardown that failed halfway: with a unique prefix,
    everything so named was made by this scenario.
    """
    removed = []
    for bridge in ovs_bridges():
        if bridge.startswith(prefix):
            vsctl("--if-exists", "del-br", bridge)
            removed.append(f"bridge {bridge}")
    for name in link_names():
        if name.startswith(prefix) and delete_link(name):
            removed.append(f"interface {name}")
    return removed


def _processes() -> Iterable[tuple[int, list[str]]]:
    """(pid, argv) of every other process that is still there when read."""
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            raw = (entry / "cmdline").read_bytes()
        except OSError:
            continue
        if raw:
            yield int(entry.name), raw.rstrip(b"\0").decode(errors="replace").split("\0")


def _base36(n: int) -> str:
    out = ""
    while True:
        n, digit = divmod(n, 36)
        out = _DIGITS[digit] + out
        if not n:
            return out
