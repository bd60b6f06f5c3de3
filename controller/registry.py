"""The storage servers, as their agents registered them, and whether they are alive.

A registration binds a name to a data address, a MAC and an admin URL, and
the binding is permanent for the controller's lifetime: a second
registration under the same name must come with the same identity (an
agent restarting, or re-registering after a controller restart), and no
other name may claim an address or admin URL already bound. So a caller
holding the cluster secret still cannot redirect a live server's
migrations to a machine of its choosing by re-registering it; replacing a
machine means a new name.

Pure state; no I/O. Two exceptions to "one thread", which the liveness
thread (`controller.liveness`) writes too: `heard`, which `silent` reads (a
dict whose entries are replaced whole, so a reader sees a beat or the one
before), and `hearing` (a deque, whose appends and pops are atomic).
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import TypeAlias

from client_lib.api.admin import Role
from client_lib.api.rest import Heartbeat, Registration
from client_lib.cidr import Block
from client_lib.errors import Conflict, NotFound
from client_lib.liveness import state_digest

Heard: TypeAlias = dict[str, tuple[float, int]]
"""Server name -> (when its last liveness datagram came, on the core's clock;
the key count it carried)."""


@dataclass
class Server:
    name: str
    data_ip: str
    data_mac: str
    admin_url: str
    capacity: int
    store: str
    replication: str = ""
    """host:port of its replication listener."""
    reported: list[Block] = field(default_factory=list)
    """What the agent last said it owns (registration, heartbeats)."""
    roles: list[Role] = field(default_factory=list)
    """Its roles with epochs, as it registered them (a rebuild's evidence)."""
    suspended: bool = False
    degraded: list[Block] = field(default_factory=list)
    frozen: list[Block] = field(default_factory=list)
    keys: int = 0
    last_seen: float = 0.0
    """When it was last heard: registration, HTTP heartbeat, or (merged by
    `Registry.silent`) a liveness datagram."""
    digest: bytes = b""
    """`state_digest` of the state it last sent over HTTP; a datagram that
    carries another says this record is not current."""
    failed: str | None = None
    """Why it is out of service; a failed server stays failed until it rejoins empty."""
    incarnation: str = ""
    """`Registration.incarnation`: which process of the agent's this is."""
    again: bool = False
    """Its last registration came from the process that registered before
    (same incarnation): its `suspended` may predate roles given since."""

    def identity(self) -> tuple[str, str, str]:
        return self.data_ip, self.data_mac.lower(), self.admin_url.rstrip("/")


class Hearing:
    """When the controller last heard any agent, by HTTP or by datagram, and
    the silences longer than `quiet_s` that a word ended since the decision
    loop last asked (`ended`): a silence of everyone is the controller's own
    (`controller.core.MetaFlowCore._heard`), and an agent's datagram ends it
    as an HTTP heartbeat does."""

    def __init__(self, quiet_s: float = float("inf")) -> None:
        self.quiet_s = quiet_s
        self._last = float("-inf")
        self._ended: deque[tuple[float, float]] = deque()

    def word(self, now: float) -> None:
        """Two threads racing here at most say one silence twice."""
        silence = now - self._last
        self._last = max(self._last, now)
        if silence > self.quiet_s:
            self._ended.append((now, silence))

    def ended(self) -> list[tuple[float, float]]:
        """(when, how long) of each silence a word ended since the last call."""
        ended = []
        while self._ended:
            ended.append(self._ended.popleft())
        return ended


class Registry:
    def __init__(self, space: Block) -> None:
        self.space = space
        self.servers: dict[str, Server] = {}
        self.hearing = Hearing()
        """When anyone was heard (`Hearing`); the core sets its `quiet_s`."""
        self.heard: Heard = {}
        """Liveness datagrams (`controller.liveness`); the controller's shim
        hands every new core's registry the one table its listener writes."""
        # Indexes (a server's identity never changes, and none is ever removed):
        # an ARP packet-in and a port status ask which server an address is, and
        # every registration whether its address or URL is taken; at 2,000
        # servers a scan per event was the registry's whole cost
        # (docs/decision-thread.md).
        self._by_ip: dict[str, str] = {}
        self._by_url: dict[str, str] = {}

    def __contains__(self, name: object) -> bool:
        return name in self.servers

    def __getitem__(self, name: str) -> Server:
        try:
            return self.servers[name]
        except KeyError:
            raise NotFound(f"unknown server {name!r}") from None

    def live(self) -> list[Server]:
        return [s for s in self.servers.values() if not s.failed]

    def by_ip(self, ip: str) -> Server | None:
        name = self._by_ip.get(ip)
        return None if name is None else self.servers[name]

    def register(self, reg: Registration, now: float) -> tuple[Server, bool]:
        """The server record, and whether it is new. Conflict (409) when the
        name is bound to another identity or the identity to another name."""
        if reg.space != self.space:
            raise Conflict(f"{reg.name} serves the space {reg.space}, the controller {self.space}")
        server = Server(reg.name, reg.data_ip, reg.data_mac, reg.admin_url.rstrip("/"), reg.capacity,
                        reg.store, reg.replication, list(reg.owned), list(reg.roles), reg.suspended,
                        last_seen=now, digest=state_digest(reg.owned, [], []), incarnation=reg.incarnation)
        old = self.servers.get(reg.name)
        if old is not None and old.identity() != server.identity():
            raise Conflict(f"{reg.name} is registered as {old.data_ip} ({old.data_mac}, {old.admin_url}); "
                           "a server's identity cannot change: give a new server a new name")
        taken = {self._by_ip.get(server.data_ip), self._by_url.get(server.admin_url)} - {None, reg.name}
        if taken:
            other = next(name for name in self.servers if name in taken)   # the first registered
            raise Conflict(f"{reg.name}: address {server.data_ip} or {server.admin_url} belongs to {other}")
        if old is not None:
            server.failed = old.failed
            server.keys = old.keys
            server.again = bool(reg.incarnation) and reg.incarnation == old.incarnation
        self.servers[reg.name] = server
        self._by_ip[server.data_ip] = self._by_url[server.admin_url] = reg.name
        return server, old is None

    def heartbeat(self, name: str, beat: Heartbeat, now: float) -> Server:
        server = self[name]
        server.last_seen = now
        server.keys = beat.keys
        server.reported = list(beat.owned)
        server.frozen = list(beat.frozen)
        server.degraded = list(beat.degraded)
        server.digest = state_digest(beat.owned, beat.frozen, beat.degraded)
        return server

    def catch_up(self) -> None:
        """Fold the liveness datagrams into the records: a server's
        `last_seen` is when it was last heard by HTTP or by datagram
        (whichever came last; a datagram's key count is then the current
        one). Every reader of `last_seen` (the silent-server sweep, hybrid
        mode's probes, the metrics) reads it after this, once a tick."""
        heard = self.heard
        for server in self.servers.values():
            beat = heard.get(server.name)
            if beat is not None and beat[0] > server.last_seen:
                server.last_seen, server.keys = beat

    def silent(self, now: float, timeout: float) -> list[Server]:
        """Live servers not heard for longer than `timeout` (as of the last `catch_up`)."""
        return [server for server in self.live() if now - server.last_seen > timeout]
