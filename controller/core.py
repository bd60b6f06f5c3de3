"""The controller's brain: discovery state, the B-tree, splits and failures.

Everything that decides is here; everything that talks is behind two small
interfaces, so tests drive the whole state machine with fake agents and a
fake fabric (faucet's valve/shim split):

- `SwitchIO` installs per-switch MetaFlow diffs and host routes and blocks
  until the switches confirm with a barrier (the os-ken app implements it);
- `AgentApi` is one storage server's admin API (`agents.HttpAgent`).

Calls are synchronous and not thread-safe: the os-ken app runs every call
on one worker thread.

Order of a split (ARCHITECTURE.md, "Migration without loss"): plan with the
agent's own counts as the oracle, freeze and copy to the target, apply the
tree change and push the flow diffs, wait for the barriers, then commit (the
target starts serving, the source deletes). A failure before the commit
aborts the migration and puts the entries back, so the source keeps serving.
"""

from __future__ import annotations

import logging
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Callable, Protocol

import networkx as nx

from btree.flows import FlowDiff, FlowEntry, FlowPlanner
from btree.split import SplitBounds, apply_split, plan_split
from btree.tree import LogicalBTree, Move, State, TreeError
from client_lib.cidr import Block
from controller.routing import Routes, diff_routes, host_routes
from topology.classify import (
    Classification,
    TopologyError,
    discovered_graph,
    map_topology,
)

log = logging.getLogger("metaflow.controller")


class SwitchIO(Protocol):
    def apply(self, diff: FlowDiff) -> None:
        """Send each switch its MetaFlow changes; return once all barriers are back."""

    def sync(self, dpid: int, entries: list[FlowEntry], routes: dict[str, int]) -> None:
        """Give one switch its whole table (it connected or reconnected)."""

    def routes(self, dpid: int, changed: dict[str, int], deleted: list[str]) -> None:
        """Update one switch's host routes."""


class AgentApi(Protocol):
    def health(self) -> dict: ...
    def count(self, first: int, last: int) -> int: ...
    def own(self, blocks: list[str], migration: str | None = None) -> dict: ...
    def migrate(self, blocks: list[str], target: str) -> dict: ...
    def commit(self, migration: str) -> dict: ...
    def abort(self, migration: str) -> dict: ...


@dataclass
class Server:
    """A storage server as its agent registered it."""

    name: str
    data_ip: str
    data_mac: str
    admin_url: str
    capacity: int
    owned: list[str] = field(default_factory=list)
    keys: int = 0
    last_seen: float = 0.0
    failed: str | None = None   # why, once it has failed


@dataclass
class Host:
    ip: str
    mac: str
    dpid: int
    port: int


