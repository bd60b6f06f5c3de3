"""Every setting of the controller, in one object, parsed from one command line.

`metaflow-controller`'s flags map one to one onto `Settings`; the launcher
hands the object to the os-ken app (as a constructor argument), the app
gives it to the core. Nothing reads a module global.
"""

from __future__ import annotations

import argparse
import re
from dataclasses import dataclass, field
from typing import Literal, get_args

from btree.bootstrap import Bootstrap
from btree.flows import DEFAULT_TABLE_BUDGET
from btree.split import SplitBounds
from client_lib.api.auth import load_secret
from client_lib.cidr import Block
from client_lib.config import add_config_flag, checked
from client_lib.constants import (
    DEFAULT_GATEWAY,
    DEFAULT_REPLICAS,
    DEFAULT_SPACE_CIDR,
    OPENFLOW_PORT,
    REST_PORT,
)
from client_lib.errors import InvalidArgument
from client_lib.version import add_version_flag
from controller.leadership import DEFAULT_ETCD_PREFIX, DEFAULT_LEASE_TTL_S

# -- hybrid mode (issue 25) --------------------------------------------------------
Mode = Literal["full", "hybrid"]
"""full: MetaFlow forwards everything (host routes, every ARP, drop the rest);
hybrid: MetaFlow adds its own entries to a fabric that forwards on its own
(NORMAL below them). ARCHITECTURE.md, "Flow table layout"."""
MODES: tuple[Mode, ...] = get_args(Mode)
# -- end hybrid mode -----------------------------------------------------------------


