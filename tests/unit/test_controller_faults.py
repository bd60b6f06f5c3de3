"""Splits and fail-overs end consistent whatever fails between any two of their steps.

A clean run of each operation lists the steps it takes (agent calls, flow
pushes, flow reads). Then, for every step and every fault that can hit it,
a fresh world runs the operation again with that fault injected there:

- ``unreachable``: the agent does not get the call;
- ``reply lost``: the agent carries the call out, the controller hears a timeout;
- ``barrier timeout``: the switch applies the messages, the barrier reply never comes;
- ``barrier timeout, not applied``: the switch drops them too;
- ``kill``: the controller dies right after the step is carried out (its
  outcome and everything queued is lost) and a new one starts from the
  switches and the agents;
- ``source dies`` / ``other dies``: right after the step, the operation's
  own server (a split's source, a fail-over's failed server) or the other
  server it involves (a split's target, a merge's servers, a fail-over's
  successor) dies outright and its edge port goes down: the operation is
  overtaken.

Every operation runs without replication (r=1) and with a backup per block
(r=2). Clients keep writing through the switches at every step. Afterwards
(once the migrations' leases have run out): every ID is routed by the
switches to a server that serves it, no block is frozen, the replica sets
agree with the agents and their synced members hold the primary's records,
and every acknowledged write reads back. With r=1 the controller may declare
blocks lost, only with a server that really died; with r=2 one death loses
nothing.
"""

from __future__ import annotations

import itertools
import random
from collections.abc import Callable

import pytest

from btree.bootstrap import Bootstrap
from btree.tree import State
from client_lib.cidr import Block
from controller.steps import CallAgent, ReadFlows, SendFlows, SplitNow, Step
from tests.unit.controller_world import ControllerKilled, World, check_consistent, fill
from topology.builders import fat_tree

DEATHS = ("source dies", "other dies")
AGENT_FAULTS = ("unreachable", "reply lost", "kill", *DEATHS)
SWITCH_FAULTS = ("barrier timeout", "barrier timeout, not applied", "kill", *DEATHS)


def _fallible(step: Step) -> bool:
    return isinstance(step, (CallAgent, SendFlows, ReadFlows))


def _split(world: World) -> tuple[Callable[[], object], str]:
    source = world.tree.leaves_in(State.BUSY)[0]
    return (lambda: world.post(SplitNow("outcome", source))), source


def _failover(world: World) -> tuple[Callable[[], object], str]:
    victim = world.tree.leaves_in(State.BUSY)[1]
    return (lambda: world.cut(victim)), victim


def _split_far(world: World) -> tuple[Callable[[], object], str]:
    """A split whose target is under another edge switch (the source's
    neighbour has failed), so its flows change on several switches at once."""
    tree = world.tree
    source = tree.leaves_in(State.BUSY)[0]
    neighbours = [leaf for leaf in tree.children(tree.parent(source) or "") if leaf != source]
    for leaf in neighbours:
        world.agents[leaf].dead = True
        world.cut(leaf)
    world.run()
    return (lambda: world.post(SplitNow("outcome", source))), source


def _failover_far(world: World) -> tuple[Callable[[], object], str]:
    """A fail-over whose successor is under another edge switch."""
    tree = world.tree
    victim = tree.leaves_in(State.BUSY)[1]
    for leaf in [leaf for leaf in tree.children(tree.parent(victim) or "") if leaf != victim]:
        world.agents[leaf].dead = True
        world.cut(leaf)
    world.run()
    return (lambda: world.cut(victim)), victim


OPERATIONS = {"split": _split, "split-far": _split_far, "split-merging": _split, "failover": _failover,
              "failover-far": _failover_far}
SETTINGS: dict[str, dict[str, object]] = {"split-merging": {"bootstrap": Bootstrap("preallocate", 8)}}
"""A split with every server busy from the start: it merges a cold server away first."""


