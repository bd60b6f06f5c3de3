"""Static routes: which agent serves which part of the MetaDataID space, for
a client without the switches (``--route CIDR=HOST[:PORT]``, repeatable).

Why: a client on the fabric sends each request to its MetaDataID as an
address and the switches pick the server by longest prefix. Without a
fabric (agents that split the space on one machine, a test, a laptop), a
client can only talk to one agent (``--via``), so a space split over several
agents was out of its reach. A table of routes is what the switches would
hold, given to the client instead: the longest prefix that covers an ID
names its agent, and the entries together must cover the whole space (an
ID no entry covers would have nowhere to go).
"""

from __future__ import annotations

import ipaddress
from collections.abc import Sequence

from client_lib.cidr import Block
from client_lib.client import Destination, Route, host_port
from client_lib.errors import InvalidArgument

__all__ = ["parse_route", "static_route"]


def parse_route(text: str, port: int) -> tuple[Block, Destination]:
    """``CIDR=HOST[:PORT]`` (the port defaults to `port`); `InvalidArgument` otherwise."""
    cidr, sep, where = text.partition("=")
    if not sep:
        raise InvalidArgument(f"route {text!r}: expected CIDR=HOST[:PORT]")
    try:
        block = Block.parse(cidr.strip())
    except ValueError as exc:
        raise InvalidArgument(f"route {text!r}: {exc}") from None
    return block, host_port(where.strip(), port)


def static_route(entries: Sequence[tuple[Block, Destination]], space: Block) -> Route:
    """A client's `route` for `entries` (block, agent) in `space`: the longest
    prefix wins. `InvalidArgument` if an entry lies outside the space, two
    name the same block, or they leave part of the space uncovered."""
    table: dict[Block, Destination] = {}
    for block, destination in entries:
        if not space.covers(block):
            raise InvalidArgument(f"route {block}: outside the space {space}")
        if block in table:
            raise InvalidArgument(f"route {block}: given twice")
        table[block] = destination
    reached = space.first
    for block in sorted(table, key=lambda b: b.first):
        if block.first > reached:
            break
        reached = max(reached, block.last + 1)
    if reached <= space.last:
        raise InvalidArgument(f"the routes leave {space.address(reached)} of {space} uncovered")
    longest_first = sorted(table.items(), key=lambda item: -item[0].plen)

    def route(address: str) -> Destination:
        ident = int(ipaddress.ip_address(address))
        return next(destination for block, destination in longest_first if block.contains(ident))
    return route