@dataclass(frozen=True)
class Settings:
    space: Block = Block.parse(DEFAULT_SPACE_CIDR)
    gateway_ip: str = DEFAULT_GATEWAY
    mode: Mode = "full"
    """What MetaFlow installs on the switches (`MODES`); not live: a restart."""
    bounds: SplitBounds = SplitBounds()
    capacity: int | None = None
    """Keys per server before a split; None: each agent's own --capacity."""
    bootstrap: Bootstrap = Bootstrap("preallocate")
    replicas: int = DEFAULT_REPLICAS
    """Copies of every block; 1 is no replication."""
    sync_rate: int = 5000
    """Records a second a re-replication copies at most."""
    max_syncs: int = 2
    """Re-replications running at once."""
    settle_s: float = 3.0
    locate_timeout_s: float = 30.0
    """How long the first build waits for a registered server to show up on
    the data plane (its ARP); after that it builds without it."""
    heartbeat_timeout_s: float = 1.0
    barrier_timeout_s: float = 10.0
    agent_timeout_s: float = 10.0
    migration_lease_s: float = 60.0
    auto_split: bool = True
    merge: bool = True
    """A split that finds no room first frees a cold server near it (`btree.merge`)."""
    table_budget: int | None = DEFAULT_TABLE_BUDGET
    """MetaFlow entries any one switch may hold; a split that would exceed it is refused. None: no limit."""
    load_poll_s: float = 1.0
    """Seconds between polls of the switches' flow counters (`controller.load`); 0: no polling."""
    load_capacity: float = 40_000.0
    """Packets a second one server can take: the imbalance factor's urgency is measured against it."""
    imbalance_threshold: float = 0.1
    """The imbalance factor above which load is moved (`btree.balance.ImbalanceModel`)."""
    rebalance: bool = True
    """Move hot ranges off a server when the imbalance model says so (`controller.rebalance`)."""
    churn_per_rebalance: float = 0.05
    """Of the keys stored, the share one rebalance (all its moves) may move."""
    churn_per_minute: float = 0.2
    """Of the keys stored, the share rebalancing may move in any minute."""
    minimize: bool = True
    of_host: str = "127.0.0.1"
    of_port: int = OPENFLOW_PORT
    rest_host: str = "127.0.0.1"
    rest_port: int = REST_PORT
    # -- liveness datagrams (issue 26, `controller.liveness`) --
    liveness_port: int | None = None
    """UDP port for agents' liveness datagrams on the --rest-host; None: the
    REST port's number (`client_lib.constants.LIVENESS_PORT`); 0: none (HTTP
    heartbeats only)."""
    # -- end of liveness --
    metrics_port: int = 0
    """Prometheus metrics on the --rest-host at this port (`controller.metrics`); 0: none."""
    open_reads: bool = False
    secret: bytes = field(default=b"", repr=False)
    # -- leadership among controllers (issue 25, `controller.leadership`) --
    etcd: tuple[str, ...] = ()
    """etcd client URLs; empty: the one controller without etcd (the default)."""
    etcd_prefix: str = DEFAULT_ETCD_PREFIX
    lease_ttl_s: int = DEFAULT_LEASE_TTL_S
    advertise_url: str = ""
    """--advertise-url as given ("": the default, `rest_url`)."""
    # -- end of leadership --

    @property
    def rest_url(self) -> str:
        """This controller's REST URL as agents reach it (the leader key's value):
        --advertise-url, or http://REST-HOST:REST-PORT."""
        return self.advertise_url or f"http://{self.rest_host}:{self.rest_port}"

    @property
    def liveness_udp_port(self) -> int:
        """Where liveness datagrams are taken (0: nowhere): --liveness-port, or the REST port's number."""
        return self.rest_port if self.liveness_port is None else self.liveness_port


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="metaflow-controller",
        description="The MetaFlow controller: an os-ken OpenFlow 1.0 app that maps the fabric onto the "
                    "B-tree, installs MetaFlow flows, splits full servers and takes over failed ones.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    add_version_flag(p)
    add_config_flag(p)
    p.add_argument("--secret-file", required=True,
                   help="the cluster's shared secret (make one with: metaflowctl secret FILE); every "
                        "REST call must be signed with it, and the controller signs its calls to agents")
    p.add_argument("--of-host", default="127.0.0.1", help="OpenFlow listen address")
    p.add_argument("--of-port", type=int, default=OPENFLOW_PORT, help="OpenFlow listen port")
    p.add_argument("--rest-host", default="127.0.0.1",
                   help="REST API address: the management network's address (agents register here)")
    p.add_argument("--rest-port", type=int, default=REST_PORT, help="REST API port")
    # -- liveness datagrams (issue 26) --
    p.add_argument("--liveness-port", type=int, default=None,
                   help="UDP port on the --rest-host where agents' signed liveness datagrams are taken "
                        "(default: the --rest-port's number, in UDP; 0: none, agents beat over HTTP); "
                        "agents learn it when they register")
    # -- end of liveness --
    p.add_argument("--metrics-port", type=int, default=0,
                   help="serve Prometheus metrics on the --rest-host at this port (0: none); a port "
                        "that is taken stops the start")
    p.add_argument("--open-reads", action="store_true",
                   help="let unsigned callers read the views (changes always need the secret)")
    p.add_argument("--space", default=DEFAULT_SPACE_CIDR, help="the MetaDataID space")
    p.add_argument("--gateway", default=DEFAULT_GATEWAY,
                   help="virtual gateway address clients route the space to (ARP answered here)")
    p.add_argument("--mode", default="full", choices=MODES,
                   help="full: MetaFlow forwards everything (host routes, every ARP answered, the rest "
                        "dropped); hybrid: only MetaFlow's entries, the gateway's ARP and LLDP, above one "
                        "lowest-priority NORMAL entry: the switches' own forwarding carries the rest")
    p.add_argument("--split", default="0.4,0.6", help="split bounds low,high")
    p.add_argument("--capacity", type=int, default=None,
                   help="keys per server before a split (default: each agent's --capacity)")
    p.add_argument("--replicas", type=int, default=DEFAULT_REPLICAS,
                   help="copies of every block, on servers of different racks where the topology has them "
                        "(1: no replication)")
    p.add_argument("--sync-rate", type=int, default=5000,
                   help="records a second a re-replication copies at most (it runs in the background)")
    p.add_argument("--max-syncs", type=int, default=2, help="re-replications running at once")
    p.add_argument("--bootstrap", default="preallocate",
                   help="organic (one server owns all) or preallocate[:N] (default: half the servers)")
    p.add_argument("--settle", type=float, default=3.0,
                   help="seconds without topology change before the network is built")
    p.add_argument("--locate-timeout", type=float, default=30.0,
                   help="seconds the build waits for a registered server to appear on the data plane; "
                        "then it builds without it and takes its blocks over")
    p.add_argument("--heartbeat-timeout", type=float, default=1.0,
                   help="seconds without a heartbeat before a server counts as failed (agents send one "
                        "every 0.25 s by default)")
    p.add_argument("--barrier-timeout", type=float, default=10.0,
                   help="seconds a switch may take to confirm flow changes")
    p.add_argument("--agent-timeout", type=float, default=10.0,
                   help="seconds an admin call to an agent may take (a migration's copy may take longer)")
    p.add_argument("--migration-lease", type=float, default=60.0,
                   help="seconds a copied migration may wait for its commit before its agent aborts it")
    p.add_argument("--no-auto-split", action="store_true", help="split only when asked over REST")
    p.add_argument("--no-merge", action="store_true",
                   help="never merge a cold server into a neighbour to free it for a split")
    p.add_argument("--table-budget", type=int, default=DEFAULT_TABLE_BUDGET,
                   help="MetaFlow entries any one switch may hold; a split that would exceed it is "
                        f"refused, naming the switch (default {DEFAULT_TABLE_BUDGET}: 2,048-entry switches; "
                        "0: no limit)")
    p.add_argument("--load-poll", type=float, default=1.0,
                   help="seconds between polls of every switch's flow counters for request load "
                        "(GET /metaflow/load); 0 turns polling off")
    p.add_argument("--load-capacity", type=float, default=40_000.0,
                   help="packets a second one server can take; the imbalance factor counts an uneven load "
                        "as harmful as the busiest server nears it")
    p.add_argument("--imbalance-threshold", type=float, default=0.1,
                   help="the imbalance factor (Lunule's, in [0, 1]) above which load is moved once it held "
                        "for two polls; with 8 busy servers near capacity, 0.1 is one server at about 1.7x "
                        "the mean, 0.03 about 1.2x")
    p.add_argument("--no-rebalance", action="store_true",
                   help="only report imbalance (the 'imbalanced' event); never move load between servers")
    p.add_argument("--churn-per-rebalance", type=float, default=0.05,
                   help="of the keys stored, the share one rebalance (all its moves) may move")
    p.add_argument("--churn-per-minute", type=float, default=0.2,
                   help="of the keys stored, the share rebalancing may move in any 60 s")
    # -- leadership among controllers (issue 25) --
    p.add_argument("--etcd", default="",
                   help="etcd client URLs, comma-separated (http://HOST:PORT,...): run as one of several "
                        "controllers, the one holding etcd's lease leads; empty: the one controller, "
                        "no etcd")
    p.add_argument("--etcd-prefix", default=DEFAULT_ETCD_PREFIX,
                   help="etcd key prefix; the leader key is PREFIX/leader")
    p.add_argument("--lease-ttl", type=int, default=DEFAULT_LEASE_TTL_S,
                   help="seconds of the leader's etcd lease (renewed every third of it); etcd refuses a TTL "
                        "below its minimum, 1.5 election timeouts rounded up (see docs/ha.md)")
    p.add_argument("--advertise-url", default="",
                   help="this controller's REST URL as agents reach it, stored in etcd while it leads "
                        "(default: http://REST-HOST:REST-PORT)")
    # -- end of leadership --
    p.add_argument("--log-level", default="INFO", choices=("DEBUG", "INFO", "WARNING", "ERROR"))
    return p


