"""Draining a server: the plan (`btree.drain`), the saga and the core's rules
(`controller.drain`, `controller.core`), the REST routes and `metaflowctl
drain|undrain` (`controller.rest`, `controller.drainctl`).

The faults at every step of a drain are in test_controller_faults.py; here:
the planning is pure and checked on random trees; a drain on fake switches
and agents ends with the server holding nothing and every write readable;
the refusals end in defined states with their reasons; a drained server is
never chosen again until undrained, and stopping it is no fail-over.
"""

from __future__ import annotations

import random
import re
import threading
from collections.abc import Iterator
from concurrent.futures import Future
from pathlib import Path
from typing import Any

import pytest
from hypothesis import event, given, settings
from hypothesis import strategies as st

from btree.drain import plan_drain
from btree.flows import FlowPlanner
from btree.merge import DEFAULT_FILL
from btree.tree import LogicalBTree, State
from client_lib.api.auth import Verifier, write_secret
from client_lib.api.rest import DrainsView
from client_lib.errors import Conflict, NotFound
from controller import views
from controller.ctl import main
from controller.rest import RestApi, RestServer
from controller.steps import DrainNow, FailNow, SplitNow
from tests.unit.controller_world import SECRET, World, check_consistent, fill
from tests.unit.test_controller_faults import _check_drained
from tests.unit.test_tree_split import check_invariants, hand_tree, topo_fabric, topo_tree
from topology.builders import fat_tree, two_tier

# -- the plan ------------------------------------------------------------------------


def test_blocks_go_to_the_nearest_server_with_room_an_idle_one_first() -> None:
    tree = hand_tree()   # root: e1 (a b c), e2 (d e)
    tree.bootstrap_preallocate(4)   # a, c, d, e busy; b idle
    (block,) = tree.blocks("a")
    held = {"a": 50, "b": 0, "c": 10, "d": 0, "e": 0}
    plan = plan_drain(tree, "a", {block: 50}, held.__getitem__, capacity=100)
    assert plan.ok and [(m.block, m.source, m.target) for m in plan.moves] == [(block, "a", "b")]
    # b is held by another operation: c, beside a, has room (10 + 50 <= 80) before the other rack
    plan = plan_drain(tree, "a", {block: 50}, held.__getitem__, capacity=100, avoid={"b"})
    assert [m.target for m in plan.moves] == ["c"]
    # no room beside a: the other rack
    plan = plan_drain(tree, "a", {block: 75}, held.__getitem__, capacity=100, avoid={"b"})
    assert [m.target for m in plan.moves] == ["d"]


def test_a_plan_without_room_for_a_block_is_refused_whole() -> None:
    tree = hand_tree()
    tree.bootstrap_preallocate(5)
    tree.transfer(tree.blocks("b"), "a")   # a holds several blocks
    big, *small = tree.blocks("a")
    held = {"a": 95, "b": 0, "c": 60, "d": 60, "e": 60}
    keys = {big: 21, **{b: 1 for b in small}}   # the small ones fit beside a, the big one nowhere
    plan = plan_drain(tree, "a", keys, held.__getitem__, capacity=100, avoid={"b"})
    assert not plan.ok and plan.moves == ()
    assert str(big) in plan.reason and "room" in plan.reason
    refused = plan_drain(tree, "a", keys, held.__getitem__, capacity=100,
                         fits=lambda moves: "over the table budget")
    assert not refused.ok and "over the table budget" in refused.reason


@settings(max_examples=150, deadline=None)
@given(name=st.sampled_from(["fat4", "three_small", "three_up2"]), seed=st.integers(0, 2**32 - 1),
       capacity=st.integers(20, 400), budget_slack=st.one_of(st.none(), st.integers(0, 4)),
       held_share=st.floats(0.0, 0.8))
