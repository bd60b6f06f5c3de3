"""The REST API's views: each builds one response of `client_lib.api.rest`
from the core's state, on the decision loop (`controller.rest` runs them
through `query`). Reads only: nothing here changes the core.
"""

from __future__ import annotations

from btree.balance import imbalance_factor
from client_lib.api.rest import (
    DrainInfo,
    DrainsView,
    EventsView,
    FlowInfo,
    FlowsView,
    HostInfo,
    LeadershipView,
    LeafInfo,
    LoadView,
    OperationInfo,
    OperationsView,
    PrefixLoad,
    ServerInfo,
    ServersView,
    SplitsView,
    SwitchInfo,
    TopologyView,
    TreeView,
)
from controller.core import MetaFlowCore
from controller.drain import holdings
from controller.leadership import Leadership
from controller.telemetry import Gauges, ServerGauges
from controller.watch import owner_loads


def topology_view(core: MetaFlowCore) -> TopologyView:
    c = core.classification
    return TopologyView(
        switches=[SwitchInfo(d, c.layer.get(f"s{d}") if c else None,
                             c.group_of.get(f"s{d}") if c else None)
                  for d in sorted(core.inventory.dpids)],
        links=sorted(core.inventory.links),
        hosts=[HostInfo(h.ip, h.mac, h.dpid, h.port) for h in core.inventory.hosts.values()],
        pods=[list(p) for p in c.pods] if c else [],
        missing_servers=core.missing())


def tree_view(core: MetaFlowCore) -> TreeView:
    t = core.tree
    if t is None:
        return TreeView(False, core.missing())
    return TreeView(True, [], t.root, {n: t.children(n) for n in t.inner_nodes()},
                    {leaf: LeafInfo(t.state(leaf).name.lower(), t.blocks(leaf), t.parent(leaf))
                     for leaf in t.leaves()})


def flows_view(core: MetaFlowCore) -> FlowsView:
    planner = core.planner
    if planner is None:
        return FlowsView({})
    return FlowsView({str(dpid): [FlowInfo(e.priority, e.prefix, e.out_port, e.set_dl_dst)
                                  for e in sorted(planner.table(dpid).values())]
                      for dpid in sorted(planner.fabric.switches)})


def servers_view(core: MetaFlowCore) -> ServersView:
    tree = core.tree
    out = {}
    for name, s in sorted(core.registry.servers.items()):
        in_tree = tree is not None and name in tree.leaves()
        busy = core.operations.involving(name)
        backups = sorted(b for b, rs in core.replicas.of(name).items() if rs.primary != name) \
            if core.replicas is not None else []
        out[name] = ServerInfo(
            s.data_ip, s.admin_url, s.keys, core.world.capacity(s), s.failed,
            tree.state(name).name.lower() if tree is not None and in_tree else None,
            tree.blocks(name) if tree is not None and in_tree else list(s.reported),
            busy[0].kind if busy else None, backups)
    return ServersView(out)


def events_view(core: MetaFlowCore) -> EventsView:
    return EventsView(list(core.events))


def splits_view(core: MetaFlowCore) -> SplitsView:
    return SplitsView(list(core.splits))


def load_view(core: MetaFlowCore) -> LoadView:
    servers = core.watch.server_loads()
    owners = list(owner_loads(core.tree, servers).values())
    mean = sum(owners) / len(owners) if owners else 0.0
    return LoadView(core.settings.load_poll_s, {name: round(rate, 1) for name, rate in servers.items()},
                    {str(dpid): [PrefixLoad(r.block, r.port, round(r.packets_per_s, 1))
                                 for r in core.watch.meter.rates(dpid)]
                     for dpid in core.watch.meter.switches()},
                    round(max(owners) / mean, 3) if mean > 0 else 0.0,
                    round(imbalance_factor(owners, core.settings.load_capacity), 4))


def operations_view(core: MetaFlowCore) -> OperationsView:
    now = core.clock()
    return OperationsView([OperationInfo(op.id, op.kind, op.server, op.step, round(now - op.started, 3))
                           for op in core.operations.running.values()])



def drains_view(core: MetaFlowCore) -> DrainsView:
    """Each drain with what its server still holds (counted now, from the tree and the sets)."""
    now = core.clock()
    out = {}
    for name, drain in sorted(core.world.drains.items()):
        owned, backups = holdings(core.world, name)
        running = [op for op in core.operations.involving(name) if op.kind == "drain"]
        out[name] = DrainInfo(drain.state, len(owned), len(backups), len(drain.moves), drain.backups_moved,
                              sum(int(m["keys_moved"]) for m in drain.moves),
                              round((drain.finished or now) - drain.started, 3),
                              running[0].step if running else "", drain.reason)
    return DrainsView(out)


def leadership_view(lead: Leadership) -> LeadershipView:
    """Read off the leadership itself, not the core: a standby's or a stuck
    decision loop's answer still says who leads."""
    return LeadershipView(lead.state.value, lead.term, lead.leader_url, lead.etcd_reachable,
                          lead.coordinated, lead.reason, lead.takeovers)


def gauges(core: MetaFlowCore) -> Gauges:
    """The numbers a scrape of the controller's metrics shows (`controller.metrics`)."""
    now, tree, replicas, planner = core.clock(), core.tree, core.replicas, core.planner
    loads = core.watch.server_loads()
    leaves = set(tree.leaves()) if tree is not None else set()
    servers = {name: ServerGauges("failed" if s.failed else
                                  tree.state(name).name.lower() if tree is not None and name in leaves
                                  else "unplaced",
                                  s.keys, max(0.0, now - s.last_seen), loads.get(name))
               for name, s in core.registry.servers.items()}
    live = {s.name for s in core.registry.live()}
    sets = replicas.sets if replicas is not None else {}
    oldest: dict[str, tuple[int, float]] = {}
    for op in core.operations.running.values():
        count, age = oldest.get(op.kind, (0, 0.0))
        oldest[op.kind] = (count + 1, max(age, now - op.started))
    return Gauges(
        switches_connected=len(core.inventory.dpids), built=tree is not None,
        replicas=core.settings.replicas, table_budget=core.settings.table_budget,
        entries={dpid: len(planner.table(dpid)) for dpid in planner.fabric.switches} if planner else {},
        servers=servers, blocks=len(sets),
        blocks_without_live_backup=sum(not (set(s.synced) - {s.primary}) & live for s in sets.values()),
        blocks_not_serving=len(core.not_serving),
        imbalance_factor=imbalance_factor(list(owner_loads(tree, loads).values()),
                                          core.settings.load_capacity),
        imbalance_threshold=core.settings.imbalance_threshold, data_lost=len(core.lost), operations=oldest,
        heartbeat_timeout_s=core.settings.heartbeat_timeout_s,
        migration_lease_s=core.settings.migration_lease_s)
