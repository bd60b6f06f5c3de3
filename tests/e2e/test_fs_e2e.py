"""metaflow-fs in a Mininet client host, over the fabric: every request of
the mount goes to its key's MetaDataID through real Open vSwitch switches
(k=4 fat-tree, 8 servers, a backup per block). A tar x of a source tree,
and renames of 100 files from one directory to another, run on the mount
while the busiest storage server's agent is killed with kill -9; the tar
finishes without an error, every renamed file is found exactly once, in
its new directory, diff -r finds the tree whole,
and git, find, du and ls -lR work on it afterwards. (rsync, fs_mark and
postmark run on a standalone mount in tests/integration/test_fs_mount.py;
here they would only add a minute to `make test`. The host has a mount
namespace of its own: every tool runs in it, through `FuseMount.run`.)"""

from __future__ import annotations

import subprocess
import tarfile
import time
import warnings
from pathlib import Path

import os_ken
import pytest

from client_lib.api.rest import REST
from mininet_scenarios.fs_mount import FuseMount
from mininet_scenarios.metaflow_net import MetaFlowNet
from tests.e2e.test_metaflow_e2e import wait_for
from topology import builders

warnings.filterwarnings("ignore", category=DeprecationWarning)
SOURCE = Path(os_ken.__file__).parent / "services"
"""125 files in 19 directories of os-ken's source (no bytecode)."""


def _files(mount: FuseMount, tree: Path) -> int:
    return len(mount.run("find", tree, "-type", "f", check=False).stdout.split())


@pytest.mark.timeout(600)
def test_tar_on_a_mount_in_a_client_host_survives_a_killed_server(tmp_path: Path) -> None:
    archive = tmp_path / "src.tar"
    with tarfile.open(archive, "w") as packing:
        packing.add(SOURCE, arcname="src", filter=lambda i: None if "__pycache__" in i.name else i)
    expected = sum(1 for p in SOURCE.rglob("*") if p.is_file() and "__pycache__" not in p.parts)
    graph = builders.fat_tree(4, servers=8)
    with MetaFlowNet(graph, capacity=100_000, workdir=tmp_path,
                     controller_args=["--bootstrap", "preallocate:2"]) as mf:
        host = mf.running.ns(mf.hosts("client")[0])
        with FuseMount(tmp_path / "mnt", netns=host, log_path=tmp_path / "fs.log",
                       attr_timeout=0, entry_timeout=0) as mount:
            tree = mount.path / "src"
            mount.run("sh", "-c", f"mkdir {mount.path}/a {mount.path}/b && cd {mount.path}/a && "
                                  "for i in $(seq 100); do echo $i > f$i; done")
            moves = f"cd {mount.path} && for i in $(seq 100); do mv a/f$i b/f$i || exit 1; sleep 0.05; done"
            mover = subprocess.Popen(host.command("sh", "-c", moves),
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
            tar = subprocess.Popen(host.command("tar", "xf", str(archive), "-C", str(mount.path)),
                                   stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
            wait_for(lambda: _files(mount, tree) > 40, 120)
            servers = mf.view(REST.servers).servers
            victim = max((n for n, s in servers.items() if s.state == "busy"), key=lambda n: servers[n].keys)
            killed_at = time.monotonic()
            mf.kill_agent(victim)
            _, err = tar.communicate(timeout=300)
            finished = time.monotonic() - killed_at
            assert tar.returncode == 0, err[-3000:]
            _, moved_err = mover.communicate(timeout=300)
            assert mover.returncode == 0, moved_err[-3000:]
            assert mount.run("ls", mount.path / "a").stdout.split() == []
            moved = sorted(mount.run("ls", mount.path / "b").stdout.split())
            assert moved == sorted(f"f{i}" for i in range(1, 101))
            assert mount.run("cat", mount.path / "b" / "f42").stdout == "42\n"
            assert _files(mount, tree) == expected
            mount.run("diff", "-r", "--exclude=__pycache__", SOURCE, tree)
            takeover = next(e for e in mf.events("takeover") if e["server"] == victim)
            assert not mf.events("DATA-LOST"), mf.events("DATA-LOST")
            git = ["git", "-c", "user.email=t@example.org", "-c", "user.name=t", "-C", str(tree)]
            for step in (["init", "-q"], ["add", "-A"], ["commit", "-qm", "on the fabric"]):
                mount.run(*git, *step)
            assert mount.run(*git, "log", "--format=%s").stdout.split("\n")[0] == "on the fabric"
            assert int(mount.run("du", "-s", "--block-size=1", tree).stdout.split()[0]) > 0
            assert "__init__.py" in mount.run("ls", "-lR", tree).stdout
        print(f"tar of {expected} files through a kill -9 of {victim} (take-over: {takeover}); "
              f"tar done {finished:.1f} s after the kill")
