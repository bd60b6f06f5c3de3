"""One node of the multi-site experiments (issue 29; the multi-site paper's
section VI): a process in a site's border namespace
(`mininet_scenarios.sites_net`) that writes or reads registry entries under
one strategy, through `client_lib.site_client.SiteClient` and the network's
routes (no route table, no lookup).

A **workflow job** (`--job`) waits for its inputs' entries, computes (a
sleep, as the paper simulates its tasks) and posts its outputs.

A **writer** posts its entries in order (``/<tag>/w<id>/file<k>``, the paper's
"consecutive entries"). A **reader** gets entries at random from what the
writers post; one not there yet (a writer behind, or a propagation under
way) is asked again after `RETRY_S`, and counted as a miss. The node starts
at `--start` (a wall-clock time shared by every node, so that all begin
together) and prints one JSON line: its operations, when each tenth of them
was done (seconds from the start, for the progress curves) and its
completion time.

    python -m benchmarks.sites_node --layout sites.toml --site east-us --strategy decentralized \\
        --role writer --id 3 --entries 200 --start 1733550000.5
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time

from benchmarks.baselines.site_registry import registry_stores
from client_lib.errors import MetaFlowError
from client_lib.site_client import SiteClient, read_layout
from client_lib.sites import Strategy

RETRY_S = 0.02
"""A reader's pause before asking again for an entry not there yet."""
PROGRESS_POINTS = 20
"""How many points of its progress curve a node reports."""
VALUE = b"loc=" + b"x" * 60
"""An entry's value: the paper's entries name a file's locations; theirs were of empty files."""


def entry(tag: str, writer: int, k: int) -> str:
    return f"/{tag}/w{writer}/file{k}"


Step = tuple[str, str | float]
"""One thing a node does: ``("put", name)``, ``("get", name)`` (waiting
until the entry is there) or ``("compute", seconds)``."""


def steps(args: argparse.Namespace) -> list[Step]:
    """What this node does, in order: a writer's puts, a reader's random
    gets, or a workflow job's (`--job`: its reads, its computation, its writes)."""
    if args.job is not None:
        with open(args.job) as f:
            job = json.load(f)
        return ([("get", name) for name in job["reads"]] + [("compute", float(job["compute_s"]))]
                + [("put", name) for name in job["writes"]])
    if args.role == "writer":
        return [("put", entry(args.tag, args.id, k)) for k in range(1, args.entries + 1)]
    rand = random.Random(args.seed)
    return [("get", entry(args.tag, rand.choice(args.writers), rand.randint(1, args.entries)))
            for _ in range(args.entries)]


def run(args: argparse.Namespace) -> dict[str, object]:
    layout = read_layout(args.layout)
    stores = None
    if args.registry is not None:   # the baseline: the paper's per-site registries
        with open(args.registry) as f:
            stores = registry_stores({site: (host, port) for site, (host, port) in json.load(f).items()})
    client = SiteClient(layout, Strategy(args.strategy), args.site, central=args.central, stores=stores,
                        deadline=args.deadline, fast_open=args.fast_open)
    todo = steps(args)
    ops = sum(kind != "compute" for kind, _ in todo)
    marks = {max(1, round(ops * (n + 1) / PROGRESS_POINTS)) for n in range(PROGRESS_POINTS)}
    progress: list[tuple[int, float]] = []
    done = misses = failures = 0
    time.sleep(max(0.0, args.start - time.time()))
    began = time.time()
    for kind, what in todo:
        if kind == "compute":
            time.sleep(float(what))
            continue
        name = str(what)
        try:
            if kind == "put":
                client.put(name, VALUE)
            else:
                while client.get(name) is None:
                    misses += 1
                    if time.time() - began > args.deadline * ops + args.wait:
                        raise TimeoutError(f"{name} never appeared")
                    time.sleep(RETRY_S)
        except (MetaFlowError, OSError) as exc:
            failures += 1
            print(f"{args.site} node {args.id}: {exc}", file=sys.stderr)
        done += 1
        if done in marks:
            progress.append((done, time.time() - args.start))
    client.close()
    return {"site": args.site, "role": args.role, "id": args.id, "strategy": args.strategy, "ops": ops,
            "seconds": time.time() - began, "finished": time.time() - args.start, "progress": progress,
            "misses": misses, "failures": failures}


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m benchmarks.sites_node", description=__doc__.split("\n\n")[0])
    p.add_argument("--layout", required=True)
    p.add_argument("--site", required=True)
    p.add_argument("--strategy", required=True, choices=[s.value for s in Strategy])
    p.add_argument("--central", default=None, help="the centralized strategy's site")
    p.add_argument("--role", required=True, choices=("writer", "reader", "job"))
    p.add_argument("--job", default=None, help="a workflow job (JSON: reads, compute_s, writes)")
    p.add_argument("--wait", type=float, default=600.0,
                   help="how long a get may wait for its entry beyond the deadline of every operation")
    p.add_argument("--id", type=int, required=True, help="this node's number (a writer's names carry it)")
    p.add_argument("--writers", type=int, nargs="*", default=[], help="a reader: the writers' numbers")
    p.add_argument("--entries", type=int, default=0, help="operations of a writer or reader")
    p.add_argument("--start", type=float, required=True, help="wall-clock time to begin at")
    p.add_argument("--deadline", type=float, default=10.0,
                   help="seconds one request may take, retries included")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--registry", default=None,
                   help="the baseline: JSON of each site's registry (benchmarks.baselines.site_registry)")
    p.add_argument("--fast-open", action="store_true", help="TCP Fast Open for new connections")
    p.add_argument("--tag", default="run", help="the run's directory: each run writes entries of its own")
    return p


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    if args.role == "reader" and not args.writers:
        parser().error("a reader needs --writers")
    if (args.role == "job") != (args.job is not None):
        parser().error("--role job goes with --job FILE")
    print(json.dumps(run(args)), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