def from_args(args: argparse.Namespace) -> Settings:
    """Settings from parsed flags; InvalidArgument names the flag that is wrong."""
    space = checked("--space", Block.parse, args.space)
    secret = checked("--secret-file", load_secret, args.secret_file)
    bounds = checked("--split", SplitBounds.parse, args.split)
    bootstrap = checked("--bootstrap", Bootstrap.parse, args.bootstrap)
    for flag, value in (("--heartbeat-timeout", args.heartbeat_timeout), ("--settle", args.settle),
                        ("--locate-timeout", args.locate_timeout),
                        ("--barrier-timeout", args.barrier_timeout), ("--agent-timeout", args.agent_timeout),
                        ("--migration-lease", args.migration_lease), ("--load-capacity", args.load_capacity)):
        if value <= 0:
            raise InvalidArgument(f"{flag} must be positive, not {value}")
    for flag, count in (("--replicas", args.replicas), ("--sync-rate", args.sync_rate),
                        ("--max-syncs", args.max_syncs)):
        if count < 1:
            raise InvalidArgument(f"{flag} must be at least 1, not {count}")
    if not 0 <= args.metrics_port <= 65535:
        raise InvalidArgument(f"--metrics-port must be 0 (none) or a port number, not {args.metrics_port}")
    for flag, value, zero in (("--table-budget", args.table_budget, "no limit"),
                              ("--load-poll", args.load_poll, "off")):
        if value < 0:
            raise InvalidArgument(f"{flag} must be 0 ({zero}) or positive, not {value}")
    for flag, share in (("--churn-per-rebalance", args.churn_per_rebalance),
                        ("--churn-per-minute", args.churn_per_minute),
                        ("--imbalance-threshold", args.imbalance_threshold)):
        if not 0 <= share <= 1:
            raise InvalidArgument(f"{flag} must lie in [0, 1], not {share}")
    if args.liveness_port is not None and not 0 <= args.liveness_port <= 65535:
        raise InvalidArgument(f"--liveness-port must be 0 (none) or a port number, not {args.liveness_port}")
    etcd, advertise = _leadership(args)
    return Settings(space=space, gateway_ip=args.gateway, bounds=bounds, capacity=args.capacity,
                    bootstrap=bootstrap, replicas=args.replicas, sync_rate=args.sync_rate,
                    max_syncs=args.max_syncs, settle_s=args.settle, locate_timeout_s=args.locate_timeout,
                    heartbeat_timeout_s=args.heartbeat_timeout,
                    barrier_timeout_s=args.barrier_timeout, agent_timeout_s=args.agent_timeout,
                    migration_lease_s=args.migration_lease, auto_split=not args.no_auto_split,
                    merge=not args.no_merge,
                    load_poll_s=args.load_poll, load_capacity=args.load_capacity,
                    imbalance_threshold=args.imbalance_threshold, rebalance=not args.no_rebalance,
                    churn_per_rebalance=args.churn_per_rebalance, churn_per_minute=args.churn_per_minute,
                    table_budget=args.table_budget or None,
                    mode=args.mode,
                    of_host=args.of_host, of_port=args.of_port, rest_host=args.rest_host,
                    rest_port=args.rest_port, liveness_port=args.liveness_port,
                    metrics_port=args.metrics_port, open_reads=args.open_reads,
                    secret=secret, etcd=etcd, etcd_prefix=args.etcd_prefix.rstrip("/"),
                    lease_ttl_s=args.lease_ttl, advertise_url=advertise)


