"""The controller's REST API (HTTP+JSON, port 8080 on the management address), declared once.

Agents register and send heartbeats here; operators (`metaflowctl status`)
and tests read the views and ask for splits and fail-overs. The controller
serves exactly these routes (`controller.rest`). Every route needs the
cluster's signature; the views may be opened to unsigned readers with the
controller's ``--open-reads``.

Registration binds a name to its data address, MAC and admin URL: another
registration under the same name with different ones is refused (409)
while the first is alive, so no one can take over a server's name and
redirect its migrations.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from client_lib.api.admin import Role
from client_lib.api.route import Route
from client_lib.cidr import Block

# -- agents ----------------------------------------------------------------------


@dataclass(frozen=True)
class Registration:
    """What the controller needs to route to and manage one storage server."""

    name: str
    data_ip: str
    data_mac: str
    data_port: int
    admin_url: str
    store: str
    capacity: int
    space: Block
    owned: list[Block]
    replication: str = ""
    """host:port of its replication listener (where primaries stream to it)."""
    roles: list[Role] = field(default_factory=list)
    """What it holds, with epochs: a restarted controller rebuilds from these."""
    suspended: bool = False
    """True after the agent restarted: it serves nothing until it is told
    (`Registered.roles`, or an exclusive ``/assign``), so a server that was
    declared failed never serves what it saved."""
    incarnation: str = ""
    """Drawn at random when the agent process starts. A registration with
    the incarnation of the one before is the same process registering again
    (its heartbeat timed out, say), not a restart, whatever `suspended` says
    of the moment it was sent: an agent that registered suspended, then was
    assigned its roles by the first build while its next registration was on
    its way, must not be failed over as restarted (real agents at k=32,
    where a build holds the controller for seconds). "": not said."""


@dataclass(frozen=True)
class Registered:
    name: str
    roles: list[Role] | None = None
    """The roles the agent is to hold, and only those (None: the controller
    has no word yet, e.g. it is rebuilding; keep what you hold, suspended if
    suspended, until an exclusive ``/assign``). [] for a server declared
    failed: it drops everything and rejoins empty."""
    term: int = 0
    """The leadership term of the controller that answered (0: a single
    controller without etcd). An agent that has seen a higher term does
    not adopt these roles: the answer comes from an older leader."""
    liveness_port: int = 0
    """The UDP port, on the controller's REST address, where it takes
    liveness datagrams (`client_lib.liveness`); 0: none (an older
    controller, or ``--liveness-port 0``): beat over HTTP."""


@dataclass(frozen=True)
class Heartbeat:
    keys: int
    owned: list[Block]
    frozen: list[Block]
    degraded: list[Block] = field(default_factory=list)
    """Blocks whose primary (this agent) could not get a write acknowledged
    by a synced member: it answers TRYAGAIN for them until the controller
    gives the block a newer epoch (re-syncing that member)."""


@dataclass(frozen=True)
class Ack:
    ok: bool
    datagram_age_s: float | None = None
    """The answer to a heartbeat: how long ago the controller took this
    agent's last liveness datagram (None: none yet, or an older
    controller). Datagrams that arrive while their replies do not (a
    controller starved of CPU replies late) are no reason to beat over HTTP
    instead (`nat_agent.registration`)."""


# -- views -----------------------------------------------------------------------


@dataclass(frozen=True)
class SwitchInfo:
    dpid: int
    layer: str | None
    group: str | None


@dataclass(frozen=True)
class HostInfo:
    ip: str
    mac: str
    dpid: int
    port: int


@dataclass(frozen=True)
class TopologyView:
    switches: list[SwitchInfo]
    links: list[tuple[int, int, int, int]]
    hosts: list[HostInfo]
    pods: list[list[str]]
    missing_servers: list[str]


@dataclass(frozen=True)
class LeafInfo:
    state: str
    blocks: list[Block]
    parent: str | None


@dataclass(frozen=True)
class TreeView:
    built: bool
    missing_servers: list[str]
    root: str | None = None
    inner: dict[str, list[str]] = field(default_factory=dict)
    leaves: dict[str, LeafInfo] = field(default_factory=dict)


@dataclass(frozen=True)
class FlowInfo:
    priority: int
    prefix: Block
    out_port: int
    set_dl_dst: str | None


@dataclass(frozen=True)
class FlowsView:
    """MetaFlow entries per switch, by dpid (as text: JSON keys are strings)."""

    switches: dict[str, list[FlowInfo]]


@dataclass(frozen=True)
class PrefixLoad:
    """One MetaFlow entry's traffic: packets a second toward its port."""

    prefix: Block
    port: int
    packets_per_s: float


@dataclass(frozen=True)
class LoadView:
    """Request load as the switches count it (`controller.load`): packets a
    second per server (at its edge switch, toward its port) and per entry of
    every polled switch (by dpid, as text). Empty until two polls have run;
    `poll_s` 0 means polling is off."""

    poll_s: float
    servers: dict[str, float]
    switches: dict[str, list[PrefixLoad]]
    max_over_mean: float = 0.0
    """Over the servers that own blocks; 0 without load."""
    imbalance: float = 0.0
    """Lunule's imbalance factor over the same servers (`btree.balance`), in [0, 1]."""


@dataclass(frozen=True)
class ServerInfo:
    data_ip: str
    admin_url: str
    keys: int
    capacity: int
    failed: str | None
    state: str | None
    blocks: list[Block]
    operation: str | None
    """The operation under way on this server (a split, a fail-over), if any."""
    backups: list[Block] = field(default_factory=list)
    """Blocks it holds a copy of for another primary."""


