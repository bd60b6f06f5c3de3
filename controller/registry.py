"""The storage servers, as their agents registered them, and whether they are alive.

A registration binds a name to a data address, a MAC and an admin URL, and
the binding is permanent for the controller's lifetime: a second
registration under the same name must come with the same identity (an
agent restarting, or re-registering after a controller restart), and no
other name may claim an address or admin URL already bound. So a caller
holding the cluster secret still cannot redirect a live server's
migrations to a machine of its choosing by re-registering it; replacing a
machine means a new name.

Pure state; no I/O.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from client_lib.api.admin import Role
from client_lib.api.rest import Heartbeat, Registration
from client_lib.cidr import Block
from client_lib.errors import Conflict, NotFound


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
    failed: str | None = None
    """Why it is out of service; a failed server stays failed until it rejoins empty."""

    def identity(self) -> tuple[str, str, str]:
        return self.data_ip, self.data_mac.lower(), self.admin_url.rstrip("/")


class Registry:
    def __init__(self, space: Block) -> None:
        self.space = space
        self.servers: dict[str, Server] = {}

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
        return next((s for s in self.servers.values() if s.data_ip == ip), None)

    def register(self, reg: Registration, now: float) -> tuple[Server, bool]:
        """The server record, and whether it is new. Conflict (409) when the
        name is bound to another identity or the identity to another name."""
        if reg.space != self.space:
            raise Conflict(f"{reg.name} serves the space {reg.space}, the controller {self.space}")
        server = Server(reg.name, reg.data_ip, reg.data_mac, reg.admin_url.rstrip("/"), reg.capacity,
                        reg.store, reg.replication, list(reg.owned), list(reg.roles), reg.suspended,
                        last_seen=now)
        old = self.servers.get(reg.name)
        if old is not None and old.identity() != server.identity():
            raise Conflict(f"{reg.name} is registered as {old.data_ip} ({old.data_mac}, {old.admin_url}); "
                           "a server's identity cannot change: give a new server a new name")
        for other in self.servers.values():
            if other.name != reg.name and (other.data_ip == server.data_ip
                                           or other.admin_url == server.admin_url):
                raise Conflict(f"{reg.name}: address {server.data_ip} or {server.admin_url} belongs "
                               f"to {other.name}")
        if old is not None:
            server.failed = old.failed
            server.keys = old.keys
        self.servers[reg.name] = server
        return server, old is None

    def heartbeat(self, name: str, beat: Heartbeat, now: float) -> Server:
        server = self[name]
        server.last_seen = now
        server.keys = beat.keys
        server.reported = list(beat.owned)
        server.frozen = list(beat.frozen)
        server.degraded = list(beat.degraded)
        return server

    def silent(self, now: float, timeout: float) -> list[Server]:
        """Live servers whose last heartbeat is older than `timeout`."""
        return [s for s in self.live() if now - s.last_seen > timeout]
