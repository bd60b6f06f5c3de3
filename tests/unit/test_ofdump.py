"""mininet_scenarios.ofdump: `ovs-ofctl dump-flows` lines back as MetaFlow entries.

The lines are in the form `ovs-ofctl -O OpenFlow10` prints them (checked
with its `parse-flow`); no switch is needed to parse text.
"""

from __future__ import annotations

import pytest

from btree.flows import FlowEntry
from client_lib.cidr import Block
from mininet_scenarios.ofdump import parse_dump

HEAD = " cookie=0x0, duration=1.5s, table=0, n_packets=0, n_bytes=0, idle_age=1, "
TCP = "priority=2010,tcp,nw_dst=100.64.0.0/10,tp_dst=9000 "
UDP = "priority=2010,udp,nw_dst=100.64.0.0/10,tp_dst=9000 "


def test_the_tcp_half_of_each_pair_becomes_an_entry() -> None:
    text = "\n".join([
        HEAD + TCP + "actions=mod_dl_dst:02:00:00:00:00:01,output:3",
        HEAD + UDP + "actions=mod_dl_dst:02:00:00:00:00:01,output:3",
        HEAD + "priority=100,arp actions=NORMAL",
    ])
    entry = FlowEntry(2010, Block.parse("100.64.0.0/10"), 3, "02:00:00:00:00:01")
    assert parse_dump(text) == {entry.match: entry}


def test_an_entry_without_an_output_port_is_a_clear_error() -> None:
    line = HEAD + TCP + "actions=drop"
    with pytest.raises(ValueError, match="without an output port") as refused:
        parse_dump(line)
    assert "actions=drop" in str(refused.value)
