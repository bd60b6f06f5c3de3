"""Two controllers, one leader (etcd), in Mininet: real Open vSwitch bridges
with both controllers as targets, agents given both URLs, clients writing.

kill -9 of the leader: the standby takes over (MASTER on every bridge), and
no MetaFlow entry leaves any bridge meanwhile (the tables are polled the
whole time and compared with what they held before); then the killed
controller comes back as a standby, the leader is killed again and, right
after it, a storage server holding primaries: the new leader fails it over
(its backups promoted). No client sees an error it does not retry past,
and no acknowledged write is lost. A split the leader left in flight is
aborted by the next one, from what the source agent holds.
"""

from __future__ import annotations

import threading
import time
import warnings

import pytest

from client_lib.api.admin import ADMIN
from client_lib.api.rest import REST
from mininet_scenarios.flowwatch import FlowWatch, entries
from mininet_scenarios.metaflow_net import MetaFlowNet
from tests.e2e.test_metaflow_e2e import _mid_split, _quietly, wait_for
from topology import builders

warnings.filterwarnings("ignore", category=DeprecationWarning)
GRAPH = builders.two_tier(core=2, edges=2, servers_per_edge=2, clients_per_edge=1)
"""Not the default (another scenario may run beside this one)."""
TAKEOVER_S = 3.0
"""The issue's target: a fail-over decided by the new leader within 3 s of the old one's death."""


def _served_elsewhere(mf: MetaFlowNet, victim: str, blocks: list) -> bool:
    """Every one of `blocks` is served by a live server other than `victim`."""
    servers = mf.view(REST.servers).servers
    held = {b for name, s in servers.items() if name != victim and not s.failed for b in s.blocks}
    return all(any(h.covers(b) or b.covers(h) for h in held) for b in blocks)


def _events_since(mf: MetaFlowNet, since: float, kind: str) -> list[dict]:
    return [e for e in mf.events(kind) if e["t"] >= since]


@pytest.mark.timeout(600)
def test_the_standby_takes_over_without_touching_a_flow_and_fails_over_a_server(tmp_path):
    with MetaFlowNet(GRAPH, controllers=2, capacity=1_000_000, workdir=tmp_path,
                     controller_args=["--no-auto-split"]) as mf:
        first = mf.leader()
        term = mf.view(REST.leadership).term
        procs = mf.start_clients(400, tmp_path, concurrency=2)
        time.sleep(1.0)

        # 1. The leader dies: the other takes over and no entry leaves a bridge.
        with FlowWatch(mf) as watch:
            killed_at = time.monotonic()
            assert mf.kill_leader() == first
            second = mf.leader(timeout=30)
            took = time.monotonic() - killed_at
            assert second != first and mf.view(REST.leadership).term > term
            wait_for(lambda: _events_since(mf, killed_at, "network-built"))
            wait_for(lambda: not mf.view(REST.operations).operations)
            time.sleep(1.0)
        assert watch.polls > 5 and not watch.removed, sorted(watch.removed)[:10]
        assert entries(mf) == watch.first   # the same tables: read back, nothing to change
        built = _events_since(mf, killed_at, "network-built")
        assert built and built[0]["restored"], built
        print(f"takeover: leading after {took:.2f} s, rebuilt after {built[0]['t'] - killed_at:.2f} s")

        # 2. The killed controller returns as a standby; the leader dies, and right
        #    after it a server holding primaries: the newest leader fails it over.
        mf.revive_controller(first)
        mf.standby(first)   # hosts from the leader's etcd record, links from its LLDP packet-ins
        servers = mf.view(REST.servers).servers
        victim = next(n for n, s in sorted(servers.items()) if s.blocks and not s.failed)
        blocks = servers[victim].blocks
        killed_at = time.monotonic()
        mf.kill_leader()
        mf.kill_agent(victim)
        third = mf.leader(timeout=30)
        assert third == first
        promoted = wait_for(lambda: _events_since(mf, killed_at, "promoted-at-rebuild")
                            or _events_since(mf, killed_at, "takeover"))
        decided = promoted[0]["t"] - killed_at
        print(f"fail-over of {victim} decided by the new leader {decided:.2f} s after the leader's death")
        wait_for(lambda: _served_elsewhere(mf, victim, blocks))
        results = mf.collect(procs, timeout=300)
        assert all(r["written"] == 400 for r in results), results
        result = mf.verify_acked(tmp_path, [])
        assert result["missing"] == result["wrong"] == 0, result
        assert decided <= TAKEOVER_S + 2.0, f"fail-over decided {decided:.2f} s after the leader's death"


@pytest.mark.timeout(600)
def test_a_split_the_old_leader_left_in_flight_is_aborted_by_the_new_one(tmp_path):
    """The leader dies while a split copies: the new leader's rebuild finds the
    migration on the source agent and aborts it (today's restart path), so no
    block stays frozen and every write succeeds afterwards."""
    with MetaFlowNet(GRAPH, controllers=2, capacity=1_000_000, workdir=tmp_path,
                     controller_args=["--no-auto-split", "--migration-lease", "30"]) as mf:
        results = mf.collect(mf.start_clients(2000, tmp_path, read_back=False, concurrency=16))
        assert all(r["errors"] == 0 for r in results), results
        servers = mf.view(REST.servers).servers
        source = max((n for n, s in servers.items() if s.state == "busy"), key=lambda n: servers[n].keys)
        leader = mf.apis[mf.leader()]
        splitting = threading.Thread(target=lambda: _quietly(lambda: leader.call(REST.split, name=source)))
        splitting.start()
        step = _mid_split(mf)
        killed_at = time.monotonic()
        mf.kill_leader()
        mf.leader(timeout=30)
        splitting.join(10)
        wait_for(lambda: _events_since(mf, killed_at, "network-built"))
        agent = mf.running.agents[mf.running.topo.graph_names[source]]
        wait_for(lambda: not agent.admin.call(ADMIN.health).frozen, 15)
        assert _events_since(mf, killed_at, "leftover-migrations") or step != "copy" \
            or not agent.admin.call(ADMIN.migrations).migrations
        results = mf.run_clients(300, tmp_path, start=10_000)
        assert all(r["errors"] == 0 and r["read_back"] == r["written"] == 300 for r in results), results
        result = mf.verify_acked(tmp_path, [])
        assert result["missing"] == result["wrong"] == 0, result
