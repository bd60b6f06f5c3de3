"""Choosing the management subnet from the root namespace's routes (no I/O)."""

from __future__ import annotations

import ipaddress

import pytest

from mininet_scenarios.mgmt import AUTO_SUBNETS, choose_subnet

ROUTES = ["default via 192.0.2.1 dev eth0",
          "192.0.2.0/24 dev eth0 proto kernel scope link src 192.0.2.2"]


def net(text: str) -> ipaddress.IPv4Network:
    return ipaddress.IPv4Network(text)


def test_nothing_wanted_and_nothing_taken_gives_the_first_automatic_subnet():
    assert choose_subnet(ROUTES, None) == net("10.254.0.0/16") == AUTO_SUBNETS[0]


def test_a_leftover_scenario_pushes_the_choice_to_the_next_free_subnet():
    leftover = "10.254.0.0/16 dev mfhmnjmgmt proto kernel scope link src 10.254.255.254 linkdown"
    blackhole = "blackhole 10.253.7.0/24"
    assert choose_subnet([*ROUTES, leftover, blackhole], None) == net("10.252.0.0/16")


def test_a_wider_route_over_the_pool_takes_every_subnet_it_covers():
    assert choose_subnet([*ROUTES, "10.240.0.0/12 dev wan0"], None) == net("10.239.0.0/16")
    with pytest.raises(RuntimeError, match="no free management subnet"):
        choose_subnet(["10.0.0.0/8 dev big0"], None)


def test_a_wanted_subnet_is_given_when_free_and_refused_when_routed():
    assert choose_subnet(ROUTES, net("10.250.0.0/16")) == net("10.250.0.0/16")
    with pytest.raises(RuntimeError, match="overlaps the route '10.250.3.0/24 dev x'"):
        choose_subnet([*ROUTES, "10.250.3.0/24 dev x"], net("10.250.0.0/16"))
