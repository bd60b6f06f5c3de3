"""The rule list of each rewrite mode, exactly as it is handed to iptables."""

from __future__ import annotations

import pytest

from client_lib.cidr import Block
from client_lib.mdid import DEFAULT_SPACE
from nat_agent.anyip_plan import PREF_BASE, TABLE_BASE, anyip_plan
from nat_agent.rules import MODES, Rule, check_tag, rewrite_rules

TAG = "metaflow-agent:s1"
COMMENT = ("-m", "comment", "--comment", TAG)


def test_kernel_mode_is_one_dnat_per_transport() -> None:
    rules = rewrite_rules("kernel", DEFAULT_SPACE, "10.0.0.3", tag=TAG)
    assert rules == [
        Rule("nat", "PREROUTING", ("-d", "100.64.0.0/10", "-p", proto, "-m", proto,
                                   "--dport", "9000", *COMMENT,
                                   "-j", "DNAT", "--to-destination", "10.0.0.3"))
        for proto in ("tcp", "udp")
    ]


def test_nfqueue_mode_queues_requests_before_conntrack_and_replies_after() -> None:
    space = Block.parse("0.0.0.0/0")
    rules = rewrite_rules("nfqueue", space, "10.0.0.3", port=9100, queue_num=7, tag=TAG)
    queue = ("-j", "NFQUEUE", "--queue-num", "7", "--queue-bypass")
    expected = []
    for proto in ("tcp", "udp"):
        expected += [
            Rule("raw", "PREROUTING", ("-d", "0.0.0.0/0", "-p", proto, "-m", proto,
                                       "--dport", "9100", *COMMENT, *queue)),
            Rule("mangle", "OUTPUT", ("-s", "10.0.0.3", "-p", proto, "-m", proto,
                                      "--sport", "9100", *COMMENT, *queue)),
        ]
    assert rules == expected


def test_local_mode_only_bypasses_conntrack_for_the_space_and_port() -> None:
    notrack = (*COMMENT, "-j", "CT", "--notrack")
    assert rewrite_rules("local", DEFAULT_SPACE, None, port=9100, tag=TAG) == [
        Rule("raw", "PREROUTING", ("-d", "100.64.0.0/10", "-p", "tcp", "-m", "tcp", "--dport", "9100",
                                   *notrack)),
        Rule("raw", "OUTPUT", ("-s", "100.64.0.0/10", "-p", "tcp", "-m", "tcp", "--sport", "9100",
                               *notrack)),
    ]


def test_local_mode_delivers_only_tcp_to_the_port_and_blackholes_the_rest() -> None:
    plan = anyip_plan(DEFAULT_SPACE, "eth1", 9100, TAG)
    assert plan.route() == ["route", "add", "local", "100.64.0.0/10", "dev", "eth1", "table", str(plan.table)]
    arriving = ["iif", "eth1", "to", "100.64.0.0/10"]
    assert plan.rules() == [
        ["rule", "add", "pref", str(plan.pref), *arriving, "ipproto", "tcp", "dport", "9100",
         "lookup", str(plan.table)],
        ["rule", "add", "pref", str(plan.pref + 1), *arriving, "blackhole"]]
    assert TABLE_BASE <= plan.table <= TABLE_BASE + 0xFFFF
    assert PREF_BASE <= plan.pref < plan.pref + 1 < 32766  # before the main table's rule


def test_local_mode_tables_are_found_again_by_tag() -> None:
    """A restarted agent derives the same table and priorities (so it finds
    what a killed run left); the hosts of a scenario get others (a 16-bit
    hash: thousands of tags in one namespace could collide, one per host never)."""
    tags = [f"metaflow-agent:h{i}" for i in range(16)]
    plans = [anyip_plan(DEFAULT_SPACE, "eth0", 9000, tag) for tag in tags]
    assert plans == [anyip_plan(DEFAULT_SPACE, "eth0", 9000, tag) for tag in tags]
    assert len({p.table for p in plans}) == len(tags)
    assert all(p.pref % 2 == PREF_BASE % 2 for p in plans)  # pairs never overlap


