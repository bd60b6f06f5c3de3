"""A rolling restart in Mininet: real Open vSwitch, controller, agents and clients.

A k=4 fat-tree with 6 storage servers (3 owning the space, a backup per
block) and 10 clients; 1,200 files are written, then, while every client
keeps writing new files and reading them back, every agent in turn is
drained, stopped with SIGTERM (a clean exit), started again on the same
store and undrained, and then the controller is stopped with SIGTERM and
started again (`mininet_scenarios.rolling`). Every client call succeeds
within its retries; no agent's stop causes a take-over or a DATA-LOST;
while the controller is away and rebuilding, every read of the switches'
tables delivers every ID of the space, from every switch with hosts, to
the one owner of its block, and no switch ever holds fewer
MetaFlow entries than before; afterwards the tables read
back from Open vSwitch route every ID to its owner, every server serves
again, and every acknowledged write reads back. The times of each turn and
of the whole restart are printed (`docs/rolling-restart.md` quotes them).
"""

from __future__ import annotations

import shutil
import warnings

import pytest

from client_lib.api.rest import REST
from mininet_scenarios.metaflow_net import MetaFlowNet
from mininet_scenarios.rolling import RollingRestart, Writers, summary
from tests.e2e.test_metaflow_e2e import check_routes
from topology import builders

warnings.filterwarnings("ignore", category=DeprecationWarning)

SERVERS, FIRST_FILES, WAVE = 6, 1200, 100


@pytest.mark.timeout(600)
def test_every_agent_then_the_controller_restarted_while_clients_write(tmp_path):
    graph = builders.fat_tree(4, servers=SERVERS)
    with MetaFlowNet(graph, capacity=1_000_000, workdir=tmp_path,
                     controller_args=["--bootstrap", "preallocate:3", "--no-auto-split"]) as mf:
        clients = len(mf.hosts("client"))
        first = mf.collect(mf.start_clients(FIRST_FILES // clients, tmp_path, read_back=False, concurrency=8))
        assert all(r["errors"] == 0 for r in first), first
        before = mf.view(REST.servers).servers
        assert len(before) == SERVERS and sum(bool(s.backups) for s in before.values()) >= 2, before

        try:
            with Writers(mf, tmp_path, WAVE, start=FIRST_FILES // clients) as writers:
                report = RollingRestart(mf).run()
        finally:   # the agents' logs outlive the scenario, in pytest's directory
            assert mf.running.workdir is not None
            for log in mf.running.workdir.glob("*.log"):
                shutil.copy(log, tmp_path / f"agent-{log.name}")
        print()
        for name, value in summary(report, writers):
            print(f"{name:64s} {value}")

        assert [t.server for t in report.agents] == sorted(before)
        assert sum(t.blocks for t in report.agents) >= 3, report.agents   # blocks really moved
        assert report.fail_overs == [], report.fail_overs
        assert len(writers.results) >= 2 * clients, "the clients wrote through more than one wave"
        assert writers.errors == 0, [r["error_sample"] for r in writers.results if r["errors"]]
        assert all(r["read_back"] == r["written"] == WAVE for r in writers.results), writers.results

        controller = report.controller
        assert controller is not None and controller.reads >= 2, controller
        assert controller.misrouted == [], controller.misrouted
        assert controller.fewest_entries == controller.entries_before, controller   # none ever held fewer

        after = mf.view(REST.servers).servers
        assert sorted(after) == sorted(before)
        assert all(s.failed is None for s in after.values()), after
        assert not mf.events("DATA-LOST")
        check_routes(mf)
        result = mf.verify_acked(tmp_path, [])
        assert result["missing"] == result["wrong"] == 0, result
        assert result["checked"] == result["acked"] == sum(r["written"] for r in first) + writers.written
