"""Splits, fail-overs, rebalances and drains end consistent whatever fails between any two of their steps.

A clean run of each operation lists the steps it takes (agent calls, flow
pushes, flow reads; of a rebalance, the first of each of its steps in its
first two moves: `SAMPLED`). Then, for every step and every fault that can
hit it, a fresh world runs the operation again with that fault injected there:

- ``unreachable``: the agent does not get the call;
- ``reply lost``: the agent carries the call out, the controller hears a timeout;
- ``barrier timeout``: the switch applies the messages, the barrier reply never comes;
- ``barrier timeout, not applied``: the switch drops them too;
- ``kill``: the controller dies right after the step is carried out (its
  outcome and everything queued is lost) and a new one starts from the
  switches and the agents;
- ``source dies`` / ``other dies``: right after the step, the operation's
  own server (a split's, a rebalance's or a drain's source, a fail-over's
  failed server) or the other server it involves (a split's target, a
  merge's servers, a fail-over's successor, a rebalance's targets and their
  new backups, a drain's targets and the new members of the sets it leaves)
  dies outright and its edge port goes down: the operation is
  overtaken.

Every operation runs without replication (r=1) and with a backup per block
(r=2). Clients keep writing through the switches at every step. Afterwards
(once the migrations' leases have run out): every ID is routed by the
switches to a server that serves it, no block is frozen, the replica sets
agree with the agents and their synced members hold the primary's records,
and every acknowledged write reads back. With r=1 the controller may declare
blocks lost, only with a server that really died; with r=2 one death loses
nothing. A drain that ran undisturbed to its end leaves its server holding
nothing, in no set.
"""

from __future__ import annotations

import itertools
import random
from collections.abc import Callable

import pytest

from btree.bootstrap import Bootstrap
from btree.tree import State
from client_lib.cidr import Block
from controller.steps import CallAgent, DrainNow, ReadFlows, SendFlows, SplitNow, Step, Tick
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