@dataclass(frozen=True)
class ServersView:
    servers: dict[str, ServerInfo]


@dataclass(frozen=True)
class EventsView:
    """Recent events, oldest first: each has ``t``, ``event`` and its details."""

    events: list[dict[str, object]]


@dataclass(frozen=True)
class SplitsView:
    """Every finished split with its timings."""

    splits: list[dict[str, object]]


@dataclass(frozen=True)
class OperationInfo:
    id: str
    kind: str
    server: str
    step: str
    seconds: float


@dataclass(frozen=True)
class OperationsView:
    """Splits and fail-overs under way."""

    operations: list[OperationInfo]


@dataclass(frozen=True)
class DrainInfo:
    """One server's drain: ``draining`` (under way), ``drained`` (it holds
    nothing and takes nothing new: it may be stopped), or ``stopped`` (it could
    not finish; `reason` says why, and the server is back in service with
    what it still holds)."""

    state: str
    blocks_left: int
    """Blocks it still owns as primary."""
    backups_left: int
    """Blocks it still keeps a backup copy of."""
    moves: int
    """Moves of its blocks done (one migration per target)."""
    backups_moved: int
    keys_moved: int
    seconds: float
    """Since the drain started (until it ended)."""
    step: str = ""
    """The drain's current step while it runs."""
    reason: str = ""


@dataclass(frozen=True)
class DrainsView:
    """Servers being drained, drained, or whose drain stopped; a controller
    restart forgets them (a drain is not resumed)."""

    drains: dict[str, DrainInfo]


# -- actions ---------------------------------------------------------------------


@dataclass(frozen=True)
class FailRequest:
    reason: str = "marked failed over REST"


@dataclass(frozen=True)
class Outcome:
    """How an operation the caller asked for ended (`ok` False: refused or
    aborted, with the reason in `detail`)."""

    operation: str
    server: str
    ok: bool
    detail: dict[str, object]


@dataclass(frozen=True)
class LeadershipView:
    """This controller's part among several (issue 25; `controller.leadership`):
    `state` leader or standby, the leader's `term` (0: never led), the
    leader's REST URL as etcd has it, whether etcd answers, why this one is
    a standby. The one controller without etcd: leader at term 0, not
    `coordinated`."""

    state: str
    term: int
    leader: str | None
    etcd_reachable: bool
    coordinated: bool
    reason: str = ""
    takeovers: int = 0


# -- routes ----------------------------------------------------------------------


class REST:
    """The routes, by name (a namespace, not instantiated)."""

    topology: Route[None, TopologyView] = Route(
        "GET", "/metaflow/topology", None, TopologyView, changes=False,
        summary="switches with layers and groups, links, hosts, pods")
    tree: Route[None, TreeView] = Route(
        "GET", "/metaflow/tree", None, TreeView, changes=False,
        summary="the B-tree: inner nodes, leaves with state and blocks")
    flows: Route[None, FlowsView] = Route(
        "GET", "/metaflow/flows", None, FlowsView, changes=False,
        summary="MetaFlow entries per switch")
    servers: Route[None, ServersView] = Route(
        "GET", "/metaflow/servers", None, ServersView, changes=False,
        summary="storage servers with key counts, capacity, state")
    events: Route[None, EventsView] = Route(
        "GET", "/metaflow/events", None, EventsView, changes=False,
        summary="recent events (splits, take-overs, DATA-LOST, ...)")
    splits: Route[None, SplitsView] = Route(
        "GET", "/metaflow/splits", None, SplitsView, changes=False,
        summary="every split with its timings")
    load: Route[None, LoadView] = Route(
        "GET", "/metaflow/load", None, LoadView, changes=False,
        summary="packets a second per server and per MetaFlow entry, from the switches' counters")
    operations: Route[None, OperationsView] = Route(
        "GET", "/metaflow/operations", None, OperationsView, changes=False,
        summary="splits and fail-overs under way")
    drains: Route[None, DrainsView] = Route(
        "GET", "/metaflow/drains", None, DrainsView, changes=False,
        summary="drains under way, done or stopped, with what each server still holds")
    leadership: Route[None, LeadershipView] = Route(
        "GET", "/metaflow/leadership", None, LeadershipView, changes=False,
        summary="leader or standby, the term, the leader's URL, whether etcd answers "
                "(a standby serves it too)")
    register = Route(
        "POST", "/metaflow/agents", Registration, Registered, changes=True,
        summary="an agent registers")
    heartbeat = Route(
        "POST", "/metaflow/agents/{name}/heartbeat", Heartbeat, Ack, changes=True,
        summary="an agent is alive (404: register again)")
    split: Route[None, Outcome] = Route(
        "POST", "/metaflow/servers/{name}/split", None, Outcome, changes=True,
        summary="split a server now, and wait for the outcome", waits=True)
    fail = Route(
        "POST", "/metaflow/servers/{name}/fail", FailRequest, Outcome, changes=True,
        summary="take a server out of service, and wait for the take-over", waits=True)

    drain: Route[None, Outcome] = Route(
        "POST", "/metaflow/servers/{name}/drain", None, Outcome, changes=True,
        summary="start moving everything a server holds to others (progress: drains); "
                "404 unknown, 409 failed, busy or already draining")
    undrain: Route[None, Outcome] = Route(
        "POST", "/metaflow/servers/{name}/undrain", None, Outcome, changes=True,
        summary="a drained server goes back to the idle pool; 409 if it is not drained")
    ALL: tuple[Route[Any, Any], ...] = ()


REST.ALL = tuple(v for v in vars(REST).values() if isinstance(v, Route))