def _leadership(args: argparse.Namespace) -> tuple[tuple[str, ...], str]:
    """The etcd URLs and the advertised REST URL, checked (issue 25)."""
    etcd = tuple(u.strip().rstrip("/") for u in args.etcd.split(",") if u.strip())
    for url in etcd:
        checked("--etcd", etcd_endpoint, url)
    if etcd and args.lease_ttl < 1:
        raise InvalidArgument(f"--lease-ttl must be at least 1 s, not {args.lease_ttl}")
    if not args.etcd_prefix.startswith("/") or args.etcd_prefix.rstrip("/") == "":
        raise InvalidArgument(f"--etcd-prefix must be an absolute key path such as /metaflow, "
                              f"not {args.etcd_prefix!r}")
    advertise = args.advertise_url.rstrip("/")
    if advertise:
        checked("--advertise-url", etcd_endpoint, advertise)
    return etcd, advertise


def etcd_endpoint(url: str) -> tuple[str, int]:
    """(host, port) of an http://HOST:PORT URL; ValueError names what is wrong."""
    match = _HTTP_ENDPOINT.fullmatch(url)
    if match is None or not 0 < int(match["port"]) < 65536:
        raise ValueError(f"{url!r} must look like http://HOST:PORT")
    return match["host"], int(match["port"])


_HTTP_ENDPOINT = re.compile(r"http://(?P<host>[A-Za-z0-9.\-]+):(?P<port>[0-9]{1,5})/?")
