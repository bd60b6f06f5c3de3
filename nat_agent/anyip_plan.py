"""The ``local`` rewrite mode's routing, as plain data (no I/O).

In ``local`` mode nothing is rewritten: the server takes the whole
MetaDataID space as its own addresses (Linux AnyIP), so a request to any
mdid is delivered to the service as it is, and the reply leaves with the
mdid as its source because that is the address the connection was accepted
on. What makes it safe is how narrowly the space is local:

* a ``local`` route for the space lives in a routing table of the agent's
  own (`AnyIpPlan.table`), never in the kernel's ``local`` table, so
  nothing the server itself sends to an mdid is delivered to itself (a
  client on a storage server still reaches the owner through the network);
* one policy rule sends only TCP to the service port, arriving on the data
  interface, to that table. ARP is not TCP: its route lookup never matches,
  so the server never answers ARP for an mdid and no sysctl is touched;
* a second rule, just after it, blackholes everything else that arrives on
  the data interface for the space, so the server never forwards an mdid
  anywhere even with forwarding on.

The service's listener must set ``IP_TRANSPARENT``: the reply's source is
in no table the kernel checks for local sources (see `nat_agent.anyip`).

The table number and rule priority derive from the agent's tag, so a
restarted agent finds what a killed one left, and agents with different
tags in one namespace do not touch each other's rules.
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass

from client_lib.cidr import Block
from nat_agent.rules import check_tag

TABLE_BASE = 0x4D460000
"""Tables TABLE_BASE .. TABLE_BASE + 0xFFFF ("MF" in the high half) are ours."""

PREF_BASE = 1000
"""Our rules' priorities are PREF_BASE .. PREF_BASE + 2 * PREF_SLOTS - 1:
after the kernel's ``local`` rule (0), before ``main`` (32766)."""

PREF_SLOTS = 4096


@dataclass(frozen=True)
class AnyIpPlan:
    """What makes `space`:`port` local for TCP arriving on `interface`."""

    space: Block
    interface: str
    port: int
    table: int
    pref: int

    def route(self) -> list[str]:
        """The ``ip`` arguments of the table's one route."""
        return ["route", "add", "local", str(self.space), "dev", self.interface, "table", str(self.table)]

    def rules(self) -> list[list[str]]:
        """The ``ip`` arguments of the two policy rules, deliver first."""
        arriving = ["iif", self.interface, "to", str(self.space)]
        return [["rule", "add", "pref", str(self.pref), *arriving, "ipproto", "tcp",
                 "dport", str(self.port), "lookup", str(self.table)],
                ["rule", "add", "pref", str(self.pref + 1), *arriving, "blackhole"]]


    def leftovers(self, listed: list[dict]) -> list[list[str]]:
        """The ``ip`` arguments that delete our rules among `listed` (the
        entries of ``ip -j rule show``), one per rule present: what a killed
        run left, or what `rules` added. Anyone else's rules are not ours,
        even at our priorities."""
        space = (self.space.address(), self.space.plen)
        found = []
        for rule in listed:
            if (rule.get("dst"), rule.get("dstlen")) != space:
                continue
            delete = ["rule", "del", "pref", str(rule.get("priority")), "to", str(self.space)]
            if rule.get("priority") == self.pref and rule.get("table") == str(self.table):
                found.append([*delete, "lookup", str(self.table)])
            elif rule.get("priority") == self.pref + 1 and rule.get("action") == "blackhole":
                found.append([*delete, "blackhole"])
        return found


def anyip_plan(space: Block, interface: str, port: int, tag: str) -> AnyIpPlan:
    """The plan for an agent with `tag`; refuses what ``ip`` would misread."""
    if space.width != 32:
        raise ValueError(f"local mode is IPv4 only; {space} is not an IPv4 space")
    if not interface or len(interface) > 15 or any(c in interface for c in "/ \t\n:"):
        raise ValueError(f"bad interface name {interface!r}")
    if not 0 < port < 1 << 16:
        raise ValueError(f"port {port} outside 1..65535")
    digest = zlib.crc32(check_tag(tag).encode())
    return AnyIpPlan(space, interface, port, TABLE_BASE + (digest & 0xFFFF),
                     PREF_BASE + 2 * ((digest >> 16) % PREF_SLOTS))
