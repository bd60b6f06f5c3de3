"""Replication under random histories of splits, deaths, cut links, returns,
quick agent restarts and controller restarts.

After every event the world is left to settle (heartbeats, ticks, the
repairs they start), then: every ID is routed to exactly the server that
serves it, every block has r synced copies on live servers, the synced
copies hold the primary's records, and every acknowledged write reads back.
A server dies only while at least r+1 others live: one death at a time never
takes every copy of a block.
"""

from __future__ import annotations

import os
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from btree.tree import State
from client_lib.api.rest import Outcome
from controller.steps import SplitNow
from tests.unit.controller_world import World, check_consistent
from topology.builders import fat_tree

EVENTS = ("write", "split", "kill", "crash", "cut", "return", "restart", "controller")


def _settle(world: World, rounds: int = 40) -> None:
    """Heartbeats and ticks until no operation runs and every set is whole,
    and long enough for a silent server to be declared failed."""
    for done in range(rounds):
        world.advance(1.0)
        world.heartbeats()
        world.tick()
        core = world.core
        whole = core.replicas is not None and not core.replicas.under_replicated()
        if done > world.settings.heartbeat_timeout_s and whole and not core.operations.running \
                and not core.not_serving:
            return
    raise AssertionError(f"not settled: running={list(world.core.operations.running.values())} "
                         f"under={world.core.replicas and world.core.replicas.under_replicated()}")


def _write(world: World, rng: random.Random, acked: dict[int, bytes], count: int) -> None:
    tree = world.tree
    for _ in range(count):
        block, _ = rng.choice(tree.partition())
        mdid = rng.randrange(block.first, block.last + 1)
        value = f"v{rng.random()}".encode()
        if world.write(mdid, value) == "serve":
            acked[mdid] = value


def _live(world: World) -> list[str]:
    return sorted(n for n, a in world.agents.items()
                  if not a.dead and not world._cut_off(n) and not world.core.registry[n].failed)


@pytest.mark.parametrize("replicas", [2, 3])
@settings(max_examples=int(os.environ.get("METAFLOW_HISTORIES", "60")))
@given(events=st.lists(st.tuples(st.sampled_from(EVENTS), st.integers(0, 1000)), min_size=1, max_size=10))
def test_random_histories_keep_one_owner_per_id_and_r_copies(replicas: int,
                                                             events: list[tuple[str, int]]) -> None:
    world = World(fat_tree(4, servers=8), replicas=replicas, migration_lease_s=10.0)
    world.boot()
    rng = random.Random(0)
    acked: dict[int, bytes] = {}
    _write(world, rng, acked, 60)
    down: list[str] = []
    for kind, pick in events:
        live = _live(world)
        if kind == "write":
            _write(world, rng, acked, 40)
        elif kind == "split":
            busy = world.tree.leaves_in(State.BUSY)
            _write(world, rng, acked, 40)
            outcome = world.ask(SplitNow, name=busy[pick % len(busy)])
            assert isinstance(outcome, Outcome)
        elif kind in ("kill", "crash", "cut") and len(live) > replicas + 1:
            victim = live[pick % len(live)]
            if kind != "cut":
                world.agents[victim].dead = True
            if kind != "crash":
                world.cut(victim)
            down.append(victim)
            world.run()
        elif kind == "return" and down:
            name = down.pop(pick % len(down))
            world.reconnect(name)
            world.restart(name)
        elif kind == "restart" and len(live) > replicas + 1:   # kill -9, back before the timeout
            world.restart(live[pick % len(live)])
        elif kind == "controller":
            world.new_core()
            world.boot()
        _settle(world)
        check_consistent(world, acked)
        assert not world.core.lost, world.core.lost
        for block, s in world.core.world.replicas_or_raise().sets.items():
            assert len(s.synced) == replicas and all(m in _live(world) for m in s.members), (block, s)
