"""Whether another process listens on the port the service's workers share.

The workers' listeners use ``SO_REUSEPORT`` (one per thread, the kernel
spreading connections among them), and the kernel lets any process of the
same user join such a group: a second agent started on the same port, by
mistake or by two test runs picking the same free port at once, would
silently take half of the connections, and each agent would hold half of
the writes. So after binding, the agent reads its network namespace's TCP
listeners (``/proc/net/tcp``) and refuses to serve if a listener on its
port at an overlapping address (the same one, or either the wildcard) is not
one of its own sockets. Two agents racing each do that after
their own bind, so the later one sees the earlier one and stops.
"""

from __future__ import annotations

import errno
import os
import socket
from collections.abc import Iterable
from pathlib import Path

TCP_TABLE = Path("/proc/net/tcp")
_LISTEN = "0A"
_ANY = "0.0.0.0"


def listeners(table: str, host: str, port: int) -> set[int]:
    """The socket inodes in a ``/proc/net/tcp`` text listening on `port` at
    an address that overlaps `host`: the same one, or either of them the
    wildcard (the kernel would hand such a listener some of our connections)."""
    found = set()
    for line in table.splitlines()[1:]:
        fields = line.split()
        if len(fields) < 10 or fields[3] != _LISTEN:
            continue
        address, bound = fields[1].rsplit(":", 1)
        at = socket.inet_ntoa(bytes.fromhex(address)[::-1])   # the kernel's byte order: little-endian
        if int(bound, 16) == port and (at == host or _ANY in (at, host)):
            found.add(int(fields[9]))
    return found


def foreign_listeners(host: str, port: int, ours: Iterable[socket.socket]) -> set[int]:
    """Listeners overlapping `host`:`port` in this network namespace that are not `ours`."""
    mine = {os.fstat(sock.fileno()).st_ino for sock in ours}
    return listeners(TCP_TABLE.read_text(), host, port) - mine


def refuse_shared(host: str, port: int, ours: Iterable[socket.socket]) -> None:
    """OSError (EADDRINUSE) naming the port if another process listens on it."""
    others = foreign_listeners(host, port, ours)
    if others:
        raise OSError(errno.EADDRINUSE, f"port {port} is already served by another process (socket inode "
                          f"{min(others)}); its connections would be split between us: "
                          "is another agent running on it?")
