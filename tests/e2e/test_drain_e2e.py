"""A drain in Mininet: real Open vSwitch, controller, agents and clients.

The demo's 20,000 files are written (2,500 by each of 8 clients), then the
busiest server that also keeps backup copies is drained while the clients
write 4,000 more: every client call succeeds, the server ends holding
nothing (no block, no copy), the tables read back from Open vSwitch route
every ID to its owner, and every acknowledged write reads back. Then its
agent is killed: the controller marks it stopped without a fail-over (no
take-over, no promotion, no DATA-LOST), and every write still reads back.
The drain's time is printed (`docs/drain.md` quotes it).
"""

from __future__ import annotations

import time
import warnings

import pytest

from client_lib.api.rest import REST
from mininet_scenarios.metaflow_net import MetaFlowNet
from tests.e2e.test_metaflow_e2e import check_routes, wait_for
from topology import builders

warnings.filterwarnings("ignore", category=DeprecationWarning)


@pytest.mark.timeout(900)
def test_a_server_drained_while_clients_write_is_stopped_without_a_fail_over(tmp_path):
    graph = builders.fat_tree(4, servers=8)
    with MetaFlowNet(graph, capacity=1_000_000, workdir=tmp_path,
                     controller_args=["--bootstrap", "preallocate:4", "--no-auto-split"]) as mf:
        results = mf.collect(mf.start_clients(2500, tmp_path, read_back=False, concurrency=16))
        assert all(r["errors"] == 0 and r["written"] == 2500 for r in results), results
        servers = mf.view(REST.servers).servers
        backing = [n for n, s in servers.items() if s.state == "busy" and s.backups] \
            or [n for n, s in servers.items() if s.state == "busy"]
        victim = max(backing, key=lambda n: servers[n].keys)
        held = len(servers[victim].blocks), len(servers[victim].backups)

        writing = mf.start_clients(500, tmp_path, start=10_000, read_back=True, concurrency=4)
        started = time.monotonic()
        outcome = mf.api.call(REST.drain, name=victim)
        assert outcome.ok and (outcome.detail["blocks"], outcome.detail["backups"]) == held, outcome
        info = wait_for(lambda: (d := mf.view(REST.drains).drains[victim]).state != "draining" and d, 300)
        took = time.monotonic() - started
        assert info.state == "drained", info
        results = mf.collect(writing)
        assert all(r["errors"] == 0 and r["read_back"] == r["written"] == 500 for r in results), results
        print(f"\ndrained {victim} ({held[0]} blocks, {held[1]} backup copies, {info.keys_moved} keys moved "
              f"in {info.moves} moves) in {info.seconds:.2f} s by the controller, {took:.2f} s seen by the "
              f"caller, while 8 clients wrote")

        after = mf.view(REST.servers).servers[victim]
        assert (after.blocks, after.backups, after.state) == ([], [], "idle"), after
        check_routes(mf)
        result = mf.verify_acked(tmp_path, [])
        assert result["missing"] == result["wrong"] == 0 and result["checked"] == 8 * 3000, result

        mf.kill_agent(victim)
        wait_for(lambda: [e for e in mf.events("drained-server-stopped") if e["server"] == victim], 30)
        assert not [e for e in mf.events("takeover") if e["server"] == victim]
        assert not mf.events("DATA-LOST")
        check_routes(mf)
        result = mf.verify_acked(tmp_path, [])
        assert result["missing"] == result["wrong"] == 0, result
