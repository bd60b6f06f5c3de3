"""The controller core against fake switches (real OF1.0 flow mods) and fake agents.

Every check of where an ID goes sends a packet through the flow tables the
core's messages built on the fake switches.
"""

from __future__ import annotations

import pytest

from btree.bootstrap import Bootstrap
from btree.tree import State
from client_lib.api.rest import Heartbeat as HeartbeatBody
from client_lib.api.rest import Outcome, Registered, Registration
from client_lib.constants import METAFLOW_PORT
from client_lib.errors import Conflict, NotFound
from controller.arp import ArpMessage
from controller.core import BASE_FLOW_TRIES
from controller.steps import (
    ArpIn,
    CallAgent,
    FailNow,
    Heartbeat,
    PacketOut,
    PortDown,
    ReadFlows,
    SendFlows,
    SplitNow,
    Step,
    StepDone,
    StepFailed,
    SwitchDown,
    SwitchUp,
)
from tests.unit.controller_world import SPACE, World, check_consistent, fill
from topology.builders import client_hosts, fat_tree, port, storage_hosts


@pytest.fixture(params=[1, 2], ids=["r1", "r2"])
def world(request: pytest.FixtureRequest) -> World:
    """Every test runs without replication (r=1, the paper's MetaFlow) and with it."""
    return World(fat_tree(4, servers=8), replicas=request.param)


@pytest.fixture
def built(world: World) -> World:
    world.boot()
    assert world.core.tree is not None
    return world


def test_build_waits_for_every_server_then_programs_every_switch(world: World) -> None:
    g = world.graph
    world.register_all()
    world.advance(world.settings.locate_timeout_s - 1)
    world.tick()
    assert world.core.tree is None and world.core.missing()   # servers not located yet
    world.boot(register=False)
    tree = world.core.tree
    assert tree is not None
    busy = tree.leaves_in(State.BUSY)
    assert len(busy) == 4   # pre-allocation: half the servers
    assert {a.name for a in world.agents.values() if a.owned()} == set(busy)
    assert all(s.flows for s in world.switches.values())
    check_consistent(world, {})
    for client in client_hosts(g):
        assert world.deliver(SPACE.first, client).host == tree.owner(SPACE.first)


def test_a_server_that_never_shows_up_is_left_out_after_the_locate_timeout(world: World) -> None:
    g = world.graph
    absent = storage_hosts(g)[0]
    world.cut(absent)
    world.boot()
    tree = world.core.tree
    assert tree is not None and absent not in tree.leaves()
    failed = world.core.registry[absent].failed
    assert failed is not None and failed.startswith("not seen on the data plane")
    check_consistent(world, {})


def test_split_moves_keys_and_entries_together(built: World) -> None:
    tree = built.tree
    name = tree.leaves_in(State.BUSY)[0]
    acked = fill(built, name, 150)
    outcome = built.ask(SplitNow, name=name)
    assert isinstance(outcome, Outcome) and outcome.ok, outcome
    target = outcome.detail["target"]
    assert isinstance(target, str)
    moved = len(built.agents[target].records)
    assert 0.4 * 150 <= moved <= 0.6 * 150
    assert len(built.agents[name].records) + moved == 150
    assert built.core.splits and built.core.splits[0]["target"] == target
    check_consistent(built, acked)


def test_a_split_that_would_overfill_a_switch_table_is_refused_and_says_which() -> None:
    """A budget of one entry, which every table already exceeds: none may grow,
    and a split must add an entry for its target somewhere."""
    world = World(fat_tree(4, servers=8), table_budget=1, merge=False)
    world.boot()
    name = world.tree.leaves_in(State.BUSY)[0]
    acked = fill(world, name, 150)
    tables = {dpid: dict(switch.flows) for dpid, switch in world.switches.items()}
    outcome = world.ask(SplitNow, name=name)
    assert isinstance(outcome, Outcome) and not outcome.ok, outcome
    assert "over the table budget of 1" in str(outcome.detail) and "switch " in str(outcome.detail)
    assert {dpid: dict(switch.flows) for dpid, switch in world.switches.items()} == tables
    assert len(world.agents[name].records) == 150
    check_consistent(world, acked)


