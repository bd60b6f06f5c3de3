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
``network + n``, so 10.0.0.5 is 10.254.0.5 in 10.254.0.0/16.
The subnet lives in the shared root namespace, so `up` refuses a given
subnet that overlaps a route already there (another scenario, say) instead
of hijacking its traffic. Without one, `up` takes the first /16 of
`AUTO_SUBNETS` that no route overlaps, choosing and claiming it under a
lock file so that two scenarios starting at once on one machine (two test
runs, a benchmark beside CI) never pick the same.
"""

from __future__ import annotations

import fcntl
import ipaddress
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path

from mininet_scenarios.hostns import HostNamespace
from mininet_scenarios.syscmd import delete_link, ip
from mininet_scenarios.topos import MGMT_SUFFIX

#: Where an unspecified management network is taken from, first free first.
AUTO_SUBNETS = tuple(ipaddress.IPv4Network(f"10.{octet}.0.0/16") for octet in range(254, 223, -1))
#: The help of every ``--mgmt-subnet`` flag.
SUBNET_HELP = (f"the management network's subnet (default: the first of {AUTO_SUBNETS[0]} down to "
               f"{AUTO_SUBNETS[-1]} that no route here overlaps)")
#: Held while a subnet is chosen and its bridge addressed (one machine, every scenario).
LOCK_FILE = Path("/run/lock/metaflow-mgmt.lock")
_ROUTE_TYPES = ("unicast", "local", "broadcast", "multicast", "throw", "unreachable", "prohibit",
                "blackhole", "nat")


class ManagementNetwork:
    """A bridge in the root namespace and one veth per attached host; `close` removes them."""

    def __init__(self, prefix: str, subnet: str | None = None) -> None:
        """`subnet` None: the first free one of `AUTO_SUBNETS`, chosen by `up`."""
        self.bridge = f"{prefix}mgmt"
        self._wanted = ipaddress.IPv4Network(subnet) if subnet is not None else None
        if self._wanted is not None and self._wanted.num_addresses < 4:
            raise ValueError(f"management subnet {subnet} is too small")
        self._network: ipaddress.IPv4Network | None = None
        self._bridge_up = False
        self._veths: list[str] = []  # root-side ends; deleting one deletes its pair

    @property
    def network(self) -> ipaddress.IPv4Network:
        """The subnet in use; known once `up` has run."""
        if self._network is None:
            raise RuntimeError(f"management network {self.bridge} is not up")
        return self._network

    @property
    def root_ip(self) -> str:
        """The root namespace's address on the bridge (the last usable one)."""
        return str(self.network.broadcast_address - 1)

    def host_ip(self, n: int) -> str:
        """Management address of the host whose data address is 10.0.0.n."""
        address = self.network.network_address + n
        if not 0 < n < self.network.num_addresses - 2:
            raise ValueError(f"host number {n} does not fit the management subnet {self.network}")
        return str(address)

    def up(self) -> None:
        """Create the bridge with `root_ip`; refuses a given subnet already
        routed here, or fails if every automatic one is."""
        with _choosing():
            routes = ip("-4", "route", "show").splitlines()
            network = choose_subnet(routes, self._wanted)
            ip("link", "add", self.bridge, "type", "bridge")
            self._bridge_up = True
            self._network = network
            ip("addr", "add", f"{self.root_ip}/{network.prefixlen}", "dev", self.bridge)
            # Only a link that is up has its prefix route, which is what
            # the next scenario's choice reads: up before the lock is let go.
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


def choose_subnet(routes: Iterable[str], wanted: ipaddress.IPv4Network | None) -> ipaddress.IPv4Network:
    """`wanted` if no route (``ip -4 route show`` lines) overlaps it, else
    the first of `AUTO_SUBNETS` that none overlaps when nothing was wanted."""
    taken = list(_destinations(routes))

    def clash(net: ipaddress.IPv4Network) -> str | None:
        return next((route for route, dest in taken if dest.overlaps(net)), None)

    if wanted is not None:
        route = clash(wanted)
        if route is not None:
            raise RuntimeError(f"management subnet {wanted} overlaps the route '{route}' "
                               "in the root namespace (another scenario?); pass another subnet")
        return wanted
    free = next((net for net in AUTO_SUBNETS if clash(net) is None), None)
    if free is None:
        raise RuntimeError(f"no free management subnet: routes here overlap every one of "
                           f"{AUTO_SUBNETS[-1]}..{AUTO_SUBNETS[0]}; pass one")
    return free


def _destinations(routes: Iterable[str]) -> Iterator[tuple[str, ipaddress.IPv4Network]]:
    for route in routes:
        words = route.split()
        if not words:
            continue
        # "10.1.0.0/16 dev ...", or with a type first: "blackhole 10.1.0.0/16"
        dest = words[1] if words[0] in _ROUTE_TYPES else words[0]
        if dest != "default":
            yield route, ipaddress.IPv4Network(dest, strict=False)


@contextmanager
def _choosing() -> Iterator[None]:
    """The machine-wide lock under which a subnet is chosen and claimed."""
    LOCK_FILE.parent.mkdir(parents=True, exist_ok=True)
    with LOCK_FILE.open("a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield
