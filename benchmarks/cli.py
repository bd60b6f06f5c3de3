"""`metaflowctl`: the operator's command-line tool (Open vSwitch style naming).

Subcommands live next to what they drive; this module only parses arguments.
Later issues add status, bench and demo here.
"""

from __future__ import annotations

import argparse
import json
import sys

from btree.split import SplitBounds


def _plan_parser(sub: argparse._SubParsersAction) -> None:
    from .plan import TOPOLOGIES, VARIANTS

    p = sub.add_parser(
        "plan", help="simulate growth on a topology and report flow-table sizes",
        description="Generate N file paths, hash them to MetaDataIDs, insert them with "
                    "capacity-driven splits, verify every ID through a fake network of the "
                    "generated flow tables, and report entries per switch per layer.")
    p.add_argument("--topology", choices=TOPOLOGIES, default="fattree")
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
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.set_defaults(func=_run_plan)


def _run_plan(args: argparse.Namespace) -> int:
    from .plan import PlanConfig, format_report, run_plan

    cfg = PlanConfig(
        topology=args.topology, k=args.k, servers=args.servers, core=args.core, agg=args.agg,
        edges=args.edges, servers_per_edge=args.servers_per_edge, edge_uplinks=args.edge_uplinks,
        keys=args.keys, capacity=args.capacity, bounds=args.split, variant=args.variant,
        keys_dist=args.keys_dist, bootstrap=args.bootstrap, space=args.space, seed=args.seed,
        progress=sys.stderr.isatty())
    report = run_plan(cfg)
    print(json.dumps(report) if args.json else format_report(report))
    return 0 if report["verified"] else 1


def _key_parsers(sub: argparse._SubParsersAction) -> None:
    from client_lib.ctl import add_common, add_put_options, run

    for name, text in (("get", "print the value stored for a path"),
                       ("put", "store metadata (or --value) for a path"),
                       ("del", "delete a path's metadata"),
                       ("stat", "print a path's metadata as fields")):
        p = sub.add_parser(name, help=text, description=text)
        add_common(p)
        if name == "put":
            add_put_options(p)
        p.set_defaults(func=run)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="metaflowctl", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    _plan_parser(sub)
    _key_parsers(sub)
    args = parser.parse_args(argv)
    try:
        return args.func(args)
    except ValueError as err:
        parser.exit(2, f"metaflowctl: error: {err}\n")


if __name__ == "__main__":
    sys.exit(main())
