"""The route of a client of two agents that own one half of the MetaDataID
space each: what the switches do, for tests without a fabric."""

from __future__ import annotations

import ipaddress
from collections.abc import Callable

from client_lib.cidr import Block
from client_lib.constants import DEFAULT_SPACE_CIDR

SPACE = Block.parse(DEFAULT_SPACE_CIDR)
LOW, HIGH = SPACE.halves()


def route_by_halves(low: tuple[str, int], high: tuple[str, int]) -> Callable[[str], tuple[str, int]]:
    """A `MetaFlowClient(route=...)` sending IDs of `LOW` to `low`, the rest to `high`."""
    def route(address: str) -> tuple[str, int]:
        return low if LOW.contains(int(ipaddress.ip_address(address))) else high
    return route
