"""`metaflow-agent`: one per storage server.

Starts, in order, the store, the replication listener, the metadata service
on :9000, the address rewrite, the admin API, and (with --controller)
registration; stops them in reverse on SIGTERM or SIGINT, removing its
iptables rules. A start that fails halfway undoes what it had done, so a
bad flag never leaves rules behind. Under systemd (``Type=notify``) it
reports READY=1 once port 9000 serves and, with ``--controller``, the
controller has registered it; STOPPING=1 when a stop begins. SIGHUP
reloads (`reload`).

With ``--controller`` the agent comes back from a restart *suspended*: it
remembers its roles and reports them, but serves nothing until the
controller answers with what it may hold (`nat_agent.registration`).
Standalone (no ``--controller``), each ``--own`` block is served at once,
as the primary of a set of one at epoch 0; on one machine:

    metaflowctl secret /tmp/metaflow.secret      # a new secret, in a file of mode 0600
    metaflow-agent --store leveldb:/tmp/md --listen 127.0.0.1:9000 \\
        --admin 127.0.0.1:9001 --rewrite none --own 100.64.0.0/10 \\
        --secret-file /tmp/metaflow.secret

The secret file is required: every admin request must be signed with it
(`nat_agent.admin` says what is open and to whom), and the agent signs
with it when it calls other agents and the controller.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gc
import logging
import signal
import socket
import sys
from collections.abc import Callable

from client_lib import sdnotify
from client_lib.api.admin import Stats
from client_lib.api.auth import Verifier, load_secret, server_authority
from client_lib.api.clients import DEFAULT_TIMEOUT
from client_lib.api.leaders import controller_urls
from client_lib.cidr import Block
from client_lib.config import ROLES, add_config_flag, checked, parse, rereader
from client_lib.constants import ADMIN_PORT, MAX_VALUE, METAFLOW_PORT, REPLICATION_PORT
from client_lib.errors import InvalidArgument
from client_lib.mdid import DEFAULT_SPACE
from client_lib.reload import LEVELS, Outcome, Reloader, compare, set_log_level
from client_lib.version import add_version_flag
from nat_agent import netinfo
from nat_agent.admin import AdminApi
from nat_agent.agent import Agent, Identity
from nat_agent.extension import PYTHON_PATH_NOTICE, UNAVAILABLE
from nat_agent.metrics import AgentMetrics
from nat_agent.migration import Migrator
from nat_agent.registration import STATE_PERIOD_S, Registrar
from nat_agent.replica import ReplicaServer
from nat_agent.replication import DEFAULT_TIMEOUT as REPLICATION_TIMEOUT
from nat_agent.replication import Replicator
from nat_agent.rewrite import Rewriter
from nat_agent.rules import DEFAULT_MODE, MODES
from nat_agent.service import DEFAULT_WORKERS, MetadataService, ServiceLimits
from nat_agent.serving import Runner, serve
from nat_agent.store import DEFAULT_FSYNC, FSYNC_MODES
from nat_agent.store_spec import open_store
from nat_agent.syncs import Syncs

log = logging.getLogger("metaflow.agent")

LIVE_FLAGS = frozenset({"log_level", "heartbeat", "state_period"})
"""The flags (by their `argparse` names) a running agent takes from a reload;
every other one shapes a listener, the store or the compiled request path,
which only a restart rebuilds."""
REGISTERED_POLL_S = 0.05


def _hostport(text: str, default_port: int, flag: str) -> tuple[str, int]:
    host, sep, port = text.rpartition(":")
    if not sep:
        return text, default_port
    try:
        return host.strip("[]"), int(port)
    except ValueError:
        raise InvalidArgument(f"{flag}: bad address {text!r}: want HOST:PORT") from None


def parser() -> argparse.ArgumentParser:
    """Every flag of `metaflow-agent`, declared once: `parse_args` reads a
    command line with it and docs/reference/flags.md is generated from it."""
    p = argparse.ArgumentParser(
        prog="metaflow-agent",
        description="MetaFlow storage-server agent: MetaDataID rewrite, metadata service "
                    "(RESP on :9000), admin API (HTTP+JSON on :9001), migrations.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--name", default=None,
                   help="agent name used with the controller; hostname-<data port> if not given")
    p.add_argument("--store", default="leveldb:./metaflow-data",
                   help="leveldb:DIR (embedded), redis://HOST:PORT[/DB][?prefix=P], "
                        "unix:///SOCK[?db=N], or redis-server:DIR (start our own redis-server)")
    p.add_argument("--fsync", choices=FSYNC_MODES, default=DEFAULT_FSYNC,
                   help="what a write waits for before it is acknowledged: always (a synced write: its own, "
                        "or its worker turn's batch), "
                        "batch (a sync shared with concurrent writes), off (none: a power loss "
                        "can take the last seconds of writes)")
    p.add_argument("--listen", default=f"0.0.0.0:{METAFLOW_PORT}", help="metadata service address HOST:PORT")
    p.add_argument("--admin", default=f"127.0.0.1:{ADMIN_PORT}",
                   help="admin API address HOST:PORT: this server's management address, never one "
                        "the data network reaches (the default serves this machine only)")
    p.add_argument("--metrics-port", type=int, default=0,
                   help="serve Prometheus metrics (GET /metrics) on the --admin host at this port "
                        "(0: none); a port that is taken stops the start")
    p.add_argument("--secret-file", default=None, metavar="FILE",
                   help="the cluster's shared secret (required; mode 0600): admin requests must be "
                        "signed with it, and the agent signs its calls to agents and the controller")
    p.add_argument("--open-reads", action="store_true",
                   help="let unsigned callers use the admin routes that change nothing "
                        "(health, blocks, count, ops, stats, migrations, syncs)")
    p.add_argument("--peer-timeout", type=float, default=DEFAULT_TIMEOUT,
                   help="seconds one call to another agent may take during a migration")
    p.add_argument("--replication", default=None, metavar="HOST:PORT",
                   help="where primaries stream writes to this agent when it is a backup (RESP, "
                        "signed with the cluster's secret); the management network, like --admin. "
                        f"Default: the --admin host, port {REPLICATION_PORT}")
    p.add_argument("--replication-timeout", type=float, default=REPLICATION_TIMEOUT,
                   help="seconds a synced backup may take to acknowledge a write; after that the "
                        "write is refused (TRYAGAIN) and the block held back until the controller "
                        "re-syncs its members")
    p.add_argument("--rewrite", choices=MODES, default=DEFAULT_MODE,
                   help="how requests to MetaDataIDs reach the service: local (no rewrite: the space "
                        "is local for TCP to the service port arriving on the data interface, and "
                        "conntrack is bypassed; needs a wildcard --listen host), kernel (iptables "
                        "DNAT), nfqueue (the paper's user-space agent), or none (clients connect "
                        "to --listen directly)")
    p.add_argument("--data-ip", default=None,
                   help="this server's data-plane address (DNAT target; reported to the controller); "
                        "if not given, the --listen host, else the first non-loopback IPv4")
    p.add_argument("--space", default=str(DEFAULT_SPACE), help="the MetaDataID space (CIDR)")
    p.add_argument("--own", action="append", default=None, metavar="CIDR",
                   help="serve this block (repeatable) as the primary of a set of one, epoch 0; "
                        "without it, the roles held before a restart, else none (idle, waiting "
                        "for the controller)")
    p.add_argument("--capacity", type=int, default=1_000_000,
                   help="keys this server should hold before the controller splits it")
    p.add_argument("--max-value", type=int, default=MAX_VALUE, help="largest value in bytes")
    p.add_argument("--read-timeout", type=float, default=5.0,
                   help="seconds a started request may take to arrive in full")
    p.add_argument("--idle-timeout", type=float, default=300.0,
                   help="seconds an idle client connection is kept open")
    p.add_argument("--max-clients", type=int, default=4096, help="open client connections")
    p.add_argument("--queue-num", type=int, default=9000, help="NFQUEUE number (nfqueue mode)")
    p.add_argument("--controller", default=None, metavar="URL[,URL...]",
                   help="controller base URL (e.g. http://10.255.0.1:8080); register and heartbeat. "
                        "With it, the agent starts suspended (serving nothing) until the "
                        "controller says which roles it holds. Several, separated by commas: "
                        "controllers of which one leads; the agent follows the leader")
    p.add_argument("--heartbeat", type=float, default=0.25,
                   help="seconds between heartbeats (the controller declares a silent server "
                        "failed after a few missed ones)")
    p.add_argument("--liveness-datagrams", action="store_true",
                   help="beat by signed UDP datagrams to a controller that takes them, with HTTP heartbeats "
                        "only when the state changes or the controller asks; off by default until make test "
                        "has passed with it on (docs/liveness.md)")
    p.add_argument("--state-period", type=float, default=STATE_PERIOD_S,
                   help="seconds between HTTP heartbeats while beating by datagram (the safety net; a "
                        "change of state is sent at once)")
    p.add_argument("--loop", choices=("uvloop", "asyncio"), default="uvloop", help="event loop")
    p.add_argument("--request-path", choices=("compiled", "python"), default="compiled",
                   help="compiled: GET/SET/EXISTS/PING (and on worker threads the conditional writes "
                        "SET NX|XX|IFEQ, DEL, DELIFEQ, ECREATE) that need no waiting are answered in "
                        "compiled code (LevelDB store); python: every request on the Python path (for A/B)")
    p.add_argument("--workers", type=int, default=DEFAULT_WORKERS, metavar="N",
                   help="threads serving port 9000 in compiled code, each on its own SO_REUSEPORT "
                        "listener, handing what they cannot answer to the event loop; 0: the event "
                        "loop serves the port itself")
    p.add_argument("--log-level", default="INFO",
                   choices=LEVELS, help="log level")
    add_version_flag(p)
    add_config_flag(p)
    return p


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The flags over the ``--config`` file, checked (`from_args`); anything wrong exits 2."""
    return parse(ROLES["agent"], parser(), argv, from_args)[1]


