"""Which MetaDataID each client connection asked for (pure; clock injected).

In nfqueue mode the kernel does no NAT, so the agent has to remember, per
client endpoint, the mdid a request went to: the reply leaves from the
server's own address and must get that mdid back as its source. Inbound
packets always carry their mdid and (re)establish the entry; only replies
need the lookup.

Entries go away
* when idle for `idle_timeout` seconds (UDP has no end; a TCP peer may vanish),
* on a TCP RST in either direction (after that packet has been translated),
* `closing_timeout` seconds after FINs were seen in both directions: not at
  once, because the last ACK and retransmitted FINs still need rewriting.
A SYN from the client starts a fresh entry, so a port reused for a new
connection (even to another mdid) never inherits the old state.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable

from nat_agent.packet import TCP_ACK, TCP_FIN, TCP_RST, TCP_SYN

# (IP protocol, client address, client port)
FlowKey = tuple[int, int, int]

_FIN_IN = 1
_FIN_OUT = 2


class _Flow:
    __slots__ = ("mdid", "expires", "fins")

    def __init__(self, mdid: int, expires: float) -> None:
        self.mdid = mdid
        self.expires = expires
        self.fins = 0


class FlowTable:
    """Client endpoint -> mdid, with idle expiry and TCP teardown.

    Entries are kept in least-recently-used order, so expiring costs O(1)
    per packet: `inbound` drops expired entries from the old end. A closing
    entry (shorter deadline) behind a live one is also dropped by a lookup
    that finds it expired, and otherwise once it reaches the old end.
    """

    def __init__(self, idle_timeout: float = 300.0, closing_timeout: float = 10.0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.idle_timeout = idle_timeout
        self.closing_timeout = closing_timeout
        self._clock = clock
        self._flows: OrderedDict[FlowKey, _Flow] = OrderedDict()

    def __len__(self) -> int:
        return len(self._flows)

    def inbound(self, key: FlowKey, mdid: int, tcp_flags: int = 0) -> None:
        """Record a client packet sent to `mdid` (TCP flags 0 for UDP)."""
        now = self._clock()
        self.expire(now)
        flows = self._flows
        if tcp_flags & TCP_RST:
            flows.pop(key, None)
            return
        flow = flows.get(key)
        if flow is None or (tcp_flags & (TCP_SYN | TCP_ACK)) == TCP_SYN or flow.expires <= now:
            flows[key] = flow = _Flow(mdid, now + self.idle_timeout)
        else:
            flow.mdid = mdid
        self._touch(key, flow, now, tcp_flags, _FIN_IN)

    def outbound(self, key: FlowKey, tcp_flags: int = 0) -> int | None:
        """The mdid for a reply to the client `key`, or None if unknown."""
        flow = self._flows.get(key)
        if flow is None:
            return None
        now = self._clock()
        if flow.expires <= now:
            del self._flows[key]
            return None
        if tcp_flags & TCP_RST:
            del self._flows[key]
        else:
            self._touch(key, flow, now, tcp_flags, _FIN_OUT)
        return flow.mdid

    def expire(self, now: float | None = None) -> int:
        """Drop expired entries from the least recently used end; return how many."""
        if now is None:
            now = self._clock()
        flows = self._flows
        dropped = 0
        while flows:
            key, flow = next(iter(flows.items()))
            if flow.expires > now:
                break
            del flows[key]
            dropped += 1
        return dropped

    def _touch(self, key: FlowKey, flow: _Flow, now: float, tcp_flags: int, fin_bit: int) -> None:
        if flow.fins == _FIN_IN | _FIN_OUT:
            return  # closing: the deadline was fixed when the second FIN passed
        if tcp_flags & TCP_FIN:
            flow.fins |= fin_bit
        if flow.fins == _FIN_IN | _FIN_OUT:
            flow.expires = now + self.closing_timeout
        else:
            flow.expires = now + self.idle_timeout
        self._flows.move_to_end(key)