def _prepared(operation: str, replicas: int) -> tuple[World, Callable[[], object], str, dict[int, bytes]]:
    world = World(fat_tree(4, servers=8), migration_lease_s=10.0, replicas=replicas,
                  **SETTINGS.get(operation, {}))
    world.boot()
    start, server = OPERATIONS[operation](world)
    acked = fill(world, server, 120, seed=1)
    return world, start, server, acked


def _clean_steps(operation: str, replicas: int) -> list[str]:
    """The kinds of the fallible steps the operation takes when nothing fails."""
    world, start, _, _ = _prepared(operation, replicas)
    seen: list[Step] = []
    world.inject = lambda step: seen.append(step) if _fallible(step) else None
    start()
    world.run()
    return ["agent" if isinstance(s, CallAgent) else "switch" for s in seen]


def _cases() -> list[tuple[str, int, int, str]]:
    cases = []
    for operation in OPERATIONS:
        for replicas in (1, 2):
            for k, kind in enumerate(_clean_steps(operation, replicas)):
                for fault in AGENT_FAULTS if kind == "agent" else SWITCH_FAULTS:
                    cases.append((operation, replicas, k, fault))
    return cases


CASES = _cases()


@pytest.mark.parametrize("replicas", [1, 2])
def test_every_operation_has_steps_to_break(replicas: int) -> None:
    kinds = {op: _clean_steps(op, replicas) for op in OPERATIONS}
    assert kinds["split"].count("agent") >= 3 and "switch" in kinds["split"]
    assert kinds["split-far"].count("switch") >= 3 and kinds["failover-far"].count("switch") >= 3
    assert kinds["failover"].count("agent") >= 2 and "switch" in kinds["failover"]
    assert kinds["split-merging"].count("agent") > kinds["split"].count("agent")


@pytest.mark.parametrize(("operation", "replicas", "k", "fault"), CASES,
                         ids=[f"{o}-r{r}-step{k}-{f.replace(' ', '_').replace(',', '')}"
                              for o, r, k, f in CASES])
def test_operation_ends_consistent_whatever_fails(operation: str, replicas: int, k: int, fault: str) -> None:
    world, start, server, acked = _prepared(operation, replicas)
    rng = random.Random(k)
    counter = itertools.count()
    tree = world.tree
    blocks = tree.blocks(server)

    died: list[str] = []
    unsure: set[int] = set()
    """Writes answered TRYAGAIN: the primary may have stored one before a synced
    backup failed it (as a timeout may), so it may or may not read back."""

    def inject(step: Step) -> str | None:
        if not _fallible(step):
            return None
        block = rng.choice(blocks)                      # a client writes meanwhile
        mdid = rng.randrange(block.first, block.last + 1)
        answer = world.write(mdid, b"during")
        if answer == "serve":
            acked[mdid] = b"during"
        elif answer == "tryagain":
            unsure.add(mdid)
        if next(counter) != k:
            return None
        if fault in DEATHS:
            _die(world, server, fault, died, k)
            return None
        return fault

    world.inject = inject
    start()
    try:
        world.run()
    except ControllerKilled:
        world.inject = lambda step: None
        world.new_core()
        world.boot()
    world.inject = lambda step: None
    lost = [b for record in world.core.lost for b in map(Block.parse, record["blocks"])]
    check_consistent(world, acked, lost, maybe={mdid: b"during" for mdid in unsure})
    # Data may only be lost with a server that really died, and with a backup not even then.
    assert {record["server"] for record in world.core.lost} <= set(died), world.core.lost
    assert replicas == 1 or not world.core.lost, world.core.lost
    if operation == "failover" and server not in died:
        assert world.core.registry[server].failed
        assert not world.agents[server].owned()


def _die(world: World, server: str, fault: str, died: list[str], k: int) -> None:
    """The operation's own server, or the other one it holds (if it has one
    yet), dies outright."""
    victim = server
    if fault == "other dies":
        others = [name for op in world.core.operations.running.values() if server in op.involves
                  for name in op.involves if name != server]
        if not others:
            return
        victim = sorted(others)[k % len(others)]   # the step picks which: the same on every run
    world.agents[victim].dead = True
    died.append(victim)
    if not world._cut_off(victim):
        world.cut(victim)
