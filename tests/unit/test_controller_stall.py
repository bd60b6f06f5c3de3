"""A controller that was itself stopped (SIGSTOP, a paused VM) must not take
its own absence for the servers' silence: on waking, the heartbeats of the
pause are still unread, and a tick that failed every server over would turn
one pause into a fail-over of the whole cluster (found by the nemesis)."""

from __future__ import annotations

from controller.steps import Tick
from tests.unit.controller_world import World
from topology.builders import fat_tree


def _booted() -> World:
    world = World(fat_tree(4, servers=8), replicas=2)
    world.boot()
    world.heartbeats()
    return world


def _failed(world: World) -> set[str]:
    return {s.name for s in world.core.registry.servers.values() if s.failed}


def test_a_stalled_controller_grants_every_server_two_heartbeat_timeouts() -> None:
    world = _booted()
    timeout = world.settings.heartbeat_timeout_s
    world.advance(3 * timeout)              # stopped: nothing heard, nothing ticked
    world.post(Tick(stalled_s=3 * timeout))
    world.run()
    assert _failed(world) == set()
    assert [e["seconds"] for e in world.core.events if e["event"] == "controller-stalled"] == [3 * timeout]
    world.advance(timeout / 2)              # still within the grace: nobody beat yet
    world.tick()
    assert _failed(world) == set()
    world.advance(timeout)                  # an agent whose beat was lost retries after its timeout
    world.tick()
    assert _failed(world) == set()
    world.heartbeats()                      # the beats arrive
    world.advance(timeout / 2 + 0.1)
    world.tick()
    assert _failed(world) == set()


def test_a_server_that_stays_silent_after_the_grace_is_failed_over() -> None:
    world = _booted()
    timeout = world.settings.heartbeat_timeout_s
    victim = sorted(world.agents)[0]
    world.agents[victim].dead = True        # it died while the controller was stopped
    world.advance(3 * timeout)
    world.post(Tick(stalled_s=3 * timeout))
    world.run()
    world.heartbeats()
    assert _failed(world) == set()
    world.beat_for(timeout)                 # the others beat on
    world.tick()
    assert _failed(world) == set()          # still within the grace
    world.beat_for(timeout + 0.1)           # the grace is over
    world.tick()
    assert _failed(world) == {victim}


def test_without_a_stall_a_silent_server_is_failed_over() -> None:
    """The grace is only for a stall the shim measured: a server silent while
    the others beat is failed over at the next tick past the timeout."""
    world = _booted()
    victim = sorted(world.agents)[0]
    world.agents[victim].dead = True
    world.beat_for(world.settings.heartbeat_timeout_s + 0.1)
    world.tick()
    assert _failed(world) == {victim}


def test_a_controller_that_hears_no_server_at_all_fails_none_over() -> None:
    """A controller cut from every agent (its management link down) saw each
    silent at once and failed them all over, whose copies were then all
    "lost" (found by the nemesis). Hearing nobody, it is the one cut off."""
    world = _booted()
    timeout = world.settings.heartbeat_timeout_s
    for _ in range(3):                      # a long cut: tick after tick, nobody is heard
        world.advance(timeout + 0.5)
        world.tick()
    assert _failed(world) == set()
    assert any(e["event"] == "controller-deaf" for e in world.core.events)
    world.heartbeats()                      # the cut heals
    world.advance(timeout / 2)
    world.heartbeats()
    world.tick()
    assert _failed(world) == set()


def test_after_a_cut_the_grace_counts_from_the_first_word_heard() -> None:
    """A cut that outlasts the grace given when the controller found itself
    deaf: the first agent heard again starts the grace over, so the others,
    whose requests the cut caught, are not failed over while they retry (the
    nemesis saw 6 of 8 failed over after a 2.5 s cut, one agent heard first)."""
    world = _booted()
    timeout = world.settings.heartbeat_timeout_s
    first, *others = sorted(world.agents)
    for agent in world.agents.values():
        agent.reachable = False              # the cut
    world.advance(timeout + 0.1)
    world.tick()                             # deaf: the grace runs for two timeouts
    world.advance(1.5 * timeout)
    world.agents[first].reachable = True     # the cut ends; one agent gets through at once
    world.heartbeats()
    world.advance(timeout)                   # past the first grace, the others still retrying
    world.heartbeats()
    world.tick()
    assert _failed(world) == set()
    for name in others:
        world.agents[name].reachable = True
    world.heartbeats()
    world.advance(timeout)
    world.heartbeats()
    world.tick()
    assert _failed(world) == set()