@pytest.mark.parametrize("replicas", [1, 2])
def test_a_split_with_no_idle_server_first_merges_a_cold_one_away_and_loses_nothing(replicas: int) -> None:
    """Every server busy from the start: the full one's split frees the
    coldest server nearest it (its keys move to a neighbour, as a split's
    half moves), then splits into it."""
    world = World(fat_tree(4, servers=8), replicas=replicas, bootstrap=Bootstrap("preallocate", 8))
    world.boot()
    tree = world.tree
    assert not tree.leaves_in(State.IDLE)
    full = tree.leaves_in(State.BUSY)[0]
    acked = fill(world, full, 150)
    for other in tree.leaves_in(State.BUSY)[1:]:
        acked |= fill(world, other, 10, seed=len(acked))
    world.heartbeats()
    outcome = world.ask(SplitNow, name=full)
    assert isinstance(outcome, Outcome) and outcome.ok, outcome
    merge = next(e for e in world.core.events if e["event"] == "merge")
    assert merge["freed_for"] == full and merge["target"] != full
    assert outcome.detail["target"] == merge["server"]   # the split went where the merge made room
    assert tree.state(merge["target"]) is State.BUSY and tree.state(merge["server"]) is State.BUSY
    check_consistent(world, acked)


def test_servers_at_capacity_split_by_themselves(built: World) -> None:
    name = built.tree.leaves_in(State.BUSY)[1]
    acked = fill(built, name, 120)   # capacity is 100
    built.heartbeats()
    built.tick()
    assert [s["server"] for s in built.core.splits] == [name]
    check_consistent(built, acked)


@pytest.mark.parametrize("applied", [True, False])
def test_a_barrier_timeout_aborts_the_split_and_restores_every_table(built: World, applied: bool) -> None:
    name = built.tree.leaves_in(State.BUSY)[0]
    acked = fill(built, name, 120)
    before = {d: dict(s.flows) for d, s in built.switches.items()}
    failure = "barrier timeout" if applied else "barrier timeout, not applied"
    built.inject = lambda step: failure if isinstance(step, SendFlows) and step.messages else None
    outcome = built.ask(SplitNow, name=name)
    built.inject = lambda step: None
    assert not outcome.ok and outcome.operation == "split-aborted"
    assert "flows" in outcome.detail["reason"]
    assert {d: set(s.flows) for d, s in built.switches.items()} == {d: set(f) for d, f in before.items()}
    assert [m.state for m in built.agents[name].migrations.values()] == ["aborted"]
    check_consistent(built, acked)


def test_missing_heartbeats_promote_a_backup_or_hand_blocks_to_an_idle_server(built: World) -> None:
    """A dead server's blocks: with replicas a synced backup takes over and
    nothing acknowledged is lost; without, an idle server takes the blocks over
    empty and the loss is said out loud."""
    tree = built.tree
    victim = tree.leaves_in(State.BUSY)[0]
    blocks = tree.blocks(victim)
    acked = fill(built, victim, 30)
    built.agents[victim].dead = True   # the whole server died, agent included
    built.beat_for(6)   # the others beat on (a controller that hears nobody is the one cut off)
    built.tick()
    failed = built.core.registry[victim].failed
    assert failed is not None and failed.startswith("no heartbeat")
    successor = tree.owner(blocks[0].first)
    assert successor != victim and tree.state(victim) is State.FAILED
    assert set(blocks) <= set(built.agents[successor].owned())
    if built.settings.replicas == 1:
        assert built.core.lost and built.core.lost[0]["server"] == victim
        assert any(e["event"] == "DATA-LOST" for e in built.core.events)
        check_consistent(built, acked, lost=blocks)
        return
    assert not built.core.lost and not any(e["event"] == "DATA-LOST" for e in built.core.events)
    takeover = next(e for e in built.core.events if e["event"] == "takeover")
    assert set(takeover["promoted"]) == {str(b) for b in blocks}
    check_consistent(built, acked)
    built.agents[victim].dead = False   # it comes back with its old store: it rejoins empty
    built.restart(victim)
    assert built.agents[victim].roles == {} and tree.state(victim) is not State.FAILED
    check_consistent(built, acked)


