"""Several sites joined by WAN links, as pure data (issue 29): which
namespaces, links, addresses and routes `mininet_scenarios.sites_net`
makes. No I/O, as Mininet's ``topo.py`` keeps topology apart from running it.

Each site has a **border** (a namespace that routes, and where the site's
client processes, its nodes, run) and its agents, one namespace each, every
agent owning an equal block of the site's prefix. The border routes each
block to its agent and every other site's prefix out of the WAN link to that
site, so a request is carried to the agent owning its ID by longest-prefix
routing alone, in the site or across the WAN, as the fabric's switches and
border would; nothing is looked up. Every pair of sites has its own link
(its round trip made by a delay line, `mininet_scenarios.delay_line`), all
in one wire namespace. Below the sites' routes, the border holds the whole
space as ``unreachable``: when a WAN link goes down its routes go with it,
and a request for that site's prefix is refused at once (the kernel's
"no route to host", a retryable error) instead of waiting out a timeout.

Addresses: site ``i``'s border is ``10.(100+i).0.1`` (on its loopback) and
its nodes' subnet ``10.(100+i).0.0/16``; agent ``j`` of site ``i`` sits on
``10.(100+i).(j+1).2/24`` behind the border's ``.1``; the link between
sites ``i < j`` is a /30 of ``10.255.0.0/16``; the management link from
the machine to border ``i`` is ``mgmt + 4i`` (a /30, the border on ``+2``;
``mgmt`` is 10.252.0.0 by default, apart from the Mininet scenarios'
management network, 10.254.0.0/16).
"""

from __future__ import annotations

import ipaddress
import itertools
from dataclasses import dataclass, field

from client_lib.cidr import Block
from client_lib.sites import Site, SiteLayout

WAN_SUBNET = ipaddress.IPv4Network("10.255.0.0/16")
MAX_SITES = 16
MAX_AGENTS = 8


@dataclass(frozen=True)
class WanLink:
    """The link between sites `a` and `b` (indices, a < b): its round trip
    and the addresses of its two ends."""

    a: int
    b: int
    rtt_ms: float
    address_a: str
    address_b: str


@dataclass(frozen=True)
class SitesTopo:
    """`layout`'s sites, `agents` agents each, their WAN links' round trips
    (`rtt_ms`, by pair of names; both orders accepted) and a rate cap per
    link (Mbit/s, None for none)."""

    layout: SiteLayout
    rtt_ms: dict[frozenset[str], float]
    agents: int = 1
    rate_mbit: float | None = None
    mgmt: str = "10.252.0.0"
    links: tuple[WanLink, ...] = field(init=False)

    def __post_init__(self) -> None:
        names = [site.name for site in self.layout.sites]
        if not 1 <= len(names) <= MAX_SITES:
            raise ValueError(f"{len(names)} sites: from 1 to {MAX_SITES}")
        if self.agents not in (1, 2, 4, 8) or self.agents > MAX_AGENTS:
            raise ValueError(f"{self.agents} agents a site: 1, 2, 4 or 8 (they split the prefix equally)")
        links = []
        for number, (a, b) in enumerate(itertools.combinations(range(len(names)), 2)):
            pair = frozenset((names[a], names[b]))
            if pair not in self.rtt_ms:
                raise ValueError(f"no round trip given between {names[a]} and {names[b]}")
            if self.rtt_ms[pair] < 0:
                raise ValueError(f"a negative round trip between {names[a]} and {names[b]}")
            base = WAN_SUBNET.network_address + 4 * number
            links.append(WanLink(a, b, self.rtt_ms[pair], str(base + 1), str(base + 2)))
        object.__setattr__(self, "links", tuple(links))

    @property
    def sites(self) -> tuple[Site, ...]:
        return self.layout.sites

    def index(self, name: str) -> int:
        return [site.name for site in self.sites].index(self.layout.named(name).name)

    @staticmethod
    def border_address(i: int) -> str:
        return f"10.{100 + i}.0.1"

    @staticmethod
    def nodes_subnet(i: int) -> str:
        return f"10.{100 + i}.0.0/16"

    def blocks(self, i: int) -> list[Block]:
        """The blocks of site `i`'s prefix, one per agent, in agent order."""
        blocks = [self.sites[i].prefix]
        while len(blocks) < self.agents:
            blocks = [half for block in blocks for half in block.halves()]
        return blocks

    @staticmethod
    def agent_link(i: int, j: int) -> tuple[str, str]:
        """(border side, agent side) addresses of agent `j` of site `i`, /24."""
        return f"10.{100 + i}.{j + 1}.1", f"10.{100 + i}.{j + 1}.2"

    def mgmt_link(self, i: int) -> tuple[str, str]:
        """(machine side, border side) addresses of border `i`'s management link, /30."""
        base = ipaddress.IPv4Address(self.mgmt) + 4 * i
        return str(base + 1), str(base + 2)

    def link_of(self, a: str, b: str) -> WanLink:
        i, j = sorted((self.index(a), self.index(b)))
        return next(link for link in self.links if (link.a, link.b) == (i, j))

    def wan_routes(self, i: int) -> list[tuple[str, str, WanLink]]:
        """Border `i`'s routes over the WAN: (destination, next hop, link),
        each other site's prefix and its nodes' subnet."""
        out = []
        for link in self.links:
            if i not in (link.a, link.b):
                continue
            far = link.b if i == link.a else link.a
            hop = link.address_b if i == link.a else link.address_a
            out += [(str(self.sites[far].prefix), hop, link), (self.nodes_subnet(far), hop, link)]
        return out


def paper_layout(space: Block) -> SiteLayout:
    """The multi-site paper's four Azure regions, splitting `space` equally."""
    return SiteLayout.equal(space, list(PAPER_REGIONS))


PAPER_REGIONS = ("north-europe", "west-europe", "south-central-us", "east-us")
"""The paper's testbed: two datacenters in Europe (North: Ireland, West: the
Netherlands) and two in the US (South Central: Texas, East: Virginia)."""

PAPER_RTT_MS: dict[frozenset[str], float] = {frozenset(pair): rtt for pair, rtt in (
    (("north-europe", "west-europe"), 17.5),
    (("north-europe", "east-us"), 67.0),
    (("north-europe", "south-central-us"), 97.5),
    (("west-europe", "east-us"), 82.5),
    (("west-europe", "south-central-us"), 113.5),
    (("east-us", "south-central-us"), 32.5),
)}
"""Round trips between the paper's regions, in ms: Microsoft's "Azure network
round-trip latency statistics" (monthly median, ThousandEyes probes, 30 days
to 21 July 2023; MicrosoftDocs/azure-docs,
articles/networking/azure-network-latency.md at commit 5a84ea6b2e56), each
the mean of its two directions (they differ by 1 ms at most)."""
