"""The out-of-band management network: controller <-> agents, never via the fabric.

The controller talks to every agent's admin API (and agents register with
the controller's REST API). That traffic must not cross the switches under
test: they are what the controller programs, and a broken flow table would
cut the controller off from the agents it needs to repair it. So every
Mininet host gets a second interface, ``<host>-mgmt``, on one Linux bridge
in the root namespace, where the controller runs::

    root namespace:  <prefix>mgmt (bridge, root_ip = last usable address)
                       |-- <host>-mgb  ==veth==  <host>-mgmt  (in the host: host_ip(n))

Host ``h<n>`` (data address 10.0.0.n) gets management address
``network + n``, so 10.0.0.5 is 10.254.0.5 in the default 10.254.0.0/16.
The subnet lives in the shared root namespace, so `up` refuses one that
overlaps a route already there (another scenario, say) instead of
hijacking its traffic.
"""

from __future__ import annotations

import ipaddress

from mininet_scenarios.hostns import HostNamespace
from mininet_scenarios.syscmd import delete_link, ip
from mininet_scenarios.topos import MGMT_SUFFIX

DEFAULT_SUBNET = "10.254.0.0/16"
_ROUTE_TYPES = ("unicast", "local", "broadcast", "multicast", "throw", "unreachable", "prohibit",
                "blackhole", "nat")


class ManagementNetwork:
    """A bridge in the root namespace and one veth per attached host; `close` removes them."""

    def __init__(self, prefix: str, subnet: str = DEFAULT_SUBNET) -> None:
        self.bridge = f"{prefix}mgmt"
        self.network = ipaddress.IPv4Network(subnet)
        if self.network.num_addresses < 4:
            raise ValueError(f"management subnet {subnet} is too small")
        self.root_ip = str(self.network.broadcast_address - 1)
        self._bridge_up = False
        self._veths: list[str] = []  # root-side ends; deleting one deletes its pair

    def host_ip(self, n: int) -> str:
        """Management address of the host whose data address is 10.0.0.n."""
        address = self.network.network_address + n
        if not 0 < n < self.network.num_addresses - 2:
            raise ValueError(f"host number {n} does not fit the management subnet {self.network}")
        return str(address)

    def up(self) -> None:
        """Create the bridge with `root_ip`; refuses a subnet already routed here."""
        for route in ip("-4", "route", "show").splitlines():
            words = route.split()
            # "10.1.0.0/16 dev ...", or with a type first: "blackhole 10.1.0.0/16"
            dest = words[1] if words[0] in _ROUTE_TYPES else words[0]
            if dest != "default" and ipaddress.IPv4Network(dest, strict=False).overlaps(self.network):
                raise RuntimeError(f"management subnet {self.network} overlaps the route '{route}' "
                                   "in the root namespace (another scenario?); pass another subnet")
        ip("link", "add", self.bridge, "type", "bridge")
        self._bridge_up = True
        ip("addr", "add", f"{self.root_ip}/{self.network.prefixlen}", "dev", self.bridge)
        ip("link", "set", self.bridge, "up")

    def attach(self, host: HostNamespace, n: int) -> str:
        """Give `host` its ``-mgmt`` interface on the bridge; returns its address."""
        address = self.host_ip(n)
        outside, inside = f"{host.name}-mgb", f"{host.name}{MGMT_SUFFIX}"
        # The host end is created directly inside the host's namespace.
        ip("link", "add", outside, "type", "veth", "peer", "name", inside, "netns", str(host.pid))
        self._veths.append(outside)
        ip("link", "set", outside, "master", self.bridge, "up")
        host.run("ip", "addr", "add", f"{address}/{self.network.prefixlen}", "dev", inside)
        host.run("ip", "link", "set", inside, "up")
        return address

    def close(self) -> None:
        """Delete our veths (unless their host namespace took them along) and the bridge."""
        failures = []
        for name in [*self._veths, *([self.bridge] if self._bridge_up else [])]:
            try:
                delete_link(name)
            except RuntimeError as exc:
                failures.append(exc)
        self._veths.clear()
        self._bridge_up = False
        if failures:
            raise failures[0]
