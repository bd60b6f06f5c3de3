"""The physical side of the B-tree as plain data: which switch carries which
group's table, and which ports lead down to each child or up toward the root.

`topology/` fills this in from a discovered graph; `btree/` only reads it, so
the core never depends on networkx or on how the topology was found.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Literal, TypeAlias

Port = tuple[int, int]
"""(dpid, port number)."""
Peer: TypeAlias = tuple[Literal["switch"], Port] | tuple[Literal["host"], str]
"""What a switch port leads to: another switch's port, or a host."""


@dataclass(frozen=True)
class SwitchPorts:
    dpid: int
    layer: str                               # core, agg, edge, or client (no storage below)
    group: str | None                        # B-tree inner node whose table this switch carries
    down: Mapping[str, tuple[int, ...]]      # B-tree child id -> ports toward it
    up: tuple[int, ...]                      # ports toward the root, in order


@dataclass(frozen=True)
class Fabric:
    switches: Mapping[int, SwitchPorts]
    leaf_mac: Mapping[str, str]              # storage server (leaf id) -> MAC
    links: Mapping[Port, Port]               # switch port -> switch port, both directions
    hosts: Mapping[str, Port]                # every host (storage and client) -> attachment
    host_mac: Mapping[str, str] = field(default_factory=dict)
    host_at: Mapping[Port, str] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "host_at", {at: host for host, at in self.hosts.items()})

    def members(self) -> dict[str, list[int]]:
        """Group id -> dpids of the switches that carry its table."""
        out: dict[str, list[int]] = {}
        for sw in self.switches.values():
            if sw.group is not None:
                out.setdefault(sw.group, []).append(sw.dpid)
        return out

    def with_leaf(self, leaf: str, dpid: int, port: int, mac: str) -> Fabric:
        """This fabric with one more storage server, on a port of a switch that
        already carries a group of servers (a server that joined after the
        build): its group's table can then send IDs to it."""
        switch = self.switches[dpid]
        if switch.group is None:
            raise ValueError(f"switch {dpid} carries no group of servers")
        grown = replace(switch, down={**switch.down, leaf: (port,)})
        before = {h for h, at in self.hosts.items() if at == (dpid, port)}   # seen as a client
        hosts = {h: at for h, at in self.hosts.items() if h not in before}
        macs = {h: m for h, m in self.host_mac.items() if h not in before}
        return Fabric({**self.switches, dpid: grown}, {**self.leaf_mac, leaf: mac}, self.links,
                      {**hosts, leaf: (dpid, port)}, {**macs, leaf: mac})

    def peer(self, dpid: int, port: int) -> Peer | None:
        """What is on the other end of a switch port: ('switch', (dpid, port)),
        ('host', host id), or None for an unused port."""
        if (dpid, port) in self.links:
            return "switch", self.links[(dpid, port)]
        host = self.host_at.get((dpid, port))
        return ("host", host) if host is not None else None
