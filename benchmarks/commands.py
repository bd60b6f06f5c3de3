"""`metaflowctl plan` and `metaflowctl bench`: their arguments and how they run.

metaflowctl imports this module (through `benchmarks.ctl`) only when one
of the two is chosen: plan needs the pure core and tqdm, and bench
(imported only by its own functions) numpy, the agent and Mininet, none of
which the client role installs.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from btree.flows import DEFAULT_TABLE_BUDGET
from btree.split import SplitBounds
from topology.builders import DEFAULT_TOPOLOGY, TOPOLOGIES

from .plan import VARIANTS, PlanConfig, format_report, run_plan


def add_plan_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--topology", choices=list(TOPOLOGIES), default="fattree",
                   help="testbed: the paper's three-tier testbed (--servers-per-edge of 10 edges)")
    p.add_argument("--k", type=int, default=32, help="fat-tree switch ports (default 32)")
    p.add_argument("--servers", type=int, default=2000,
                   help="fat-tree hosts that are storage servers (default 2000, the paper's)")
    p.add_argument("--core", type=int, default=1, help="tier trees: core switches")
    p.add_argument("--agg", type=int, default=2, help="three-tier: aggregation switches")
    p.add_argument("--edges", type=int, default=10, help="tier trees: edge switches")
    p.add_argument("--servers-per-edge", type=int, default=20)
    p.add_argument("--edge-uplinks", type=int, default=1,
                   help="three-tier: aggregation switches each edge connects to")
    p.add_argument("--keys", type=int, default=None,
                   help="keys to insert (default 0.7 x servers x capacity: every server "
                        "becomes busy through splits)")
    p.add_argument("--capacity", type=int, default=1000, help="keys per server before it splits")
    p.add_argument("--split", type=SplitBounds.parse, default=SplitBounds(),
                   help="split bounds low,high (default 0.4,0.6)")
    p.add_argument("--variant", choices=list(VARIANTS), default="optimized",
                   help="paper: traversal + plain prefix cover; exact50: the same at 50%%; "
                        "optimized: cheapest cut in the window + minimal (ORTC) tables")
    p.add_argument("--keys-dist", choices=["uniform", "skewed"], default="uniform")
    p.add_argument("--bootstrap", default="preallocate",
                   help="organic (paper: one server owns all) or preallocate[:N] (default: "
                        "half the servers)")
    p.add_argument("--space", default="0.0.0.0/0",
                   help="MetaDataID space (default the paper's 0.0.0.0/0)")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--table-budget", type=int, default=DEFAULT_TABLE_BUDGET,
                   help="MetaFlow entries any one switch may hold; every split and merge keeps to it "
                        f"(default {DEFAULT_TABLE_BUDGET}: the paper's 2,048-entry switches; 0: no limit)")
    p.add_argument("--no-merge", action="store_true",
                   help="never merge cold servers to free one for a split (the behaviour before issue 14)")
    p.add_argument("--json", action="store_true", help="print one JSON object")


def run_plan_command(args: argparse.Namespace) -> int:
    cfg = PlanConfig(
        topology=args.topology, k=args.k, servers=args.servers, core=args.core, agg=args.agg,
        edges=args.edges, servers_per_edge=args.servers_per_edge, edge_uplinks=args.edge_uplinks,
        keys=args.keys, capacity=args.capacity, bounds=args.split, variant=args.variant,
        keys_dist=args.keys_dist, bootstrap=args.bootstrap, space=args.space, seed=args.seed,
        progress=sys.stderr.isatty(), merge=not args.no_merge, table_budget=args.table_budget or None)
    report = run_plan(cfg)
    print(json.dumps(report) if args.json else format_report(report))
    return 0 if report["verified"] else 1


def add_bench_arguments(p: argparse.ArgumentParser) -> None:
    from mininet_scenarios.metaflow_net import add_fabric_arguments

    from .bench_client import SCHEMES

    p.add_argument("--quick", action="store_true", help="a smaller run, under 2 minutes")
    add_fabric_arguments(p)
    p.add_argument("--json", metavar="FILE", default=None, help="write the full report here")
    p.add_argument("--out", default="benchmarks/results", help="directory for bench.json and the PNGs")
    p.add_argument("--no-plots", dest="plots", action="store_false")
    p.add_argument("--schemes", default=None, help="comma-separated subset of " + ",".join(SCHEMES))
    p.add_argument("--store", choices=("leveldb", "redis"), default=None)
    p.add_argument("--entries", type=int, default=None, help="namespace entries loaded before the runs")
    p.add_argument("--seconds", type=float, default=None, help="length of one run")
    p.add_argument("--reps", type=int, default=None, help="repetitions per scheme and level")
    p.add_argument("--levels", default=None, help="requests in flight per client host, e.g. 1,2,4,8,16")
    p.add_argument("--get-fraction", type=float, default=None, help="share of gets (default 0.2)")
    p.add_argument("--zipf", type=float, default=None, help="key popularity exponent (0 uniform)")
    p.add_argument("--mdtest-files", type=int, default=None, help="files per client in create/stat/remove")
    p.add_argument("--reuse", action="store_true", default=None,
                   help="reuse request connections (default: one per request, as in the paper)")
    p.add_argument("--nat-rounds", type=int, default=None, help="A/B rounds of the NAT cost (0: skip)")
    p.add_argument("--replicas", type=int, default=None,
                   help="copies of every block, for every scheme alike (default 1: lookups compared alone)")
    p.add_argument("--fsync", choices=("always", "batch", "off"), default=None,
                   help="the agents' --fsync, for every scheme alike (default off)")


def _suffix(topology: str) -> str:
    """The results' file names for a topology other than the default (so a
    testbed run leaves bench.json, the simulator's calibration, alone)."""
    return "" if topology == DEFAULT_TOPOLOGY else "-" + "".join(c if c.isalnum() else "-" for c in topology)


def run_bench_command(args: argparse.Namespace) -> int:
    from .bench import BenchConfig, run_bench, with_overrides
    from .bench_client import SCHEMES
    from .bench_report import format_report as format_bench_report
    from .bench_report import plot

    base = BenchConfig.quick() if args.quick else BenchConfig()
    schemes = tuple(args.schemes.split(",")) if args.schemes else None
    if schemes and not set(schemes) <= set(SCHEMES):
        raise ValueError(f"unknown schemes {sorted(set(schemes) - set(SCHEMES))}")
    levels = tuple(int(v) for v in args.levels.split(",")) if args.levels else None
    cfg = with_overrides(base, schemes=schemes, store=args.store, entries=args.entries, seconds=args.seconds,
                         reps=args.reps, levels=levels, get_fraction=args.get_fraction, zipf=args.zipf,
                         mdtest_files=args.mdtest_files, reuse=args.reuse, nat_rounds=args.nat_rounds,
                         topology=args.topology, mgmt_subnet=args.mgmt_subnet, replicas=args.replicas,
                         fsync=args.fsync,
                         heartbeat=tuple(args.heartbeat) if args.heartbeat else None)
    report = run_bench(cfg, show_progress=True)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    durable = "" if (cfg.replicas, cfg.fsync) == (1, "off") else f"-r{cfg.replicas}-{cfg.fsync}"
    name = ("bench-quick" if args.quick else "bench") + _suffix(cfg.topology) + durable
    (out / f"{name}.json").write_text(json.dumps(report, indent=1))
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=1))
    print(format_bench_report(report))
    if args.plots:
        for path in plot(report, out, prefix=name):
            print(f"wrote {path}")
    return 0
