"""Issue 25's faults of the leader and of the coordination service in the
nemesis, inside `make test`: two controllers and one etcd, one round of
each kind of pause (a primary, a backup, the leader, etcd) and of each
partition (an agent from the controllers, the controllers from every agent,
the leader from etcd while the standby reaches it, the standby from etcd
while the leader keeps it), two kill -9s of the leader, and two kills of
servers; nothing acknowledged may be lost, no ID served twice, no MetaFlow
entry removed by a takeover, every history linearizable
(`mininet_scenarios.nemesis --controllers 2`; `make chaos-ha` runs more)."""

from __future__ import annotations

import warnings

import pytest

from mininet_scenarios.nemesis import PARTITIONS, PAUSES, Settings, failed, run

warnings.filterwarnings("ignore", category=DeprecationWarning)


@pytest.mark.timeout(1200)
def test_the_leader_and_etcd_paused_cut_and_killed_lose_nothing_and_every_history_is_linearizable(
        tmp_path) -> None:
    summary = run(Settings(controllers=2, kills=2, pauses=4, partitions=4, leader_kills=2, seed=5),
                  say=lambda _text: None,
                  keep=tmp_path / "nemesis")   # its histories and every daemon's log, kept on failure
    brief = {k: v for k, v in summary.items() if k not in ("round_log", "settings")}
    assert "stuck" not in summary, brief
    assert summary["unavailable"] == {}, brief   # two controllers: every fault can be injected
    classes = summary["classes"]
    others = (*PAUSES, *PARTITIONS)
    assert {f: classes[f]["injected"] for f in others} == dict.fromkeys(others, 1), brief
    # every kill of the leader hands the lease to the other controller
    assert classes["kill-leader"]["injected"] == classes["kill-leader"]["leader_changes"] == 2, brief
    assert summary["controller_kills"] >= 2, brief
    # the standby cut from etcd takes nothing over and fails nobody over
    assert classes["cut-coordination-side"]["leader_changes"] == 0, brief
    assert classes["cut-coordination-side"]["failovers"] == 0, brief
    assert summary["lost"] == summary["unreadable"] == 0, brief
    assert summary["violations"] == [], brief   # among them: no entry removed by a takeover
    assert summary["linearizable"], summary["linearizability"]
    assert summary["stranded"] == 0, brief
    assert not failed(summary)
    assert summary["acknowledged_writes"] > 2000 and summary["history"]["hot_operations"] > 1000, brief
