"""One site of `mininet_scenarios.sites_net` as a MetaFlow fabric (issue 29):
its own Open vSwitch switches in Mininet, its own controller serving the
site's prefix (``--space``) over its own agents, and one of its client hosts
as the site's border, where the site's nodes run and its WAN links end.

The border is an ordinary client of the fabric: it routes its site's prefix
to the fabric's gateway, as every client does, and the fabric's entries
carry each request to the agent that owns its ID; the other sites' prefixes
it routes over the WAN links by the kernel's longest-prefix match. What
arrives over the WAN for this site is forwarded into the fabric with the
border's own fabric address as its source (``MASQUERADE``): the controller
knows the border as one of its hosts and routes the replies back to it, and
conntrack hands them to the WAN link they came from, so the fabric never
needs routes for the other sites' addresses.
"""

from __future__ import annotations

import time
from pathlib import Path
from types import TracebackType

import networkx as nx

from client_lib.cidr import Block
from mininet_scenarios.hostns import HostNamespace
from mininet_scenarios.metaflow_net import MetaFlowNet
from topology import builders


def site_graph(servers: int = 4) -> nx.Graph:
    """A small leaf-spine fabric for one site: one core switch, two edges,
    `servers` storage servers split between them, and a client host per edge
    (the first is the border)."""
    if servers < 2 or servers % 2:
        raise ValueError(f"{servers} servers a site: an even number, at least 2")
    return builders.two_tier(core=1, edges=2, servers_per_edge=servers // 2, clients_per_edge=1)


class SiteFabric:
    """`graph` brought up as a MetaFlow fabric serving `prefix`; `border` is
    the host where the site's border lives (`border_ns` runs commands there)."""

    def __init__(self, graph: nx.Graph, prefix: Block, workdir: Path, *, replicas: int = 2,
                 agent_args: tuple[str, ...] = (), controllers: int = 1) -> None:
        """`controllers` > 1: that many, one leading through the site's etcd
        and the others standing by (docs/ha.md)."""
        clients = builders.client_hosts(graph)
        if not clients:
            raise ValueError("a site's fabric needs a client host for its border")
        self.border = clients[0]
        self.net = MetaFlowNet(graph, space=str(prefix), workdir=workdir, replicas=replicas,
                               agent_args=agent_args, controllers=controllers)
        self.killed: int | None = None

    def __enter__(self) -> SiteFabric:
        self.net.__enter__()
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.net.__exit__(kind, exc, tb)

    @property
    def border_ns(self) -> HostNamespace:
        return self.net.running.ns(self.border)

    @property
    def border_interface(self) -> str:
        """The border's interface into the fabric."""
        return str(self.net.running.host(self.border).defaultIntf())

    def kill_controller(self) -> None:
        """SIGKILL of the site's (leading) controller: the switches keep its
        entries; a standby, if the site has one, takes over."""
        if self.net.controllers:
            self.killed = self.net.kill_leader()
        elif self.net.controller is not None:
            self.net.controller.kill()
        else:
            raise RuntimeError("the site's controller is not running")

    def taken_over(self, timeout: float = 60.0) -> float:
        """Seconds until a living controller leads (after `kill_controller`,
        a standby)."""
        started = time.monotonic()
        self.net.leader(timeout)
        return time.monotonic() - started

    def restart_controller(self) -> float:
        """The killed controller back (a standby now, if the site has
        several), or a new one in its place; seconds until it is ready."""
        started = time.monotonic()
        if self.killed is None:
            return self.net.restart_controller(kill=True)
        self.net.revive_controller(self.killed)
        self.net.standby(self.killed)
        self.killed = None
        return time.monotonic() - started