def test_local_mode_finds_its_leftover_rules_and_only_those() -> None:
    """From ``ip -j rule show``: ours once per copy (a rule added twice is
    deleted twice); another table, space or action at our priorities is not ours."""
    plan = anyip_plan(DEFAULT_SPACE, "eth0", 9000, TAG)
    here = {"dst": "100.64.0.0", "dstlen": 10}
    lookup = {"priority": plan.pref, **here, "iif": "eth0", "table": str(plan.table)}
    blackhole = {"priority": plan.pref + 1, **here, "iif": "eth0", "action": "blackhole"}
    others = [{"priority": 0, "src": "all", "table": "local"},
              {"priority": plan.pref, **here, "table": "main"},
              {"priority": plan.pref, "dst": "100.64.0.0", "dstlen": 11, "table": str(plan.table)},
              {"priority": plan.pref + 1, **here, "action": "unreachable"}]
    delete = [["rule", "del", "pref", str(plan.pref), "to", "100.64.0.0/10", "lookup", str(plan.table)],
              ["rule", "del", "pref", str(plan.pref + 1), "to", "100.64.0.0/10", "blackhole"]]
    assert plan.leftovers([*others, lookup, blackhole]) == delete
    assert plan.leftovers([lookup, lookup]) == [delete[0], delete[0]]
    assert plan.leftovers(others) == []


@pytest.mark.parametrize("args, message", [
    ((Block.parse("fd00::/64"), "eth0", 9000, TAG), "IPv4 only"),
    ((DEFAULT_SPACE, "", 9000, TAG), "interface"),
    ((DEFAULT_SPACE, "a-name-far-too-long", 9000, TAG), "interface"),
    ((DEFAULT_SPACE, "eth0 lookup 5", 9000, TAG), "interface"),
    ((DEFAULT_SPACE, "eth0", 70000, TAG), "port"),
    ((DEFAULT_SPACE, "eth0", 9000, "bad tag"), "bad rule tag"),
])
def test_local_mode_refuses_what_ip_would_misread(args: tuple, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        anyip_plan(*args)


def test_none_mode_has_no_rules_and_needs_no_address() -> None:
    assert rewrite_rules("none", DEFAULT_SPACE, "10.0.0.3", tag=TAG) == []
    assert rewrite_rules("none", DEFAULT_SPACE, None) == []


@pytest.mark.parametrize("mode", MODES)
def test_every_rule_carries_the_tag_once(mode: str) -> None:
    for rule in rewrite_rules(mode, DEFAULT_SPACE, "192.168.1.1", tag=TAG):
        assert rule.args.count("--comment") == 1
        assert rule.args[rule.args.index("--comment") + 1] == TAG


@pytest.mark.parametrize("kwargs, message", [
    ({"mode": "dnat"}, "unknown rewrite mode"),
    ({"space": Block.parse("fd00::/64")}, "IPv4 only"),
    ({"own_ip": "10.0.0.300"}, "not an IPv4 address"),
    ({"own_ip": "fd00::1"}, "not an IPv4 address"),
    ({"port": 0}, "port"),
    ({"queue_num": 65536}, "queue number"),
    ({"tag": "has space"}, "bad rule tag"),
    ({"tag": ""}, "bad rule tag"),
])
def test_bad_arguments_are_refused(kwargs: dict, message: str) -> None:
    arguments = {"mode": "nfqueue", "space": DEFAULT_SPACE, "own_ip": "10.0.0.3", "tag": TAG,
                 **kwargs}
    with pytest.raises(ValueError, match=message):
        rewrite_rules(**arguments)


def test_tags_are_checked_for_exact_matching() -> None:
    assert check_tag("metaflow-agent:host-9000") == "metaflow-agent:host-9000"
    with pytest.raises(ValueError):
        check_tag('metaflow-agent:"quoted"')