def test_a_cut_that_catches_the_heartbeats_out_of_phase_is_still_the_controllers() -> None:
    """The agents beat out of phase, so at the first tick of a cut some are
    past the timeout and the others not yet: hearing nobody for half a
    timeout is deafness all the same (the nemesis saw 3 of 8 failed over)."""
    world = _booted()
    timeout = world.settings.heartbeat_timeout_s
    late = sorted(world.agents)[:3]
    world.advance(0.2)
    for name, agent in world.agents.items():
        agent.reachable = name not in late   # these beat last 0.2 s before the others
    world.heartbeats()
    for agent in world.agents.values():
        agent.reachable = False              # the cut
    world.advance(timeout - 0.1)             # the late ones are past the timeout, the others are not
    world.tick()
    assert _failed(world) == set()
    assert any(e["event"] == "controller-deaf" for e in world.core.events)
    for agent in world.agents.values():
        agent.reachable = True
    world.heartbeats()
    world.advance(timeout)
    world.heartbeats()
    world.tick()
    assert _failed(world) == set()


def test_a_cut_that_ends_between_two_ticks_fails_nobody_over() -> None:
    """No tick fell in the cut after the timeout, so none found the
    controller deaf; the first agent heard again is the sign: the silence
    before it was the controller's, and the others, whose requests the cut
    caught, get the grace (the nemesis: 7 of 8 failed over at the tick after
    a 1.5 s cut, one agent heard 27 ms before it, and the cascade of
    cancelled take-overs dropped a block's only copy)."""
    world = _booted()
    timeout = world.settings.heartbeat_timeout_s
    first, *others = sorted(world.agents)
    for agent in world.agents.values():
        agent.reachable = False              # the cut, between two ticks
    world.advance(1.5 * timeout)
    world.agents[first].reachable = True     # it ends; one agent gets through at once
    world.heartbeats()
    world.tick()
    assert _failed(world) == set()
    heard = [e["silent_s"] for e in world.core.events if e["event"] == "controller-heard-again"]
    assert heard == [1.5 * timeout]
    world.beat_for(1.5 * timeout)            # the others still retrying, within the grace
    world.tick()
    assert _failed(world) == set()
    for name in others[1:]:
        world.agents[name].reachable = True
    world.beat_for(timeout)                  # one never comes back: failed over once the grace is over
    world.tick()
    assert _failed(world) == {others[0]}


def test_when_one_server_still_beats_the_silent_ones_are_failed_over() -> None:
    """Deafness is hearing nobody; a controller that hears one server takes
    the others' silence for theirs (a cut from all but one is not told apart)."""
    world = _booted()
    speaker = sorted(world.agents)[0]
    for name, agent in world.agents.items():
        agent.dead = name != speaker
    world.beat_for(world.settings.heartbeat_timeout_s + 0.1)
    world.tick()
    assert _failed(world) == set(world.agents) - {speaker}


def test_a_cut_ended_by_a_liveness_datagram_fails_nobody_over() -> None:
    """Agents that beat by datagram send HTTP rarely: the datagram the
    liveness thread verifies is the word that ends the controller's silence
    (`Registry.hearing`), read at the next tick."""
    world = _booted()
    timeout = world.settings.heartbeat_timeout_s
    first = sorted(world.agents)[0]
    world.advance(1.5 * timeout)             # the cut: nothing heard, no tick
    registry = world.core.registry
    registry.heard[first] = (world.now, 0)   # what the liveness thread writes for a verified beat
    registry.hearing.word(world.now)
    world.tick()
    assert _failed(world) == set()
    assert [e["event"] for e in world.core.events].count("controller-heard-again") == 1