class MetaFlowCore:
    def __init__(self, space: Block, switches: SwitchIO, agent: Callable[[str], AgentApi],
                 bounds: SplitBounds = SplitBounds(), bootstrap: str = "preallocate",
                 capacity: int | None = None, heartbeat_timeout: float = 6.0,
                 minimize: bool = True, clock: Callable[[], float] = time.monotonic) -> None:
        self.space = space
        self.switches = switches
        self.agent = agent                 # admin URL -> AgentApi
        self.bounds = bounds
        self.bootstrap = bootstrap
        self.capacity = capacity           # overrides the agents' own, if given
        self.heartbeat_timeout = heartbeat_timeout
        self.minimize = minimize
        self.clock = clock
        self.servers: dict[str, Server] = {}
        self.hosts: dict[str, Host] = {}   # by IP
        self.dpids: set[int] = set()
        self.links: set[tuple[int, int, int, int]] = set()
        self.graph: nx.Graph | None = None
        self.classification: Classification | None = None
        self.tree: LogicalBTree | None = None
        self.planner: FlowPlanner | None = None
        self.routes: Routes = {}
        self.events: deque[dict] = deque(maxlen=500)
        self.splits: list[dict] = []
        self.lost: list[dict] = []         # blocks whose data died with a server

    # -- record keeping --------------------------------------------------------

    def _event(self, kind: str, level: int = logging.INFO, **detail) -> dict:
        event = {"t": round(self.clock(), 3), "event": kind, **detail}
        self.events.append(event)
        log.log(level, "%s %s", kind, " ".join(f"{k}={v}" for k, v in detail.items()))
        return event

    # -- discovery inputs ------------------------------------------------------

    def switch_up(self, dpid: int) -> None:
        self.dpids.add(dpid)
        if self.planner is not None and dpid in self.planner.fabric.switches:
            # A switch that comes back gets its table again; the tree stays as it is.
            self.switches.sync(dpid, list(self.planner.table(dpid).values()), self.routes.get(dpid, {}))
            self._event("switch-resynced", dpid=dpid)

    def switch_down(self, dpid: int) -> None:
        self.dpids.discard(dpid)
        self.links = {link for link in self.links if dpid not in (link[0], link[2])}

    def link_up(self, a: int, pa: int, b: int, pb: int) -> None:
        if (b, pb, a, pa) not in self.links:
            self.links.add((a, pa, b, pb))

    def link_down(self, a: int, pa: int, b: int, pb: int) -> None:
        self.links -= {(a, pa, b, pb), (b, pb, a, pa)}

    def host_seen(self, ip: str, mac: str, dpid: int, port: int) -> bool:
        """A host's address and attachment, from an ARP packet-in on an edge
        port (ports that carry a discovered link are not host ports).
        Returns True when this is news (a new host or a move)."""
        if any((dpid, port) in ((a, pa), (b, pb)) for a, pa, b, pb in self.links):
            return False
        if self.knows(ip, mac, dpid, port):
            return False
        self.hosts[ip] = Host(ip, mac, dpid, port)
        if self.graph is not None:
            self._refresh_routes()
        return True

    def knows(self, ip: str, mac: str, dpid: int, port: int) -> bool:
        """Whether a host is already known exactly there (a re-announcement)."""
        return self.hosts.get(ip) == Host(ip, mac, dpid, port)

    def mac_of(self, ip: str) -> str | None:
        host = self.hosts.get(ip)
        return host.mac if host else None

    def register(self, doc: dict) -> Server:
        for key in ("name", "data_ip", "data_mac", "admin_url"):
            if not isinstance(doc.get(key), str) or not doc[key]:
                raise ValueError(f"registration needs {key!r}")
        server = Server(doc["name"], doc["data_ip"], doc["data_mac"], doc["admin_url"],
                        int(doc.get("capacity") or 1_000_000), list(doc.get("owned") or []),
                        last_seen=self.clock())
        old = self.servers.get(server.name)
        if old is not None and old.failed:
            server.failed = old.failed  # a failed server stays failed until it rejoins empty
        self.servers[server.name] = server
        self._event("agent-registered", name=server.name, ip=server.data_ip, owned=len(server.owned))
        return server

    def heartbeat(self, name: str, doc: dict) -> bool:
        server = self.servers.get(name)
        if server is None:
            return False
        server.last_seen = self.clock()
        server.keys = int(doc.get("keys", server.keys))
        server.owned = list(doc.get("owned", server.owned))
        return True

    # -- building the network --------------------------------------------------

    def _graph(self) -> nx.Graph:
        storage = {s.data_ip: s.name for s in self.servers.values()}
        hosts = [(storage.get(h.ip, f"h{h.ip}"), h.dpid, h.port, h.mac, h.ip,
                  "storage" if h.ip in storage else "client")
                 for h in self.hosts.values() if h.dpid in self.dpids]
        return discovered_graph(self.dpids, self.links, hosts)

    def missing(self) -> list[str]:
        """What keeps the network from being built: servers not located yet."""
        return sorted(s.name for s in self.servers.values() if s.data_ip not in self.hosts)

    def build(self) -> bool:
        """Map the discovered topology onto the B-tree and program every switch.
        Ownership comes from the agents when they report some (a restarted
        controller), else from the bootstrap policy."""
        if self.tree is not None:
            return True
        if not self.servers or self.missing():
            return False
        graph = self._graph()
        try:
            classification, tree, fabric = map_topology(graph, self.space)
        except TopologyError as exc:
            self._event("topology-not-mappable", logging.WARNING, reason=str(exc))
            return False
        self.graph, self.classification, self.tree = graph, classification, tree
        restored = self._restore_ownership(tree)
        if not restored:
            self._bootstrap(tree)
        self.planner = FlowPlanner(tree, fabric, minimize=self.minimize)
        self.routes = host_routes(graph)
        for dpid in sorted(fabric.switches):
            self.switches.sync(dpid, list(self.planner.table(dpid).values()), self.routes.get(dpid, {}))
        self._event("network-built", switches=len(fabric.switches), servers=len(tree.leaves()),
                    busy=len(tree.leaves_in(State.BUSY)), restored=restored,
                    entries=self.planner.total_entries())
        return True

    def _restore_ownership(self, tree: LogicalBTree) -> bool:
        owners = {s.name: s.owned for s in self.servers.values() if s.owned}
        if not owners:
            return False
        tree.bootstrap_organic(next(iter(owners)))
        for name, blocks in owners.items():
            tree.transfer([Block.parse(b) for b in blocks], name)
        tree.check()
        return True

    def _bootstrap(self, tree: LogicalBTree) -> None:
        leaves = tree.leaves()
        if self.bootstrap == "organic":
            moves = tree.bootstrap_organic(leaves[0])
        else:
            _, _, count = self.bootstrap.partition(":")
            moves = tree.bootstrap_preallocate(int(count) if count else max(1, len(leaves) // 2))
        for leaf in {m.target for m in moves}:
            server = self.servers[leaf]
            self.agent(server.admin_url).own([str(b) for b in tree.blocks(leaf)])
            server.owned = [str(b) for b in tree.blocks(leaf)]

    def _refresh_routes(self) -> None:
        self.graph = self._graph()
        new = host_routes(self.graph)
        for dpid, table in new.items():
            changed, deleted = diff_routes(self.routes.get(dpid, {}), table)
            if changed or deleted:
                self.switches.routes(dpid, changed, deleted)
        self.routes = new

    # -- splits -----------------------------------------------------------------

    def _capacity(self, server: Server) -> int:
        return self.capacity or server.capacity

    def due_for_split(self) -> list[str]:
        if self.tree is None:
            return []
        return [s.name for s in self.servers.values()
                if not s.failed and s.keys >= self._capacity(s) and self.tree.state(s.name) is State.BUSY]

    def split(self, name: str) -> dict:
        """Split one server now; returns what happened, with timings."""
        started = self.clock()
        server = self.servers[name]
        source = self.agent(server.admin_url)
        plan = plan_split(self.tree, name, lambda _leaf, first, last: source.count(first, last),
                          self.bounds, method="aligned", cost=self.planner.cost_of)
        if not plan.ok:
            return self._event("split-refused", logging.WARNING, server=name, reason=plan.reason)
        target = self.servers[plan.target]
        blocks = [str(b) for b in plan.move]
        migration = source.migrate(blocks, target.admin_url)
        copied = self.clock()
        moves = apply_split(self.tree, plan)
        diff = self.planner.update(moves)
        try:
            self.switches.apply(diff)
        except Exception as exc:
            self._undo(moves, list(diff))
            source.abort(migration["id"])
            return self._event("split-aborted", logging.ERROR, server=name, reason=str(exc))
        flows_done = self.clock()
        source.commit(migration["id"])
        finished = self.clock()
        server.owned = [str(b) for b in self.tree.blocks(name)]
        target.owned = [str(b) for b in self.tree.blocks(target.name)]
        record = {"server": name, "target": target.name, "blocks": blocks,
                  "keys_moved": migration.get("keys", plan.keys_moved), "keys_total": plan.keys_total,
                  "switches": len(diff), "flow_mods": sum(len(d) for d in diff.values()),
                  "copy_s": round(copied - started, 4), "flows_s": round(flows_done - copied, 4),
                  "total_s": round(finished - started, 4)}
        self.splits.append(record)
        self._event("split", **record)
        return record

    def _undo(self, moves: list[Move], dpids: list[int]) -> None:
        """Put the tree back and give the touched switches their whole tables:
        how much of the failed diff they applied is unknown."""
        back = [Move(m.block, m.target, m.source) for m in moves]
        for move in back:
            self.tree.transfer([move.block], move.target)
        self.planner.update(back)
        for dpid in dpids:
            self.switches.sync(dpid, list(self.planner.table(dpid).values()), self.routes.get(dpid, {}))

    # -- failures ----------------------------------------------------------------

    def fail(self, name: str, reason: str) -> dict:
        """An idle server takes over a failed one's blocks. If the failed
        server's agent still answers over the management network (its edge
        link died, not the server), the blocks' keys are copied over first,
        exactly as in a split, and nothing is lost. Otherwise its data is gone
        (there is no replication yet): that is said loudly, never silently."""
        server = self.servers[name]
        if server.failed:
            return {"server": name, "already": server.failed}
        started = self.clock()
        server.failed = reason
        if self.tree is None or self.tree.state(name) is State.FAILED:
            return self._event("server-failed", logging.ERROR, server=name, reason=reason)
        try:
            takeover = self.tree.fail(name)
        except TreeError as exc:
            return self._event("takeover-impossible", logging.CRITICAL, server=name, reason=str(exc))
        blocks = [str(m.block) for m in takeover.moves]
        salvaged = False
        if takeover.successor is not None:
            successor = self.servers[takeover.successor]
            migration = self._salvage(server, successor, blocks) if blocks else None
            if migration is None:
                self.agent(successor.admin_url).own(blocks)
            self.switches.apply(self.planner.update(list(takeover.moves)))
            if migration is not None:
                salvaged = self._commit_salvage(server, migration)
                if not salvaged:
                    self.agent(successor.admin_url).own(blocks)
            successor.owned = [str(b) for b in self.tree.blocks(successor.name)]
        if blocks and not salvaged:
            lost = {"server": name, "blocks": blocks, "keys_lost_at_most": server.keys, "reason": reason}
            self.lost.append(lost)
            self._event("DATA-LOST", logging.ERROR, **lost,
                        note="no replication: metadata in these blocks is gone until rewritten")
        return self._event("takeover", logging.WARNING, server=name, successor=takeover.successor,
                           blocks=len(blocks), same_parent=takeover.same_parent, salvaged=salvaged,
                           why=takeover.reason, seconds=round(self.clock() - started, 4))

    def _salvage(self, server: Server, successor: Server, blocks: list[str]) -> dict | None:
        """Copy a failed server's blocks to its successor over the management
        network, if its agent still answers; None when it does not."""
        try:
            return self.agent(server.admin_url).migrate(blocks, successor.admin_url)
        except Exception as exc:  # unreachable or refusing: the data cannot be saved
            self._event("salvage-impossible", logging.WARNING, server=server.name, reason=str(exc))
            return None

    def _commit_salvage(self, server: Server, migration: dict) -> bool:
        try:
            self.agent(server.admin_url).commit(migration["id"])
            return True
        except Exception as exc:
            self._event("salvage-failed", logging.ERROR, server=server.name, reason=str(exc))
            return False

    def port_down(self, dpid: int, port: int) -> None:
        for server in self.servers.values():
            host = self.hosts.get(server.data_ip)
            if host is not None and (host.dpid, host.port) == (dpid, port) and not server.failed:
                self.fail(server.name, f"edge port {dpid}:{port} went down")

    def check_heartbeats(self) -> None:
        now = self.clock()
        for server in list(self.servers.values()):
            if not server.failed and now - server.last_seen > self.heartbeat_timeout:
                self.fail(server.name, f"no heartbeat for {now - server.last_seen:.1f} s")

    # -- views for the REST API -----------------------------------------------------

    def topology_view(self) -> dict:
        c = self.classification
        switches = sorted(self.dpids)
        return {"switches": [{"dpid": d, "layer": c.layer.get(f"s{d}") if c else None,
                              "group": c.group_of.get(f"s{d}") if c else None} for d in switches],
                "links": sorted(self.links), "hosts": [vars(h) for h in self.hosts.values()],
                "pods": [list(p) for p in c.pods] if c else [],
                "missing_servers": self.missing()}

    def tree_view(self) -> dict:
        if self.tree is None:
            return {"built": False, "missing_servers": self.missing()}
        t = self.tree
        return {"built": True, "root": t.root,
                "inner": {n: t.children(n) for n in t.inner_nodes()},
                "leaves": {leaf: {"state": t.state(leaf).name.lower(),
                                  "blocks": [str(b) for b in t.blocks(leaf)],
                                  "parent": t.parent(leaf)} for leaf in t.leaves()}}

    def flows_view(self) -> dict:
        if self.planner is None:
            return {}
        return {str(dpid): [{"priority": e.priority, "prefix": str(e.prefix), "out_port": e.out_port,
                             "set_dl_dst": e.set_dl_dst} for e in sorted(self.planner.table(dpid).values())]
                for dpid in sorted(self.planner.fabric.switches)}

    def servers_view(self) -> dict:
        return {name: {"data_ip": s.data_ip, "admin_url": s.admin_url, "keys": s.keys,
                       "capacity": self._capacity(s), "failed": s.failed,
                       "state": self.tree.state(name).name.lower() if self.tree and name in self.tree.leaves() else None,
                       "blocks": [str(b) for b in self.tree.blocks(name)] if self.tree and name in self.tree.leaves() else s.owned}
                for name, s in sorted(self.servers.items())}

