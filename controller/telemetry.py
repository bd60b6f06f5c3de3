"""What the controller tells its monitoring, without knowing who listens.

Two kinds of numbers leave the controller. What it keeps as state anyway
(switches, tables, servers, blocks, load, heartbeats) is read at scrape
time into a `Gauges` (`controller.views.gauges`, on the decision loop);
nothing on a hot path changes for it. What happens and is then gone (an
operation that ended and how long it took, a move of blocks) is said to a
`Recorder` as it happens: the core and the sagas get this narrow interface,
and the shim (`controller.metrics`) owns the Prometheus client behind it,
as faucet's valves report through its metrics object. Pure: no I/O.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol


class Recorder(Protocol):
    """Where the core and the sagas say what happened, as it happens."""

    def operation(self, kind: str, seconds: float, ok: bool) -> None:
        """An operation (`controller.saga.Operation`: build, split, rebalance,
        failover, repair, ...) ended after `seconds`; `ok`: it did what it set
        out to (not refused, aborted, cancelled or incomplete)."""

    def move(self, kind: str, seconds: float, ok: bool) -> None:
        """A move of blocks to a new replica set (`controller.move`: a split's
        half, a merge, a rebalance's range) ended after `seconds`."""


class NoRecorder:
    """A recorder that keeps nothing: a core without monitoring (the tests' default)."""

    def operation(self, kind: str, seconds: float, ok: bool) -> None:
        """Nothing is kept."""

    def move(self, kind: str, seconds: float, ok: bool) -> None:
        """Nothing is kept."""


@dataclass(frozen=True)
class ServerGauges:
    """One registered server as the controller sees it."""

    state: str
    """idle, busy, failed, or unplaced (registered, not in the tree)."""
    keys: int
    """Keys it holds, by its last heartbeat."""
    heartbeat_age_s: float
    """Seconds since its last heartbeat (or registration)."""
    packets_per_s: float | None
    """Packets a second toward it, from the last polls of its edge switch; None: not measured."""


@dataclass(frozen=True)
class Gauges:
    """The controller's state, as numbers, at one moment (one scrape)."""

    switches_connected: int
    built: bool
    replicas: int
    """Copies of every block the cluster keeps (--replicas)."""
    table_budget: int | None
    """MetaFlow entries any one switch may hold (--table-budget); None: no limit."""
    entries: dict[int, int] = field(default_factory=dict)
    """MetaFlow entries the planner has in each switch's table, by dpid."""
    servers: dict[str, ServerGauges] = field(default_factory=dict)
    blocks: int = 0
    blocks_without_live_backup: int = 0
    """Blocks whose set has no synced backup on a live server."""
    blocks_not_serving: int = 0
    imbalance_factor: float = 0.0
    imbalance_threshold: float = 0.0
    data_lost: int = 0
    """DATA-LOST events since the controller started."""
    operations: dict[str, tuple[int, float]] = field(default_factory=dict)
    """Running operations per kind: how many, and the oldest one's age in seconds."""
    heartbeat_timeout_s: float = 0.0
    migration_lease_s: float = 0.0
