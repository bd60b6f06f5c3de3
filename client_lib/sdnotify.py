"""systemd's readiness protocol (sd_notify(3)), written with the standard library.

A unit of ``Type=notify`` starts a daemon with ``NOTIFY_SOCKET`` naming a
datagram socket: a path, or an abstract-namespace name written with a
leading ``@``. The daemon sends newline-separated ``KEY=VALUE`` assignments
to it: ``READY=1`` once it really serves (systemd holds back the units
that wait for it until then), ``STOPPING=1`` when it starts to shut down,
``RELOADING=1`` when a SIGHUP's reload begins (then ``READY=1`` again when
it ends), and ``STATUS=`` a line ``systemctl status`` shows. Outside
systemd (no ``NOTIFY_SOCKET``) every call is a no-op, so the daemons call
these unconditionally.

The daemons (controller, agent, mount) all import this module, which is why
it sits in the client library, which imports nothing but the standard library.
"""

from __future__ import annotations

import logging
import os
import socket
import time

ENV = "NOTIFY_SOCKET"

log = logging.getLogger("metaflow.sdnotify")


def _address(name: str) -> str:
    """The socket address of a ``NOTIFY_SOCKET`` value: ``@name`` is the
    abstract namespace, which Python writes with a leading NUL."""
    return "\0" + name[1:] if name.startswith("@") else name


def notify(*assignments: str) -> bool:
    """Send `assignments` (``"READY=1"``, ...) in one datagram to the service
    manager; False when there is none to tell (``NOTIFY_SOCKET`` unset) or the
    message could not be sent (logged: the daemon runs on, as sd_notify's
    callers do, since readiness is advice to the manager, not a condition of
    serving)."""
    name = os.environ.get(ENV)
    if not name:
        return False
    message = "\n".join(assignments).encode()
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC) as sock:
            sock.connect(_address(name))
            sock.sendall(message)
    except OSError as exc:
        log.warning("cannot notify the service manager at %s: %s", name, exc)
        return False
    return True


def ready(status: str | None = None) -> bool:
    """The daemon serves (and a reload, if one was under way, is over)."""
    return notify("READY=1", *_status(status))


def stopping(status: str | None = None) -> bool:
    """Shutdown has begun: systemd counts the service as deactivating from here."""
    return notify("STOPPING=1", *_status(status))


def reloading(status: str | None = None) -> bool:
    """A reload has begun; `ready` ends it. MONOTONIC_USEC (CLOCK_MONOTONIC, as
    ``Type=notify-reload`` wants it) lets the manager tell this reload from an
    earlier one."""
    usec = time.clock_gettime_ns(time.CLOCK_MONOTONIC) // 1000
    return notify("RELOADING=1", f"MONOTONIC_USEC={usec}", *_status(status))


def status(text: str) -> bool:
    """A one-line state for ``systemctl status`` (what the daemon waits for, say)."""
    return notify(*_status(text))


def _status(text: str | None) -> list[str]:
    return [] if text is None else [f"STATUS={' '.join(text.split())}"]
