"""Issue 11's nemesis inside `make test`: 20 kills on a real MetaFlow in
Mininet, and nothing acknowledged may be lost, no ID served twice, every
history linearizable (`mininet_scenarios.nemesis`; `make chaos` runs 200).

And what the nemesis found in the controller, on its own: a server that was
dead while a restarted controller rebuilt the network must be taken back
when it returns."""

from __future__ import annotations

import time
import warnings

import pytest

from client_lib.api.rest import REST
from mininet_scenarios.metaflow_net import MetaFlowNet
from mininet_scenarios.nemesis import FAULTS, Settings, back_in_service, failed, run, settled
from topology import builders

warnings.filterwarnings("ignore", category=DeprecationWarning)


@pytest.mark.timeout(900)
def test_twenty_kills_lose_nothing_and_every_history_is_linearizable() -> None:
    summary = run(Settings(kills=20, seed=11), say=lambda _text: None)
    brief = {k: v for k, v in summary.items() if k not in ("round_log", "settings")}
    assert "stuck" not in summary, brief
    assert summary["kills"] >= 20 and set(summary["faults"]) >= set(FAULTS) - {"kill-during-split"}, brief
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