def from_args(args: argparse.Namespace) -> argparse.Namespace:
    """The parsed flags checked, with addresses, blocks and the secret read
    into their values; InvalidArgument names the flag that is wrong."""
    args.space = checked("--space", Block.parse, args.space)
    args.own = None if args.own is None else [checked("--own", Block.parse, b) for b in args.own]
    if args.secret_file is None:
        raise InvalidArgument(
            "--secret-file FILE is required: the admin API accepts only requests signed with the "
            "cluster's secret. Make one with `metaflowctl secret FILE` or "
            "`python -c 'from client_lib.api.auth import write_secret; write_secret(\"FILE\")'`, "
            "and give the same file to the controller and every agent")
    args.secret = checked("--secret-file", load_secret, args.secret_file)
    args.controller = controller_urls(args.controller) if args.controller else None
    for flag in ("peer_timeout", "replication_timeout", "heartbeat", "state_period"):
        if not getattr(args, flag) > 0:
            raise InvalidArgument(f"--{flag.replace('_', '-')} must be positive")
    if not 0 <= args.metrics_port <= 65535:
        raise InvalidArgument(f"--metrics-port must be 0 (none) or a port number, not {args.metrics_port}")
    if not 0 <= args.workers <= 64:
        raise InvalidArgument("--workers must be between 0 and 64")
    args.listen = _hostport(args.listen, METAFLOW_PORT, "--listen")
    if args.rewrite == "local" and args.listen[0] not in ("", "0.0.0.0"):
        raise InvalidArgument(f"--rewrite local needs --listen 0.0.0.0:PORT: requests arrive addressed to "
                              f"MetaDataIDs, which a listener bound to {args.listen[0]} never sees")
    args.admin = _hostport(args.admin, ADMIN_PORT, "--admin")
    args.replication = _hostport(args.replication or f"{args.admin[0]}:{REPLICATION_PORT}",
                                 REPLICATION_PORT, "--replication")
    return args


