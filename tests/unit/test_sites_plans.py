"""The multi-site experiments' plans, as pure data: the sites' namespaces,
links, addresses and routes (`mininet_scenarios.sites_topo`), a site's
fabric (`mininet_scenarios.site_fabric.site_graph`), the workflow shapes
(`benchmarks.sites_workflows`), and the bench's comparison of fabrics."""

from __future__ import annotations

import ipaddress
import itertools

import pytest
from hypothesis import given
from hypothesis import strategies as st

from benchmarks import sites_bench
from benchmarks.sites_workflows import SCENARIOS, Scenario, buzzflow, montage
from client_lib.cidr import Block
from client_lib.sites import SiteLayout, Strategy
from mininet_scenarios.site_fabric import site_graph
from mininet_scenarios.sites_topo import PAPER_REGIONS, PAPER_RTT_MS, SitesTopo, paper_layout
from topology import builders

SPACE = Block.parse("100.64.0.0/10")


def _topo(sites: int, agents: int = 1) -> SitesTopo:
    names = [f"s{i}" for i in range(sites)]
    rtts = {frozenset(pair): 10.0 + n for n, pair in enumerate(itertools.combinations(names, 2))}
    return SitesTopo(SiteLayout.equal(SPACE, names), rtts, agents=agents)


def test_the_paper_has_a_round_trip_for_every_pair_of_its_regions() -> None:
    topo = SitesTopo(paper_layout(SPACE), PAPER_RTT_MS)
    assert len(topo.links) == 6 and {s.name for s in topo.sites} == set(PAPER_REGIONS)
    assert topo.link_of("west-europe", "south-central-us").rtt_ms == 113.5
    assert all(15 < link.rtt_ms < 120 for link in topo.links)


@given(st.sampled_from([1, 2, 4, 8]), st.sampled_from([1, 2, 4, 8]))
def test_every_border_routes_every_other_prefix_over_its_own_link_and_its_blocks_to_its_agents(
        sites: int, agents: int) -> None:
    topo = _topo(sites, agents)
    wan = [ipaddress.ip_network(f"{link.address_a}/30", strict=False) for link in topo.links]
    assert len(set(wan)) == len(wan)   # one /30 a link
    for i, site in enumerate(topo.sites):
        blocks = topo.blocks(i)
        assert len(blocks) == agents and sum(b.size for b in blocks) == site.prefix.size
        assert all(site.prefix.covers(b) for b in blocks)
        routed = {destination for destination, _, _ in topo.wan_routes(i)}
        assert routed == {str(s.prefix) for s in topo.sites if s != site} | {
            topo.nodes_subnet(j) for j in range(sites) if j != i}
        for destination, hop, link in topo.wan_routes(i):
            assert i in (link.a, link.b) and hop in (link.address_a, link.address_b)
            far = link.b if link.a == i else link.a
            assert hop == (link.address_b if link.a == i else link.address_a)
            assert destination in (str(topo.sites[far].prefix), topo.nodes_subnet(far))


def test_a_topology_missing_a_round_trip_or_with_odd_agents_is_refused() -> None:
    layout = SiteLayout.equal(SPACE, ["a", "b", "c", "d"])
    with pytest.raises(ValueError, match="no round trip given between"):
        SitesTopo(layout, {frozenset(("a", "b")): 1.0})
    with pytest.raises(ValueError, match="agents a site"):
        _topo(2, agents=3)
    with pytest.raises(ValueError, match="negative"):
        SitesTopo(SiteLayout.equal(SPACE, ["a", "b"]), {frozenset(("a", "b")): -1.0})


@given(st.sampled_from(SCENARIOS), st.integers(4, 16))
def test_every_workflow_read_is_written_by_an_earlier_job_and_nothing_twice(scenario: Scenario,
                                                                              nodes: int) -> None:
    sites = list(PAPER_REGIONS)
    for shape in (buzzflow, montage):
        jobs = shape(sites, nodes, scenario, "t")
        written = [name for job in jobs for name in job.writes]
        assert len(written) == len(set(written))
        writer = {name: n for n, job in enumerate(jobs) for name in job.writes}
        for n, job in enumerate(jobs):
            assert job.site in sites and job.compute_s == scenario.compute_s
            assert all(name in writer and writer[name] != n for name in job.reads)
        assert sum(len(job.reads) + len(job.writes) for job in jobs) >= len(jobs) * (scenario.ops // 2)
    assert len(montage(sites, nodes, scenario, "t")) == nodes
    assert len(buzzflow(sites, nodes, scenario, "t")) == max(1, nodes // len(sites)) * len(sites)


def test_a_site_fabric_has_a_border_client_and_an_even_number_of_servers() -> None:
    graph = site_graph(4)
    assert len(builders.storage_hosts(graph)) == 4 and len(builders.client_hosts(graph)) == 2
    for odd in (1, 3):
        with pytest.raises(ValueError, match="even number"):
            site_graph(odd)


def test_the_report_compares_each_strategy_on_fabrics_with_the_same_run_on_the_plain_sites() -> None:
    def run(strategy: Strategy, makespan: float, failures: int = 0) -> dict[str, object]:
        return {"strategy": strategy.value, "entries": 10, "nodes": 4, "makespan": makespan,
                "failures": failures, "throughput": 1.0}

    results = {"rtts": [], "central": "s0", "entries": [10], "fig7": [],
               "fig5": [run(s, 1.0) for s in Strategy],
               "fig6": {"speedup": {f: 1.0 for f in sites_bench.PROGRESS}},
               "plain": [run(s, 2.0 + n) for n, s in enumerate(Strategy)],
               "fabric": [run(s, 4.0 + n, failures=n) for n, s in enumerate(Strategy)]}
    rows = [line for line in sites_bench.report(results).splitlines() if line.count("|") == 6
            and line.split("|")[1].strip() in {s.value for s in Strategy}]
    want = [f"| {s.value} | {2.0 + n:.2f} | {4.0 + n:.2f} | {(4.0 + n) / (2.0 + n):.2f} | {n} |"
            for n, s in enumerate(Strategy)]
    assert rows == want
