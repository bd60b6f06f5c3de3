"""metaflow-fs over the fabric beside the same mount on a central
redis-server in that fabric (issue 28's fair comparison; `make bench-fs`).

A k=4 fat-tree in Mininet (Open vSwitch in user space), 8 storage servers,
each an agent that owns a share of the space from the start (one copy of
each block, ``--fsync batch``: acknowledged means on disk, as redis's
``appendfsync always``). In a client host, a `metaflow-fs` mount sends
every request to its key's MetaDataID through the switches; then the same
mount with ``--central-redis`` sends every request to one redis-server on
a storage host (JuiceFS's layout). Both without kernel caching, the
mdtest-style phases (`benchmarks.mdtest`) with 1, 4 and 16 processes in
the client host, the same files per phase split among them.

This machine has two cores for the switches, the 8 agents, redis, the
mount and the processes together: it shows what the fabric costs a client
against a central server, not how either scales with real machines.

    python -m benchmarks.fs_fabric [--procs 1,4,16] [--files 1200] [--out benchmarks/results]
"""

from __future__ import annotations

import argparse
import json
import secrets
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from benchmarks import mdtest
from benchmarks.publish import publish
from mininet_scenarios.daemons import ROOT
from mininet_scenarios.fs_mount import FuseMount
from mininet_scenarios.hostns import HostNamespace
from mininet_scenarios.metaflow_net import MetaFlowNet
from topology import builders

BACKENDS = ("fabric", "central-redis")
REDIS_PORT = 6379
SERVERS = 8


@contextmanager
def central_redis(host: HostNamespace, workdir: Path) -> Iterator[None]:
    """redis-server in `host`, on all its addresses, ``appendfsync always``."""
    workdir.mkdir(parents=True, exist_ok=True)
    proc = subprocess.Popen(host.command("redis-server", "--port", str(REDIS_PORT), "--bind", "0.0.0.0",
                                         "--protected-mode", "no", "--appendonly", "yes",
                                         "--appendfsync", "always", "--save", "", "--dir", str(workdir)),
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 20
        while host.run("redis-cli", "-p", str(REDIS_PORT), "ping", check=False).stdout.strip() != "PONG":
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError("the central redis-server did not start in its host")
            time.sleep(0.1)
        yield
    finally:
        proc.terminate()
        proc.wait(20)


def phases(client: HostNamespace, path: Path, procs: int, files: int) -> dict[str, dict[str, float]]:
    """One mdtest run in the client host (its processes see the mount there)."""
    done = client.run(sys.executable, "-m", "benchmarks.mdtest", str(path), "--procs", str(procs),
                      "--files", str(files // procs), cwd=ROOT, timeout=3600)
    return json.loads(done.stdout.strip().splitlines()[-1])


def run(procs: list[int], files: int, say: Callable[[str], None]) -> dict:
    results: dict = {"setting": {"servers": SERVERS, "topology": "fat-tree k=4", "mdtest_procs": procs,
                                 "mdtest_files": files}, "backends": {b: {} for b in BACKENDS}}
    with tempfile.TemporaryDirectory(prefix="mf-fs-fabric-") as tmp:
        work = Path(tmp)
        work.chmod(0o755)
        graph = builders.fat_tree(4, servers=SERVERS)
        started = time.monotonic()
        with MetaFlowNet(graph, workdir=work, replicas=1,
                         controller_args=["--bootstrap", f"preallocate:{SERVERS}"]) as mf:
            mf.wait_served()
            say(f"fabric up in {time.monotonic() - started:.0f} s")
            client = mf.running.ns(mf.hosts("client")[0])
            storage = mf.hosts("storage")[0]
            redis_ip = mf.running.host(storage).IP()
            with central_redis(mf.running.ns(storage), work / "redis"):
                for kind in BACKENDS:
                    extra = ["--central-redis", f"{redis_ip}:{REDIS_PORT}"] if kind == "central-redis" else []
                    with FuseMount(work / f"mnt-{kind}", *extra, netns=client, root=secrets.randbits(62) | 2,
                                   attr_timeout=0, entry_timeout=0,
                                   log_path=work / f"fs-{kind}.log") as mount:
                        for n in procs:
                            measured = phases(client, mount.path, n, files)
                            results["backends"][kind][str(n)] = measured
                            say(f"{kind}, {n} processes: " + ", ".join(
                                f"{p} {measured[p]['ops_per_s']}" for p in mdtest.PHASES))
    return results


def report(results: dict) -> str:
    setting = results["setting"]
    fabric, central = (results["backends"][b] for b in BACKENDS)
    lines = [f"mdtest-style phases over the fabric ({setting['servers']} agents, {setting['topology']}), "
             f"{setting['mdtest_files']} files per phase, no kernel caching, ops/s: "
             "MetaFlow / central redis-server in the fabric (ratio)",
             f"  {'':<8}" + "".join(f"{str(n) + ' processes':>28}" for n in setting["mdtest_procs"])]
    for phase in mdtest.PHASES:
        cells = []
        for n in setting["mdtest_procs"]:
            a, b = fabric[str(n)][phase]["ops_per_s"], central[str(n)][phase]["ops_per_s"]
            cells.append(f"{a:>9.1f} /{b:>8.1f} ({a / b:.2f}x)")
        lines.append(f"  {phase:<8}" + "".join(f"{c:>28}" for c in cells))
    return "\n".join(lines)


def plot(results: dict, path: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    procs = results["setting"]["mdtest_procs"]
    fig, axes = plt.subplots(1, len(procs), figsize=(4 * len(procs), 3.6))
    width = 0.38
    for ax, n in zip(axes, procs, strict=True):
        for i, kind in enumerate(BACKENDS):
            rates = [results["backends"][kind][str(n)][p]["ops_per_s"] for p in mdtest.PHASES]
            ax.bar([x + (i - 0.5) * width for x in range(len(mdtest.PHASES))], rates, width,
                   label=f"MetaFlow ({SERVERS} agents)" if kind == "fabric" else "central redis-server")
        ax.set_xticks(range(len(mdtest.PHASES)), mdtest.PHASES, fontsize=8)
        ax.set_title(f"{n} processes", fontsize=9)
    axes[0].set_ylabel("ops/s")
    axes[0].legend(fontsize=8)
    fig.suptitle("metaflow-fs over the fabric (Mininet), no kernel caching")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--procs", default="1,4,16", help="mdtest processes of each run, comma-separated")
    p.add_argument("--files", type=int, default=1200,
                   help="mdtest files per phase, split among the processes")
    p.add_argument("--out", type=Path, default=Path("benchmarks/results"))
    args = p.parse_args(argv)
    results = run([int(n) for n in args.procs.split(",")], args.files,
                  lambda line: print(line, file=sys.stderr, flush=True))
    publish(results, args.out, "fs-fabric", plot, report)
    return 0


if __name__ == "__main__":
    sys.exit(main())
