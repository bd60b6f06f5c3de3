"""The pure parts of the nemesis's faults (`mininet_scenarios.faults`) and of
its report per kind of fault; the faults themselves run for real in
tests/e2e/test_nemesis.py."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from mininet_scenarios.etcd import EtcdProcess
from mininet_scenarios.faults import ROOT_NS, cut_rules, device_of, dropped, paused, port_rules, process_tree
from mininet_scenarios.nemesis import (
    CLASS_OF,
    CLASSES,
    NEEDS_HOOK,
    PAUSE_FACTORS,
    Hooks,
    Round,
    fault_classes,
)


def test_a_cut_drops_both_directions_of_each_address_once_and_is_marked() -> None:
    rules = cut_rules(["10.254.255.254", "10.254.255.253", "10.254.255.254"], "mfx0nemesis")
    assert [r[:3] for r in rules] == [["INPUT", "-s", "10.254.255.253"], ["OUTPUT", "-d", "10.254.255.253"],
                                      ["INPUT", "-s", "10.254.255.254"], ["OUTPUT", "-d", "10.254.255.254"]]
    assert all(r[3:] == ["-m", "comment", "--comment", "mfx0nemesis", "-j", "DROP"] for r in rules)


def test_a_port_cut_drops_both_directions_of_each_loopback_port_once_and_is_marked() -> None:
    rules = port_rules([2379, 2381, 2379], "mfx0nemesis")
    assert [r[:7] for r in rules] == [["INPUT", "-i", "lo", "-p", "tcp", side, port]
                                      for port in ("2379", "2381") for side in ("--dport", "--sport")]
    assert all(r[7:] == ["-m", "comment", "--comment", "mfx0nemesis", "-j", "DROP"] for r in rules)


def test_one_client_port_of_a_real_etcd_cut_leaves_the_other_answering_and_comes_back(tmp_path: Path) -> None:
    """What `Hooks.cluster` does to cut one controller from etcd, on a real etcd."""
    with EtcdProcess(tmp_path / "etcd", extra_clients=1) as etcd:
        assert len(set(etcd.urls)) == 2
        cut = EtcdProcess(tmp_path / "unused", client_port=etcd.client_ports[1])
        assert etcd.healthy() and cut.healthy()
        with dropped([ROOT_NS], port_rules([etcd.client_ports[1]], f"mfut{etcd.peer_port}")):
            assert etcd.healthy() and not cut.healthy()
        assert cut.healthy()
        listed = ROOT_NS.run("iptables", "-w", "-S", "INPUT").stdout
        assert f"mfut{etcd.peer_port}" not in listed


def test_a_disk_that_is_no_block_device_is_refused_by_name() -> None:
    with pytest.raises(ValueError, match="no block device"):
        device_of(Path("/proc"))


def test_the_process_tree_has_the_children_a_throttle_must_move_too() -> None:
    with subprocess.Popen([sys.executable, "-c", "import subprocess, sys; "
                           "subprocess.run([sys.executable, '-c', 'import time; time.sleep(30)'])"]) as proc:
        try:
            for _ in range(100):
                tree = process_tree(proc.pid)
                if len(tree) == 2:
                    break
                time.sleep(0.05)
            assert tree[0] == proc.pid and len(tree) == 2
        finally:
            for pid in reversed(tree):
                subprocess.run(["kill", "-9", str(pid)], check=False)


class _Proc:
    def __init__(self, proc: subprocess.Popen[bytes] | None) -> None:
        self.proc = proc


def test_paused_stops_what_runs_continues_it_after_and_skips_what_does_not() -> None:
    with subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"]) as proc:
        try:
            with paused([_Proc(proc), _Proc(None)]) as pids:
                assert pids == [proc.pid]
                assert _settled_state(proc.pid) == "T"
            assert _settled_state(proc.pid) in "SR"
        finally:
            proc.kill()


def _settled_state(pid: int) -> str:
    """The process's state once a signal sent to it has taken effect (delivery is asynchronous)."""
    states = []
    for _ in range(40):
        states.append(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0])
        if len(states) > 3 and len(set(states[-3:])) == 1:
            break
        time.sleep(0.05)
    return states[-1]


def test_every_fault_has_one_class_and_the_pauses_span_the_heartbeat_timeout() -> None:
    assert sorted(CLASS_OF) == sorted(f for faults in CLASSES.values() for f in faults)
    assert set(NEEDS_HOOK) <= set(CLASS_OF)
    assert min(PAUSE_FACTORS) < 1 < max(PAUSE_FACTORS) and max(PAUSE_FACTORS) >= 4


def test_one_controller_cannot_inject_the_faults_of_several() -> None:
    hooks = Hooks(leader=lambda: None, controller_addresses=lambda: ["10.254.255.254"],
                  kill_leader=lambda: lambda: None)
    assert set(hooks.unavailable()) == set(NEEDS_HOOK)


def test_the_report_per_kind_counts_rounds_fail_overs_and_time_to_serve_again() -> None:
    def round_(number: int, fault: str, **fields: Any) -> Round:
        return Round(number, fault, "h1", **fields)

    report = fault_classes([round_(1, "pause-primary", fault_s=0.5, served_s=0.6),
                            round_(2, "pause-primary", fault_s=1.5, served_s=1.7, failovers=1),
                            round_(3, "kill-primary", kills=1, settle_s=1.2, failovers=1),
                            round_(4, "pause-primary", fault_s=4.0, served_s=1.4, failovers=1),
                            round_(5, "kill-leader", served_s=2.5, new_leader=True)])
    assert list(report) == ["kill-primary", "pause-primary", "kill-leader"]
    assert report["kill-leader"]["leader_changes"] == 1 and report["kill-leader"]["class"] == "leader"
    assert report["pause-primary"] == {"class": "pause", "injected": 3, "failovers": 2, "leader_changes": 0,
                                       "fault_s": [0.5, 1.5, 4.0], "served_s": {"median": 1.4, "max": 1.7}}
    assert report["kill-primary"]["served_s"] == {"median": 1.2, "max": 1.2}
