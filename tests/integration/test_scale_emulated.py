"""The issue's short form of `make bench-scale`: a k=8 fat-tree (80 emulated
OpenFlow 1.0 switches, 128 emulated agents) against the real controller,
built, and checked for the whole fabric: every switch holds exactly the
planner's table, and every ID of the space reaches its owner from every edge
switch through the tables the switches hold."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest

from benchmarks.scale import run_size


def measured(tmp_path: Path, **kwargs: Any) -> dict[str, Any]:
    """`run_size` in `tmp_path`, its whole result kept there as result.json
    beside the controllers' logs (an assertion's message is cut short), and
    no controller's LLDP loop having failed, no emulated switch having failed
    on a message from a controller."""
    result = asyncio.run(run_size(workdir=tmp_path, restart=False, settle=1.0, **kwargs))
    (tmp_path / "result.json").write_text(json.dumps(result, indent=1, default=str))
    for log in tmp_path.glob("*.log"):   # the LLDP loop says what it survived: nothing, here
        assert "the LLDP loop failed" not in log.read_text(errors="replace"), log
    assert result["switch_session_errors"] == [], result["switch_session_errors"]
    return result


@pytest.mark.timeout(120)
def test_a_k8_fat_tree_of_emulated_switches_is_built_and_routes_every_id(tmp_path: Path) -> None:
    result = measured(tmp_path, k=8, servers=128, steady_s=3.0)
    assert (result["switches"], result["links"], result["servers"]) == (80, 256, 128)
    assert result["registration_failed"] == []
    check = result["check"]
    assert check["differing_count"] == 0 and check["misdelivered_from"] == [], check
    assert check["ingress_checked"] == 32 and check["owners"] == 64 and check["ok"]
    assert result["flow_mods"] > 0 and result["barriers"] >= 80   # the build confirmed every switch
    steady = result["steady"]   # the built fabric's cost: the agents beat, the controller was measured
    assert steady["datagrams"] + steady["http_beats"] > 0 and steady["cpu_pct_mean"] is not None, steady


@pytest.mark.timeout(180)
def test_a_standby_rebuilds_the_emulated_fabric_after_the_leader_is_killed(tmp_path: Path) -> None:
    """Two real controllers elected through a real etcd, every emulated switch
    connected to both: the leader is killed after the build and the standby
    rebuilds the same tables without waiting out the heartbeat timeout
    (it knows the leader's servers in service from etcd)."""
    result = measured(tmp_path, k=4, servers=16, heartbeat_s=5.0, leader_change="built")
    assert "error" not in result, result.get("error")
    assert result["controllers"] == 2 and result["check"]["ok"]
    assert result["standby_switches_at_kill"] == result["switches"]   # it had heard every switch
    check = result["check_after_leader_change"]
    assert check["ok"] and check["owners"] == result["check"]["owners"], check
    events = [e["event"] for e in result["leader_change_events"]]
    assert events.index("leader-elected") < events.index("network-built")
    # built once every server registered again, well before the 20 s heartbeat timeout ran out
    assert result["leader_rebuild_planned_at_s"] < result["heartbeat_timeout_s"], result


@pytest.mark.timeout(240)
def test_switch_flaps_and_a_rack_powered_off_leave_every_id_routed_to_a_live_owner(tmp_path: Path) -> None:
    """The issue's faults at scale, short: on the built k=8 fabric, 10 switches
    disconnect and connect again (their tables kept and re-synced), then a
    rack of 12 servers (three edge switches' worth) loses power at once; the
    whole-fabric check holds after each, with the dead servers owning nothing."""
    # 60 s phases: a stalled one ends in the run's own error, with what it reached (the
    # tables that differ from the plan among it), before the test's timeout (one CI run hung)
    result = measured(tmp_path, k=8, servers=128, heartbeat_s=1.0, phase_s=60.0, fault_sizes=(10, 12))
    assert "error" not in result, (result.get("error"), result.get("at_error"))
    flaps, rack = result["faults"]["flaps"], result["faults"]["rack"]
    assert flaps["switches"] == 10 and flaps["check"]["ok"], flaps
    assert rack["servers"] == 12 and rack["edges"] == 3, rack
    assert rack["check"]["ok"] and rack["takeovers"] >= 1, rack
    # (a block whose two copies were both in the dead edges is served empty, said as DATA-LOST:
    # backups avoid their primary's edge, not three edges at once; `data_lost` reports how many)


@pytest.mark.timeout(240)
def test_a_leader_killed_in_the_registration_storm_leaves_the_build_to_the_standby(tmp_path: Path) -> None:
    """The issue's leader change during a registration storm: the leader dies
    when half the agents have registered; they all find the standby, which
    makes the first build, and the whole-fabric check holds. (Each phase
    may take 60 s, so a stalled one ends in the run's own error, with what it
    reached, before the test's timeout.)"""
    result = measured(tmp_path, k=8, servers=128, heartbeat_s=5.0, phase_s=60.0, leader_change="storm")
    assert "error" not in result, (result.get("error"), result.get("at_error"))
    assert 64 <= result["killed_at_registered"] < 128 and result["registration_failed"] == []
    assert result["leader_elected_s"] > 0 and result["check"]["ok"], result["check"]
    assert "check_after_leader_change" not in result   # one kill: the storm's