def _rebalance(world: World) -> tuple[Callable[[], object], str]:
    """A rebalance started by load: 16 hot IDs in the middle of the first busy
    server's block (as `test_load.hot_range_world` has them; the keys there are
    the ones `fill` writes), polled until the next harmful poll starts it. Its
    steps are the rebalance's: the poll's own reads are carried out unbroken."""
    tree = world.tree
    busy = tree.leaves_in(State.BUSY)
    source = busy[0]
    block = tree.blocks(source)[0]
    hot = [block.first + block.size // 2 + i * 4096 for i in range(16)]

    def second_of_load() -> None:   # as test_load.poll_with gives it, up to the poll
        for agent in world.agents.values():
            agent.requests.clear()
        for mdid in hot:
            world.deliver(mdid, packets=500)
        for name in busy:
            for b in tree.blocks(name):
                world.deliver(b.first, packets=100)
        world.advance(1.0)
        world.heartbeats()
        world.post(Tick())

    for _ in range(world.core.imbalance.hold):   # the baseline, and every harmful poll but the last
        second_of_load()
        world.run()

    def start() -> None:
        second_of_load()
        inject, world.inject = world.inject, lambda step: None
        world.run(limit=1)   # the Tick: its reads go out; their answers start the rebalance
        world.inject = inject

    return start, source


def _drain(world: World) -> tuple[Callable[[], object], str]:
    """A drain of a busy server that also keeps a backup of another's block
    (with r=2): both its primaries and its copies move."""
    replicas = world.core.replicas
    assert replicas is not None
    busy = world.tree.leaves_in(State.BUSY)
    backing = [leaf for leaf in busy if any(s.primary != leaf for s in replicas.of(leaf).values())]
    source = (backing or busy)[0]
    return (lambda: world.post(DrainNow("outcome", source))), source


OPERATIONS = {"split": _split, "split-far": _split_far, "split-merging": _split, "failover": _failover,
              "failover-far": _failover_far, "rebalance": _rebalance, "drain": _drain}
SETTINGS: dict[str, dict[str, object]] = {
    "split-merging": {"bootstrap": Bootstrap("preallocate", 8)},
    "rebalance": {"load_capacity": 10_000.0, "auto_split": False},
    "drain": {"capacity": 1000},
}
"""A split-merging with every server busy from the start: it merges a cold
server away first. A rebalance with a server capacity of 10,000 packets/s (as
in test_load), and no split by keys to pre-empt it. A drain with room for
its source's keys elsewhere."""
SAMPLED = {"rebalance": 2}
"""Operations broken only at the first fallible step of each of their steps
(`Operation.step`), in their first so many moves. A rebalance's plan asks
the source for one request count after another, dozens of reads alike, and
how many depends on the clients' writes meanwhile (they are requests too),
so a step is found by its name, not its position; each of its up to four
moves is the same migration as a split's, whose every step is broken there."""


def _prepared(operation: str, replicas: int) -> tuple[World, Callable[[], object], str, dict[int, bytes]]:
    world = World(fat_tree(4, servers=8), migration_lease_s=10.0, replicas=replicas,
                  **SETTINGS.get(operation, {}))
    world.boot()
    start, server = OPERATIONS[operation](world)
    acked = fill(world, server, 120, seed=1)
    return world, start, server, acked


def _marker(world: World, operation: str) -> Callable[[Step], tuple[str, str] | None]:
    """Picks the steps the faults hit, in the order they come: every fallible
    step, or for an operation in `SAMPLED` the first fallible step of each of
    its steps (`Operation.step`) in its first moves. A pick is the step's
    kind ("agent" or "switch") and the operation's step ("" unless sampled);
    None: not a pick."""
    last = ""
    moves = 0

    def mark(step: Step) -> tuple[str, str] | None:
        nonlocal last, moves
        if not _fallible(step):
            return None
        kind = "agent" if isinstance(step, CallAgent) else "switch"
        if operation not in SAMPLED:
            return kind, ""
        running = world.core.operations.running.values()
        now = ", ".join(sorted(op.step for op in running if op.kind == operation))
        if not now or now == last:
            return None
        last = now
        moves += now == "plan"
        return (kind, now) if moves <= SAMPLED[operation] else None

    return mark


def _clean_steps(operation: str, replicas: int) -> list[tuple[str, str]]:
    """The steps the faults hit (`_marker`) when nothing fails."""
    world, start, _, _ = _prepared(operation, replicas)
    mark = _marker(world, operation)
    seen: list[tuple[str, str]] = []

    def note(step: Step) -> None:
        picked = mark(step)
        if picked is not None:
            seen.append(picked)

    world.inject = lambda step: note(step)
    start()
    world.run()
    return seen


def _cases() -> list[tuple[str, int, int, str]]:
    cases = []
    for operation in OPERATIONS:
        for replicas in (1, 2):
            for k, (kind, _) in enumerate(_clean_steps(operation, replicas)):
                for fault in AGENT_FAULTS if kind == "agent" else SWITCH_FAULTS:
                    cases.append((operation, replicas, k, fault))
    return cases


CASES = _cases()


@pytest.mark.parametrize("replicas", [1, 2])
def test_every_operation_has_steps_to_break(replicas: int) -> None:
    steps = {op: _clean_steps(op, replicas) for op in OPERATIONS}
    kinds = {op: [kind for kind, _ in steps[op]] for op in OPERATIONS}
    assert kinds["split"].count("agent") >= 3 and "switch" in kinds["split"]
    assert kinds["split-far"].count("switch") >= 3 and kinds["failover-far"].count("switch") >= 3
    assert kinds["failover"].count("agent") >= 2 and "switch" in kinds["failover"]
    assert kinds["split-merging"].count("agent") > kinds["split"].count("agent")
    assert kinds["drain"].count("agent") >= 4 and "switch" in kinds["drain"]
    # the faults hit every step of a rebalance's first two moves
    assert [step for _, step in steps["rebalance"]] == ["plan", "rebalance copy", "rebalance assign",
                                                        "rebalance flows", "rebalance commit",
                                                        "rebalance serve"] * 2


@pytest.mark.parametrize(("operation", "replicas", "k", "fault"), CASES,
                         ids=[f"{o}-r{r}-step{k}-{f.replace(' ', '_').replace(',', '')}"
                              for o, r, k, f in CASES])
def test_operation_ends_consistent_whatever_fails(operation: str, replicas: int, k: int, fault: str) -> None:
    world, start, server, acked = _prepared(operation, replicas)
    rng = random.Random(k)
    mark = _marker(world, operation)
    picks = itertools.count()
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
        if mark(step) is None or next(picks) != k:
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
    drain = world.core.world.drains.get(server)
    if operation == "drain" and drain is not None and drain.state == "drained":
        _check_drained(world, server)
    if operation == "drain" and drain is not None and drain.state == "stopped":
        assert drain.reason, drain


def _check_drained(world: World, server: str) -> None:
    """`server` holds nothing: no block, no role, no record, in no set."""
    replicas = world.core.replicas
    assert replicas is not None
    assert not world.tree.blocks(server) and not replicas.of(server)
    agent = world.agents[server]
    assert not agent.owned() and not agent.roles and not agent.records, (agent.roles, len(agent.records))


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