def _data_address(args: argparse.Namespace) -> tuple[str | None, str | None, str | None]:
    """The data-plane IP, MAC and interface; an IP is required when we rewrite."""
    ip = args.data_ip
    if ip is None and args.listen[0] not in ("", "0.0.0.0", "::"):
        ip = args.listen[0]
    if ip is None:
        ip = netinfo.first_global_ipv4()
    if ip is None and args.rewrite != "none":
        raise SystemExit("metaflow-agent: no data-plane address found; pass --data-ip")
    found = netinfo.interface_of(ip) if ip else None
    interface, mac = found if found else (None, None)
    if args.rewrite == "local" and interface is None:
        raise SystemExit(f"metaflow-agent: --rewrite local needs the interface requests arrive on, "
                         f"but the data-plane address {ip} is on no interface here; pass --data-ip")
    if args.controller and not (ip and mac):
        missing = f"{ip} is on no interface here, so its MAC is unknown" if ip else "no address was found"
        raise SystemExit(f"metaflow-agent: --controller needs this server's data-plane address and MAC "
                         f"(the switches deliver to them), but {missing}; pass --data-ip with an "
                         "address of one of this machine's interfaces")
    return ip, mac, interface


def reload(running: argparse.Namespace, new: argparse.Namespace, registrar: Registrar | None) -> Outcome:
    """Apply the `LIVE_FLAGS` of `new` (flags as `parse_args` gives them) to the
    running agent and to `running`, which then holds the settings in force;
    the other changes are named for a restart."""
    outcome = compare(vars(running), vars(new), LIVE_FLAGS)
    if "log_level" in outcome.applied:
        set_log_level(new.log_level)
    if "heartbeat" in outcome.applied and registrar is not None:
        registrar.interval = new.heartbeat
    if "state_period" in outcome.applied and registrar is not None:
        registrar.state_period = new.state_period
    for name in outcome.applied:
        setattr(running, name, getattr(new, name))
    return outcome


