"""Two network namespaces joined by a veth pair: a client and a server.

The smallest real network for the agent's data path: the client namespace
routes the MetaDataID space to the server's address, so a connection to any
mdid leaves the client, crosses the veth and arrives at the server with the
mdid as destination, exactly as the switches deliver it. Needs root and
iproute2.

    with NetnsPair() as net:
        server = net.server.popen(sys.executable, "echo_server.py")
        out = net.client.run(sys.executable, "client.py", "100.64.1.2").stdout

Names (namespaces and interfaces) carry a prefix, this process's id and a
counter, so concurrent test processes never collide. Everything is torn down
on exit, also when the body raises: processes started with `popen` are
stopped first (a namespace lives on while a process is inside it), then the
namespaces are deleted, which deletes the veth ends inside them.
"""

from __future__ import annotations

import ipaddress
import itertools
import os
import subprocess
from types import TracebackType

from client_lib.constants import DEFAULT_SPACE_CIDR
from mininet_scenarios.syscmd import ip as _ip

_counter = itertools.count()


class Namespace:
    """One named network namespace; commands run in it via ``ip netns exec``."""

    def __init__(self, name: str) -> None:
        self.name = name
        self._processes: list[subprocess.Popen] = []

    def command(self, *argv: str) -> list[str]:
        """`argv` wrapped so that it runs inside this namespace."""
        return ["ip", "netns", "exec", self.name, *argv]

    def run(self, *argv: str, check: bool = True, timeout: float = 60,
            **kwargs) -> subprocess.CompletedProcess[str]:
        """Run `argv` in the namespace to completion; stdout/stderr captured as
        text unless overridden; raises CalledProcessError (with the output)
        on a non-zero exit when `check`."""
        kwargs.setdefault("capture_output", True)
        kwargs.setdefault("text", True)
        return subprocess.run(self.command(*argv), check=check, timeout=timeout, **kwargs)

    def popen(self, *argv: str, **kwargs) -> subprocess.Popen:
        """Start `argv` in the namespace and return it.

        ``ip netns exec`` execs the command, so the Popen's pid is the
        command's own and signals reach it directly. The process is stopped
        (SIGTERM, then SIGKILL after 5 s) when the pair is torn down, if it
        is still running then.
        """
        process = subprocess.Popen(self.command(*argv), **kwargs)
        self._processes.append(process)
        return process

    def stop_processes(self) -> None:
        """Stop every process started with `popen` that is still running."""
        for process in self._processes:
            if process.poll() is None:
                process.terminate()
        for process in self._processes:
            try:
                process.wait(timeout=5)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        self._processes.clear()


class NetnsPair:
    """A client and a server namespace joined by one veth pair.

    Attributes after ``__enter__``: `client`, `server` (`Namespace`),
    `client_ip`, `server_ip` (addresses on the veth, /`subnet`'s prefix
    length), `client_if`, `server_if` (veth end names). Both namespaces have
    loopback up; the client routes `space` via `server_ip`. Each namespace has
    its own addresses and iptables, so every pair may use the same `subnet`.

    `mtu` sets both veth ends (up to 65535): a large one makes the kernel
    hand whole tens-of-KB TCP segments to netfilter.
    `prefix` (at most 4 characters) starts every name, so leftovers of a
    crashed run can be found (``ip netns list | grep <prefix>``).
    """

    def __init__(self, space: str = DEFAULT_SPACE_CIDR, subnet: str = "10.199.0.0/24",
                 mtu: int = 1500, prefix: str = "mfns") -> None:
        if not 1 <= len(prefix) <= 4 or not prefix.isalnum():
            raise ValueError(f"prefix {prefix!r}: want 1-4 letters or digits")
        network = ipaddress.IPv4Network(subnet)
        self.space = str(ipaddress.IPv4Network(space))
        self.mtu = mtu
        self.prefixlen = network.prefixlen
        self.client_ip = str(network.network_address + 1)
        self.server_ip = str(network.network_address + 2)
        # 'x' separates pid and counter (both hex) so names stay unique and
        # within the 15 characters an interface name may have.
        base = f"{prefix}{os.getpid():x}x{next(_counter):x}"
        if len(base) + 1 > 15:
            raise ValueError(f"interface names from {base!r} would exceed 15 characters")
        self.client = Namespace(f"{base}c")
        self.server = Namespace(f"{base}s")
        self.client_if = f"{base}c"
        self.server_if = f"{base}s"
        self._created: list[Namespace] = []

    def __enter__(self) -> NetnsPair:
        try:
            self._build()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()

    def names(self) -> tuple[str, ...]:
        """Every namespace and interface name this pair uses (for leak checks)."""
        return (self.client.name, self.server.name, self.client_if, self.server_if)

    def _build(self) -> None:
        for ns in (self.client, self.server):
            _ip("netns", "add", ns.name)
            self._created.append(ns)
        # Created directly inside the namespaces: nothing ever appears in the
        # namespace the tests run in, so nothing can leak there.
        _ip("link", "add", self.client_if, "netns", self.client.name, "mtu", str(self.mtu),
            "type", "veth", "peer", "name", self.server_if, "netns", self.server.name,
            "mtu", str(self.mtu))
        for ns, intf, address in ((self.client, self.client_if, self.client_ip),
                                  (self.server, self.server_if, self.server_ip)):
            _ip("-n", ns.name, "addr", "add", f"{address}/{self.prefixlen}", "dev", intf)
            _ip("-n", ns.name, "link", "set", intf, "up")
            _ip("-n", ns.name, "link", "set", "lo", "up")
        _ip("-n", self.client.name, "route", "add", self.space, "via", self.server_ip)

    def close(self) -> None:
        """Stop the namespaces' processes and delete the namespaces (idempotent)."""
        for ns in (self.client, self.server):
            ns.stop_processes()
        failures: list[RuntimeError] = []
        while self._created:
            try:
                _ip("netns", "del", self._created.pop().name)
            except RuntimeError as exc:
                failures.append(exc)
        if failures:
            raise failures[0]
