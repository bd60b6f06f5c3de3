"""Install and remove the ``local`` mode's route and rules (`AnyIpPlan`) with ``ip``.

Like the iptables rules, nothing here keeps state: what an agent installed
is found again from its tag (the table and priorities `anyip_plan`
derives from it), so `install` first removes what a killed predecessor
left, and `remove` is safe to call twice.

The reply to a connection accepted on an mdid has the mdid as its source.
The kernel accepts an unusual source for a socket only if the address is
in its ``local`` table or the socket is transparent; ours is in a table of
its own on purpose (see `nat_agent.anyip_plan`), so the listener must be
`transparent_listener` (``IP_TRANSPARENT``, root), and every connection
it accepts inherits that.
"""

from __future__ import annotations

import json
import socket
import subprocess

from nat_agent.anyip_plan import AnyIpPlan

IP_TRANSPARENT = 19
"""From <linux/in.h>; the socket module does not name it."""


class AnyIpError(RuntimeError):
    """An ``ip`` command failed; the message carries its stderr."""


def _ip(*argv: str) -> str:
    proc = subprocess.run(["ip", *argv], capture_output=True, text=True)
    if proc.returncode != 0:
        raise AnyIpError(f"ip {' '.join(argv)}: {proc.stderr.strip() or 'failed'}")
    return proc.stdout


def ours(plan: AnyIpPlan) -> tuple[list[list[str]], list[dict]]:
    """(``ip rule del`` arguments of our rules present, our table's routes)."""
    rules = plan.leftovers(json.loads(_ip("-j", "rule", "show")))
    try:
        routes = json.loads(_ip("-j", "route", "show", "table", str(plan.table)) or "[]")
    except AnyIpError as exc:
        if "does not exist" not in str(exc):
            raise
        routes = []
    return rules, routes


def remove(plan: AnyIpPlan) -> int:
    """Delete our rules and our table's routes; return how many there were."""
    rules, routes = ours(plan)
    for rule in rules:
        _ip(*rule)
    if routes:
        _ip("route", "flush", "table", str(plan.table))
    return len(rules) + len(routes)


def install(plan: AnyIpPlan) -> None:
    """Replace what a predecessor left by the plan's route and rules; on a
    failure, remove what was added and raise (nothing half-installed)."""
    remove(plan)
    try:
        _ip(*plan.route())
        for rule in plan.rules():
            _ip(*rule)
    except AnyIpError:
        remove(plan)
        raise


def transparent_listener(host: str, port: int, backlog: int = 1024, *, reuse_port: bool = False,
                         transparent: bool = True) -> socket.socket:
    """A listening TCP socket that may answer from any address (mdids).
    `reuse_port`: one of several on the same port (the service's worker
    threads), among which the kernel spreads new connections;
    `transparent=False` makes a plain listener."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        if reuse_port:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        if transparent:
            sock.setsockopt(socket.SOL_IP, IP_TRANSPARENT, 1)
        sock.bind((host, port))
        sock.listen(backlog)
        sock.setblocking(False)
    except BaseException:
        sock.close()
        raise
    return sock
