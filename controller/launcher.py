"""`metaflow-controller`: start the os-ken app (os-ken 4 has no osken-manager).

    metaflow-controller --of-port 6653 --rest-port 8080 --space 100.64.0.0/10

Loads os-ken's topology service with link observation (LLDP) and our app,
and runs until SIGTERM or SIGINT. The OpenFlow switches connect to
`--of-host:--of-port`; agents register at `http://<rest host>:<rest port>`.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import os
import signal
import sys

from os_ken import cfg
from os_ken.base import app_manager
from os_ken.lib import hub

from btree.split import SplitBounds
from client_lib.cidr import Block
from client_lib.constants import DEFAULT_SPACE_CIDR
from controller import app


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="metaflow-controller", description=__doc__.splitlines()[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--of-host", default="0.0.0.0", help="OpenFlow listen address")
    p.add_argument("--of-port", type=int, default=6653, help="OpenFlow listen port")
    p.add_argument("--rest-host", default="0.0.0.0", help="REST API address (agents register here)")
    p.add_argument("--rest-port", type=int, default=8080, help="REST API port")
    p.add_argument("--space", default=DEFAULT_SPACE_CIDR, help="the MetaDataID space")
    p.add_argument("--gateway", default="10.255.255.254",
                   help="virtual gateway address clients route the space to (ARP answered here)")
    p.add_argument("--split", type=SplitBounds.parse, default=SplitBounds(),
                   help="split bounds low,high")
    p.add_argument("--capacity", type=int, default=None,
                   help="keys per server before a split (default: each agent's --capacity)")
    p.add_argument("--bootstrap", default="preallocate",
                   help="organic (one server owns all) or preallocate[:N] (default: half the servers)")
    p.add_argument("--settle", type=float, default=3.0,
                   help="seconds without topology change before the network is built")
    p.add_argument("--heartbeat-timeout", type=float, default=6.0,
                   help="seconds without a heartbeat before a server counts as failed")
    p.add_argument("--no-auto-split", action="store_true", help="split only when asked over REST")
    p.add_argument("--log-level", default="INFO", choices=("DEBUG", "INFO", "WARNING", "ERROR"))
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    logging.basicConfig(level=args.log_level, stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("os_ken").setLevel(max(logging.WARNING, logging.getLevelName(args.log_level)))
    app.SETTINGS = app.Settings(space=Block.parse(args.space), gateway_ip=args.gateway,
                                bounds=args.split, capacity=args.capacity, bootstrap=args.bootstrap,
                                rest_host=args.rest_host, rest_port=args.rest_port, settle=args.settle,
                                heartbeat_timeout=args.heartbeat_timeout,
                                auto_split=not args.no_auto_split)
    importlib.import_module("os_ken.topology.switches")  # registers --observe-links
    cfg.CONF(args=["--ofp-listen-host", args.of_host, "--ofp-tcp-listen-port", str(args.of_port),
                   "--observe-links"], project="os_ken")
    stop = hub.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    manager = app_manager.AppManager.get_instance()
    manager.load_apps(["os_ken.topology.switches", "controller.app"])
    manager.instantiate_apps(**manager.create_contexts())
    stop.wait()
    logging.getLogger("metaflow.controller").info("stopping; switches keep their flows")
    logging.shutdown()
    # os-ken's own threads (OpenFlow server, LLDP) cannot be joined or killed
    # in its native-thread hub; nothing of ours is left to clean up: the
    # switches keep their tables on purpose, so traffic survives a restart.
    os._exit(0)


if __name__ == "__main__":
    sys.exit(main())
