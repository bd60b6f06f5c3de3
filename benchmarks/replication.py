"""What a second copy of every block costs: write latency and throughput at
r=2 against r=1, with and without the disk sync, and re-replication's rate
and its effect on the foreground, in Mininet.

Every network is a k=4 fat-tree with 8 storage servers (LevelDB), 8 client
hosts and the controller (``--bootstrap preallocate:8``: every server is a
primary from the start, and at r=2 the backup of a block of another rack).
The number of copies is the controller's ``--replicas`` and the disk sync
the agents' ``--fsync``, both fixed at start, so r=1 and r=2 are two
networks of the same graph. They run side by side (on management subnets of
their own), and every measurement is taken on one and then the other (which
goes first alternates), so whatever else loads this shared machine loads
both alike; each ratio is paired within a round. One pair runs with the
agents' default ``--fsync batch``, one with ``--fsync off``: the first
ratio is the cost of replication as shipped, the second the cost of the
extra hop alone.

In each network, with `benchmarks.bench_client` on every client host
(writes only, 250-byte values):

- latency at a moderate, fixed number of writes in flight (1 and 4, spread
  over the client hosts), with a new connection per write (the paper's
  setting, as `make bench` measures; zipf popularity over `entries` paths)
  and on reused connections (a small uniform namespace whose connections
  stay open: the server's share of a write, without the TCP handshake);
- throughput at saturation (128 writes in flight over all client hosts);
  CPU per write from /proc (`benchmarks.cpu`) says where the time goes.

Re-replication then runs on a fresh r=2 network per ``--sync-rate``: the
namespace is loaded, the busiest server is killed (kill -9) under a
foreground load of 4 writes in flight, measured in short windows, until the
controller has promoted its backups and every block has r synced copies
again. The primaries' ``GET /syncs`` give each sync's keys a second, the
controller's ``replicated`` events its interval.

    python -m benchmarks.replication [--quick] [--out benchmarks/results]
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from collections.abc import Callable
from contextlib import ExitStack
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

from benchmarks.bench import OVS_PIDFILE, BenchConfig, ClientFleet, aggregate, write_membership
from benchmarks.cpu import CpuMeter, pid_of
from benchmarks.replication_report import (
    MODES,
    PAIRS,
    Variant,
    foreground,
    format_report,
    plot,
    ratios,
    repair_intervals,
    summarize,
    sync_rates,
    targets,
)
from client_lib.api.admin import ADMIN
from client_lib.api.rest import REST
from mininet_scenarios.metaflow_net import MetaFlowNet
from topology import builders

Say = Callable[[str], None]

MGMT_SUBNETS = ("10.241.0.0/16", "10.242.0.0/16")
"""Management subnets of a pair's two networks (the default one stays free
for tests and the demo; a subnet already routed here is refused, not shared)."""


@dataclass(frozen=True)
class ReplicationConfig:
    k: int = 4
    servers: int = 8
    pairs: tuple[str, ...] = tuple(PAIRS)
    rounds: int = 6
    seconds: float = 1.5
    """Length of each latency or throughput measurement (short, so that a round is short and many
    rounds give a median that one burst of a neighbour's load does not move)."""
    warmup_s: float = 3.0
    """Writes at 8 in flight on each fleet of a network before its first round, not counted: the
    reused-connection clients open their connections, the stores and caches warm up."""
    latency_levels: tuple[int, ...] = (1, 4)
    """Writes in flight (all client hosts together) for the latency pair; the last is the target's."""
    saturation: int = 128
    entries: int = 24000
    """Paths of the new-connection namespace; loaded before a kill, so each block has ~entries/8 keys."""
    reused_entries: int = 64
    """Paths of the reused-connection namespace, uniform: small, so that the warm-up opens a connection
    to nearly every one from every client, and large enough that two of 4 writes in flight rarely
    hit one key (they would wait for each other)."""
    zipf: float = 0.9
    seed: int = 1
    sync_rates: tuple[int, ...] = (1000, 5000, 20000)
    window: float = 0.25
    """Foreground window around the kill, in seconds."""
    settle_s: float = 2.0
    """Pause between loading the namespace and the windows before the kill (LevelDB compacts)."""
    before_s: float = 3.0
    after_s: float = 1.0
    repair_timeout_s: float = 90.0

    @classmethod
    def quick(cls) -> ReplicationConfig:
        return cls(pairs=("fsync batch",), rounds=1, warmup_s=1.0, entries=8000, sync_rates=(5000,),
                   settle_s=1.0, before_s=1.5, after_s=0.5)

    @property
    def measurements(self) -> list[tuple[str, int]]:
        """(connection mode, writes in flight) of each measurement in a round."""
        return [(mode, level) for mode in MODES for level in self.latency_levels] + [("new", self.saturation)]


class Network:
    """One variant's MetaFlowNet with its two client fleets and a CPU meter,
    up and down as a context manager."""

    def __init__(self, variant: Variant, cfg: ReplicationConfig, workdir: Path, mgmt_subnet: str,
                 sync_rate: int | None = None) -> None:
        self.variant = variant
        self.cfg = cfg
        self.workdir = workdir
        self.mf = MetaFlowNet(builders.fat_tree(cfg.k, servers=cfg.servers), replicas=variant.replicas,
                              workdir=workdir, agent_args=["--fsync", variant.fsync], mgmt_subnet=mgmt_subnet,
                              controller_args=["--bootstrap", f"preallocate:{cfg.servers}",
                                               *(["--sync-rate", str(sync_rate)] if sync_rate else [])])
        self.fleets: dict[str, ClientFleet] = {}
        self.meter = CpuMeter({})

    def __enter__(self) -> Network:
        self.mf.__enter__()
        try:
            self._start_clients()
        except BaseException:
            self.__exit__(*sys.exc_info())
            raise
        return self

    def _start_clients(self) -> None:
        mf, cfg = self.mf, self.cfg
        bench = BenchConfig(entries=cfg.entries, get_fraction=0.0, zipf=cfg.zipf, mdtest_files=0,
                            seed=cfg.seed)
        for mode, fleet_cfg in (("new", bench),
                                ("reused", replace(bench, entries=cfg.reused_entries, zipf=0.0, reuse=True))):
            (self.workdir / mode).mkdir()   # each fleet's clients log next to their membership file
            write_membership(mf, self.workdir / mode / "membership.json")
            self.fleets[mode] = ClientFleet(mf, self.workdir / mode / "membership.json", fleet_cfg)
        ovs = [int(OVS_PIDFILE.read_text())] if OVS_PIDFILE.exists() else []
        assert mf.controller is not None
        self.meter = CpuMeter({"agents": [pid_of(a.proc) for a in mf.running.agents.values()],
                               "clients": [pid for f in self.fleets.values() for pid in f.pids],
                               "ovs": ovs, "controller": [pid_of(mf.controller.proc)]})

    def __exit__(self, *exc: object) -> None:
        try:
            for fleet in self.fleets.values():
                fleet.close()
        finally:
            self.mf.__exit__(*exc)

    def writes(self, mode: str, concurrency: int, seconds: float) -> list[dict[str, Any]]:
        return self.fleets[mode].run({"phase": "mixed", "scheme": "metaflow", "concurrency": concurrency,
                                      "seconds": seconds})

    def measure(self, round_number: int, mode: str, concurrency: int) -> dict[str, Any]:
        """One measurement: a `benchmarks.bench.Run` as a dict, named after the variant."""
        before = self.meter.snapshot()
        results = self.writes(mode, concurrency, self.cfg.seconds)
        run = aggregate(self.variant.name, concurrency, round_number, results,
                        CpuMeter.delta(before, self.meter.snapshot()))
        return asdict(run)


def run_pair(label: str, cfg: ReplicationConfig, say: Say) -> dict[str, list[dict[str, Any]]]:
    """Both networks of a pair up at once, every measurement on each in turn;
    the runs per connection mode."""
    variants = PAIRS[label]
    runs: dict[str, list[dict[str, Any]]] = {mode: [] for mode in MODES}
    with tempfile.TemporaryDirectory(prefix="mfrepl-") as tmp, ExitStack() as stack:
        nets: dict[str, Network] = {}
        for variant, subnet in zip(reversed(variants), MGMT_SUBNETS, strict=True):
            started = time.monotonic()
            (Path(tmp) / variant.name).mkdir()
            nets[variant.name] = stack.enter_context(Network(variant, cfg, Path(tmp) / variant.name, subnet))
            for mode in MODES:
                nets[variant.name].writes(mode, 8, cfg.warmup_s)
            say(f"  {variant.name} (--replicas {variant.replicas}, --fsync {variant.fsync}) up and warmed "
                f"up in {time.monotonic() - started:.0f} s")
        for round_number in range(cfg.rounds):
            for i, (mode, level) in enumerate(cfg.measurements):
                order = variants if (round_number + i) % 2 else tuple(reversed(variants))
                cells = []
                for variant in order:
                    run = nets[variant.name].measure(round_number, mode, level)
                    runs[mode].append(run)
                    cells.append(f"{variant.name} p50 {run['p50_ms']:.2f} p99 {run['p99_ms']:.2f} ms "
                                 f"{run['ops_per_s']:.0f}/s" + (f" ({run['errors']} errors)" if run["errors"]
                                                               else ""))
                say(f"  round {round_number + 1}/{cfg.rounds}, {MODES[mode]}, {level} in flight: "
                    + "; ".join(cells))
    return runs


def rereplicate(net: Network, cfg: ReplicationConfig, sync_rate: int, say: Say) -> dict[str, Any]:
    """Load the namespace, kill -9 the busiest server under a foreground
    load, and follow it in windows until every block has r synced copies."""
    mf = net.mf
    loaded = net.fleets["new"].run({"phase": "load", "scheme": "metaflow", "concurrency": 64}, shares=True)
    if sum(r["errors"] for r in loaded):
        raise RuntimeError(f"loading failed: {[r['error_sample'] for r in loaded]}")
    time.sleep(cfg.settle_s)
    servers = mf.view(REST.servers).servers
    victim = max(servers, key=lambda n: servers[n].keys)
    say(f"  loaded {cfg.entries} paths; kill -9 of {victim} ({servers[victim].keys} keys, primary of "
        f"{', '.join(map(str, servers[victim].blocks))}, backup of "
        f"{', '.join(map(str, servers[victim].backups))}), --sync-rate {sync_rate}")
    level = cfg.latency_levels[-1]
    windows: list[dict[str, Any]] = []

    def window() -> None:
        began = time.monotonic()
        results = net.writes("new", level, cfg.window)
        windows.append({"start": began, "end": time.monotonic(), "results": results})

    while not windows or windows[-1]["end"] - windows[0]["start"] < cfg.before_s:
        window()
    mf.kill_agent(victim)
    killed = time.monotonic()
    restored: float | None = None
    while restored is None or time.monotonic() - restored < cfg.after_s:
        if time.monotonic() - killed > cfg.repair_timeout_s:
            raise TimeoutError(f"blocks not re-replicated {cfg.repair_timeout_s} s after the kill: "
                               f"{mf.events()[-10:]}")
        window()
        if restored is None and _restored(mf, victim, killed):
            restored = time.monotonic()
    events = [e for e in mf.events() if e["t"] >= killed]
    takeover = next((e["t"] for e in events if e["event"] == "takeover" and e["server"] == victim), None)
    repairs = repair_intervals(events, killed)
    syncs = _sync_reports(mf, events)
    timeline, phases = foreground(windows, killed, takeover, repairs)
    rates = sync_rates(syncs, repairs)
    last = max((end for _, end in repairs), default=None)
    result = {"sync_rate": sync_rate, "victim": victim, "takeover_s": _since(takeover, killed),
              "restored_s": _since(last, killed), "repairs_since_kill": [
                  (round(s - killed, 3), round(e - killed, 3)) for s, e in repairs],
              "syncs": syncs, "rates": rates, "phases": phases, "timeline": timeline,
              "events": [{k: v for k, v in e.items() if k != "t"} | {"t": round(e["t"] - killed, 3)}
                         for e in events]}
    sync = phases.get("sync", {})
    say(f"  re-replicated {rates['records']} keys in {len(syncs)} syncs at "
        f"{', '.join(f'{v:.0f}' for v in rates['per_sync_keys_per_s'])} keys/s, every block at r copies "
        f"{result['restored_s']} s after the kill; foreground p50/p99 before "
        f"{phases['before']['p50_ms']:.2f}/{phases['before']['p99_ms']:.2f} ms, during syncs "
        f"{sync.get('p50_ms', float('nan')):.2f}/{sync.get('p99_ms', float('nan')):.2f} ms "
        f"({sync.get('windows', 0)} windows)")
    return result


def _since(t: float | None, killed: float) -> float | None:
    return None if t is None else round(t - killed, 3)


def _restored(mf: MetaFlowNet, victim: str, killed: float) -> bool:
    """The victim's fail-over is done and every block has r synced copies.
    `MetaFlowNet.replicated` alone holds before the controller notices the
    kill, and counts a member still syncing as a copy: so it is asked first,
    and then whether a repair runs (asked the other way round, a repair that
    starts between the two questions would pass for done)."""
    if not any(e["event"] == "takeover" and e["server"] == victim and e["t"] >= killed for e in mf.events()):
        return False
    if not mf.replicated():
        return False
    return not any(op.kind == "repair" for op in mf.view(REST.operations).operations)


def _sync_reports(mf: MetaFlowNet, events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Each successful re-replication's sync as its primary reports it (`GET /syncs`)."""
    out = []
    scenario = mf.running
    for e in events:
        if e["event"] != "replicated" or e.get("failed"):
            continue
        agent = scenario.agents[scenario.topo.graph_names[e["server"]]]
        for report in agent.call(ADMIN.syncs).syncs:
            if str(report.block) == e["block"] and report.member in e["added"] and report.state == "synced":
                out.append({"block": e["block"], "primary": e["server"], "member": report.member,
                            "records": report.records, "seconds": report.seconds})
    return out


def run_benchmark(cfg: ReplicationConfig, say: Say) -> dict[str, Any]:
    started = time.monotonic()
    runs: dict[str, list[dict[str, Any]]] = {mode: [] for mode in MODES}
    for label in cfg.pairs:
        say(f"{label}: r=2 against r=1, {time.monotonic() - started:.0f} s in")
        for mode, mode_runs in run_pair(label, cfg, say).items():
            runs[mode] += mode_runs
    rereplication = []
    for rate in cfg.sync_rates:
        say(f"re-replication at --sync-rate {rate}, {time.monotonic() - started:.0f} s in")
        with tempfile.TemporaryDirectory(prefix="mfrepl-") as tmp, \
                Network(PAIRS["fsync batch"][0], cfg, Path(tmp), MGMT_SUBNETS[0], rate) as net:
            say(f"  network up in {net.mf.timings['network_built_s']} s")
            rereplication.append(rereplicate(net, cfg, rate, say))
    pair_ratios = ratios(runs, cfg.latency_levels, cfg.saturation)
    clients = len(builders.client_hosts(builders.fat_tree(cfg.k, servers=cfg.servers)))
    return {"config": {**asdict(cfg), "clients": clients},
            "summary": {mode: summarize(mode_runs) for mode, mode_runs in runs.items()},
            "ratios": pair_ratios,
            "targets": targets(pair_ratios, cfg.latency_levels[-1], cfg.saturation),
            "rereplication": rereplication, "runs": runs, "total_s": round(time.monotonic() - started, 1)}


def _say(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true",
                   help="fsync batch only, one round of shorter runs, one --sync-rate (about 2 minutes)")
    p.add_argument("--out", type=Path, default=None,
                   help="write replication.json, .md and .png here (replication-quick.* with --quick)")
    args = p.parse_args(argv)
    cfg = ReplicationConfig.quick() if args.quick else ReplicationConfig()
    result = run_benchmark(cfg, _say)
    report = format_report(result)
    print(report)
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        stem = "replication-quick" if args.quick else "replication"
        (args.out / f"{stem}.json").write_text(json.dumps(result, indent=1) + "\n")
        (args.out / f"{stem}.md").write_text(report + "\n")
        plot(result, args.out / f"{stem}.png")
    return 0


if __name__ == "__main__":
    sys.exit(main())
