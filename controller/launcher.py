"""`metaflow-controller`: start the os-ken app (os-ken 4 has no osken-manager).

    metaflow-controller --secret-file /etc/metaflow/secret --rest-host 10.255.0.1

Loads os-ken's topology service with link observation (LLDP) and our app,
and runs until SIGTERM or SIGINT. The OpenFlow switches connect to
`--of-host:--of-port`; agents register at `http://<rest host>:<rest port>`.
On SIGTERM it stops its REST API and its decision loop and exits 0; the
switches keep their flows on purpose, so traffic survives a restart, and a
restarted controller re-reads the switches and the agents instead of
starting over.
"""

from __future__ import annotations

import importlib
import logging
import os
import signal
import sys

from os_ken import cfg
from os_ken.base import app_manager
from os_ken.lib import hub

from client_lib.config import ROLES, parse
from controller.settings import from_args, parser


def main(argv: list[str] | None = None) -> int:
    # Flags over the --config file, checked before anything listens (a refusal exits 2).
    args, settings = parse(ROLES["controller"], parser(), argv, from_args)
    logging.basicConfig(level=args.log_level, stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("os_ken").setLevel(max(logging.WARNING, logging.getLevelName(args.log_level)))
    importlib.import_module("os_ken.topology.switches")  # registers --observe-links
    cfg.CONF(args=["--ofp-listen-host", settings.of_host, "--ofp-tcp-listen-port", str(settings.of_port),
                   "--observe-links"], project="os_ken")
    stop = hub.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    manager = app_manager.AppManager.get_instance()
    manager.load_apps(["os_ken.topology.switches", "controller.app"])
    try:
        manager.instantiate_apps(**manager.create_contexts(), settings=settings)
    except OSError as exc:   # a port taken (REST, metrics): os-ken's threads are running already
        logging.getLogger("metaflow.controller").error("cannot start: %s", exc)
        logging.shutdown()
        os._exit(1)
    stop.wait()
    log = logging.getLogger("metaflow.controller")
    log.info("stopping; switches keep their flows")
    app = manager.applications.get("MetaFlowApp")
    if app is not None:
        app.close()
    logging.shutdown()
    # os-ken's own threads (OpenFlow server, LLDP) cannot be joined or killed
    # in its native-thread hub; ours are stopped above.
    os._exit(0)


if __name__ == "__main__":
    sys.exit(main())
