"""Two sites, each two real agents that split its prefix and run with that
prefix as their ``--space``, and `SiteClient` placing entries by the
strategies (issue 29): a copy lands on exactly the sites the placement
names, at the ID the site's agents compute themselves (a copy routed to
the wrong half would be answered MOVED), and a reader finds it where the
strategy says, the local copy even when the home site is down."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from client_lib.cidr import Block
from client_lib.client import MetaFlowClient, RetryPolicy, Route
from client_lib.errors import InvalidArgument, Unavailable
from client_lib.mdid import normalize_path
from client_lib.routes import static_route
from client_lib.site_client import SiteClient
from client_lib.sites import SiteLayout, Strategies, Strategy
from mininet_scenarios.daemons import AgentProcess

LAYOUT = SiteLayout.equal(Block.parse("100.64.0.0/10"), ["east", "west"])
ONCE = RetryPolicy(1, base=0.001, cap=0.001)


@pytest.fixture(scope="module")
def agents(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[Block, AgentProcess]]:
    """Each half of each site's prefix: its agent."""
    base = tmp_path_factory.mktemp("sites")
    procs = {half: AgentProcess(f"leveldb:{base / f'{site.name}{i}'}", "--space", str(site.prefix),
                                own=[str(half)], log_path=base / f"{site.name}{i}.log")
             for site in LAYOUT.sites for i, half in enumerate(site.prefix.halves())}
    for proc in procs.values():
        proc.launch()
    try:
        for proc in procs.values():
            proc.wait_ready()
        yield procs
    finally:
        for proc in procs.values():
            proc.terminate()
        for proc in procs.values():
            assert proc.stop() == 0, proc.log()[-2000:]


def _route(agents: dict[Block, AgentProcess]) -> Route:   # what the switches and the borders would do
    return static_route([(half, (a.host, a.port)) for half, a in agents.items()], LAYOUT.space)


def _held(agents: dict[Block, AgentProcess], path: str) -> dict[str, bytes | None]:
    """What each site holds for `path`, asked of it alone (no MOVED followed)."""
    route = _route(agents)
    out = {}
    for site in LAYOUT.sites:
        with MetaFlowClient(site.prefix, route=route, retry=ONCE, follow_moved=False) as client:
            out[site.name] = client.get(path)
    return out


def _homed_in(site: str, tag: str) -> str:
    """A path whose home is `site`."""
    return next(p for i in range(1000) if LAYOUT.home_of(normalize_path(p := f"/{tag}/{i}"))[0].name == site)


def test_each_strategy_writes_exactly_its_copies_and_reads_them_in_order(
        agents: dict[Block, AgentProcess]) -> None:
    route = _route(agents)
    for strategy, central in ((Strategy.DECENTRALIZED, None), (Strategy.LOCAL_REPLICATION, None),
                              (Strategy.CENTRALIZED, "east")):
        path = _homed_in("west", strategy.value)
        with SiteClient(LAYOUT, strategy, "east", central=central, route=route, retry=ONCE) as writer, \
                SiteClient(LAYOUT, strategy, "west", central=central, route=route, retry=ONCE) as reader:
            writer.put(path, b"v")
            held = _held(agents, path)
            want = {copy for copy, _ in writer.placed(normalize_path(path)).writes}
            assert {site for site, value in held.items() if value == b"v"} == want, (strategy, held)
            assert reader.get(path) == b"v" and writer.get(path) == b"v"
            assert reader.get(path + "-never-written") is None


def test_with_local_replication_the_local_copy_answers_while_home_is_down(
        agents: dict[Block, AgentProcess]) -> None:
    path = _homed_in("west", "down")
    west = next(agent for half, agent in agents.items()
                if half.contains(LAYOUT.id_in(normalize_path(path), LAYOUT.named("west"))))
    options: dict[str, Any] = {"route": _route(agents), "retry": ONCE, "deadline": 2}
    with SiteClient(LAYOUT, Strategy.LOCAL_REPLICATION, "east", **options) as local, \
            SiteClient(LAYOUT, Strategy.DECENTRALIZED, "east", **options) as remote:
        local.put(path, b"kept here too")
        west.terminate()
        assert west.stop() == 0
        try:
            assert local.get(path) == b"kept here too"
            with pytest.raises(Unavailable):
                remote.get(path)
        finally:
            west.launch().wait_ready()


def test_a_bad_layout_or_strategy_is_refused_at_once() -> None:
    with pytest.raises(InvalidArgument, match="propagation agent"):
        SiteClient(LAYOUT, Strategy.REPLICATED, "east")
    with pytest.raises(InvalidArgument, match="needs its site"):
        SiteClient(LAYOUT, Strategy.CENTRALIZED, "east")
    with pytest.raises(InvalidArgument, match="no site named 'north'"):
        SiteClient(LAYOUT, Strategy.DECENTRALIZED, "north")


def test_strategies_by_prefix_place_each_entry_by_its_own_rule(agents: dict[Block, AgentProcess]) -> None:
    rules = Strategies.parse(["/=decentralized", "/mine=local-replication"])
    mine, other = _homed_in("west", "mine"), _homed_in("west", "other")
    with SiteClient(LAYOUT, rules, "east", route=_route(agents), retry=ONCE) as client:
        client.put(mine, b"m")
        client.put(other, b"o")
        assert client.get(mine) == b"m" and client.get(other) == b"o"
    assert _held(agents, mine) == {"east": b"m", "west": b"m"}
    assert _held(agents, other) == {"east": None, "west": b"o"}


def test_a_delete_removes_exactly_the_copies_a_write_makes(agents: dict[Block, AgentProcess]) -> None:
    for strategy in (Strategy.DECENTRALIZED, Strategy.LOCAL_REPLICATION):
        path = _homed_in("west", f"del-{strategy.value}")
        with SiteClient(LAYOUT, strategy, "east", route=_route(agents), retry=ONCE) as client:
            client.put(path, b"v")
            client.delete(path)
            assert client.get(path) is None
        assert _held(agents, path) == {"east": None, "west": None}, strategy