def test_edge_port_down_moves_the_data_of_a_still_reachable_server(built: World) -> None:
    g = built.graph
    victim = built.tree.leaves_in(State.BUSY)[1]
    acked = fill(built, victim, 50)
    (edge,) = list(g.neighbors(victim))
    built.post(PortDown(g.nodes[edge]["dpid"], port(g, edge, victim)))
    built.run()
    assert built.core.registry[victim].failed and built.tree.state(victim) is State.FAILED
    assert not built.core.lost
    takeover = next(e for e in built.core.events if e["event"] == "takeover")
    if built.settings.replicas == 1:   # the only copy is salvaged from the cut-off agent
        assert takeover["salvaged"] and built.agents[victim].records == {}
    else:   # the backups are promoted; the cut-off agent lets go at its next heartbeat (404)
        assert takeover["promoted"] and not takeover["salvaged"]
        built.heartbeats()
        assert not built.agents[victim].owned()
    check_consistent(built, acked)


def test_a_cut_off_server_that_registers_during_its_salvage_keeps_what_is_being_copied() -> None:
    """Its heartbeat is answered 404 the moment it is declared failed, so it
    registers again while its take-over runs; answered "hold nothing", it
    deleted the records the salvage was copying (750 acknowledged writes lost
    in one CI run of the three-tier e2e test). Without replication: only
    then is its store salvaged."""
    built = World(fat_tree(4, servers=8), replicas=1)
    built.boot()
    g = built.graph
    victim = built.tree.leaves_in(State.BUSY)[1]
    acked = fill(built, victim, 50)
    agent = built.agents[victim]
    answers: list[Registered] = []

    def registers_first(step: Step) -> None:
        if isinstance(step, CallAgent) and step.url.rstrip("/") == agent.url and not answers:
            answers.append(built.register(agent))

    built.inject = registers_first
    (edge,) = list(g.neighbors(victim))
    built.post(PortDown(g.nodes[edge]["dpid"], port(g, edge, victim)))
    built.run()
    assert answers and answers[0].roles is None   # no word while its fail-over runs: it keeps all
    assert not built.core.lost and not any(e["event"] == "DATA-LOST" for e in built.core.events)
    check_consistent(built, acked)
    built.heartbeats()   # once its fail-over is done, a cut-off server lets go of everything
    assert not agent.owned()
    check_consistent(built, acked)


def test_reconnecting_switch_gets_its_table_back_from_what_it_holds(built: World) -> None:
    dpid, switch = next(iter(built.switches.items()))
    table = dict(switch.flows)
    victim = next(iter(k for k in table if k[0] >= 1999))
    del switch.flows[victim]
    built.post(SwitchDown(dpid))
    built.post(SwitchUp(dpid))
    mods = switch.mods
    built.run()
    assert set(switch.flows) == set(table)
    assert switch.mods - mods <= 2 + 3   # the missing entry (tcp+udp) and the base entries
    assert any(isinstance(s, ReadFlows) and s.dpid == dpid for s in built.executed)