async def _until_registered(registrar: Registrar, stop: asyncio.Event) -> None:
    """Wait for the controller to register this agent (or for a stop)."""
    while not (registrar.registered or stop.is_set()):
        await asyncio.sleep(REGISTERED_POLL_S)


async def run(args: argparse.Namespace, reread: Callable[[], argparse.Namespace] | None = None) -> None:
    """The agent until SIGTERM; SIGHUP applies what `reread` gives (None: no file to re-read)."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    registrar: Registrar | None = None
    # Installed first: SIGHUP's default action would end the agent while it starts.
    reloader: Reloader[argparse.Namespace] = Reloader(log, reread, lambda new: reload(args, new, registrar))
    loop.add_signal_handler(signal.SIGHUP, reloader)
    data_ip, data_mac, data_interface = _data_address(args)
    name = args.name or f"{socket.gethostname()}-{args.listen[1]}"
    if UNAVAILABLE is not None:
        log.warning("%s; %s", UNAVAILABLE, PYTHON_PATH_NOTICE)
    async with contextlib.AsyncExitStack() as undo:
        store = open_store(args.store, args.space.width, args.fsync)
        undo.push_async_callback(store.close)
        admin_host, admin_port = args.admin
        repl_host, repl_port = args.replication
        identity = Identity(name, data_ip, data_mac, args.listen[1], f"http://{admin_host}:{admin_port}",
                            args.capacity, f"{repl_host}:{repl_port}")
        agent = Agent(identity, store, args.space)
        await agent.load(args.own, suspended=bool(args.controller))
        replica = ReplicaServer(agent, Verifier(args.secret, server_authority(repl_host, repl_port)),
                                args.max_value, args.read_timeout)
        await replica.start(repl_host, repl_port)
        undo.push_async_callback(replica.stop)
        replicator = Replicator(agent.ownership, name, args.secret, args.replication_timeout)
        undo.push_async_callback(replicator.close)
        syncs = Syncs(agent, replicator)
        undo.push_async_callback(syncs.close)
        service = MetadataService(agent, replicator, ServiceLimits(args.max_value, args.read_timeout,
                                                                   args.idle_timeout, args.max_clients,
                                                                   args.workers),
                                  compiled=args.request_path == "compiled")
        await service.start(args.listen[0], args.listen[1], transparent=args.rewrite == "local")
        undo.push_async_callback(service.stop)
        migrator = Migrator(agent, replicator, args.secret, timeout=args.peer_timeout)
        undo.push_async_callback(migrator.close)
        rewriter = Rewriter(args.rewrite, args.space, data_ip, port=args.listen[1],
                            queue_num=args.queue_num, tag=f"metaflow-agent:{name}",
                            interface=data_interface)
        await loop.run_in_executor(None, rewriter.start)
        undo.callback(rewriter.stop)

        def stats() -> Stats:
            counters = {**service.stats, **{f"replication_{k}": v for k, v in replicator.stats.items()},
                        **{f"replica_{k}": v for k, v in replica.stats.items()}}
            return Stats(counters, rewriter.stats())

        if args.metrics_port:
            metrics = AgentMetrics(service, replica, syncs, migrator)
            undo.push_async_callback(metrics.stop)
            await metrics.start(admin_host, args.metrics_port)
        # The admin API comes up last: once /health answers, everything is in place.
        admin = AdminApi(agent, migrator, syncs, stats, service.ops, service.load,
                         Verifier(args.secret, server_authority(admin_host, admin_port)),
                         open_reads=args.open_reads)
        await admin.start(admin_host, admin_port)
        undo.push_async_callback(admin.stop)
        if args.controller:
            registrar = Registrar(agent, args.controller, args.secret, args.heartbeat,
                                  args.liveness_datagrams, args.state_period)
            registrar.start()
            undo.push_async_callback(registrar.stop)
        log.info("agent %s serving %s on %s:%d (rewrite %s, data %s/%s), admin on %s:%d, replication "
                 "on %s:%d, holding %s%s", name, store.kind, *args.listen, args.rewrite, data_ip, data_mac,
                 admin_host, admin_port, repl_host, repl_port,
                 ", ".join(f"{r.block}@{r.epoch}{'' if r.primary else ' (backup)'}"
                           for r in agent.ownership.roles) or "nothing (idle)",
                 " (suspended until the controller answers)" if agent.ownership.suspended else "")
        serving = f"serving on {args.listen[0]}:{args.listen[1]}"
        if registrar is not None:
            sdnotify.status(f"{serving}; registering with the controller at {', '.join(args.controller)}")
            await _until_registered(registrar, stop)
            serving += f", registered with the controller at {registrar.controller.base_url}"
        if not stop.is_set():
            sdnotify.ready(serving)
        quiet_collector()
        await stop.wait()
        sdnotify.stopping()
        log.info("stopping")
    log.info("stopped; rules removed, store closed")


GC_FIRST_GENERATION = 50_000
"""Allocations between two collections of the youngest generation (CPython's
default: 700). The request path allocates a few objects per request and
almost never a cycle, yet at 700 the collector ran often enough to take 13 %
of an agent's CPU under replicated writes (perf, 2026-11-28), its older
generations traversing every live object. At this threshold it runs about
70 times less often, for a few MB more of short-lived garbage at most."""


def quiet_collector() -> None:
    """Once started: what the start-up made (modules, the store's index of
    IDs, tables) is moved out of the collector's view for good (`gc.freeze`),
    and the youngest generation is collected every `GC_FIRST_GENERATION`
    allocations."""
    gc.freeze()
    gc.set_threshold(GC_FIRST_GENERATION, *gc.get_threshold()[1:])


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    runner: Runner = asyncio.run
    if args.loop == "uvloop":
        import uvloop
        runner = uvloop.run
    return serve(run(args, rereader(ROLES["agent"], parser, argv, from_args)), args.log_level, log, runner)


if __name__ == "__main__":
    sys.exit(main())
