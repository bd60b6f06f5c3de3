"""The iptables rules of each rewrite mode, as plain data (no I/O).

A client sends its request to a MetaDataID (mdid) as the destination
address; the server's metadata service listens on its own address, and the
reply must come back from the mdid or the client's TCP socket ignores it.

* ``kernel``: nat PREROUTING DNAT of the whole space to the server's address;
  conntrack un-NATs the replies, so no outbound rule is needed. There is no
  nat OUTPUT rule for clients on the server itself: OUTPUT sees requests for
  *every* mdid, including those other servers own, and DNAT-ing the whole
  space there would send them all to the local service (which answers MOVED,
  and the client would retry into the same rule forever). Only the network
  guarantees that what arrives in PREROUTING is for us.
* ``nfqueue``: the paper's user-space agent, which rewrites in both
  directions itself. Where each direction is queued is chosen so that
  conntrack sees every connection from the server's side only, exactly as
  if the client had connected to our own address:
  - requests in raw PREROUTING: before conntrack (and before routing, so the
    rewritten destination is delivered locally);
  - replies in mangle OUTPUT: after conntrack has matched them to that
    connection (the kernel re-routes a locally generated packet whose
    source changed in OUTPUT).
  The alternative, NOTRACK for both directions, breaks a stateful firewall
  for clients of our own address: their replies match the outbound rule
  too, conntrack never sees them, and the clients' next packets are INVALID.
  ``--queue-bypass`` lets traffic through unchanged while no agent is bound
  to the queue instead of dropping it.
* ``local``: no rewrite at all. The server takes the space as local
  addresses (`nat_agent.anyip_plan`), so requests arrive as they were sent
  and replies leave from the mdid by construction. The only rules are
  connection tracking's bypass for the service port in both directions
  (raw PREROUTING for requests, raw OUTPUT for replies): no NAT needs a
  connection's state, and the rules match the space only, so a stateful
  firewall keeps tracking every other connection, including clients of our
  own address. TCP only: the metadata service speaks nothing else.
* ``none``: no rules (the service is reached by its own address only).
"""

from __future__ import annotations

import ipaddress
import re
from dataclasses import dataclass
from typing import Literal, get_args

from client_lib.cidr import Block
from client_lib.constants import METAFLOW_PORT

Mode = Literal["local", "kernel", "nfqueue", "none"]
MODES: tuple[str, ...] = get_args(Mode)
DEFAULT_MODE: Mode = "local"
"""What the agent and the scenarios run unless told otherwise: it measured
cheapest (`benchmarks.nat_cost`, docs/benchmarks/baselines.md)."""


DEFAULT_QUEUE_NUM = METAFLOW_PORT
DEFAULT_TAG = "metaflow-agent:default"
TRANSPORTS = ("tcp", "udp")

# Comments are matched exactly against `iptables-save` output, which quotes
# comments holding spaces or quotes; a tag without them reads back verbatim.
_TAG = re.compile(r"[A-Za-z0-9_.:@/+-]{1,255}")


@dataclass(frozen=True)
class Rule:
    """One iptables rule: ``iptables -t <table> -A <chain> <args...>``."""

    table: str
    chain: str
    args: tuple[str, ...]


def check_tag(tag: str) -> str:
    """Return `tag` if it can be found again exactly in `iptables-save` output."""
    if not _TAG.fullmatch(tag):
        raise ValueError(f"bad rule tag {tag!r}: want 1-255 of [A-Za-z0-9_.:@/+-]")
    return tag


def rewrite_rules(mode: str, space: Block, own_ip: str | None,
                  port: int = METAFLOW_PORT, queue_num: int = DEFAULT_QUEUE_NUM,
                  tag: str = DEFAULT_TAG) -> list[Rule]:
    """The rules that make requests to `space`:`port` reach `own_ip`:`port`
    and replies leave from the requested mdid, in the given mode.

    Mode ``none`` ignores the other arguments: an agent without a data-plane
    address (``own_ip`` None) can still run it; ``local`` needs no address.
    """
    if mode not in MODES:
        raise ValueError(f"unknown rewrite mode {mode!r}: want one of {', '.join(MODES)}")
    if mode == "none":
        return []
    if space.width != 32:
        raise ValueError(f"the rewrite is IPv4 only; {space} is not an IPv4 space")
    if not 0 < port < 1 << 16:
        raise ValueError(f"port {port} outside 1..65535")
    comment = ("-m", "comment", "--comment", check_tag(tag))
    if mode == "local":
        notrack = (*comment, "-j", "CT", "--notrack")
        return [Rule("raw", "PREROUTING", ("-d", str(space), "-p", "tcp", "-m", "tcp", "--dport", str(port),
                                           *notrack)),
                Rule("raw", "OUTPUT", ("-s", str(space), "-p", "tcp", "-m", "tcp", "--sport", str(port),
                                       *notrack))]
    try:
        address = str(ipaddress.IPv4Address(own_ip))
    except ValueError:
        raise ValueError(f"own address {own_ip!r} is not an IPv4 address") from None
    if not 0 <= queue_num < 1 << 16:
        raise ValueError(f"queue number {queue_num} outside 0..65535")
    rules: list[Rule] = []
    for proto in TRANSPORTS:
        inbound = ("-d", str(space), "-p", proto, "-m", proto, "--dport", str(port), *comment)
        outbound = ("-s", address, "-p", proto, "-m", proto, "--sport", str(port), *comment)
        if mode == "kernel":
            rules.append(Rule("nat", "PREROUTING",
                              (*inbound, "-j", "DNAT", "--to-destination", address)))
        else:
            queue = ("-j", "NFQUEUE", "--queue-num", str(queue_num), "--queue-bypass")
            rules += [Rule("raw", "PREROUTING", (*inbound, *queue)),
                      Rule("mangle", "OUTPUT", (*outbound, *queue))]
    return rules