@pytest.mark.parametrize("failures", [1, BASE_FLOW_TRIES])
def test_a_switch_whose_base_entries_time_out_is_sent_them_again_a_few_times(world: World,
                                                                             failures: int) -> None:
    dpid = next(iter(world.switches))
    tries: list[int] = []

    def timing_out(step: object) -> str | None:
        if isinstance(step, SendFlows) and step.dpid == dpid:
            tries.append(step.id)
            return "barrier timeout, not applied" if len(tries) <= failures else None
        return None

    world.inject = timing_out
    world.post(SwitchUp(dpid))
    world.run()
    held = set(world.switches[dpid].flows)
    retried = [e for e in world.core.events if e["event"] == "step-failed" and "again" in e]
    assert len(tries) == min(failures + 1, BASE_FLOW_TRIES)
    assert len(retried) == min(failures, BASE_FLOW_TRIES - 1)
    assert bool(held) == (failures < BASE_FLOW_TRIES)   # given up after the last try: said, not retried


def test_a_switch_gone_before_its_base_entries_time_out_is_not_sent_them_again(world: World) -> None:
    dpid = next(iter(world.switches))
    sent: list[int] = []

    def timing_out(step: object) -> str | None:
        if isinstance(step, SendFlows) and step.dpid == dpid:
            sent.append(step.id)
            world.post(SwitchDown(dpid))   # (handled before the failure it causes)
            return "barrier timeout, not applied"
        return None

    world.inject = timing_out
    world.post(SwitchUp(dpid))
    world.run()
    assert len(sent) == 1


def test_restarted_controller_rebuilds_ownership_from_the_agents(built: World) -> None:
    partition = sorted(built.tree.partition())
    owned_before = {a.name: a.owned() for a in built.agents.values()}
    acked = fill(built, built.tree.leaves_in(State.BUSY)[0], 40)
    built.new_core()
    built.boot()
    assert sorted(built.tree.partition()) == partition
    assert {a.name: a.owned() for a in built.agents.values()} == owned_before
    check_consistent(built, acked)


def test_decisions_go_on_while_a_copy_runs(built: World, monkeypatch: pytest.MonkeyPatch) -> None:
    """A split's copy is in flight (its answer not back yet): a heartbeat is
    answered and another server's failure is handled to its end meanwhile."""
    tree = built.tree
    source, victim = tree.leaves_in(State.BUSY)[:2]
    fill(built, source, 60)
    held: list[CallAgent] = []
    built.inject = lambda step: None
    original = built.execute

    def hold_copies(step: Step) -> None:  # the migrate call "takes long": not carried out yet
        if isinstance(step, CallAgent) and step.route is not None and step.route.template == "/migrations" \
                and step.route.method == "POST" and step.server == source:
            held.append(step)
            return
        original(step)

    monkeypatch.setattr(built, "execute", hold_copies)
    reply = "split-reply"
    built.post(SplitNow(reply, source))
    built.run()
    assert held and reply not in built.answers
    assert built.ask(FailNow, name=victim, reason="test").ok
    assert tree.state(victim) is State.FAILED
    built.heartbeats()
    assert [op.kind for op in built.core.operations.running.values()] == ["split"]
    monkeypatch.setattr(built, "execute", original)
    original(held[0])
    built.run()
    assert built.answers[reply].ok


def test_a_name_cannot_be_taken_over_by_re_registering(built: World) -> None:
    agent = next(iter(built.agents.values()))
    assert isinstance(built.register(agent), Registered)   # the same identity may re-register
    reply = "hijack"
    hijack = Registration(agent.name, agent.ip, agent.mac, METAFLOW_PORT, "http://attacker:9001", "fake", 100,
                          SPACE, [])
    from controller.steps import Register
    built.post(Register(reply, hijack))
    built.run()
    assert isinstance(built.answers[reply], Conflict)
    other = list(built.agents.values())[1]
    built.post(Register("steal-ip", Registration("newcomer", other.ip, "02:00:00:00:00:99", METAFLOW_PORT,
                                                 "http://newcomer:9001", "fake", 100, SPACE, [])))
    built.run()
    assert isinstance(built.answers["steal-ip"], Conflict)
    assert built.core.registry[agent.name].admin_url == agent.url
    assert isinstance(built.ask(SplitNow, name="nobody"), NotFound)


