"""The one CIDR type of MetaFlow, and prefix algebra over plain integers of
width 32 (IPv4) or 128 (IPv6).

`Block` is both the MetaDataID space (clients, agents and the controller
agree on one) and every block of the partition: MetaDataIDs are integers and
the switches only understand prefixes, so every partition value of the
B-tree ends up as a set of prefixes. Keeping the algebra
on integers (not `ipaddress` objects) keeps the hot paths of planning and
flow generation cheap; `ipaddress` is used only to parse and print.
"""

from __future__ import annotations

import ipaddress
import socket
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TypeVar

WIDTHS = (32, 128)
"""Bits of an address: 32 for IPv4 spaces, 128 for IPv6 ones."""

T = TypeVar("T")


@dataclass(frozen=True, order=True, slots=True)
class Block:
    """A CIDR block: `plen` leading bits of `first` fixed, the rest free."""

    first: int
    plen: int
    width: int = 32

    def __post_init__(self) -> None:
        if self.width not in WIDTHS:
            raise ValueError(f"width must be 32 or 128, not {self.width}")
        if not 0 <= self.plen <= self.width:
            raise ValueError(f"prefix length {self.plen} outside 0..{self.width}")
        if self.first & (self.size - 1) or not 0 <= self.first < 1 << self.width:
            raise ValueError(f"{self.first:#x}/{self.plen} has host bits set or is out of range")

    @classmethod
    def parse(cls, text: str) -> Block:
        """Parse '100.64.0.0/10' or '2001:db8::/32'; host bits set is an error."""
        net = ipaddress.ip_network(text, strict=True)
        return cls(int(net.network_address), net.prefixlen, net.max_prefixlen)

    @property
    def size(self) -> int:
        return 1 << (self.width - self.plen)

    @property
    def last(self) -> int:
        return self.first + self.size - 1

    def contains(self, addr: int) -> bool:
        return self.first <= addr <= self.last

    def covers(self, other: Block) -> bool:
        return self.first <= other.first and other.last <= self.last

    def halves(self) -> tuple[Block, Block]:
        """The two sub-blocks one bit longer; the split step of the paper's traversal."""
        if self.plen == self.width:
            raise ValueError(f"{self} is a single address and cannot be halved")
        half = self.size >> 1
        return (Block(self.first, self.plen + 1, self.width),
                Block(self.first + half, self.plen + 1, self.width))

    def parent(self) -> Block:
        if self.plen == 0:
            raise ValueError("the whole space has no parent block")
        plen = self.plen - 1
        mask = ((1 << self.width) - 1) ^ ((1 << (self.width - plen)) - 1)
        return Block(self.first & mask, plen, self.width)

    def address(self, addr: int | None = None) -> str:
        """Text form of `addr`, an address of this block (default: the network
        address): dotted IPv4 or IPv6 by the block's width, even for small IDs
        of an IPv6 space."""
        value = self.first if addr is None else addr
        if not self.contains(value):
            raise ValueError(f"{value:#x} is not an address of {self}")
        if self.width == 32:  # every request's destination: inet_ntoa is ten times ipaddress's speed
            return socket.inet_ntoa(value.to_bytes(4, "big"))
        return str(ipaddress.IPv6Address(value))

    def __str__(self) -> str:
        return f"{self.address()}/{self.plen}"


def cover(first: int, last: int, width: int = 32) -> list[Block]:
    """The minimal list of CIDR blocks whose union is exactly [first, last], in order.

    Greedy from the left is optimal: at each point take the largest aligned
    block that fits; any cover must split at the same points.
    """
    if first > last:
        return []
    if first < 0 or last >= 1 << width:
        raise ValueError(f"range [{first:#x}, {last:#x}] outside a {width}-bit space")
    out: list[Block] = []
    while first <= last:
        align = (first & -first).bit_length() - 1 if first else width
        span = (last - first + 1).bit_length() - 1
        bits = min(align, span)
        out.append(Block(first, width - bits, width))
        first += 1 << bits
    return out


def subtract(block: Block, part: Block) -> list[Block]:
    """`block` without `part` (a block inside it), as the minimal list of blocks."""
    if not block.covers(part):
        raise ValueError(f"{part} is not inside {block}")
    return cover(block.first, part.first - 1, block.width) + cover(part.last + 1, block.last, block.width)


def most_aligned(lo: int, hi: int, width: int = 32) -> int:
    """The point in [lo, hi] with the most trailing zero bits (a split point
    there costs the fewest prefixes)."""
    if lo > hi:
        raise ValueError("empty interval")
    if lo == 0:
        return 0
    for bit in range(width, -1, -1):
        candidate = (hi >> bit) << bit
        if candidate >= lo:
            return candidate
    return lo  # unreachable: bit 0 always yields hi


def lpm(table: Sequence[tuple[Block, T]] | dict[Block, T], addr: int) -> T | None:
    """Longest-prefix match by brute force: the reference the fast paths are tested against."""
    items = table.items() if isinstance(table, dict) else table
    best: tuple[int, T] | None = None
    for block, value in items:
        if block.contains(addr) and (best is None or block.plen > best[0]):
            best = (block.plen, value)
    return None if best is None else best[1]
