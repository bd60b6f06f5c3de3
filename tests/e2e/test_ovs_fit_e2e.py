"""`benchmarks.ovs_fit` short: the k=4 fat-tree's 20 switches as real Open
vSwitch bridges (userspace datapath, veth links on the topology's ports),
connected to the real controller, which finds all 32 links by LLDP; the
idle costs are measured, and nothing with the run's prefix is left."""

from __future__ import annotations

from pathlib import Path

import pytest

from benchmarks.ovs_fit import measure


@pytest.mark.timeout(180)
def test_the_k4_switches_as_ovs_bridges_are_connected_discovered_and_removed(tmp_path: Path) -> None:
    result = measure(4, idle_s=2.0, timeout=60.0, workdir=tmp_path)
    assert "error" not in result, result
    assert (result["switches"], result["links"], result["ovs_ports"]) == (20, 32, 64)
    assert result["switches_connected_s"] >= 0 and result["links_found_s"] >= 0
    assert result["ovs_rss_mb"] > 0 and result["controller_idle_cpu_pct"] >= 0
    assert result["left_behind"] == []   # Mininet's teardown removed every bridge and veth itself
