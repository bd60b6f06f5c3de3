"""`metaflowctl bench`: MetaFlow against hash mapping, a central coordinator,
One-Hop, Chord and G-HBA, side by side in one Mininet run.

One network (by default a k=4 fat-tree: 8 storage servers, 8 client hosts,
the controller, kernel-mode NAT agents; `topology` names another, such as
the paper's testbed, `builders.named`), one namespace loaded once, and every
scheme in turn on it. Every scheme stores each key on the same server (the
MetaFlow partition), the same agent serves it from the same store; what
differs is how a client finds the server: MetaFlow sends to the MetaDataID
and the switches route; hash mapping computes the server; the others ask
`metaflow-lookupd` on the storage servers, where the lookup competes with
the store for the CPU, as in the paper.

The sweep: for each level of requests in flight (spread over the client
hosts), `reps` rounds, and in
each round every scheme once (the order rotates), so slow drift on a shared
machine hits all schemes alike; a scheme stops climbing once a level gains
less than `growth` over its best. Each run is timed by the clients, and CPU
comes from /proc for the process groups (agents, lookup servers, clients,
ovs-vswitchd) between snapshots around it. The kernel NAT's CPU, which no
process of ours owns, comes from an A/B measurement first
(`benchmarks.nat_cost`).

Headline numbers per scheme: ops/s at its best level (the paper's
"maximum number of operations"), latency at the lowest level (the paper's
"average time to complete an operation", unloaded), CPU per op at the best
level.
"""

from __future__ import annotations

import asyncio
import json
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import IO

import numpy as np
from tqdm import tqdm

from benchmarks import nat_cost
from benchmarks.baselines.ghba import group_size_for
from benchmarks.baselines.lookupd import Membership
from benchmarks.baselines.rpc import RpcPool
from benchmarks.bench_client import SCHEMES
from benchmarks.cpu import CpuMeter, pid_of
from benchmarks.mix import entries
from client_lib.api.rest import REST
from client_lib.constants import LOOKUP_PORT
from mininet_scenarios.daemons import ROOT
from mininet_scenarios.metaflow_net import MetaFlowNet
from topology import builders

OVS_PIDFILE = Path("/var/run/openvswitch/ovs-vswitchd.pid")
TARGETS = {"latency_vs_hash": 1.05, "throughput_vs_hash": 1.0, "throughput_vs_chord": 3.0, "nat_share": 0.02,
           "mdtest_vs_hash": 1.0}
"""Issue 13's: MetaFlow level with hash mapping (mdtest: in every phase), 3x Chord,
and address handling at most 2 % of the service's CPU."""


@dataclass
class BenchConfig:
    topology: str = builders.DEFAULT_TOPOLOGY
    """A `builders.named` topology: "testbed", "fat-tree:8", ..."""
    entries: int = 20000
    seconds: float = 3.0
    reps: int = 3
    levels: tuple[int, ...] = (1, 8, 32, 128, 256)   # requests in flight, all client hosts together
    growth: float = 1.05
    get_fraction: float = 0.2
    zipf: float = 0.9
    mdtest_files: int = 200
    reuse: bool = False
    store: str = "leveldb"
    seed: int = 1
    nat_rounds: int = 4
    nat_ops: int = 3000
    schemes: tuple[str, ...] = SCHEMES
    mgmt_subnet: str | None = None
    """The management network's: another lets the run share the machine with another scenario."""
    replicas: int = 1
    """Copies of every block: 1 compares lookups alone; 2 with `fsync` batch is how an
    operator runs it (issue 27's mdtest row)."""
    fsync: str = "off"
    """The agents' --fsync."""
    heartbeat: tuple[float, float] | None = None
    """The agents' --heartbeat and the controller's --heartbeat-timeout (default theirs): on a
    large fabric on a loaded machine, a false take-over would move blocks under the baselines'
    fixed partition (docs/testbed.md)."""

    def __post_init__(self) -> None:
        builders.named(self.topology)   # a bad name or size fails now, not after the NAT A/B

    @classmethod
    def quick(cls) -> BenchConfig:
        return cls(entries=4000, seconds=1.5, reps=1, levels=(1, 16, 128), mdtest_files=0,
                   nat_rounds=2, nat_ops=1500)


