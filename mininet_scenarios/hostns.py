"""Run commands inside a Mininet host's network namespace, with exit codes.

Mininet's own ``host.cmd`` goes through the host's interactive shell and
returns only the output, so a failed ``ip route add`` would pass unnoticed.
`HostNamespace` runs each command as its own process attached to the host's
namespaces with ``mnexec -a <pid>`` (what ``host.popen`` does too), and has
the ``command``/``run`` interface of `netns_pair.Namespace`, so
`mininet_scenarios.daemons.AgentProcess` can launch an agent inside a Mininet host.

``-d`` (setsid) puts every process in its own session: neither a Ctrl-C in
the terminal nor Mininet's SIGHUP to the host's shell group reaches an
agent, which is stopped by its PID with SIGTERM so it can remove its
iptables rules and close its store.
"""

from __future__ import annotations

import subprocess


class HostNamespace:
    """The namespaces of one Mininet host, addressed by its shell's PID."""

    def __init__(self, name: str, pid: int) -> None:
        self.name = name
        self.pid = pid

    def command(self, *argv: str) -> list[str]:
        """`argv` wrapped so that it runs inside the host; the process keeps its PID."""
        return ["mnexec", "-d", "-a", str(self.pid), *argv]

    def run(self, *argv: str, check: bool = True, timeout: float = 60,
            **kwargs) -> subprocess.CompletedProcess[str]:
        """Run `argv` in the host to completion, output captured as text; raises
        RuntimeError naming the host, the command and its stderr on failure when `check`."""
        kwargs.setdefault("capture_output", True)
        kwargs.setdefault("text", True)
        done = subprocess.run(self.command(*argv), timeout=timeout, **kwargs)
        if check and done.returncode:
            raise RuntimeError(f"{self.name}: {' '.join(argv)} exited with {done.returncode}: "
                               f"{(done.stderr or '').strip()}")
        return done
