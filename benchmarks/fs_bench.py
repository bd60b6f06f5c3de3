"""The file system on MetaFlow, measured side by side in one run (make bench-fs).

1. **Key scheme.** Renaming a directory with n descendants: with the paper's
   full-path keys every descendant is re-keyed (read, written under its new
   path, deleted under the old one: 3 requests each, each to its own
   server); with (parent inode, name) keys, `client_lib.fs.namespace`'s, it is
   one rename of one entry, whatever n. Requests and milliseconds per
   rename, on one standalone agent.
2. **The mount against a central metadata server.** The same FUSE client
   (`metaflow-fs`), its records on MetaFlow (one standalone agent on
   loopback, LevelDB, ``--fsync batch``: acknowledged means on disk) or in
   one central redis-server (``--central-redis``, ``appendfsync always``:
   the same promise), running the mdtest-style driver (`benchmarks.mdtest`:
   create, stat, readdir, rename, remove) with 1, 4 and 16 processes
   (``--procs``; the same files per phase, split among them) on mounts
   without kernel caching (``--attr-timeout 0 --entry-timeout 0``: every
   stat and lookup is a request, so the phases measure the metadata
   service and the mount, not the kernel), then, on mounts with the default
   1 s caching, mdtest with 4 processes, tar x of a source tree checked
   with diff -r, git add and commit of it, fs_mark and postmark.
   Backends alternate over ``--rounds``; the tables give medians.

This machine has two cores and no network between the parts: it measures
what one client's requests cost, not how either scales with servers (the
MetaFlow mount in a Mininet fabric is tested in tests/e2e).

    python -m benchmarks.fs_bench [--quick] [--out benchmarks/results]
"""

from __future__ import annotations

import argparse
import re
import secrets
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import os_ken
from tqdm import tqdm

from benchmarks import mdtest
from benchmarks.publish import publish
from client_lib.client import MetaFlowClient
from client_lib.constants import DEFAULT_SPACE_CIDR
from client_lib.fs.namespace import Namespace
from mininet_scenarios.daemons import AgentProcess
from mininet_scenarios.fs_mount import FuseMount
from nat_agent.redis_server import RedisServer

SOURCE = Path(os_ken.__file__).parent
BACKENDS = ("metaflow", "central-redis")


# -- 1. key scheme --------------------------------------------------------------

def key_scheme(client: MetaFlowClient, sizes: list[int]) -> list[dict]:
    """Requests and ms to rename a directory of n files, both ways."""
    rows = []
    for n in sizes:
        base = f"/kb/{secrets.token_hex(4)}"
        for i in range(n):
            client.put(f"{base}/d/f{i}", b"attributes")
        before, started = client.stats.requests, time.perf_counter()
        for i in range(n):   # the full-path scheme: every descendant re-keyed
            value = client.get(f"{base}/d/f{i}")
            assert value is not None
            client.put(f"{base}/e/f{i}", value)
            client.delete(f"{base}/d/f{i}")
        full = (client.stats.requests - before, (time.perf_counter() - started) * 1000)
        ns = Namespace(client, root=secrets.randbits(62) | 2)
        ns.format()
        d = ns.mkdir(ns.root, "d")
        for i in range(n):
            ns.create(d.ino, f"f{i}")
        before, started = client.stats.requests, time.perf_counter()
        ns.rename(ns.root, "d", ns.root, "e")
        inode = (client.stats.requests - before, (time.perf_counter() - started) * 1000)
        rows.append({"descendants": n, "full_path_requests": full[0], "full_path_ms": round(full[1], 1),
                     "inode_requests": inode[0], "inode_ms": round(inode[1], 2)})
    return rows


# -- 2. the mount ---------------------------------------------------------------

@contextmanager
def backend_mount(kind: str, workdir: Path, agent: AgentProcess, redis: RedisServer,
                  cache: float) -> Iterator[FuseMount]:
    root = secrets.randbits(62) | 2
    extra = ["--central-redis", redis.url.removeprefix("redis://")] if kind == "central-redis" else []
    via = None if extra else f"{agent.host}:{agent.port}"
    with FuseMount(workdir / f"mnt-{kind}", *extra, via=via, root=root, attr_timeout=cache,
                   entry_timeout=cache, log_path=workdir / f"fs-{kind}.log") as mount:
        yield mount


def _timed(*argv: str | Path, cwd: Path | None = None) -> tuple[float, str]:
    started = time.perf_counter()
    out = subprocess.run([str(a) for a in argv], cwd=cwd, capture_output=True, text=True, timeout=1800)
    if out.returncode:
        raise RuntimeError(f"{argv[0]} failed ({out.returncode}): {out.stderr[-2000:]}")
    return time.perf_counter() - started, out.stdout


