"""What a real switch holds, back as abstract MetaFlow entries.

`ovs-ofctl -O OpenFlow10 dump-flows` text -> `btree.flows.Table`, so the
fake network (`btree.fake_network`) can answer where an ID goes using
exactly the entries Open vSwitch has installed, not the ones the
controller meant to install.
"""

from __future__ import annotations

import re

from btree.flows import FlowEntry, Table
from client_lib.cidr import Block
from client_lib.constants import METAFLOW_BASE_PRIORITY, METAFLOW_PORT, UPRULE_PRIORITY
from mininet_scenarios.syscmd import ofctl

_PRIORITY = re.compile(r"priority=(\d+)")
_NW_DST = re.compile(r"nw_dst=([\d.]+)(?:/(\d+))?")
_SET_DST = re.compile(r"mod_dl_dst:([0-9a-f:]{17})")
_OUTPUT = re.compile(r"(?:output:)?(\d+)\s*$")


def parse_dump(text: str) -> Table:
    """MetaFlow entries (priority >= 1999, the tcp half of each pair) of one dump."""
    table: Table = {}
    for line in text.splitlines():
        match = _PRIORITY.search(line)
        if match is None or ",tcp" not in line or f"tp_dst={METAFLOW_PORT}" not in line:
            continue
        priority = int(match.group(1))
        if priority < UPRULE_PRIORITY:
            continue
        dst = _NW_DST.search(line)
        prefix = Block.parse(f"{dst.group(1)}/{dst.group(2) or 32}") if dst else Block(0, 0)
        if priority >= METAFLOW_BASE_PRIORITY and prefix.plen != priority - METAFLOW_BASE_PRIORITY:
            raise ValueError(f"priority {priority} does not match prefix {prefix}: {line}")
        actions = line.split("actions=", 1)[1]
        set_dst = _SET_DST.search(actions)
        port = _OUTPUT.search(actions)
        if port is None:   # e.g. "actions=drop": not an entry the controller installs
            raise ValueError(f"MetaFlow entry without an output port: {line}")
        entry = FlowEntry(priority, prefix, int(port.group(1)), set_dst.group(1) if set_dst else None)
        table[entry.match] = entry
    return table


def dump(bridge: str) -> str:
    return ofctl("dump-flows", bridge)