def test_forged_arp_cannot_move_a_server_or_claim_the_gateway(built: World) -> None:
    g = built.graph
    server = storage_hosts(g)[0]
    attacker = client_hosts(g)[-1]
    located = built.core.inventory.hosts[g.nodes[server]["ip"]]
    built.arp(server, at=attacker)    # the server's IP and MAC, from a client's port
    built.arp(attacker, ip="10.255.255.254")
    built.arp(attacker, ip=SPACE.address(SPACE.first + 5))
    built.run()
    assert built.core.inventory.hosts[g.nodes[server]["ip"]] == located
    assert "10.255.255.254" not in built.core.inventory.hosts
    assert any(e["event"] == "arp-refused" for e in built.core.events)
    check_consistent(built, {})


@pytest.mark.parametrize("outcome", [StepDone, StepFailed])
def test_a_new_host_hears_its_arp_answer_only_once_every_switch_routes_back_to_it(
        built: World, outcome: type[StepDone] | type[StepFailed]) -> None:
    """Its first packet leaves the moment the answer arrives, and the answer to
    that packet comes back along the routes toward it: on a switch still
    applying them, the reply is dropped (seen in Mininet under load). A
    switch that fails its barrier does not keep the host waiting forever."""
    g = built.graph
    client = client_hosts(g)[0]
    (edge,) = list(g.neighbors(client))
    at = (g.nodes[edge]["dpid"], port(g, edge, client))
    target = g.nodes[storage_hosts(g)[0]]["ip"]

    def ask(sender: str, mac: str) -> list[Step]:
        return built.core.handle(ArpIn(*at, ArpMessage(sender, mac, target, True)))

    first = ask("10.0.9.99", "02:00:00:00:09:99")
    routes = [s for s in first if isinstance(s, SendFlows)]
    assert routes and not [s for s in first if isinstance(s, PacketOut)]
    assert {s.dpid for s in routes} == set(built.switches)   # every switch learns the way back
    again = ask("10.0.9.99", "02:00:00:00:09:99")   # the host's ARP retry: not answered early either
    assert not [s for s in again if isinstance(s, PacketOut)]
    other = next(h for h in client_hosts(g) if h != client)
    (other_edge,) = list(g.neighbors(other))
    toward = built.core.handle(ArpIn(g.nodes[other_edge]["dpid"], port(g, other_edge, other), ArpMessage(
        g.nodes[other]["ip"], g.nodes[other]["mac"], "10.0.9.99", True)))   # a known host asks for it
    assert not [s for s in toward if isinstance(s, PacketOut)]
    released: list[Step] = []
    for step in routes:
        assert not released, "answered before the last switch confirmed its routes"
        done = StepDone(step.id) if outcome is StepDone else StepFailed(step.id, "barrier timeout")
        released = built.core.handle(done)
    outs = [s for s in released if isinstance(s, PacketOut)]
    assert len(outs) == len(released) == 3
    assert [(s.dpid, s.port) for s in outs][:2] == [at, at]
    known = ask("10.0.9.99", "02:00:00:00:09:99")   # once routed, answered at once
    assert [type(s) for s in known] == [PacketOut]


def test_a_server_restarted_in_service_comes_back_empty_unless_it_holds_the_only_copy(built: World) -> None:
    """kill -9 and a restart faster than the heartbeat timeout: with backups,
    the restarted agent is failed over (its store may hold a write its set
    never acknowledged) and rejoins empty; alone (r=1) it serves its blocks."""
    tree = built.tree
    victim = tree.leaves_in(State.BUSY)[0]
    blocks = tree.blocks(victim)
    acked = fill(built, victim, 30)
    built.restart(victim)
    agent = built.agents[victim]
    if built.settings.replicas == 1:
        assert tree.blocks(victim) == blocks and agent.owned() == blocks and not agent.suspended
    else:
        assert agent.roles == {} and not agent.suspended
        assert tree.owner(blocks[0].first) != victim
        assert any(e["event"] == "server-failed" and e["server"] == victim for e in built.core.events)
        built.heartbeats()   # 404: it registers again and rejoins, empty and idle
        assert tree.state(victim) is State.IDLE
    assert not built.core.lost
    check_consistent(built, acked)


