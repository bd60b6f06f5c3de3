"""The few root-namespace commands the scenarios need, raising with stderr on failure."""

from __future__ import annotations

import subprocess


def ip(*argv: str) -> str:
    """Run ``ip argv`` and return its stdout; RuntimeError with ip's message if it fails."""
    return _run("ip", *argv)


def vsctl(*argv: str) -> str:
    """Run ``ovs-vsctl`` with a timeout, so a dead ovsdb-server fails instead of hanging."""
    return _run("ovs-vsctl", "--timeout=10", *argv)


def ofctl(*argv: str) -> str:
    """Run ``ovs-ofctl -O OpenFlow10 argv`` (the only version MetaFlow's switches speak)."""
    return _run("ovs-ofctl", "-O", "OpenFlow10", *argv)


def appctl(*argv: str) -> str:
    """Run ``ovs-appctl argv`` (e.g. ``ofproto/trace``: which entries a packet would take)."""
    return _run("ovs-appctl", *argv)


def link_names() -> list[str]:
    """Interface names in the root namespace (``ip -o link`` prints 'N: name@peer: ...')."""
    return [line.split(":")[1].strip().split("@")[0] for line in ip("-o", "link", "show").splitlines()]


def delete_link(name: str) -> bool:
    """Delete a root-namespace interface; False if it was already gone, which
    happens to a veth whose peer's namespace is being destroyed meanwhile."""
    try:
        ip("link", "del", name)
    except RuntimeError:
        if name in link_names():
            raise
        return False
    return True


def ovs_bridges() -> list[str]:
    return vsctl("list-br").split()


def _run(*argv: str) -> str:
    done = subprocess.run(argv, capture_output=True, text=True)
    if done.returncode:
        raise RuntimeError(f"{' '.join(argv)}: {done.stderr.strip()}")
    return done.stdout
