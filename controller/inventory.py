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
import itertools
from collections import Counter, defaultdict
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

Port = tuple[int, int]
"""(dpid, port number)."""


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
        self.version = 0
        """Counts the changes to what `controller.core.MetaFlowCore.graph_now`
        reads (switches, links, hosts): a core that holds the graph of one
        version knows nothing moved since (`core._arp` then routes one new host
        instead of recomputing every route)."""
        # Indexes: an ARP packet-in asks whether its port carries a link, a port
        # status which host it cut off; at k=32 (16,384 links, 8,192 hosts) a
        # scan per event cost milliseconds (docs/decision-thread.md).
        self._link_ends: Counter[Port] = Counter()
        """How many known links end at each (dpid, port)."""
        self._located: defaultdict[Port, set[str]] = defaultdict(set)
        """The addresses of the hosts located at each (dpid, port)."""
        self._rank: dict[str, int] = {}
        """Each host's position in `hosts` (its first insertion since it was
        last forgotten): among several hosts at one port the first wins, as a
        scan of `hosts` in order would find it."""
        self._ranks = itertools.count()

    # -- switches and links --------------------------------------------------------

    def switch_up(self, dpid: int, ports: tuple[int, ...] = (), name: str = "") -> None:
        self.version += 1
        self.dpids.add(dpid)
        self.ports[dpid] = set(ports)
        if name:
            self.names[dpid] = name

    def switch_down(self, dpid: int) -> None:
        self.version += 1
        self.dpids.discard(dpid)
        self.ports.pop(dpid, None)
        gone = {link for link in self.links if dpid in (link[0], link[2])}
        self.links -= gone
        self._unindex_links(gone)

    def link_up(self, a: int, pa: int, b: int, pb: int) -> bool:
        """True when the link is new. Kept with its lower end first, whichever
        end LLDP saw first: two controllers (a leader and its standby) that
        discovered a link from opposite ends then hold and show the same link."""
        link = min((a, pa, b, pb), (b, pb, a, pa))
        if link in self.links:
            return False
        self.version += 1
        self.links.add(link)
        self._link_ends.update(((a, pa), (b, pb)))
        return True

    def _unindex_links(self, links: set[Link]) -> None:
        for a, pa, b, pb in links:
            self._link_ends.subtract(((a, pa), (b, pb)))
            for end in ((a, pa), (b, pb)):
                if self._link_ends[end] <= 0:
                    del self._link_ends[end]

    def forget_hosts_at(self, ends: tuple[tuple[int, int], ...]) -> list[Host]:
        """Forget the hosts located at ports now known to carry a link: a frame
        that reached a switch over a link LLDP had not found yet (hybrid mode:
        a server's answer forwarded NORMAL before its own switch held the
        gateway entry) located its sender there by mistake."""
        ips = {ip for end in ends for ip in self._located.get(end, ())}
        gone = [self.hosts[ip] for ip in sorted(ips, key=self._rank.__getitem__)]
        for host in gone:
            self._unlocate(host)
            del self.hosts[host.ip]
            del self._rank[host.ip]
        if gone:
            self.version += 1
        return gone

    def link_down(self, a: int, pa: int, b: int, pb: int) -> bool:
        gone = {(a, pa, b, pb), (b, pb, a, pa)} & self.links
        self.links -= gone
        self._unindex_links(gone)
        if gone:
            self.version += 1
        return bool(gone)

    def port_down(self, dpid: int, port: int) -> None:
        self.down_ports.add((dpid, port))

    def port_up(self, dpid: int, port: int) -> None:
        self.down_ports.discard((dpid, port))
        if dpid in self.ports:
            self.ports[dpid].add(port)

    def edge_ports(self) -> list[tuple[int, int]]:
        """(dpid, port) of every port that is up and carries no
        switch-to-switch link: where hosts can be."""
        return sorted((dpid, port) for dpid in self.dpids for port in self.ports.get(dpid, ())
                      if (dpid, port) not in self.down_ports and (dpid, port) not in self._link_ends)

    def name(self, dpid: int) -> str:
        """How a switch is reported: its own name and dpid."""
        return f"{self.names[dpid]} (dpid {dpid})" if dpid in self.names else f"dpid {dpid}"

    def is_link_port(self, dpid: int, port: int) -> bool:
        return (dpid, port) in self._link_ends

    # -- hosts ---------------------------------------------------------------------

    def attached(self, ip: str) -> bool:
        """The host is located and its port is up: the data plane reaches it."""
        host = self.hosts.get(ip)
        return host is not None and (host.dpid, host.port) not in self.down_ports and host.dpid in self.dpids

    def host_at(self, dpid: int, port: int) -> Host | None:
        here = self._located.get((dpid, port))
        return self.hosts[min(here, key=self._rank.__getitem__)] if here else None

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
        old = self.hosts.get(ip)
        if old == host:
            return False
        if old is not None:
            self._unlocate(old)
        else:
            self._rank[ip] = next(self._ranks)
        self.version += 1
        self.hosts[ip] = host
        self._located[(dpid, port)].add(ip)
        self.down_ports.discard((dpid, port))
        return True

    def _unlocate(self, host: Host) -> None:
        here = self._located[(host.dpid, host.port)]
        here.discard(host.ip)
        if not here:
            del self._located[(host.dpid, host.port)]

    def mac_of(self, ip: str) -> str | None:
        host = self.hosts.get(ip)
        return host.mac if host else None