def tools(mount: FuseMount, archive: Path, files: int, quick: bool, workdir: Path) -> dict[str, float]:
    """Seconds for tar x (+ diff -r), git add and commit; fs_mark and postmark rates."""
    out: dict[str, float] = {}
    out["tar_x_s"], _ = _timed("tar", "xf", archive, "-C", mount.path)
    out["tar_files_per_s"] = round(files / out["tar_x_s"], 1)
    out["diff_r_s"], _ = _timed("diff", "-r", "--exclude=__pycache__", SOURCE, mount.path / "os_ken")
    git: list[str | Path] = ["git", "-c", "user.email=b@example.org", "-c", "user.name=b",
                             "-C", mount.path / "os_ken"]
    _timed(*git, "init", "-q")
    out["git_add_s"], _ = _timed(*git, "add", "-A")
    out["git_commit_s"], _ = _timed(*git, "commit", "-qm", "bench")
    (mount.path / "fsm").mkdir()
    _, report = _timed("fs_mark", "-d", "fsm", "-n", "100" if quick else "400", "-s", "4096", "-t", "2", "-k",
                       cwd=mount.path)
    rows = [line.split() for line in report.splitlines() if line.strip() and line.split()[0].isdigit()]
    out["fs_mark_files_per_s"] = float(rows[-1][3])
    (mount.path / "pm").mkdir()
    config = workdir / "pm.cfg"
    config.write_text(f"set location {mount.path / 'pm'}\nset number {100 if quick else 500}\n"
                      f"set transactions {200 if quick else 1000}\nset size 512 16384\nrun\nquit\n")
    _, report = _timed("postmark", config)
    found = re.search(r"\((\d+) per second\)", report.split("transactions", 1)[1])
    out["postmark_transactions_per_s"] = float(found.group(1)) if found else 0.0
    return {k: round(v, 2) for k, v in out.items()}


