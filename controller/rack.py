"""A new rack online: the tree grows by the switch groups of a new edge switch
(or a new pod) while the controller runs (`topology.grow` says how and
when it may).

`grow_rack` updates the world (the tree gains the new groups, the planner
the new switches) once the core decides a server under a switch without a
group should join; its servers then join as idle leaves like any late
server. `rack_saga` pushes the new switches their full tables (up-rules and
their group's entries, read back and sent as differences, as a re-sync
does): no other switch's table changes until a block moves below the new
groups. A new switch that disconnects mid-push is re-synced when it comes
back, as any switch is.
"""

from __future__ import annotations

import logging

import networkx as nx

from controller.saga import Saga
from controller.world import SagaWorld
from topology.classify import TopologyError
from topology.grow import Growth, grow


def grow_rack(world: SagaWorld, graph: nx.Graph) -> tuple[Growth, list[int]] | str:
    """Grow the world's tree and planner by the new switch groups in `graph`;
    with the switches whose tables must be pushed, or the reason it cannot
    (nothing changed then)."""
    tree, planner = world.tree_or_raise(), world.planner_or_raise()
    try:
        growth = grow(tree, planner.fabric, graph)
    except TopologyError as exc:
        return str(exc)
    growth.apply(tree)
    switches = planner.extend(growth.fabric)
    world.event("rack-added", groups=[g for g, _, _ in growth.groups],
                parents=sorted({p for _, p, _ in growth.groups} - {g for g, _, _ in growth.groups}),
                switches=switches, servers=[leaf for leaf, _ in growth.leaves])
    return growth, switches


def rack_saga(world: SagaWorld, switches: list[int]) -> Saga:
    """Program the new groups' switches from what they hold."""
    yield from world.resync(switches)
    world.event("rack-programmed", logging.INFO, switches=switches)
