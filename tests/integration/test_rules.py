"""The rule list of each rewrite mode, exactly as it is handed to iptables."""

from __future__ import annotations

import pytest

from client_lib.cidr import Block
from client_lib.mdid import DEFAULT_SPACE
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
