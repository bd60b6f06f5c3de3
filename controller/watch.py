"""Watching the load: when the controller polls which switches' counters,
and what they say of each server.

A request crosses its owner's edge switch once, so the switches with
storage servers below them give every server's and every prefix's load; the
switches above (most of a fat-tree, with the largest tables) are left
alone. `LoadWatch` asks them each `--load-poll-s`, one poll at a time (a
slow switch slows the polling rather than piling requests on it), turns
their answers into rates (`controller.load.LoadMeter`) and those into
packets a second per server. What to do about an imbalance is the core's
policy (`MetaFlowCore._judge_load`). No I/O: a poll is steps.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from btree.tree import LogicalBTree, State
from controller import ofmsgs
from controller.inventory import Inventory
from controller.load import LoadMeter
from controller.registry import Registry
from controller.steps import ReadFlows, Step


class LoadWatch:
    """The polls of the edge switches' flow counters, and the loads they give."""

    def __init__(self, interval: float, registry: Registry, inventory: Inventory) -> None:
        self.interval = interval
        """Seconds between polls (`--load-poll-s`); 0 polls never."""
        self.meter = LoadMeter()
        self._registry = registry
        self._inventory = inventory
        self._polls: dict[int, int] = {}
        """Flow-counter reads under way: step id to dpid."""
        self._polled = float("-inf")

    def poll(self, now: float, edges: Iterable[int], issue: Callable[[Step], int]) -> list[Step]:
        """A read of every connected switch of `edges`, if a poll is due and
        the last one has been answered."""
        if self.interval <= 0 or self._polls or now - self._polled < self.interval:
            return []
        self._polled = now
        steps: list[Step] = []
        for dpid in sorted(self._inventory.dpids & set(edges)):
            step = ReadFlows(dpid=dpid)
            self._polls[issue(step)] = dpid
            steps.append(step)
        return steps

    def polling(self, step: int) -> bool:
        """`step` is one of this poll's reads."""
        return step in self._polls

    def answered(self, step: int, result: object, now: float) -> bool:
        """A read's answer (None if it failed: the next poll asks again); True
        once the poll is complete."""
        dpid = self._polls.pop(step)
        if isinstance(result, list):
            self.meter.observe(dpid, now, ofmsgs.entry_counts(result))
        return not self._polls

    def forget(self, dpid: int) -> None:
        """A switch disconnected: its counters start over when it is back."""
        self.meter.forget(dpid)

    def server_loads(self) -> dict[str, float]:
        """Packets a second toward each located server, from the polls of its edge."""
        out = {}
        switches = set(self.meter.switches())
        for name, server in sorted(self._registry.servers.items()):
            host = self._inventory.hosts.get(server.data_ip)
            if host is not None and host.dpid in switches:
                out[name] = sum(r.packets_per_s for r in self.meter.rates(host.dpid) if r.port == host.port)
        return out


def owner_loads(tree: LogicalBTree | None, loads: dict[str, float]) -> dict[str, float]:
    """Those of `loads` of the servers that own blocks: the ones balancing is about."""
    if tree is None:
        return {}
    owners = set(tree.leaves_in(State.BUSY))
    return {name: rate for name, rate in loads.items() if name in owners}
