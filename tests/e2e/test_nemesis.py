"""Issue 11's nemesis inside `make test`: 20 kills on a real MetaFlow in
Mininet, and issue 25's other faults, two of each kind (pauses of a primary,
a backup and the controller; an agent cut from the controller and the
controller from every agent; a slow disk), and nothing acknowledged may be
lost, no ID served twice, every history linearizable
(`mininet_scenarios.nemesis`; `make chaos` runs 200 kills and more of each).

And what the nemesis found in the controller, on its own: a server that was
dead while a restarted controller rebuilt the network must be taken back
when it returns."""

from __future__ import annotations

import time
import warnings

import pytest

from client_lib.api.rest import REST
from mininet_scenarios.metaflow_net import MetaFlowNet
from mininet_scenarios.nemesis import (
    FAULTS,
    HEARTBEAT_TIMEOUT_S,
    PARTITIONS,
    PAUSES,
    SLOW_DISKS,
    Settings,
    back_in_service,
    failed,
    run,
    settled,
)
from topology import builders

warnings.filterwarnings("ignore", category=DeprecationWarning)


@pytest.mark.timeout(1200)
def test_kills_pauses_cuts_and_a_slow_disk_lose_nothing_and_every_history_is_linearizable(tmp_path) -> None:
    summary = run(Settings(kills=20, pauses=6, partitions=4, slow_disks=2, seed=11), say=lambda _text: None,
                  keep=tmp_path / "nemesis")   # its histories and every daemon's log, kept on failure
    brief = {k: v for k, v in summary.items() if k not in ("round_log", "settings")}
    assert "stuck" not in summary, brief
    assert summary["kills"] >= 20 and set(summary["faults"]) >= set(FAULTS) - {"kill-during-split"}, brief
    # two of each kind this cluster can have (one controller: no coordination service to pause or cut)
    others = {f for f in (*PAUSES, *PARTITIONS, *SLOW_DISKS) if f not in summary["unavailable"]}
    assert others == {"pause-primary", "pause-backup", "pause-controller", "cut-agent-from-controller",
                      "cut-controller-from-agents", "slow-disk"}, summary["unavailable"]
    assert {f: summary["classes"][f]["injected"] for f in others} == dict.fromkeys(others, 2), brief
    # the controller's own pause, or a cut from every agent longer than the heartbeat timeout,
    # is nobody's failure (`controller.core`: the grace). A shorter cut may fail over the agents
    # whose beat it caught in flight: they retry only after their own 1 s request timeout.
    own = [r for r in summary["round_log"] if r["fault"] == "pause-controller"
           or (r["fault"] == "cut-controller-from-agents" and r["fault_s"] > HEARTBEAT_TIMEOUT_S)]
    assert len(own) == 3 and [r["failovers"] for r in own] == [0, 0, 0], own
    assert summary["events"].get("controller-stalled") and summary["events"].get("controller-deaf"), brief
    assert summary["lost"] == summary["unreadable"] == 0, brief
    assert summary["violations"] == [], brief
    assert summary["linearizable"], summary["linearizability"]
    assert summary["stranded"] == 0, brief
    assert not failed(summary)
    # the run did what it says: many acknowledged writes, hot keys read and written by every client
    assert summary["acknowledged_writes"] > 5000 and summary["history"]["hot_operations"] > 5000, brief
    assert summary["operations"]["read_ok"] > 1000, brief


@pytest.mark.timeout(600)
def test_a_server_dead_while_the_controller_restarted_rejoins_when_it_comes_back(tmp_path) -> None:
    with MetaFlowNet(builders.fat_tree(4, servers=8), capacity=1_000_000, workdir=tmp_path,
                     controller_args=["--no-auto-split"]) as mf:
        servers = mf.view(REST.servers).servers
        victim = next(n for n, s in sorted(servers.items()) if s.blocks)
        agent = mf.kill_agent(victim)
        settled(mf, victim, 60)      # failed over, every block backed up again
        mf.restart_controller()      # rebuilds from the seven agents that answer
        time.sleep(1)
        mf.revive_agent(agent)
        assert back_in_service(mf, victim, 30), mf.view(REST.servers).servers.get(victim)