def test_a_plan_gives_every_block_a_live_target_with_room_or_is_refused_whole(
        name: str, seed: int, capacity: int, budget_slack: int | None, held_share: float) -> None:
    """Random key counts, failed and held leaves, with and without a table
    budget. An accepted plan moves every block of the source, once, to a
    live leaf outside `avoid` that stays within its room and the budget; the
    tree is a partition afterwards with the source idle. A refused one moves
    nothing and says why; it is never refused while one leaf could take
    every block at once (without a budget)."""
    rng = random.Random(seed)
    tree = topo_tree(name)
    tree.bootstrap_preallocate(max(1, len(tree.leaves()) // 2))
    planner = FlowPlanner(tree, topo_fabric(name), minimize=True)
    largest = max(len(planner.table(dpid)) for dpid in planner.fabric.switches)
    budget = None if budget_slack is None else largest + budget_slack
    source = rng.choice(tree.leaves_in(State.BUSY))
    for _ in range(rng.randrange(4)):   # a few splits give the source several blocks
        block = rng.choice(tree.blocks(source))
        if block.plen < tree.space.width:
            planner.update(tree.transfer([block.halves()[1]], source))
    for leaf in rng.sample(tree.leaves_in(State.IDLE), k=min(2, len(tree.leaves_in(State.IDLE)))):
        if rng.random() < 0.5:
            tree.fail(leaf)
    avoid = {leaf for leaf in tree.leaves() if leaf != source and rng.random() < held_share}
    held = {leaf: rng.randrange(capacity) for leaf in tree.leaves()}
    block_keys = {b: rng.randrange(capacity) for b in tree.blocks(source)}
    fits = planner.keeps(budget)
    plan = plan_drain(tree, source, block_keys, held.__getitem__, capacity, avoid=avoid, fits=fits)
    room = int(DEFAULT_FILL * capacity)
    event("planned" if plan.ok else "refused")
    if not plan.ok:
        assert plan.moves == () and plan.reason
        alone = sum(block_keys.values())
        if budget is None:
            assert not any(held[leaf] + alone <= room for leaf in _allowed(tree, source, avoid))
        return
    assert sorted(m.block.first for m in plan.moves) == sorted(b.first for b in tree.blocks(source))
    given_keys: dict[str, int] = {}
    for move in plan.moves:
        assert move.source == source and move.target in _allowed(tree, source, avoid)
        given_keys[move.target] = given_keys.get(move.target, 0) + block_keys[move.block]
    assert all(held[t] + k <= room for t, k in given_keys.items())
    assert fits(list(plan.moves)) is None
    for target, blocks in plan.by_target().items():
        planner.update(tree.transfer(blocks, target))
    assert tree.state(source) is State.IDLE
    check_invariants(tree)


def _allowed(tree: LogicalBTree, source: str, avoid: set[str]) -> list[str]:
    return [leaf for leaf in tree.leaves()
            if leaf != source and leaf not in avoid and tree.state(leaf) is not State.FAILED]


# -- the saga on fake switches and agents ---------------------------------------------------


def _world(replicas: int, **settings: Any) -> tuple[World, str, dict[int, bytes]]:
    """A booted fat tree with a busy server that (r=2) also keeps a backup of
    another's block, holding 120 acknowledged writes."""
    world = World(fat_tree(4, servers=8), migration_lease_s=10.0, replicas=replicas,
                  **{"capacity": 1000, **settings})
    world.boot()
    core_replicas = world.core.replicas
    assert core_replicas is not None
    busy = world.tree.leaves_in(State.BUSY)
    backing = [leaf for leaf in busy if any(s.primary != leaf for s in core_replicas.of(leaf).values())]
    name = (backing or busy)[0]
    return world, name, fill(world, name, 120, seed=3)


def _drains(world: World) -> DrainsView:
    return views.drains_view(world.core)


@pytest.mark.parametrize("replicas", [1, 2])
def test_a_drained_server_holds_nothing_and_every_write_reads_back(replicas: int) -> None:
    world, name, acked = _world(replicas)
    holds = len(world.tree.blocks(name)), len(world.core.world.replicas_or_raise().of(name))
    started = world.ask(DrainNow, name=name)
    assert started.ok and started.operation == "drain-started"
    assert started.detail["blocks"] + started.detail["backups"] == holds[1] >= holds[0] >= 1
    info = _drains(world).drains[name]
    assert info.state == "drained" and (info.blocks_left, info.backups_left) == (0, 0)
    assert info.keys_moved == 120 and info.moves >= 1 and info.reason == ""
    assert info.backups_moved == (holds[1] - holds[0])
    _check_drained(world, name)
    check_consistent(world, acked)
    kinds = [e["event"] for e in world.core.events]
    assert {"drain-started", "drain-progress", "drained"} <= set(kinds)
    assert "takeover" not in kinds and "DATA-LOST" not in kinds


def test_a_backup_leaving_a_drained_server_may_stay_in_its_rack_not_beside_its_primary() -> None:
    """Two racks: the copy a drained server keeps goes to another server of
    its own rack, the only one apart from the primary's (placed as if the
    leaving server were staying, it went beside its primary, and at k=32 with
    real agents to a third rack that could not take it)."""
    world = World(two_tier(core=1, edges=2, servers_per_edge=4, clients_per_edge=1), replicas=2,
                  capacity=1000)
    world.boot()
    replicas = world.core.world.replicas_or_raise()
    rack = replicas.domain
    name, block = next((m, b) for b, s in replicas.sets.items()
                       for m in s.backups if rack(m) != rack(s.primary))
    acked = fill(world, replicas.sets[block].primary, 40, seed=5)
    assert world.ask(DrainNow, name=name).ok
    assert _drains(world).drains[name].state == "drained"
    moved = world.core.world.replicas_or_raise().sets[block]
    assert name not in moved.members and rack(moved.backups[0]) == rack(name) != rack(moved.primary)
    assert not [e for e in world.core.events if e["event"] == "replicas-share-a-rack"]
    check_consistent(world, acked)


def test_a_drain_without_room_stops_before_anything_moves() -> None:
    world, name, acked = _world(2, capacity=100)   # 120 keys fit nowhere within 80
    before = {leaf: world.tree.blocks(leaf) for leaf in world.tree.leaves()}
    sets = dict(world.core.world.replicas_or_raise().sets)
    assert world.ask(DrainNow, name=name).ok   # started: the plan says no room
    info = _drains(world).drains[name]
    assert info.state == "stopped" and info.reason.startswith("no room") and info.moves == 0
    assert {leaf: world.tree.blocks(leaf) for leaf in world.tree.leaves()} == before
    assert world.core.world.replicas_or_raise().sets == sets
    assert name not in world.core.world.drained()   # back in service
    stopped = [e for e in world.core.events if e["event"] == "drain-stopped"]
    assert stopped and stopped[-1]["reason"] == info.reason
    check_consistent(world, acked)


def test_a_copy_that_fails_once_is_tried_again_and_the_drain_finishes() -> None:
    world, name, acked = _world(2)
    copies = len(world.core.world.replicas_or_raise().of(name)) - len(world.tree.blocks(name))
    assert copies >= 1
    for agent in world.agents.values():
        agent.failing_syncs = 1
    assert world.ask(DrainNow, name=name).ok
    info = _drains(world).drains[name]
    assert info.state == "drained" and info.backups_moved == copies, info
    retries = [e for e in world.core.events if e["event"] == "drain-retry"]
    assert retries and all("did not answer" in e["reason"] and e["attempt"] == 1 for e in retries)
    _check_drained(world, name)
    check_consistent(world, acked)


def test_a_copy_that_keeps_failing_stops_the_drain_with_the_primarys_reason() -> None:
    world, name, acked = _world(2)
    for agent in world.agents.values():
        agent.failing_syncs = 100
    assert world.ask(DrainNow, name=name).ok
    info = _drains(world).drains[name]
    assert info.state == "stopped" and info.backups_left >= 1, info
    assert re.fullmatch(r"copying \S+ to (\S+): failed: \1 did not answer", info.reason), info.reason
    retries = [e["attempt"] for e in world.core.events if e["event"] == "drain-retry"]
    assert retries == [1, 2]
    check_consistent(world, acked)


def test_refusals_end_in_defined_states_with_their_reasons() -> None:
    world, name, _ = _world(2)
    with_reason = world.ask(DrainNow, name="nobody")
    assert isinstance(with_reason, NotFound) and "nobody" in str(with_reason)
    assert isinstance(world.ask(DrainNow, undrain=True, name="nobody"), NotFound)
    refused = world.ask(DrainNow, undrain=True, name=name)
    assert isinstance(refused, Conflict) and "not drained" in str(refused)

    # a second drain, and an undrain, while the first runs
    world.post(DrainNow("first", name))
    world.run(limit=1)   # the drain starts; its first step's answer waits in the queue
    assert world.core.world.drains[name].state == "draining"
    world.post(DrainNow("second", name))
    world.post(DrainNow("early", name, undrain=True))
    world.run()
    assert world.answers["first"].ok
    second, early = world.answers["second"], world.answers["early"]
    assert isinstance(second, Conflict) and "already draining" in str(second)
    assert isinstance(early, Conflict) and "still draining" in str(early)
    assert world.core.world.drains[name].state == "drained"
    again = world.ask(DrainNow, name=name)
    assert isinstance(again, Conflict) and "already drained" in str(again)

    # a failed server
    victim = next(leaf for leaf in world.tree.leaves_in(State.BUSY) if leaf != name)
    world.ask(FailNow, name=victim, reason="test")
    dead = world.ask(DrainNow, name=victim)
    assert isinstance(dead, Conflict) and "has failed" in str(dead)
    assert victim not in world.core.world.drains

    undrained = world.ask(DrainNow, undrain=True, name=name)
    assert undrained.ok and name not in world.core.world.drains


def test_a_drained_server_is_never_chosen_until_undrained() -> None:
    """Splits, their new backups and a fail-over's successor pass a drained
    server by, though it is idle and nearest; undrained, it takes blocks again."""
    world, name, _ = _world(2, capacity=1000)
    world.ask(DrainNow, name=name)
    assert world.core.world.drains[name].state == "drained"
    replicas = world.core.world.replicas_or_raise()
    for source in world.tree.leaves_in(State.BUSY):
        world.ask(SplitNow, name=source)
    victim = world.tree.leaves_in(State.BUSY)[0]
    world.ask(FailNow, name=victim, reason="test")
    world.tick()
    assert world.tree.state(name) is State.IDLE and not replicas.of(name)
    assert any(e["event"] == "split" for e in world.core.events)
    world.ask(DrainNow, undrain=True, name=name)
    neighbour = next(leaf for leaf in world.tree.children(world.tree.parent(name) or "")
                     if leaf != name and world.tree.state(leaf) is State.BUSY)
    fill(world, neighbour, 50, seed=5)
    world.heartbeats()
    world.ask(SplitNow, name=neighbour)
    assert replicas.of(name), "an undrained server takes a block or a copy again"


def test_stopping_a_drained_server_is_no_fail_over_and_it_rejoins_drained() -> None:
    world, name, acked = _world(2)
    world.ask(DrainNow, name=name)
    world.agents[name].dead = True
    world.beat_for(world.settings.heartbeat_timeout_s + 1)
    world.tick()
    assert world.core.registry[name].failed
    events = [e for e in world.core.events if e.get("server") == name]
    assert events[-1]["event"] == "drained-server-stopped"
    assert not any(e["event"] in ("server-failed", "takeover") for e in events)
    world.restart(name)   # back up: it rejoins idle and still drained
    world.heartbeats()
    assert not world.core.registry[name].failed and world.tree.state(name) is State.IDLE
    assert world.core.world.drains[name].state == "drained"
    check_consistent(world, acked)


def test_a_controller_restart_forgets_the_drain_and_keeps_every_write() -> None:
    world, name, acked = _world(2)
    world.post(DrainNow("drain", name))
    world.run(limit=6)   # part way
    assert world.core.world.drains[name].state == "draining"
    world.new_core()
    world.boot()
    assert name not in world.core.world.drains
    check_consistent(world, acked)


# -- REST and metaflowctl ----------------------------------------------------------------


@pytest.fixture
def served(request: pytest.FixtureRequest) -> Iterator[tuple[World, str, str]]:
    """The controller's REST API over a fake world (its events run to the end
    before the answer): the world, the server to drain, the URL. Parametrized
    indirectly with the servers' capacity."""
    world, name, _ = _world(2, capacity=getattr(request, "param", 1000))
    lock = threading.Lock()

    def query(view: Any) -> Future[object]:
        future: Future[object] = Future()
        with lock:
            future.set_result(view(world.core))
        return future

    def post(event: Any) -> None:
        with lock:
            world.post(event)
            world.run()
            event.reply.set_result(world.answers.pop(event.reply))

    server = RestServer(RestApi(query, post, Verifier(SECRET), open_reads=False), "127.0.0.1", 0)
    server.start()
    yield world, name, f"http://127.0.0.1:{server.httpd.server_port}"
    server.close()


@pytest.fixture
def secret(tmp_path: Path) -> str:
    return str(write_secret(tmp_path / "secret", SECRET.decode()))


def test_metaflowctl_drains_and_undrains_over_rest(served: tuple[World, str, str], secret: str,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    world, name, url = served
    signed = ["--controller", url, "--secret-file", secret]
    assert main(["drain", name, *signed, "--poll", "0.01"]) == 0
    out, err = capsys.readouterr()
    assert err == "" and f"draining {name}:" in out and f"{name} is drained" in out
    assert "0 blocks and 0 backup copies left" in out
    assert main(["drain", name, *signed]) == 2
    assert "409" in capsys.readouterr().err
    assert main(["drain", "nobody", *signed]) == 2
    assert "404" in capsys.readouterr().err
    assert main(["undrain", name, *signed]) == 0
    assert "idle" in capsys.readouterr().out and name not in world.core.world.drains
    assert main(["undrain", name, *signed]) == 2
    assert "not drained" in capsys.readouterr().err


@pytest.mark.parametrize("served", [100], indirect=True)   # 120 keys have no room within 80
def test_metaflowctl_drain_says_why_a_drain_stopped(served: tuple[World, str, str], secret: str,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    _, name, url = served
    assert main(["drain", name, "--controller", url, "--secret-file", secret, "--poll", "0.01"]) == 1
    assert "stopped: no room" in capsys.readouterr().err
