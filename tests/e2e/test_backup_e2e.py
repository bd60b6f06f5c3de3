"""Backup and restore of the demo's 20,000 files in Mininet.

The demo's cluster (k=4 fat-tree, 8 LevelDB servers, two of them busy at
the start, 8,000 keys per server, a backup per block) takes the clients'
20,000 files, splitting as it fills; `metaflowctl snapshot` then copies it
over the management network, the way an operator would from the
controller's host. The network is torn down, a new empty one of the same
shape comes up (its own secret, fresh stores), and `metaflowctl restore`
loads the snapshot, following the splits the restore itself sets off; every
acknowledged file is then read back by a client through the switches, and
the snapshot's count per block is checked by the restore. The times of
both are printed (`-s`): docs/backup.md quotes them.
"""

from __future__ import annotations

import subprocess
import sys
import time
import warnings
from pathlib import Path

import pytest

from client_lib.api.rest import REST
from controller.snapshot_format import read_manifest
from mininet_scenarios.daemons import ROOT
from mininet_scenarios.metaflow_net import MetaFlowNet
from topology import builders

warnings.filterwarnings("ignore", category=DeprecationWarning)
FILES = 20_000
CAPACITY = 8000
"""The demo's (mininet_scenarios/demo.py)."""


"""Not the default: this long test can run beside another scenario."""


def _demo_net(workdir: Path) -> MetaFlowNet:
    return MetaFlowNet(builders.fat_tree(4, servers=8), capacity=CAPACITY, workdir=workdir,
                       controller_args=["--bootstrap", "preallocate:2"])


def _ctl(mf: MetaFlowNet, *args: str) -> tuple[float, str]:
    """Run metaflowctl against `mf`'s controller; seconds it took and its output."""
    assert mf.api is not None and mf.running.secret_file is not None
    started = time.monotonic()
    out = subprocess.run([sys.executable, "-m", "controller.ctl", *args, "--controller", mf.api.base_url,
                          "--secret-file", str(mf.running.secret_file)],
                         cwd=ROOT, capture_output=True, text=True, timeout=900)
    assert out.returncode == 0, out.stderr[-3000:]
    return time.monotonic() - started, out.stdout + out.stderr


@pytest.mark.timeout(1800)
def test_the_demos_files_survive_a_snapshot_and_a_restore_into_a_new_cluster(tmp_path: Path) -> None:
    first, second, snap = tmp_path / "first", tmp_path / "second", tmp_path / "snap"
    first.mkdir()
    second.mkdir()
    with _demo_net(first) as mf:
        results = mf.run_clients(FILES // len(mf.hosts("client")), first)
        assert all(r["errors"] == 0 for r in results), results
        splits = len(mf.view(REST.splits).splits)
        assert splits >= 1
        snapshot_s, said = _ctl(mf, "snapshot", str(snap))
    manifest = read_manifest(snap)
    assert manifest.records == FILES, said
    assert len(manifest.blocks) > 2   # the splits' blocks, each read from its own primary

    with _demo_net(second) as mf:
        assert sum(s.keys for s in mf.view(REST.servers).servers.values()) == 0
        restore_s, said = _ctl(mf, "restore", str(snap))
        assert f"restored {FILES} records" in said, said
        result = mf.verify_acked(first, [])
        assert result["checked"] == FILES and result["missing"] == result["wrong"] == 0, result
        restore_splits = len(mf.view(REST.splits).splits)
    print(f"\nsnapshot of {FILES} files ({len(manifest.blocks)} blocks after {splits} splits, "
          f"{sum(e.bytes for e in manifest.blocks) / 1e6:.1f} MB): {snapshot_s:.1f} s; "
          f"restore into an empty cluster ({restore_splits} splits on the way): {restore_s:.1f} s")