def run(quick: bool, rounds: int, procs: list[int], files: int) -> dict[str, Any]:
    """`files` per mdtest phase, split among the processes of each run."""
    results: dict[str, Any] = {"setting": {"quick": quick, "rounds": rounds, "mdtest_procs": procs,
                                 "mdtest_files": files, "cached_procs": CACHED_PROCS,
                                 "source_tree": str(SOURCE)}}
    with tempfile.TemporaryDirectory(prefix="mf-bench-fs-") as tmp:
        workdir = Path(tmp)
        archive = workdir / "os_ken.tar"
        with tarfile.open(archive, "w") as packing:
            packing.add(SOURCE, arcname="os_ken", filter=lambda i: None if "__pycache__" in i.name else i)
        tree_files = sum(1 for p in SOURCE.rglob("*") if p.is_file() and "__pycache__" not in p.parts)
        results["setting"]["tree_files"] = tree_files
        store = f"leveldb:{workdir / 'db'}"
        with AgentProcess(store, "--fsync", "batch", own=[DEFAULT_SPACE_CIDR]) as agent, \
                RedisServer(workdir / "redis", port=0, appendfsync="always") as redis:
            with MetaFlowClient(via=f"{agent.host}:{agent.port}") as client:
                results["key_scheme"] = key_scheme(client, [10, 100] if quick else [10, 100, 1000, 5000])
            rounds_out: dict[str, list[dict]] = {b: [] for b in BACKENDS}
            steps = rounds * len(BACKENDS)
            with tqdm(total=steps, desc="bench-fs", unit="run", file=sys.stderr) as progress:
                for _ in range(rounds):
                    for kind in BACKENDS:
                        with backend_mount(kind, workdir, agent, redis, cache=0) as mount:
                            phases = {str(n): mdtest.run(mount.path, n, files // n) for n in procs}
                        with backend_mount(kind, workdir, agent, redis, cache=1.0) as mount:
                            cached = mdtest.run(mount.path, CACHED_PROCS, files // CACHED_PROCS)
                            measured = {"mdtest": phases, "mdtest_cached": cached,
                                        "tools": tools(mount, archive, tree_files, quick, workdir)}
                        rounds_out[kind].append(measured)
                        progress.update()
        results["backends"] = {kind: _medians(runs) for kind, runs in rounds_out.items()}
        results["rounds"] = rounds_out
    return results


CACHED_PROCS = 4
"""Processes of the mdtest run on a mount with the default kernel caching."""


def _medians(runs: list[dict]) -> dict:
    phases = {n: {p: statistics.median(r["mdtest"][n][p]["ops_per_s"] for r in runs) for p in mdtest.PHASES}
              for n in runs[0]["mdtest"]}
    cached = {p: statistics.median(r["mdtest_cached"][p]["ops_per_s"] for r in runs) for p in mdtest.PHASES}
    measured = {k: statistics.median(r["tools"][k] for r in runs) for k in runs[0]["tools"]}
    return {"mdtest_ops_per_s": phases, "mdtest_cached_ops_per_s": cached, "tools": measured}


def report(results: dict) -> str:
    lines = ["Key scheme: renaming a directory of n files (one standalone agent)",
             f"{'n':>6} {'full-path requests':>19} {'ms':>9} {'inode requests':>15} {'ms':>7}"]
    for row in results["key_scheme"]:
        lines.append(f"{row['descendants']:>6} {row['full_path_requests']:>19} {row['full_path_ms']:>9} "
                     f"{row['inode_requests']:>15} {row['inode_ms']:>7}")
    meta, central = (results["backends"][b] for b in BACKENDS)
    setting = results["setting"]
    lines += ["", f"mdtest-style phases, {setting['mdtest_files']} files per phase, ops/s, MetaFlow / "
              "central redis-server (ratio)", "  no kernel caching:"]
    header = "".join(f"{str(n) + ' processes':>28}" for n in setting["mdtest_procs"])
    lines.append(f"  {'':<8}{header}")

    def cell(a: float, b: float) -> str:
        return f"{a:>9.1f} /{b:>8.1f} ({a / b:.2f}x)"
    for phase in mdtest.PHASES:
        lines.append(f"  {phase:<8}" + "".join(
            f"{cell(meta['mdtest_ops_per_s'][str(n)][phase], central['mdtest_ops_per_s'][str(n)][phase]):>28}"
            for n in setting["mdtest_procs"]))
    lines.append(f"  the default kernel caching (1 s), {setting['cached_procs']} processes:")
    for phase in mdtest.PHASES:
        a, b = meta["mdtest_cached_ops_per_s"][phase], central["mdtest_cached_ops_per_s"][phase]
        lines.append(f"  {phase:<8}{cell(a, b):>28}")
    lines += ["", "Tools (MetaFlow / central redis-server)"]
    for key in meta["tools"]:
        a, b = meta["tools"][key], central["tools"][key]
        lines.append(f"  {key:<28} {a:>9} {b:>9}")
    return "\n".join(lines)


def plot(results: dict, path: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    procs = results["setting"]["mdtest_procs"]
    panels = [(f"{n} processes, no kernel caching", "mdtest_ops_per_s", str(n)) for n in procs]
    cached = results["setting"]["cached_procs"]
    panels.append((f"{cached} processes, 1 s caching", "mdtest_cached_ops_per_s", ""))
    fig, axes = plt.subplots(1, len(panels), figsize=(4 * len(panels), 3.6), sharey=False)
    width = 0.38
    for ax, (title, key, n) in zip(axes, panels, strict=True):
        for i, kind in enumerate(BACKENDS):
            table = results["backends"][kind][key]
            rates = [(table[n] if n else table)[p] for p in mdtest.PHASES]
            ax.bar([x + (i - 0.5) * width for x in range(len(mdtest.PHASES))], rates, width,
                   label="MetaFlow (1 agent)" if kind == "metaflow" else "central redis-server")
        ax.set_xticks(range(len(mdtest.PHASES)), mdtest.PHASES, fontsize=8)
        ax.set_title(title, fontsize=9)
        ax.set_yscale("log")
    axes[0].set_ylabel("ops/s")
    axes[0].legend(fontsize=8)
    fig.suptitle("metaflow-fs, mdtest-style phases")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.fs_bench", description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="small sizes, one round (about 2 minutes)")
    p.add_argument("--rounds", type=int, default=None, help="rounds per backend (default 3, quick 1)")
    p.add_argument("--procs", default="1,4,16", help="mdtest processes of each run, comma-separated")
    p.add_argument("--files", type=int, default=None,
                   help="mdtest files per phase, split among the processes (default 2000, quick 400)")
    p.add_argument("--out", type=Path, default=Path("benchmarks/results"))
    args = p.parse_args()
    rounds = args.rounds or (1 if args.quick else 3)
    files = args.files or (400 if args.quick else 2000)
    procs = [int(n) for n in args.procs.split(",")]
    results = run(args.quick, rounds, procs, files)
    publish(results, args.out, "fs-quick" if args.quick else "fs", plot, report)
    return 0


if __name__ == "__main__":
    sys.exit(main())