def test_a_restarted_controller_prefers_a_backup_to_a_primary_that_restarted() -> None:
    world = World(fat_tree(4, servers=8), replicas=2)
    world.boot()
    victim = world.tree.leaves_in(State.BUSY)[0]
    blocks = world.tree.blocks(victim)
    acked = fill(world, victim, 30)
    world.agents[victim].suspended = True   # it restarted while no controller ran
    world.new_core()
    world.boot()
    promoted = [e for e in world.core.events if e["event"] == "promoted-at-rebuild"]
    assert {e["block"] for e in promoted} == {str(b) for b in blocks}
    assert all(world.tree.owner(b.first) != victim for b in blocks)
    replicas = world.core.world.replicas_or_raise()
    assert all(victim in replicas.sets[b].unsynced or victim not in replicas.sets[b].members for b in blocks)
    check_consistent(world, acked)


def test_a_server_the_built_network_never_saw_joins_idle_when_it_shows_up(world: World) -> None:
    """Dead while the controller built the network (found by the nemesis: a
    server down during a controller restart was never taken back): when it
    starts and the data plane reaches it, it joins as an idle leaf under its
    edge switch, and takes blocks over like any other."""
    late = "p0e0h1"
    world.agents[late].dead = True
    world.cut(late)
    world.boot()
    tree = world.tree
    assert late not in tree.leaves()
    world.agents[late].dead = False
    world.reconnect(late)
    answer = world.register(world.agents[late])
    assert answer.roles == [] and tree.state(late) is State.IDLE
    assert any(e["event"] == "server-joined" and e["server"] == late for e in world.core.events)
    busy = tree.leaves_in(State.BUSY)[-1]
    acked = fill(world, busy, 30)
    # every other idle server dies, then a busy one is cut off: the newcomer must take over
    for name in [leaf for leaf in tree.leaves_in(State.IDLE) if leaf != late] + [busy]:
        if name == busy:
            world.cut(name)
        else:
            world.agents[name].dead = True
        for _ in range(6):
            world.beat_for(world.settings.heartbeat_timeout_s / 2 + 0.1)
            world.tick()
    sets = world.core.world.replicas_or_raise().sets
    assert tree.blocks(late) or any(late in s.members for s in sets.values())
    if world.settings.replicas == 1:
        assert tree.blocks(late)
    assert not world.core.lost
    check_consistent(world, acked)


def test_the_last_live_server_failed_keeps_its_blocks_and_serves_them_when_back() -> None:
    """Its fail-over finds every other leaf failed (`takeover-impossible`):
    nobody took its blocks, so it holds their only copy. Asked to register
    again, as a failed server is, it is answered with its roles, not told to
    drop them, and back on the data plane it serves them (the nemesis lost a
    block's acknowledged writes when a mass false failure ended this way)."""
    world = World(fat_tree(4, servers=8), replicas=2)
    world.boot()
    acked: dict[int, bytes] = {}
    for name in world.tree.leaves_in(State.BUSY):
        acked.update(fill(world, name, 10, seed=len(acked)))
    *others, last = sorted(world.agents)
    for name in others:                    # one edge port after the other: each fail-over ends first
        world.cut(name)
        for _ in range(8):
            world.beat_for(1.0)
            world.tick()
    assert set(world.tree.blocks(last)) == {b for b, _ in world.tree.partition()}
    world.cut(last)
    world.beat_for(3.0)                    # it still beats (404) and registers again
    world.tick()
    assert any(e["event"] == "takeover-impossible" and e["server"] == last for e in world.core.events)
    assert world.core.registry[last].failed and world.agents[last].roles
    world.reconnect(last)
    world.beat_for(2.0)
    world.tick()
    assert not world.core.registry[last].failed
    assert any(e["event"] == "server-rejoined" and e["server"] == last for e in world.core.events)
    assert all(world.read(mdid) == ("serve", value) for mdid, value in acked.items())


