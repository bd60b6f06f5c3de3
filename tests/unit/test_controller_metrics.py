"""The controller's Prometheus metrics against the fake world (tests/unit/controller_world.py).

The exporter (`controller.metrics`) is the core's recorder and reads its
state at scrape time (`controller.views.gauges`); here the scrape is the
text exposition format, parsed back with prometheus_client's own parser, so
what is checked is what Prometheus would store.
"""

from __future__ import annotations

import pytest
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from btree.tree import State
from client_lib.api import metrics as m
from client_lib.api.rest import Outcome
from controller import ofmsgs, views
from controller.core import MetaFlowCore
from controller.metrics import ControllerMetrics
from controller.steps import FailNow, SplitNow
from tests.unit.controller_world import World, fill
from topology.builders import fat_tree

Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def _monitored(replicas: int) -> tuple[World, ControllerMetrics]:
    """A booted world whose core reports to an exporter."""
    world = World(fat_tree(4, servers=8), replicas=replicas)
    exporter = ControllerMetrics(lambda: views.gauges(world.core))
    world.core = MetaFlowCore(world.settings, world.clock, recorder=exporter)
    world.boot()
    return world, exporter


def scrape(exporter: ControllerMetrics) -> Samples:
    """Every sample of one scrape, by name and labels."""
    text = generate_latest(exporter.registry).decode()
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def value(samples: Samples, name: str, **labels: str) -> float:
    return samples[(name, tuple(sorted(labels.items())))]


def test_a_scrape_shows_the_fabric_the_servers_and_the_blocks_as_the_core_holds_them() -> None:
    world, exporter = _monitored(replicas=2)
    samples = scrape(exporter)
    assert value(samples, m.SWITCHES_CONNECTED.name) == len(world.switches)
    assert value(samples, m.NETWORK_BUILT.name) == 1
    for dpid, switch in world.switches.items():   # what the switch really holds
        table = ofmsgs.installed(switch.stats()).table
        assert value(samples, m.SWITCH_ENTRIES.name, switch=str(dpid)) == len(table)
    assert value(samples, m.TABLE_BUDGET.name) == world.settings.table_budget
    tree = world.tree
    assert value(samples, m.SERVERS.name, state="busy") == len(tree.leaves_in(State.BUSY)) == 4
    assert value(samples, m.SERVERS.name, state="idle") == 4
    assert value(samples, m.SERVERS.name, state="failed") == 0
    assert value(samples, m.BLOCKS.name) == len(world.core.world.replicas_or_raise().sets) > 0
    assert value(samples, m.BLOCKS_UNBACKED.name) == 0
    assert value(samples, m.DATA_LOST.name) == 0
    assert value(samples, m.OPERATIONS.name, kind="build", result="ok") == 1
    for name in world.agents:
        assert value(samples, m.HEARTBEAT_AGE.name, server=name) >= 0
    exposed = {family.name for family in text_string_to_metric_families(generate_latest(exporter.registry)
                                                                         .decode())}
    declared = {f.name.removesuffix("_total") for f in m.CONTROLLER}
    assert exposed <= declared, f"exposed but not declared in client_lib.api.metrics: {exposed - declared}"


def test_a_split_and_a_fail_over_are_counted_with_their_durations() -> None:
    world, exporter = _monitored(replicas=2)
    name = world.tree.leaves_in(State.BUSY)[0]
    fill(world, name, 150)
    outcome = world.ask(SplitNow, name=name)
    assert isinstance(outcome, Outcome) and outcome.ok, outcome
    refused = world.ask(SplitNow, name="nobody")   # refused before any operation: not one
    assert not isinstance(refused, Outcome)
    victim = outcome.detail["target"]
    assert isinstance(victim, str)
    assert world.ask(FailNow, name=victim, reason="test").ok
    samples = scrape(exporter)
    assert value(samples, m.OPERATIONS.name, kind="split", result="ok") == 1
    assert value(samples, m.MOVES.name, kind="split", result="ok") == 1
    assert value(samples, m.MOVE_SECONDS.name + "_count", kind="split") == 1
    assert value(samples, m.OPERATION_SECONDS.name + "_count", kind="split") == 1
    assert value(samples, m.OPERATIONS.name, kind="failover", result="ok") == 1
    assert value(samples, m.SERVERS.name, state="failed") == 1
    assert value(samples, m.HEARTBEAT_AGE.name, server=victim) >= 0
    assert (m.OPERATIONS.name, (("kind", "split"), ("result", "failed"))) not in samples


def test_a_block_that_dies_with_its_only_copy_is_counted_as_data_lost() -> None:
    world, exporter = _monitored(replicas=1)
    victim = world.tree.leaves_in(State.BUSY)[0]
    fill(world, victim, 10)
    assert value(scrape(exporter), m.BLOCKS_UNBACKED.name) == value(scrape(exporter), m.BLOCKS.name)
    world.agents[victim].dead = True
    assert world.ask(FailNow, name=victim, reason="test").ok
    samples = scrape(exporter)
    assert value(samples, m.DATA_LOST.name) == len(world.core.lost) == 1


@pytest.mark.parametrize("switch_error", [0, 1, 3])
def test_the_shims_counters_count_per_switch(switch_error: int) -> None:
    exporter = ControllerMetrics(lambda: views.gauges(World(fat_tree(4, servers=8)).core))
    exporter.sent(7, 12)
    for _ in range(switch_error):
        exporter.refused(7)
    exporter.barrier(7, 0.002)
    samples = scrape(exporter)
    assert value(samples, m.FLOW_MODS.name, switch="7") == 12
    assert value(samples, m.FLOW_MODS_REFUSED.name, switch="7") == switch_error
    assert value(samples, m.BARRIER_SECONDS.name + "_count", switch="7") == 1
    assert value(samples, m.BARRIER_SECONDS.name + "_bucket", switch="7", le="0.005") == 1
    assert value(samples, m.NETWORK_BUILT.name) == 0
