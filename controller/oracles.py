"""Counts an agent knows (keys, requests per ID range), asked for as a pure
planner needs them.

Why a replay: a planner (`btree.split`, `btree.rebalance`) is a plain
function of oracles, so the same code runs on a simulation and on live
agents, and the core never blocks on a count. Here the planner runs against
what has been fetched so far; the first count it lacks stops that run, the
lacking counts are fetched (one admin call per kind), and it runs again.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, TypeVar

from client_lib.api.admin import ADMIN, CountRequest
from client_lib.api.route import Route
from controller.saga import Saga
from controller.steps import CallAgent
from controller.world import SagaWorld

T = TypeVar("T")

Range = tuple[int, int]
Ask = Callable[[int, int], int]
"""A count on the agent within the inclusive ID range [first, last]."""

KEYS = "keys"
REQUESTS = "requests"
ROUTES: Mapping[str, Route[Any, Any]] = {KEYS: ADMIN.count, REQUESTS: ADMIN.ops}
"""Each kind of count, and the agent's route that answers it."""


class _Unknown(Exception):
    """The planner asked for a count not fetched yet."""


def answered(world: SagaWorld, name: str, decide: Callable[[Mapping[str, Ask]], T],
             prefetch: Mapping[str, list[Range]] | None = None) -> Saga:
    """`decide(oracles)` (one oracle per kind in `ROUTES`) once every count
    it asks of server `name` is known; `prefetch`: ranges surely asked for,
    fetched before the first run."""
    server = world.registry[name]
    known: dict[str, dict[Range, int]] = {kind: {} for kind in ROUTES}
    wanted: dict[str, list[Range]] = {kind: list((prefetch or {}).get(kind, [])) for kind in ROUTES}
    while True:
        for kind, ranges in wanted.items():
            if ranges:
                reply = yield CallAgent(server=name, url=server.admin_url, route=ROUTES[kind],
                                        body=CountRequest(ranges))
                known[kind].update(zip(ranges, reply.counts, strict=True))
        wanted = {kind: [] for kind in ROUTES}
        try:
            return decide({kind: _oracle(known[kind], wanted[kind]) for kind in ROUTES})
        except _Unknown:
            continue


def _oracle(known: dict[Range, int], missing: list[Range]) -> Ask:
    def ask(first: int, last: int) -> int:
        if (first, last) not in known:
            missing.append((first, last))
            raise _Unknown
        return known[(first, last)]
    return ask
