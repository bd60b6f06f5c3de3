"""Which MetaDataID each client connection asked for (pure; clock injected).

In nfqueue mode the kernel does no NAT, so the agent has to remember, per
client connection, the mdid a request went to: the reply leaves from the
server's own address and must get that mdid back as its source. Inbound
packets carry their mdid and start or find the entry; only replies need the
lookup.

The server's socket sees a connection as (client address, client port), the
mdid rewritten away. A client may hold two connections from one port to two
mdids at once (Linux reuses a local port for another destination), and after
the rewrite the two would be one connection to the server: the second SYN
meets the first connection, the reply can leave with the wrong mdid, and the
client's RST tears the first one down. So the table is a small NAPT, as
conntrack is in kernel mode: a connection whose client port is already taken
by a live flow to another mdid is given another port on the server's side
(`REMAP_PORTS`), and its packets get their port swapped in and out along with
the address. The server never sees two connections as one.

Entries go away
* when idle for `idle_timeout` seconds (UDP has no end; a TCP peer may vanish),
* on a TCP RST in either direction (after that packet has been translated),
* `closing_timeout` seconds after FINs were seen in both directions: not at
  once, because the last ACK and retransmitted FINs still need rewriting.
A SYN from the client starts a fresh entry, so a port reused for a new
connection to the same mdid never inherits the old state.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable

from nat_agent.packet import IPPROTO_TCP, TCP_ACK, TCP_FIN, TCP_RST, TCP_SYN

# (IP protocol, client address, port): the client's port inbound, the port
# the server sees for replies (the same unless the flow was remapped).
FlowKey = tuple[int, int, int]
# (IP protocol, client address, client port, mdid): one remapped connection.
_Alias = tuple[int, int, int, int]

# Ports given to remapped connections, above Linux's default ephemeral range
# (32768-60999), so that they rarely meet a client's own port; one the table
# holds is skipped, and a client port that meets one is remapped in turn.
REMAP_PORTS = range(61000, 65536)

_FIN_IN = 1
_FIN_OUT = 2


class _Flow:
    __slots__ = ("mdid", "port", "expires", "fins")

    def __init__(self, mdid: int, port: int, expires: float) -> None:
        self.mdid = mdid
        self.port = port  # the client's own port
        self.expires = expires
        self.fins = 0


class NoFreePort(RuntimeError):
    """Every port of `REMAP_PORTS` holds a flow of this client."""


class FlowTable:
    """Server-side client endpoint -> (mdid, client port), with idle expiry
    and TCP teardown.

    Entries are kept in least-recently-used order, so expiring costs O(1)
    per packet: `inbound` drops expired entries from the old end. A closing
    entry (shorter deadline) behind a live one is also dropped by a lookup
    that finds it expired, and otherwise once it reaches the old end.
    """

    def __init__(self, idle_timeout: float = 300.0, closing_timeout: float = 10.0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.idle_timeout = idle_timeout
        self.closing_timeout = closing_timeout
        self.remapped = 0  # connections ever given another port
        self._clock = clock
        self._flows: OrderedDict[FlowKey, _Flow] = OrderedDict()
        self._aliases: dict[_Alias, int] = {}
        self._next_port = REMAP_PORTS.start

    def __len__(self) -> int:
        return len(self._flows)

    def inbound(self, key: FlowKey, mdid: int, tcp_flags: int = 0) -> int:
        """Record a client packet sent to `mdid` (TCP flags 0 for UDP) and
        return the source port the server must see: the client's own, or the
        one its connection was remapped to."""
        now = self._clock()
        self.expire(now)
        proto, client, port = key
        syn = (tcp_flags & (TCP_SYN | TCP_ACK)) == TCP_SYN
        alias = self._aliases.get((proto, client, port, mdid))
        slot = key if alias is None else (proto, client, alias)
        flow = self._live(slot, now)
        if flow is None and alias is not None:  # the remapped flow expired
            slot = key
            flow = self._live(key, now)
        if flow is not None and (flow.mdid != mdid or flow.port != port):
            flow = None  # the slot holds another connection
            if proto == IPPROTO_TCP and not syn:  # only a SYN, or any UDP datagram, starts a flow
                return port  # a stray packet of a connection we do not know
            slot = (proto, client, self._free_port(proto, client))
            self._aliases[(proto, client, port, mdid)] = slot[2]
            self.remapped += 1
        if tcp_flags & TCP_RST:
            if flow is not None:
                self._drop(slot)
            return slot[2]
        if flow is None or syn:
            self._flows[slot] = flow = _Flow(mdid, port, now + self.idle_timeout)
        self._touch(slot, flow, now, tcp_flags, _FIN_IN)
        return slot[2]

    def outbound(self, key: FlowKey, tcp_flags: int = 0) -> tuple[int, int] | None:
        """The mdid and client port for a reply to the server-side endpoint
        `key`, or None if unknown."""
        now = self._clock()
        flow = self._live(key, now)
        if flow is None:
            return None
        if tcp_flags & TCP_RST:
            self._drop(key)
        else:
            self._touch(key, flow, now, tcp_flags, _FIN_OUT)
        return flow.mdid, flow.port

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
            self._drop(key)
            dropped += 1
        return dropped

    def _live(self, key: FlowKey, now: float) -> _Flow | None:
        """The flow at `key`, dropping it if it has expired."""
        flow = self._flows.get(key)
        if flow is not None and flow.expires <= now:
            self._drop(key)
            return None
        return flow

    def _drop(self, key: FlowKey) -> None:
        flow = self._flows.pop(key)
        if flow.port != key[2]:
            del self._aliases[(key[0], key[1], flow.port, flow.mdid)]

    def _free_port(self, proto: int, client: int) -> int:
        """The next port of `REMAP_PORTS` that holds no flow of `client`."""
        span = len(REMAP_PORTS)
        for step in range(span):
            port = REMAP_PORTS.start + (self._next_port - REMAP_PORTS.start + step) % span
            if (proto, client, port) not in self._flows:
                self._next_port = port + 1 if port + 1 < REMAP_PORTS.stop else REMAP_PORTS.start
                return port
        raise NoFreePort(f"all {span} remap ports of client {client:#010x} hold flows")

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