@dataclass
class Run:
    """One scheme at one level for `seconds`, all clients at once."""

    scheme: str
    level: int
    rep: int
    ops: int
    ops_per_s: float
    mean_ms: float
    p50_ms: float
    p99_ms: float
    lookup_rpcs_per_op: float
    cpu_us_per_op: dict[str, float]
    errors: int
    moved: int
    error_sample: list[str] = field(default_factory=list)


class ClientFleet:
    """One long-lived `bench_client` per client host, fed JSON lines."""

    def __init__(self, mf: MetaFlowNet, membership: Path, cfg: BenchConfig) -> None:
        self.procs: dict[str, subprocess.Popen] = {}
        self.logdir = membership.parent
        for index, node in enumerate(mf.hosts("client")):
            argv = [sys.executable, "-m", "benchmarks.bench_client", "--client", node, "--index", str(index),
                    "--membership", str(membership), "--entries", str(cfg.entries), "--seed", str(cfg.seed),
                    "--get-fraction", str(cfg.get_fraction), "--zipf", str(cfg.zipf),
                    "--mdtest-files", str(cfg.mdtest_files), *(["--reuse"] if cfg.reuse else [])]
            self.procs[node] = subprocess.Popen(mf.running.ns(node).command(*argv), cwd=ROOT, text=True,
                                                stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                                stderr=open(self.logdir / f"{node}.err", "w"))
        for node in self.procs:
            self._read(node)

    @property
    def pids(self) -> list[int]:
        return [p.pid for p in self.procs.values()]

    def _read(self, node: str) -> dict:
        line = _pipe(self.procs[node].stdout).readline()
        if not line:
            log = (self.logdir / f"{node}.err").read_text()
            raise RuntimeError(f"bench client {node} died: {log[-2000:]}")
        return json.loads(line)

    def run(self, command: dict, shares: bool = False) -> list[dict]:
        """Start a command on every client at once, its `concurrency` spread
        over them (so 1 is one request in flight in the whole network); wait
        for all. `shares` splits the namespace for loading."""
        n = len(self.procs)
        for i, proc in enumerate(self.procs.values()):
            cmd = dict(command, concurrency=command["concurrency"] // n + (i < command["concurrency"] % n))
            if shares:
                cmd["share"] = [i, n]
            stdin = _pipe(proc.stdin)
            stdin.write(json.dumps(cmd) + "\n")
            stdin.flush()
        return [self._read(node) for node in self.procs]

    def close(self) -> None:
        for proc in self.procs.values():
            _pipe(proc.stdin).close()
        for proc in self.procs.values():
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


class LookupFleet:
    """`metaflow-lookupd` on every storage host."""

    def __init__(self, mf: MetaFlowNet, membership: Path, names: dict[str, str]) -> None:
        self.procs: dict[str, subprocess.Popen] = {}
        self.mgmt = {}
        for node, name in names.items():
            argv = [sys.executable, "-m", "benchmarks.baselines.lookupd", "--name", name,
                    "--membership", str(membership), "--listen", f"0.0.0.0:{LOOKUP_PORT}"]
            self.procs[name] = subprocess.Popen(mf.running.ns(node).command(*argv), cwd=ROOT, text=True,
                                                stdout=subprocess.PIPE,
                                                stderr=open(membership.parent / f"lookupd-{name}.err", "w"))
            self.mgmt[name] = f"{mf.running.mgmt_ips[node]}:{LOOKUP_PORT}"
        for name, proc in self.procs.items():
            if not _pipe(proc.stdout).readline().startswith("ready"):
                raise RuntimeError(f"lookupd {name} did not start (exit {proc.poll()})")

    @property
    def pids(self) -> list[int]:
        return [p.pid for p in self.procs.values()]

    def call_all(self, calls: dict[str, list[tuple]]) -> dict[str, list]:
        """Run RPCs against each lookupd over the management network, in order per server."""
        async def go() -> dict[str, list]:
            pool = RpcPool(timeout=60)
            try:
                async def one(name: str, todo: list[tuple]) -> list:
                    return [await pool.call(self.mgmt[name], *args) for args in todo]
                answers = await asyncio.gather(*(one(n, c) for n, c in calls.items()))
            finally:
                pool.close()
            return dict(zip(calls, answers, strict=True))
        return asyncio.run(go())

    def stop(self) -> list[str]:
        failures = []
        for proc in self.procs.values():
            proc.send_signal(signal.SIGTERM)
        for name, proc in self.procs.items():
            try:
                if proc.wait(10):
                    failures.append(f"lookupd {name} exited with {proc.returncode}")
            except subprocess.TimeoutExpired:
                proc.kill()
                failures.append(f"lookupd {name} ignored SIGTERM")
        return failures


def _pipe(stream: IO[str] | None) -> IO[str]:
    """A pipe a fleet opened (Popen types every stream as optional)."""
    if stream is None:
        raise RuntimeError("the process was started without this pipe")
    return stream


def write_membership(mf: MetaFlowNet, path: Path) -> tuple[Membership, dict[str, str]]:
    """The partition as the controller built it, plus where each lookupd
    listens; returns it and storage host node -> server name."""
    servers = mf.view(REST.servers).servers
    scenario = mf.running
    names = {node: scenario.topo.names[node] for node in mf.hosts("storage")}
    ordered = sorted(servers)
    data = {"space": scenario.space, "coordinator": ordered[0], "group_size": group_size_for(len(ordered)),
            "servers": {name: {"data_ip": s.data_ip, "lookup": f"{s.data_ip}:{LOOKUP_PORT}",
                               "blocks": [str(b) for b in s.blocks]} for name, s in servers.items()}}
    path.write_text(json.dumps(data, indent=1))
    return Membership.load(data), names


def load_ghba_filters(lookups: LookupFleet, members: Membership, cfg: BenchConfig) -> None:
    """Each server's filter gets the keys it stores, then every server
    fetches the replicas it holds (G-HBA's replica update)."""
    ring = members.chord()
    own: dict[str, list[bytes]] = {name: [] for name in members.data_ip}
    for entry in entries(cfg.entries, cfg.seed):
        own[ring.owner(entry.key)].append(entry.key)
    lookups.call_all({name: [("GADD", b"\0".join(keys))]
                      for name, keys in own.items()})
    lookups.call_all({name: [("GSYNC",)] for name in members.data_ip})


def aggregate(scheme: str, level: int, rep: int, results: list[dict], cpu: dict[str, float]) -> Run:
    lat = np.concatenate([np.asarray(r["latency_us"], dtype=float) for r in results]) / 1000
    results = [r for r in results if r["ops"]]   # idle clients (fewer requests in flight than clients)
    ops = sum(r["ops"] for r in results)
    per_op = {name: round(seconds * 1e6 / max(ops, 1), 1) for name, seconds in cpu.items()}
    return Run(scheme, level, rep, ops, round(sum(r["ops"] / r["seconds"] for r in results), 1),
               round(float(lat.mean()), 3) if ops else 0.0,
               round(float(np.percentile(lat, 50)), 3) if ops else 0.0,
               round(float(np.percentile(lat, 99)), 3) if ops else 0.0,
               round(sum(r.get("lookup_rpcs", 0) for r in results) / max(ops, 1), 3), per_op,
               sum(r["errors"] for r in results), sum(r.get("moved", 0) for r in results),
               [e for r in results for e in r["error_sample"]][:3])


class Sweep:
    """Interleaved runs at rising concurrency until throughput stops growing."""

    def __init__(self, clients: ClientFleet, meter: CpuMeter, cfg: BenchConfig, progress: tqdm) -> None:
        self.clients, self.meter, self.cfg, self.progress = clients, meter, cfg, progress
        self.runs: list[Run] = []

    def one(self, scheme: str, level: int, rep: int, phase: str = "mixed") -> Run:
        self.progress.set_description(f"{phase} {scheme} x{level}")
        before = self.meter.snapshot()
        # the mixed phase runs for `seconds`; the mdtest phases until their files are done
        seconds = self.cfg.seconds if phase == "mixed" else 600
        results = self.clients.run({"phase": phase, "scheme": scheme, "concurrency": level,
                                    "seconds": seconds})
        run = aggregate(scheme, level, rep, results, CpuMeter.delta(before, self.meter.snapshot()))
        self.progress.update(1)
        return run

    def best(self, scheme: str, below: int | None = None) -> float:
        levels = {r.level for r in self.runs if r.scheme == scheme and (below is None or r.level < below)}
        return max((self.median(scheme, level, "ops_per_s") for level in levels), default=0.0)

    def median(self, scheme: str, level: int, attr: str) -> float:
        return statistics.median(getattr(r, attr) for r in self.runs
                                 if r.scheme == scheme and r.level == level)

    def sweep(self) -> None:
        climbing = list(self.cfg.schemes)
        for i, level in enumerate(self.cfg.levels):
            for rep in range(self.cfg.reps):
                shift = (i * self.cfg.reps + rep) % len(climbing)
                for scheme in climbing[shift:] + climbing[:shift]:
                    self.runs.append(self.one(scheme, level, rep))
            if i:
                climbing = [s for s in climbing if self.median(s, level, "ops_per_s")
                            >= self.cfg.growth * self.best(s, below=level)]
            if not climbing:
                break


def summarize(sweep: Sweep, nat: dict) -> dict[str, dict]:
    out = {}
    for scheme in sweep.cfg.schemes:
        runs = [r for r in sweep.runs if r.scheme == scheme]
        levels = sorted({r.level for r in runs})
        peak = max(levels, key=lambda lv: sweep.median(scheme, lv, "ops_per_s"))
        at_peak = [r for r in runs if r.level == peak]
        cpu = {g: statistics.median(r.cpu_us_per_op[g] for r in at_peak) for g in at_peak[0].cpu_us_per_op}
        nat_us = nat.get("nat_cpu_us_per_op", 0.0) if scheme == "metaflow" else 0.0
        out[scheme] = {
            "ops_per_s": round(sweep.median(scheme, peak, "ops_per_s"), 1),
            "peak_concurrency": peak,
            "p50_ms": sweep.median(scheme, levels[0], "p50_ms"),
            "p99_ms": sweep.median(scheme, levels[0], "p99_ms"),
            "mean_ms": sweep.median(scheme, levels[0], "mean_ms"),
            "p50_ms_at_peak": sweep.median(scheme, peak, "p50_ms"),
            "p99_ms_at_peak": sweep.median(scheme, peak, "p99_ms"),
            "lookup_rpcs_per_op": sweep.median(scheme, peak, "lookup_rpcs_per_op"),
            "server_cpu_us_per_op": round(cpu["storage"] + cpu["lookup"], 1),
            "storage_cpu_us_per_op": cpu["storage"], "lookup_cpu_us_per_op": cpu["lookup"],
            "ovs_cpu_us_per_op": cpu["ovs"], "client_cpu_us_per_op": cpu["client"],
            "machine_cpu_us_per_op": cpu["machine"], "nat_cpu_us_per_op": nat_us,
            "errors": sum(r.errors for r in runs), "moved": sum(r.moved for r in runs),
            "sweep": [{"concurrency": lv, **{a: sweep.median(scheme, lv, a) for a in
                                                        ("ops_per_s", "mean_ms", "p50_ms", "p99_ms")}}
                      for lv in levels],
        }
    return out


def paired_ratio(runs: list[dict], a: str, b: str, attr: str, level_a: int, level_b: int) -> float | None:
    """Median over repetitions of a's value / b's value in the same round.
    Rounds run every scheme back to back, so a ratio within a round cancels
    the drift of a shared machine that a ratio of two medians keeps."""
    def by_rep(scheme: str, level: int) -> dict[int, float]:
        return {r["rep"]: r[attr] for r in runs if r["scheme"] == scheme and r["level"] == level}
    first, second = by_rep(a, level_a), by_rep(b, level_b)
    ratios = [first[rep] / second[rep] for rep in first if rep in second and second[rep]]
    return statistics.median(ratios) if ratios else None


def targets(schemes: dict[str, dict], nat: dict, runs: list[dict]) -> dict[str, dict]:
    """The issue's targets as paired ratios: latency at the lowest
    concurrency, throughput at each scheme's best level."""
    out = {}

    def check(name: str, value: float | None, limit: float, at_most: bool) -> None:
        if value is not None:
            out[name] = {"value": round(value, 3), "target": limit,
                         "met": value <= limit if at_most else value >= limit}

    def peak(scheme: str) -> int:
        return schemes[scheme]["peak_concurrency"]

    if "metaflow" in schemes and "hash" in schemes:
        lowest = min(r["level"] for r in runs)
        check("latency_vs_hash", paired_ratio(runs, "metaflow", "hash", "p50_ms", lowest, lowest),
              TARGETS["latency_vs_hash"], True)
        check("throughput_vs_hash", paired_ratio(runs, "metaflow", "hash", "ops_per_s", peak("metaflow"),
                                                 peak("hash")), TARGETS["throughput_vs_hash"], False)
    if "metaflow" in schemes and "chord" in schemes:
        check("throughput_vs_chord", paired_ratio(runs, "metaflow", "chord", "ops_per_s", peak("metaflow"),
                                                  peak("chord")), TARGETS["throughput_vs_chord"], False)
    if nat:
        check("nat_share", nat["nat_share_of_service"], TARGETS["nat_share"], True)
    return out


def mdtest_targets(phases: dict[str, dict[str, dict]]) -> dict[str, dict]:
    """MetaFlow's ops/s over hash mapping's in each mdtest phase (one run each:
    no rounds to pair)."""
    if "metaflow" not in phases or "hash" not in phases:
        return {}
    out = {}
    for phase, run in phases["metaflow"].items():
        value = run["ops_per_s"] / phases["hash"][phase]["ops_per_s"]
        out[f"mdtest_{phase}_vs_hash"] = {"value": round(value, 3), "target": TARGETS["mdtest_vs_hash"],
                                          "met": value >= TARGETS["mdtest_vs_hash"]}
    return out


def mdtest(sweep: Sweep, lookups: LookupFleet, members: Membership, cfg: BenchConfig) -> dict:
    """create, stat, remove of fresh files per client, each scheme in turn;
    G-HBA's replicas are refreshed between phases, as its periodic update would."""
    out: dict[str, dict] = {}
    level = cfg.levels[min(1, len(cfg.levels) - 1)]
    for scheme in cfg.schemes:
        for phase in ("create", "stat", "remove"):
            run = sweep.one(scheme, level, 0, phase)
            out.setdefault(scheme, {})[phase] = {"ops_per_s": run.ops_per_s, "p50_ms": run.p50_ms,
                                                 "lookup_rpcs_per_op": run.lookup_rpcs_per_op,
                                                 "errors": run.errors}
            if scheme == "ghba":
                lookups.call_all({name: [("GSYNC",)] for name in members.data_ip})
    return out


@dataclass
class Harness:
    """The benchmark's network, loaded: what `harness` yields."""

    mf: MetaFlowNet
    members: Membership
    lookups: LookupFleet
    clients: ClientFleet


@contextmanager
def harness(cfg: BenchConfig, workdir: Path, progress: tqdm) -> Iterator[Harness]:
    """The fat-tree with the controller and agents, a lookup service on every
    storage server and a bench client on every client host, the namespace
    loaded; everything stopped after, and a lookup server that did not stop
    cleanly raised."""
    progress.set_description("network up")
    graph = builders.with_clients(builders.named(cfg.topology))
    servers = len(builders.storage_hosts(graph))
    # every server owns a share from the start (the controller's default gives
    # half of them blocks and the rest wait for splits); by default one copy of
    # each block, as the baselines keep, and no disk sync per write: this
    # compares lookups (replication's cost is `make bench-replication`'s, a
    # sync's `benchmarks.bench_fsync`'s); --replicas and --fsync give every
    # scheme the same storage with copies and syncs
    with MetaFlowNet(graph, store=cfg.store, workdir=workdir, replicas=cfg.replicas,
                     mgmt_subnet=cfg.mgmt_subnet, agent_args=["--fsync", cfg.fsync], heartbeat=cfg.heartbeat,
                     controller_args=["--bootstrap", f"preallocate:{servers}"]) as mf:
        mf.wait_served()
        members, names = write_membership(mf, workdir / "membership.json")
        lookups = LookupFleet(mf, workdir / "membership.json", names)
        failures: list[str] = []
        try:
            clients = ClientFleet(mf, workdir / "membership.json", cfg)
            try:
                progress.set_description("loading namespace")
                loaded = clients.run({"phase": "load", "scheme": "hash", "concurrency": 64}, shares=True)
                if sum(r["errors"] for r in loaded):
                    raise RuntimeError(f"loading failed: {[r['error_sample'] for r in loaded]}")
                load_ghba_filters(lookups, members, cfg)
                yield Harness(mf, members, lookups, clients)
            finally:
                clients.close()
        finally:
            failures += lookups.stop()
    if failures:
        raise RuntimeError("; ".join(failures))


def run_bench(cfg: BenchConfig, show_progress: bool = True, keep: Path | None = None) -> dict:
    """The whole benchmark; `keep` is a directory to leave the daemons' logs in
    (default: a temporary one, deleted)."""
    started = time.monotonic()
    per_scheme = len(cfg.levels) * cfg.reps + 3 * bool(cfg.mdtest_files)
    planned = len(nat_cost.MODES) * cfg.nat_rounds + len(cfg.schemes) * per_scheme
    progress = tqdm(total=planned, disable=not show_progress, file=sys.stderr, unit="run")
    with tempfile.TemporaryDirectory(prefix="mfbench-") as tmp:
        workdir = keep or Path(tmp)
        progress.set_description("NAT A/B")
        nat = nat_cost.measure(cfg.nat_rounds, cfg.nat_ops, workdir, progress) if cfg.nat_rounds else {}
        with harness(cfg, workdir, progress) as bench:
            mf, members, lookups, clients = bench.mf, bench.members, bench.lookups, bench.clients
            ovs = [int(OVS_PIDFILE.read_text())] if OVS_PIDFILE.exists() else []
            meter = CpuMeter({"storage": [pid_of(a.proc) for a in mf.running.agents.values()],
                              "lookup": lookups.pids, "client": clients.pids, "ovs": ovs})
            sweep = Sweep(clients, meter, cfg, progress)
            sweep.sweep()
            ghba_levels = _ghba_levels(lookups)   # of the mixed workload, before mdtest's creates
            phases = mdtest(sweep, lookups, members, cfg) if cfg.mdtest_files else {}
            flows = mf.flow_counts()
            timings = dict(mf.timings)
    progress.close()
    schemes = summarize(sweep, nat)
    if "ghba" in schemes:
        schemes["ghba"].update(levels=ghba_levels, group_size=members.group_size)
    runs = [asdict(r) for r in sweep.runs]
    if "hash" in schemes:
        lowest = min(r["level"] for r in runs)
        for name, entry in schemes.items():
            entry["throughput_vs_hash"] = paired_ratio(runs, name, "hash", "ops_per_s",
                                                       entry["peak_concurrency"],
                                                       schemes["hash"]["peak_concurrency"])
            entry["latency_vs_hash"] = paired_ratio(runs, name, "hash", "p50_ms", lowest, lowest)
    return {"config": {**asdict(cfg), "servers": len(members.data_ip), "clients": len(clients.procs),
                       "topology": mf.graph.graph["name"]},
            "schemes": schemes, "targets": {**targets(schemes, nat, runs), **mdtest_targets(phases)},
            "nat": nat, "mdtest": phases,
            "flows": flows, "runs": runs,
            "timings": {**timings, "total_s": round(time.monotonic() - started, 1)}}


def _ghba_levels(lookups: LookupFleet) -> dict[str, int]:
    totals: dict[str, int] = {}
    for answers in lookups.call_all({name: [("STATS",)] for name in lookups.procs}).values():
        for key, value in json.loads(answers[0]).items():
            if key.startswith("level_"):
                totals[key[6:]] = totals.get(key[6:], 0) + value
    return totals


def with_overrides(cfg: BenchConfig, **changes) -> BenchConfig:
    return replace(cfg, **{k: v for k, v in changes.items() if v is not None})
