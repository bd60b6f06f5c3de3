"""What the controller has discovered of the network: switches, links, hosts.

Switches, their ports and links come from OpenFlow (features, port status,
LLDP); hosts from the ARP frames the switches send up (in hybrid mode only
those for the gateway: clients asking for it, servers answering the
controller's probes, sent out of `edge_ports`). ARP is unauthenticated, so the inventory only
believes what cannot be a takeover:

- a frame from a port that carries a switch-to-switch link is not a host;
- nobody may claim the virtual gateway or an address of the MetaDataID space;
- a storage server's address is believed only with the MAC its agent
  registered (the agent's registration is signed; ARP is not);
- a host already located stays where it is until its port goes down (or its
  switch leaves): one forged ARP from elsewhere cannot move it.

Pure state; no I/O.
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass

from client_lib.cidr import Block


@dataclass(frozen=True)
class Host:
    ip: str
    mac: str
    dpid: int
    port: int


Link = tuple[int, int, int, int]
"""(dpid a, port a, dpid b, port b), stored once per pair."""


class Inventory:
    def __init__(self, space: Block, gateway_ip: str) -> None:
        self.space = space
        self.gateway_ip = gateway_ip
        self.dpids: set[int] = set()
        self.links: set[Link] = set()
        self.hosts: dict[str, Host] = {}      # by IP
        self.down_ports: set[tuple[int, int]] = set()
        self.ports: dict[int, set[int]] = {}
        """Each switch's physical ports, from its features and port status."""
        self.names: dict[int, str] = {}
        """Each switch's own name (its local port's), to report it by."""

    # -- switches and links --------------------------------------------------------

    def switch_up(self, dpid: int, ports: tuple[int, ...] = (), name: str = "") -> None:
        self.dpids.add(dpid)
        self.ports[dpid] = set(ports)
        if name:
            self.names[dpid] = name

    def switch_down(self, dpid: int) -> None:
        self.dpids.discard(dpid)
        self.ports.pop(dpid, None)
        self.links = {link for link in self.links if dpid not in (link[0], link[2])}

    def link_up(self, a: int, pa: int, b: int, pb: int) -> bool:
        """True when the link is new. Kept with its lower end first, whichever
        end LLDP saw first: two controllers (a leader and its standby) that
        discovered a link from opposite ends then hold and show the same link."""
        link = min((a, pa, b, pb), (b, pb, a, pa))
        if link in self.links:
            return False
        self.links.add(link)
        return True

    def forget_hosts_at(self, ends: tuple[tuple[int, int], ...]) -> list[Host]:
        """Forget the hosts located at ports now known to carry a link: a frame
        that reached a switch over a link LLDP had not found yet (hybrid mode:
        a server's answer forwarded NORMAL before its own switch held the
        gateway entry) located its sender there by mistake."""
        gone = [h for h in self.hosts.values() if (h.dpid, h.port) in ends]
        for host in gone:
            del self.hosts[host.ip]
        return gone

    def link_down(self, a: int, pa: int, b: int, pb: int) -> bool:
        before = len(self.links)
        self.links -= {(a, pa, b, pb), (b, pb, a, pa)}
        return len(self.links) != before

    def port_down(self, dpid: int, port: int) -> None:
        self.down_ports.add((dpid, port))

    def port_up(self, dpid: int, port: int) -> None:
        self.down_ports.discard((dpid, port))
        if dpid in self.ports:
            self.ports[dpid].add(port)

    def edge_ports(self) -> list[tuple[int, int]]:
        """(dpid, port) of every port that is up and carries no
        switch-to-switch link: where hosts can be."""
        skip = self.down_ports | {end for a, pa, b, pb in self.links for end in ((a, pa), (b, pb))}
        return sorted((dpid, port) for dpid in self.dpids for port in self.ports.get(dpid, ())
                      if (dpid, port) not in skip)

    def name(self, dpid: int) -> str:
        """How a switch is reported: its own name and dpid."""
        return f"{self.names[dpid]} (dpid {dpid})" if dpid in self.names else f"dpid {dpid}"

    def is_link_port(self, dpid: int, port: int) -> bool:
        return any((dpid, port) in ((a, pa), (b, pb)) for a, pa, b, pb in self.links)

    # -- hosts ---------------------------------------------------------------------

    def attached(self, ip: str) -> bool:
        """The host is located and its port is up: the data plane reaches it."""
        host = self.hosts.get(ip)
        return host is not None and (host.dpid, host.port) not in self.down_ports and host.dpid in self.dpids

    def host_at(self, dpid: int, port: int) -> Host | None:
        return next((h for h in self.hosts.values() if (h.dpid, h.port) == (dpid, port)), None)

    def judge(self, ip: str, mac: str, dpid: int, port: int, registered_mac: str | None) -> str | None:
        """Why an ARP sender must not be recorded as a host there, or None if it
        may. `registered_mac`: the MAC a storage server at `ip` registered."""
        if self.is_link_port(dpid, port):
            return "a switch-to-switch port"
        try:
            addr = ipaddress.ip_address(ip)
        except ValueError:
            return f"not an address: {ip!r}"
        width = 32 if addr.version == 4 else 128
        if ip == self.gateway_ip or (width == self.space.width and self.space.contains(int(addr))):
            return f"{ip} is the gateway or a MetaDataID"
        if registered_mac is not None and mac.lower() != registered_mac.lower():
            return f"{ip} is a storage server registered with MAC {registered_mac}, not {mac}"
        known = self.hosts.get(ip)
        if known is not None and (known.dpid, known.port) != (dpid, port):
            old_gone = (known.dpid, known.port) in self.down_ports or known.dpid not in self.dpids
            if not old_gone:
                return f"{ip} is located at {known.dpid}:{known.port}, whose port is still up"
        return None

    def learn(self, ip: str, mac: str, dpid: int, port: int) -> bool:
        """Record a host (after `judge` allowed it). True when this is news."""
        host = Host(ip, mac, dpid, port)
        if self.hosts.get(ip) == host:
            return False
        self.hosts[ip] = host
        self.down_ports.discard((dpid, port))
        return True

    def mac_of(self, ip: str) -> str | None:
        host = self.hosts.get(ip)
        return host.mac if host else None
