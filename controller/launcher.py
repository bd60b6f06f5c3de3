"""`metaflow-controller`: start the os-ken app (os-ken 4 has no osken-manager).

    metaflow-controller --secret-file /etc/metaflow/secret --rest-host 10.255.0.1

Loads os-ken's topology service with link observation (LLDP) and our app,
and runs until SIGTERM or SIGINT. The OpenFlow switches connect to
`--of-host:--of-port`; agents register at `http://<rest host>:<rest port>`.
Under systemd (``Type=notify``) it reports READY=1 once both ports listen,
and STOPPING=1 when a stop begins; SIGHUP reloads (`reload`); SIGUSR1 logs
what every thread is doing, grouped (`controller.threads`).
On SIGTERM it stops its REST API and its decision loop and exits 0; the
switches keep their flows on purpose, so traffic survives a restart, and a
restarted controller re-reads the switches and the agents instead of
starting over.
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib
import logging
import os
import queue
import signal
import sys
import time
from pathlib import Path
from typing import Protocol

from os_ken import cfg
from os_ken.base import app_manager

from client_lib import sdnotify
from client_lib.config import ROLES, parse, rereader
from client_lib.reload import Outcome, Reloader, compare, set_log_level
from controller import nativehub, threads
from controller.app import MetaFlowApp
from controller.core import LIVE_SETTINGS
from controller.settings import Settings, from_args, parser

log = logging.getLogger("metaflow.controller")

SIGNAL_SLICE_S = 0.2
"""How long the main thread waits for a queued signal before it checks again."""
LISTEN_WAIT_S = 10.0
"""How long os-ken's OpenFlow server may take to listen before the start counts as failed."""


def listening_ports() -> set[int]:
    """The TCP ports this process listens on: the LISTEN rows of /proc/net/tcp
    and tcp6 whose socket is one of this process's descriptors (a port some
    other process holds is not ours to report ready on)."""
    mine = set()
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:   # closed meanwhile
            continue
        if target.startswith("socket:["):
            mine.add(target[len("socket:["):-1])
    ports = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            rows = Path(table).read_text().splitlines()[1:]
        except OSError:   # no IPv6
            continue
        for row in rows:
            cols = row.split()
            if cols[3] == "0A" and cols[9] in mine:   # 0A: TCP_LISTEN
                ports.add(int(cols[1].rpartition(":")[2], 16))
    return ports


def _wait_listening(ports: set[int], deadline: float) -> set[int]:
    """Wait until this process listens on every port of `ports` (os-ken binds
    its OpenFlow port in a thread of its own, after the apps start); the
    ports still not listening at `deadline`."""
    while True:
        missing = ports - listening_ports()
        if not missing or time.monotonic() >= deadline:
            return missing
        time.sleep(0.05)


def _view(settings: Settings, log_level: str) -> dict[str, object]:
    """What a reload compares: every setting, by its name in `Settings`, and the log level."""
    return {**{f.name: getattr(settings, f.name) for f in dataclasses.fields(settings)},
            "log_level": log_level}


class Reconfigurable(Protocol):
    """What a reload changes: the app (`MetaFlowApp`), or its core alone."""

    @property
    def settings(self) -> Settings: ...

    def reconfigure(self, new: Settings) -> Settings: ...


def reload(app: Reconfigurable, new_args: argparse.Namespace) -> Outcome:
    """Re-read flags (`new_args`, the file over the command line) applied to the
    running controller: the log level and `LIVE_SETTINGS`; the rest is named for
    a restart. Checked in full first (InvalidArgument), so a bad value changes nothing."""
    new = from_args(new_args)
    running_level = logging.getLevelName(logging.getLogger().getEffectiveLevel())
    outcome = compare(_view(app.settings, running_level), _view(new, new_args.log_level),
                      LIVE_SETTINGS | {"log_level"})
    if "log_level" in outcome.applied:
        set_log_level(new_args.log_level, "os_ken")
    if outcome.applied.keys() - {"log_level"}:
        app.reconfigure(new)
    return outcome


APPS = ("controller.discovery", "controller.app")
"""The os-ken apps of a controller, by module."""


def load_apps(manager: app_manager.AppManager) -> None:
    """`APPS` into `manager`, and nothing else.

    os-ken's topology events name os-ken's own `Switches` as their source,
    so loading an app that observes them loads that too: `LinkDiscovery`
    is the source here, and two would each send and answer every LLDP frame.
    """
    manager.load_apps(list(APPS))
    manager.applications_cls.pop("os_ken.topology.switches", None)


def main(argv: list[str] | None = None) -> int:
    # Flags over the --config file, checked before anything listens (a refusal exits 2).
    args, settings = parse(ROLES["controller"], parser(), argv, from_args)
    logging.basicConfig(level=args.log_level, stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    set_log_level(args.log_level, "os_ken")
    importlib.import_module("os_ken.topology.switches")  # registers --observe-links (LinkDiscovery's)
    cfg.CONF(args=["--ofp-listen-host", settings.of_host, "--ofp-tcp-listen-port", str(settings.of_port),
                   "--observe-links"], project="os_ken")
    # The handlers only queue the signal (SimpleQueue.put is safe there); the
    # main thread acts on it, so a reload may log and wait for the decision thread.
    signals: queue.SimpleQueue[int] = queue.SimpleQueue()
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGUSR1):
        signal.signal(sig, lambda signum, _: signals.put(signum))
    nativehub.install()
    manager = app_manager.AppManager.get_instance()
    load_apps(manager)
    try:
        manager.instantiate_apps(**manager.create_contexts(), settings=settings)
    except OSError as exc:   # a port taken (REST, metrics): os-ken's threads are running already
        log.error("cannot start: %s", exc)
        logging.shutdown()
        os._exit(1)
    app = manager.applications["MetaFlowApp"]
    missing = _wait_listening({settings.of_port, settings.rest_port}, time.monotonic() + LISTEN_WAIT_S)
    if missing:
        log.error("cannot start: port %s does not listen after %g s (taken by another process?)",
                  ", ".join(map(str, sorted(missing))), LISTEN_WAIT_S)
        return _exit(app, 1)
    sdnotify.ready(f"OpenFlow on {settings.of_host}:{settings.of_port}, "
                   f"REST on {settings.rest_host}:{settings.rest_port}")
    reread = rereader(ROLES["controller"], parser, argv, from_args)
    reloader: Reloader[argparse.Namespace] = Reloader(log, reread, lambda new_args: reload(app, new_args))
    while (signum := _next_signal(signals)) in (signal.SIGHUP, signal.SIGUSR1):
        if signum == signal.SIGUSR1:
            log.warning("threads on SIGUSR1: %s", threads.now())
        else:
            reloader()
    sdnotify.stopping()
    log.info("stopping on signal %d; switches keep their flows", signum)
    return _exit(app, 0)


def _next_signal(signals: queue.SimpleQueue[int]) -> int:
    """The next signal the handlers queued. Waited for in slices: the kernel may
    deliver a signal to any of os-ken's threads, which then only flags it for
    the main thread to handle when it next runs Python code; a main thread
    blocked in one long `get` would sleep through it (a SIGHUP right after a
    reload was once lost this way, until the next signal woke the thread)."""
    while True:
        try:
            return signals.get(timeout=SIGNAL_SLICE_S)
        except queue.Empty:
            continue


def _exit(app: MetaFlowApp, code: int) -> int:
    """Stop our threads and exit with `code`: os-ken's own threads (OpenFlow
    server, LLDP) cannot be joined or killed in its native-thread hub."""
    app.close()
    logging.shutdown()
    os._exit(code)


if __name__ == "__main__":
    sys.exit(main())
