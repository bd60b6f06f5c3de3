"""What the controller core hears (events) and what it asks for (steps).

The core (`controller.core`) never performs I/O: every input arrives as an
event, and every effect it wants leaves as a step, which the os-ken shim
(`controller.app`) carries out, reporting each step's outcome back as a
`StepDone` or `StepFailed` event. A test drives the same core with fake
switches and agents that carry out the same steps (faucet's valve/shim
split), so every decision, and every failure between two steps, can be
exercised without a network.

Steps carry their OpenFlow messages ready-built (os-ken OF1.0 message
objects with no datapath; the shim attaches it), so what a test's fake
switch applies is exactly what a real switch receives.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from client_lib.api.route import Route
from controller.arp import ArpMessage

# -- events: what the core is told ------------------------------------------------


@dataclass(frozen=True)
class SwitchUp:
    dpid: int
    ports: tuple[int, ...] = ()
    """Its physical ports (features reply)."""
    name: str = ""
    """Its own name (the local port's: the bridge's, on Open vSwitch)."""


@dataclass(frozen=True)
class SwitchDown:
    dpid: int


@dataclass(frozen=True)
class LinkUp:
    a: int
    port_a: int
    b: int
    port_b: int


@dataclass(frozen=True)
class LinkDown:
    a: int
    port_a: int
    b: int
    port_b: int


@dataclass(frozen=True)
class PortDown:
    dpid: int
    port: int


@dataclass(frozen=True)
class PortUp:
    dpid: int
    port: int


@dataclass(frozen=True)
class SwitchError:
    """A switch refused a request (OFPT_ERROR); `data` begins with the request."""

    dpid: int
    error_type: int
    error_code: int
    data: bytes


@dataclass(frozen=True)
class ArpIn:
    """An ARP frame a switch sent up (packet-in)."""

    dpid: int
    port: int
    message: ArpMessage


@dataclass(frozen=True)
class FabricSeen:
    """The fabric as the leader has found it, as it published it
    (`controller.etcd_lease`): a standby, which hears no ARP a host sent
    before it started and no LLDP of a link until the leader's next round,
    learns them from this."""

    hosts: tuple[tuple[str, str, int, int], ...] = ()
    """(ip, mac, dpid, port) each."""
    links: tuple[tuple[int, int, int, int], ...] = ()
    """(dpid, port, dpid, port) each."""
    servers: tuple[str, ...] = ()
    """The storage servers registered with the leader and not failed: a
    successor builds as soon as all of them have registered with it (and
    the topology has been quiet for --settle), its heartbeat timeout
    staying the bound for those that never come. Before the leader's first
    build these are the servers registered so far: a successor that takes
    over in a registration storm builds once they are back, as the first
    leader would have built without waiting for servers not yet
    registered (those join the tree as idle servers, `server-joined`)."""

    def to_json(self) -> str:
        return json.dumps({"hosts": [list(h) for h in self.hosts], "links": [list(k) for k in self.links],
                           "servers": list(self.servers)})

    @classmethod
    def from_json(cls, text: str) -> FabricSeen:
        """As `to_json` wrote it (`servers` may be missing: an older leader's);
        ValueError, TypeError or KeyError if it is not."""
        record = json.loads(text)
        hosts = tuple((str(ip), str(mac), int(dpid), int(port)) for ip, mac, dpid, port in record["hosts"])
        servers = record.get("servers", [])
        if not isinstance(servers, list):
            raise TypeError(f"servers must be a list of names, not {servers!r}")
        return cls(hosts, tuple((int(a), int(pa), int(b), int(pb)) for a, pa, b, pb in record["links"]),
                   tuple(str(name) for name in servers))


@dataclass(frozen=True)
class Tick:
    """Time passes: build once discovery settles, check heartbeats, start splits."""

    stalled_s: float = 0.0
    """How long the controller itself did not run just before this tick (a
    SIGSTOP, a paused VM, no CPU): the shim's clock measures it. The servers'
    heartbeats of that time are still unread, so their silence is not theirs."""


@dataclass(frozen=True)
class Request:
    """Something a REST caller waits for; `reply` is the shim's handle for the
    answer (the core only passes it back in an `Answer` step)."""

    reply: object = field(compare=False)


@dataclass(frozen=True)
class Register(Request):
    registration: Any = None   # client_lib.api.rest.Registration


@dataclass(frozen=True)
class Heartbeat(Request):
    name: str = ""
    beat: Any = None           # client_lib.api.rest.Heartbeat


@dataclass(frozen=True)
class SplitNow(Request):
    name: str = ""


@dataclass(frozen=True)
class FailNow(Request):
    name: str = ""
    reason: str = ""


@dataclass(frozen=True)
class DrainNow(Request):
    """Start draining a server (`controller.drain`), answered at once; or,
    `undrain`, return a drained one to the idle pool."""

    name: str = ""
    undrain: bool = False


@dataclass(frozen=True)
class StepDone:
    step: int
    result: object = None


@dataclass(frozen=True)
class StepFailed:
    step: int
    error: str


Event = (SwitchUp | SwitchDown | SwitchError | LinkUp | LinkDown | PortDown | PortUp | ArpIn | FabricSeen
         | Tick | Register
         | Heartbeat | SplitNow | FailNow | DrainNow | StepDone | StepFailed)


# -- steps: what the core asks for -----------------------------------------------


@dataclass
class Step:
    """`id` is set by the core when it issues the step; its outcome comes
    back as `StepDone(id, result)` or `StepFailed(id, error)`."""

    id: int = field(default=0, init=False)


@dataclass
class SendFlows(Step):
    """Send OpenFlow messages to one switch, then a barrier; done when the
    barrier reply is back (failed: not connected, or no reply in time)."""

    dpid: int = 0
    messages: list[Any] = field(default_factory=list)


@dataclass
class ReadFlows(Step):
    """The switch's flow stats (os-ken OFPFlowStats list) as the result."""

    dpid: int = 0


@dataclass
class PacketOut(Step):
    """Send one frame out of a switch port; nothing to wait for."""

    dpid: int = 0
    port: int = 0
    data: bytes = b""


@dataclass
class CallAgent(Step):
    """One admin API call to an agent; the typed response is the result."""

    server: str = ""
    url: str = ""
    route: Route[Any, Any] | None = None
    body: object = None
    params: dict[str, str] = field(default_factory=dict)


@dataclass
class Wait(Step):
    """Done after `seconds` (a saga polling an agent: nothing is blocked meanwhile)."""

    seconds: float = 0.0


@dataclass
class Answer(Step):
    """Give a waiting REST caller its answer (an `Outcome`, a body, or an
    exception to raise); nothing comes back."""

    reply: object = None
    value: object = None

