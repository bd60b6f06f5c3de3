"""`metaflowctl status`: what the controller knows, read from its REST API.

One signed GET per view (tree, servers, request load, flow tables,
operations under way, recent events) through the declared routes and the
client every other caller uses, printed as a summary an operator can scan,
or as one JSON object (``--json``) for scripts. With ``--blocks`` it also
asks every live server's agent for the requests it served per block
(``POST /ops``): the switches count per flow entry, which ORTC may merge
across blocks, so only the agents can say which block is busy. Standard library only: it
belongs to the client role, so an operator's laptop needs neither os-ken nor
Mininet.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field

from client_lib.api import codec
from client_lib.api.admin import ADMIN, CountRequest
from client_lib.api.auth import load_secret
from client_lib.api.clients import ApiClient, LeaderClient
from client_lib.api.rest import (
    REST,
    EventsView,
    FlowInfo,
    FlowsView,
    LeadershipView,
    LoadView,
    OperationsView,
    ServersView,
    TreeView,
)
from client_lib.cidr import Block
from client_lib.constants import REST_PORT
from client_lib.errors import AuthError, MetaFlowError

DEFAULT_CONTROLLER = f"http://127.0.0.1:{REST_PORT}"
DEFAULT_EVENTS = 10


@dataclass(frozen=True)
class Status:
    """Every view `status` shows, read in one pass."""

    tree: TreeView
    servers: ServersView
    load: LoadView
    flows: FlowsView
    operations: OperationsView
    events: EventsView
    blocks: dict[str, dict[str, float | None]] = field(default_factory=dict)
    """Requests a second per block of each live server, from its agent (None:
    the agent did not answer); empty unless asked for."""
    leadership: LeadershipView | None = None
    """Leader or standby, and the term (None: a controller from before issue 25)."""


def fetch(client: ApiClient, agent: Callable[[str], ApiClient] | None = None) -> Status:
    """Every view; with `agent` (a client for an agent's admin URL), each live
    server's agent is asked for its load per block too."""
    servers = client.call(REST.servers)
    status = Status(tree=client.call(REST.tree), servers=servers,
                    load=client.call(REST.load), flows=client.call(REST.flows),
                    operations=client.call(REST.operations), events=client.call(REST.events),
                    leadership=client.call(REST.leadership))
    if agent is None:
        return status
    per_block = {name: block_loads(agent(s.admin_url), s.blocks)
                 for name, s in sorted(servers.servers.items()) if s.blocks and not s.failed}
    return Status(**{**vars(status), "blocks": per_block})


def block_loads(agent: ApiClient, blocks: Sequence[Block]) -> dict[str, float | None]:
    """Requests a second the agent served in each of `blocks` over its window."""
    try:
        report = agent.call(ADMIN.ops, CountRequest([(b.first, b.last) for b in blocks]))
    except MetaFlowError:
        return {str(b): None for b in blocks}
    return {str(b): rate for b, rate in zip(blocks, report.rates(), strict=True)}


# -- the summary -------------------------------------------------------------------


def format_status(status: Status, controller: str, events: int = DEFAULT_EVENTS,
                  flows: bool = False) -> str:
    """The operator's summary: a headline, then servers, the tree, operations,
    flow tables (entries too with `flows`) and the last `events` events."""
    sections = [_headline(status, controller), _servers(status.servers, status.load),
                _blocks(status.blocks), _tree(status.tree), _operations(status.operations),
                _flows(status.flows, flows), _events(status.events, events)]
    return "\n\n".join(s for s in sections if s) + "\n"


def _headline(status: Status, controller: str) -> str:
    tree = status.tree
    if tree.built:
        built = f"tree built (root {tree.root}, {len(tree.leaves)} leaves)"
    else:
        waiting = ", ".join(tree.missing_servers) or "nothing registered yet"
        built = f"tree not built: waiting for {waiting}"
    states = Counter(_state(info.state, info.failed) for info in status.servers.servers.values())
    servers = f"{len(status.servers.servers)} servers" + (
        " (" + ", ".join(f"{n} {s}" for s, n in sorted(states.items())) + ")" if states else "")
    entries = sum(len(table) for table in status.flows.switches.values())
    running = len(status.operations.operations)
    unbacked = _unbacked(status.servers)
    copies = f"; {unbacked} block{'s' if unbacked != 1 else ''} without a live backup" if unbacked else ""
    load = status.load
    lines = [f"controller {controller}{_leadership(status.leadership)}",
             f"{built}; {servers}; {len(status.flows.switches)} switches with {entries} "
             f"MetaFlow entries; {running} operation{'s' if running != 1 else ''} under way{copies}"]
    if load.servers:
        lines.append(f"load {sum(load.servers.values()):.0f} packets/s to servers; max/mean "
                     f"{load.max_over_mean:.2f}, imbalance factor {load.imbalance:.3f}")
    return "\n".join(lines)


def _leadership(view: LeadershipView | None) -> str:
    """The headline's word on leadership: nothing for the one controller without etcd."""
    if view is None or not view.coordinated:
        return ""
    if view.state == "leader":
        return f": leader, term {view.term}" + ("" if view.etcd_reachable else " (etcd unreachable)")
    return f": STANDBY ({view.reason}); the leader is {view.leader or 'unknown'}"


def _unbacked(view: ServersView) -> int:
    """Blocks served with no copy on another live server, when the cluster
    keeps backups at all (r=1 has none, and saying so on every line is noise)."""
    live = [s for s in view.servers.values() if not s.failed]
    backups = {b for s in live for b in s.backups}
    return sum(b not in backups for s in live for b in s.blocks) if backups else 0


def _state(state: str | None, failed: str | None) -> str:
    return "failed" if failed else (state or "unplaced")


def _servers(view: ServersView, load: LoadView) -> str:
    """One row each; ``pkts/s`` is the load the switches counted toward it
    (``-`` until two polls have run, or with polling off)."""
    if not view.servers:
        return ""
    rows = []
    for name, s in sorted(view.servers.items()):
        use = f"{100 * s.keys / s.capacity:.0f}%" if s.capacity else "-"
        note = f"failed: {s.failed}" if s.failed else (f"in {s.operation}" if s.operation else "")
        rows.append([name, _state(s.state, s.failed), str(s.keys), str(s.capacity), use, s.data_ip,
                     " ".join(str(b) for b in s.blocks) or "-", " ".join(str(b) for b in s.backups) or "-",
                     f"{load.servers[name]:.0f}" if name in load.servers else "-", note])
    return "servers\n" + _table(["name", "state", "keys", "capacity", "use", "data ip", "blocks", "backups",
                                 "pkts/s", ""], rows)


def _blocks(per_server: dict[str, dict[str, float | None]]) -> str:
    if not per_server:
        return ""
    rows = [[name, block, "-" if rate is None else f"{rate:.0f}"]
            for name, blocks in per_server.items() for block, rate in blocks.items()]
    title = "requests/s per block (each agent's count, POST /ops)"
    return title + "\n" + _table(["server", "block", "req/s"], rows)


def _tree(view: TreeView) -> str:
    if not view.built or view.root is None:
        return ""
    lines = ["tree"]

    def walk(node: str, depth: int) -> None:
        leaf = view.leaves.get(node)
        label = f"{node} ({leaf.state})" if leaf is not None else node
        lines.append("  " * (depth + 1) + label)
        for child in view.inner.get(node, []):
            walk(child, depth + 1)

    walk(view.root, 0)
    return "\n".join(lines)


def _operations(view: OperationsView) -> str:
    if not view.operations:
        return ""
    rows = [[op.id, op.kind, op.server, op.step, f"{op.seconds:.1f} s"] for op in view.operations]
    return "operations under way\n" + _table(["id", "kind", "server", "step", "for"], rows)


def _flows(view: FlowsView, entries: bool) -> str:
    if not view.switches:
        return ""
    switches = sorted(view.switches.items(), key=lambda item: int(item[0]))
    if not entries:
        rows = [[dpid, str(len(table))] for dpid, table in switches]
        return "flow tables (--flows lists the entries)\n" + _table(["dpid", "entries"], rows)
    lines = ["flow tables"]
    for dpid, table in switches:
        lines.append(f"  dpid {dpid}: {len(table)} entries")
        lines.extend(f"    {_entry(e)}" for e in table)
    return "\n".join(lines)


def _entry(e: FlowInfo) -> str:
    rewrite = f", set dl_dst {e.set_dl_dst}" if e.set_dl_dst else ""
    return f"{str(e.prefix):<18} -> port {e.out_port}{rewrite} (priority {e.priority})"


def _events(view: EventsView, last: int) -> str:
    shown = view.events[-last:] if last > 0 else []
    if not shown:
        return ""
    lines = [f"last {len(shown)} of {len(view.events)} events (t: controller clock, s)"]
    for event in shown:
        detail = " ".join(f"{k}={_text(v)}" for k, v in event.items() if k not in ("t", "event"))
        t = event.get("t")
        when = f"{t:10.3f}" if isinstance(t, (int, float)) else f"{t!s:>10}"
        lines.append(f"  {when}  {event.get('event', '?')!s:<22} {detail}".rstrip())
    return "\n".join(lines)


def _text(value: object) -> str:
    return value if isinstance(value, str) else json.dumps(value, separators=(",", ":"))


def _table(headers: Sequence[str], rows: Iterable[Sequence[str]]) -> str:
    grid = [list(headers), *(list(r) for r in rows)]
    widths = [max(len(row[i]) for row in grid) for i in range(len(headers))]
    return "\n".join("  " + "  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip()
                     for row in grid)


# -- the command -------------------------------------------------------------------


def add_controller_arguments(p: argparse.ArgumentParser) -> None:
    """Where the controller's REST API is and how to sign for it: every
    subcommand that talks to the controller takes these."""
    p.add_argument("--controller", default=DEFAULT_CONTROLLER, metavar="URL[,URL...]",
                   help=f"the controller's REST API (default {DEFAULT_CONTROLLER}); several, "
                        "separated by commas: the controllers of which one leads")
    p.add_argument("--secret-file", default=None, metavar="FILE",
                   help="the cluster's secret (metaflowctl secret FILE makes one); without it, "
                        "only a controller started with --open-reads answers")
    p.add_argument("--timeout", type=float, default=10.0, help="seconds per REST call")


def controller_client(args: argparse.Namespace) -> ApiClient:
    """The signed client of `add_controller_arguments`' controller (of the
    leader, when several are given)."""
    secret = load_secret(args.secret_file) if args.secret_file else None
    return LeaderClient(args.controller, secret, timeout=args.timeout)


def failed(command: str, args: argparse.Namespace, exc: MetaFlowError) -> int:
    """Say why a call to the controller failed (with a hint for a signature
    refused); the exit status 2."""
    hint = ""
    if isinstance(exc, AuthError):
        hint = ("\n(is --secret-file the cluster's secret?)" if args.secret_file
                else "\n(the controller wants signed calls: pass --secret-file)")
    print(f"metaflowctl {command}: {exc}{hint}", file=sys.stderr)
    return 2


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_controller_arguments(p)
    p.add_argument("--json", action="store_true", help="print every view as one JSON object")
    p.add_argument("--events", type=int, default=DEFAULT_EVENTS, metavar="N",
                   help=f"recent events to show (default {DEFAULT_EVENTS})")
    p.add_argument("--flows", action="store_true", help="list every switch's MetaFlow entries")
    p.add_argument("--blocks", action="store_true",
                   help="ask every live server's agent for its requests a second per block")


def run(args: argparse.Namespace) -> int:
    """Print the status; exit 2 when the secret or the controller fails us."""
    try:
        secret = load_secret(args.secret_file) if args.secret_file else None
        agent = (lambda url: ApiClient(url, secret, timeout=args.timeout)) if args.blocks else None
        controller = controller_client(args)
        status = fetch(controller, agent)
    except MetaFlowError as exc:
        return failed("status", args, exc)
    if args.json:
        print(json.dumps(codec.to_json(status), indent=1))
    else:
        print(format_status(status, controller.base_url, args.events, args.flows), end="")
    return 0
