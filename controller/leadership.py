"""Whether this controller may act now: the leader's clock, its term, and
the term's share of every epoch. Pure: the clock is injected, etcd is
`controller.etcd_lease`'s.

Several controllers run at once; etcd's lease says which one leads. A
lease is only as good as its last renewal, so leadership is measured here
against this process's own monotonic clock, never etcd's word alone: the
leader leads while

    now < (send time of its last keepalive that etcd accepted) + TTL - margin

The send time is taken *before* the request leaves, so the bound is never
later than etcd's own expiry (which counts from when etcd received it);
the margin covers a clock that runs a little slow. The shim asks `leads()`
before it carries out any step toward a switch or an agent: a leader that
was paused (SIGSTOP) or cut off past its TTL finds, the moment it runs
again, that it no longer leads, before it sends anything, and demotes
itself (`controller.app`).

One controller without etcd is `Leadership.alone()`: it always leads, at
term 0, and its epochs are today's.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import Enum

TERM_SHIFT = 32
"""A leader with term T hands out epochs `(T << TERM_SHIFT) | n`: every epoch
of a newer leader is above every epoch of an older one."""
MAX_TERM = (1 << 31) - 1
"""The highest term an epoch can carry (epochs stay below 2**63, a signed 64-bit integer)."""
DEFAULT_ETCD_PREFIX = "/metaflow"
"""etcd keys of one cluster start with it (`--etcd-prefix`); the leader's is `PREFIX/leader`."""
DEFAULT_LEASE_TTL_S = 1
"""The leader's lease (`--lease-ttl`): short, for the 3 s takeover target; etcd
must allow it (its minimum is 1.5 election timeouts: docs/ha.md)."""
MARGIN_SHARE = 0.2
"""Of the TTL, how much earlier than the lease's bound a leader stops leading."""


class State(Enum):
    STANDBY = "standby"
    LEADER = "leader"


def epoch_floor(term: int) -> int:
    """The lowest epoch leader `term` may hand out, less one: its first is `floor + 1`."""
    if not 0 <= term <= MAX_TERM:
        raise ValueError(f"a term must lie in [0, {MAX_TERM}], not {term}")
    return term << TERM_SHIFT


def term_of(epoch: int) -> int:
    """The term of the leader that handed out `epoch`."""
    return epoch >> TERM_SHIFT


@dataclass
class Leadership:
    """This controller's leadership as far as it knows it.

    `ttl_s` None: the one controller without etcd, which always leads."""

    ttl_s: float | None
    clock: Callable[[], float] = time.monotonic
    margin_s: float | None = None
    """Default: `MARGIN_SHARE` of the TTL."""
    term: int = 0
    """The term while leading, or the last term led (0: never)."""
    leader_url: str | None = None
    """The leader's REST URL as etcd has it (this controller's own when leading)."""
    own_url: str | None = None
    """This controller's REST URL (`--advertise-url`): a standby never names itself as the leader."""
    etcd_reachable: bool = False
    _reason: str = field(default="not elected yet", repr=False)
    takeovers: int = 0
    """How often this controller became the leader."""
    _until: float | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        if self.ttl_s is not None and self.ttl_s <= 0:
            raise ValueError(f"a lease TTL must be positive, not {self.ttl_s}")
        if self.margin_s is None:
            self.margin_s = MARGIN_SHARE * self.ttl_s if self.ttl_s is not None else 0.0
        if self.ttl_s is not None and not 0 <= self.margin_s < self.ttl_s:
            raise ValueError(f"the margin {self.margin_s} must lie in [0, TTL {self.ttl_s})")

    @classmethod
    def alone(cls) -> Leadership:
        """The one controller without a coordination service: leads at term 0."""
        return cls(None)

    @property
    def reason(self) -> str:
        """Why this controller is a standby (said in the view and the log); "" while leading."""
        if self.leads():
            return ""
        if self._until is not None:
            return "the lease ran out on this controller's clock"
        return self._reason

    @property
    def coordinated(self) -> bool:
        return self.ttl_s is not None

    def leads(self) -> bool:
        """May this controller act now (the gate of every step to a switch or an agent)?"""
        if self.ttl_s is None:
            return True
        return self._until is not None and self.clock() < self._until

    @property
    def state(self) -> State:
        return State.LEADER if self.leads() else State.STANDBY

    def elected(self, term: int, sent_at: float, url: str) -> None:
        """etcd created the leader key on our lease; `sent_at`: when the lease's grant was sent."""
        epoch_floor(term)   # refuses a term an epoch cannot carry
        self.term, self.leader_url, self.etcd_reachable = term, url, True
        self._until = self._bound(sent_at)
        self.takeovers += 1

    def renewed(self, sent_at: float) -> None:
        """etcd accepted a keepalive sent at `sent_at`."""
        self.etcd_reachable = True
        if self._until is not None:
            self._until = max(self._until, self._bound(sent_at))

    def lost(self, reason: str) -> None:
        """The lease is gone (etcd said so, or it ran out on our clock)."""
        self._until = None
        self._reason = reason

    def follow(self, leader_url: str | None) -> None:
        """A standby that reached etcd: the leader is `leader_url` (None: nobody yet)."""
        self.leader_url, self.etcd_reachable = leader_url, True
        self._reason = f"following {leader_url}" if leader_url else "no leader yet: campaigning"

    def unreachable(self, why: str) -> None:
        """etcd did not answer: a standby stays one (and says so); a leader
        keeps leading only until its clock bound, which nothing extends now."""
        self.etcd_reachable = False
        self._reason = f"etcd unreachable: {why}"

    def _bound(self, sent_at: float) -> float:
        assert self.ttl_s is not None and self.margin_s is not None
        return sent_at + self.ttl_s - self.margin_s
