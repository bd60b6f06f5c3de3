"""A new rack in a running fabric: how the logical B-tree grows without a rebuild.

A storage server under a switch that carried no group of servers when the
tree was built (a new edge switch, or an edge switch that had only clients)
joins by growing the tree, never by re-mapping it. The discovered graph is
classified again (`topology.classify`, the same rules as a build) and the
result must *extend* what is built:

- every switch group of the tree is still there, with the same member
  switches and the same parent (the root layer, the levels and the group ids
  did not change);
- every switch already in the fabric keeps its uplinks, its layer (a client
  switch may become a member of a new group) and its ports toward the
  children it had;
- what is new is a set of switch groups: a new edge group under an existing
  aggregation group (a new rack in an existing pod), or a new aggregation
  group under the root with its edge groups (a new pod), and the storage
  servers under them.

Anything else (a switch that joins an existing group, a server under a
switch at another depth, a fabric discovered only in part) is refused with
the classifier's reason, and the caller tries again when the topology next
changes. A new group owns nothing, so its table is empty and every other
table reads the same: the growth is a table push to the switches of the new
groups only (their up-rules; their own entries once a block moves below
them), plus the tree and fabric update here. The new servers are idle
leaves in the new groups; a split or a backup placement uses them like any
other, and replica placement has one more rack (failure domain) to spread
over. The order of the new nodes among their siblings is the classifier's,
so a controller restarted after the growth maps the very same tree.

Pure: no I/O, no controller state.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from btree.fabric import Fabric, SwitchPorts
from btree.tree import LogicalBTree
from topology.builders import Topology
from topology.classify import Classification, TopologyError, build_fabric, classify


@dataclass(frozen=True)
class Growth:
    """What a new rack adds to a built tree and its fabric."""

    classification: Classification
    """The whole graph classified, as a build would map it now."""
    groups: tuple[tuple[str, str, int], ...]
    """(new group, its parent, its position among the parent's children), parents first."""
    leaves: tuple[tuple[str, str], ...]
    """(storage server, its new group), in the classifier's order."""
    fabric: Fabric
    """The fabric with the new switches and the ports toward the new groups."""

    def apply(self, tree: LogicalBTree) -> None:
        """Add the new groups to `tree` (its servers join as leaves one by one:
        `LogicalBTree.join`, once the caller knows each is in service)."""
        for group, parent, position in self.groups:
            tree.join_group(group, parent, position)


def grow(tree: LogicalBTree, fabric: Fabric, graph: Topology) -> Growth:
    """The growth that takes `tree` and `fabric` to the fabric discovered in
    `graph`; TopologyError (saying why) when `graph` is not a growth of it."""
    c = classify(graph)
    dpid = {s: graph.nodes[s]["dpid"] for s in c.level}
    built = fabric.members()
    for group, members in built.items():
        found = sorted(dpid[s] for s in c.groups.get(group, ()))
        if found != sorted(members):
            raise TopologyError(f"switch group {group} is now switches {found}, not {sorted(members)}: "
                                f"not a new rack; restart the controller to map the fabric again")
        if group != tree.root and c.parent.get(group) != tree.parent(group):
            raise TopologyError(f"switch group {group} now hangs below {c.parent.get(group)}, "
                                f"not {tree.parent(group)}")
    known = set(tree.inner_nodes())
    new = sorted((g for g in c.groups if g not in known), key=lambda g: c.level[c.groups[g][0]])
    if not new:
        raise TopologyError("no new switch group of servers in the discovered fabric")
    seen = known | set(tree.leaves())
    groups = []
    children = c.children()
    for group in new:
        parent = c.parent[group]
        groups.append((group, parent, sum(1 for k in children[parent][:children[parent].index(group)]
                                          if k in seen)))
        seen.add(group)
    leaves = tuple((h, g) for g in new for h in children[g] if h not in seen and h not in c.groups)
    return Growth(c, tuple(groups), leaves, _extended(fabric, build_fabric(c), set(new)))


def _extended(old: Fabric, now: Fabric, new_groups: set[str]) -> Fabric:
    """`old` with the switches of `now` that carry a new group, and the ports
    of the switches already there toward the new groups; refused where a
    switch already there would change otherwise."""
    switches: dict[int, SwitchPorts] = dict(old.switches)
    for dpid, found in now.switches.items():
        had = old.switches.get(dpid)
        if had is None:
            switches[dpid] = found
            continue
        if found.up != had.up:
            raise TopologyError(f"switch {dpid}'s uplinks are now ports {list(found.up)}, not "
                                f"{list(had.up)}: the levels of the fabric changed")
        if had.group is None and found.group in new_groups:
            switches[dpid] = found   # a client switch that now carries a new group
            continue
        if found.group != had.group:
            raise TopologyError(f"switch {dpid} now carries group {found.group}, not {had.group}")
        lost = {child: ports for child, ports in had.down.items() if found.down.get(child, ports) != ports}
        if lost:
            raise TopologyError(f"switch {dpid}'s ports toward {sorted(lost)} changed")
        switches[dpid] = replace(had, down={**had.down, **{child: ports for child, ports in found.down.items()
                                                           if child in new_groups}})
    servers = {h for g in new_groups for sw in now.switches.values() if sw.group == g
               for h in sw.down if h in now.leaf_mac}
    taken = {now.hosts[h] for h in servers}
    hosts = {h: at for h, at in old.hosts.items() if at not in taken}   # a server seen as a client before
    hosts.update({h: at for h, at in now.hosts.items() if h not in old.hosts or h in servers})
    macs = {**now.host_mac, **old.host_mac, **{h: now.host_mac[h] for h in servers}}
    return Fabric(switches, {**old.leaf_mac, **{h: now.leaf_mac[h] for h in servers}},
                  {**now.links, **old.links}, hosts, {h: m for h, m in macs.items() if h in hosts})