def test_a_first_build_waits_for_the_servers_its_preallocation_wants() -> None:
    """preallocate:8, one server registering late (within --locate-timeout):
    the build waits for it, and all 8 own a part of the space."""
    world = World(fat_tree(4, servers=8), replicas=1, bootstrap=Bootstrap("preallocate", 8))
    late = sorted(world.agents)[0]
    world.agents[late].dead = True
    world.boot(patience=world.settings.locate_timeout_s / 2)
    assert world.core.tree is None          # the 7 registered and located: it waits
    world.agents[late].dead = False
    world.register(world.agents[late])
    world.beat_for(world.settings.settle_s)
    world.tick()
    assert world.core.tree is not None
    assert sorted(world.tree.leaves_in(State.BUSY)) == sorted(world.agents)
    assert not any(e["event"] == "bootstrap-short" for e in world.core.events)


def test_a_server_missing_at_the_first_build_leaves_the_preallocated_space_to_the_others() -> None:
    """preallocate:8 on 8 servers, one of which never registers: the build
    spreads the space over the 7 (it refused to build at all, every tick)."""
    world = World(fat_tree(4, servers=8), replicas=1, bootstrap=Bootstrap("preallocate", 8))
    silent = sorted(world.agents)[0]
    world.agents[silent].dead = True
    world.boot()
    assert world.core.tree is not None
    assert sorted(world.tree.leaves_in(State.BUSY)) == sorted(set(world.agents) - {silent})
    short = [e for e in world.core.events if e["event"] == "bootstrap-short"]
    assert [(e["owners"], e["wanted"]) for e in short] == [(7, 8)]


def test_a_heartbeats_answer_says_how_long_ago_the_servers_last_datagram_came(built: World) -> None:
    """What lets an agent tell late replies from datagrams that do not get
    through (`Ack.datagram_age_s`, `nat_agent.registration`)."""
    name = sorted(built.agents)[0]
    agent = built.agents[name]
    beat = HeartbeatBody(len(agent.records), agent.owned(), [], [])
    assert built.ask(Heartbeat, name=name, beat=beat).datagram_age_s is None
    built.core.registry.heard[name] = (built.now, 0)
    built.advance(0.3)
    assert built.ask(Heartbeat, name=name, beat=beat).datagram_age_s == pytest.approx(0.3)


def test_a_registration_sent_before_the_first_assignment_and_taken_after_it_is_no_restart() -> None:
    """A real agent starts suspended and registers; its heartbeat times out
    while the first build holds the controller, so it registers again, still
    suspended, and the build's assignment reaches it while that registration
    is on its way (k=32 with real agents). The same process (incarnation)
    registering again keeps its roles; another process, with backups, is
    failed over as restarted (above)."""
    world = World(fat_tree(4, servers=8), replicas=2)
    for agent in world.agents.values():
        agent.suspended = True   # started with --controller: serving nothing until told
    world.boot()
    name = world.tree.leaves_in(State.BUSY)[0]
    blocks = world.tree.blocks(name)
    agent = world.agents[name]
    assert not agent.suspended and agent.owned() == blocks   # the build's assignment
    agent.suspended = True   # the registration sent before it arrived
    answer = world.register(agent)
    assert [r.block for r in answer.roles if r.primary] == blocks
    assert not world.core.registry[name].failed and world.tree.blocks(name) == blocks
    assert not any(e["event"] == "server-failed" for e in world.core.events)
    world.restart(name)   # another process of the same server's
    assert world.core.registry[name].failed and world.tree.owner(blocks[0].first) != name
