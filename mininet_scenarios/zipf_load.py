"""A skewed, moving request load from one client host: Zipf over paths, the
hot spot moving every `--shift` seconds.

Runs inside a Mininet client host against paths written before
(`mininet_scenarios.workload.paths_for` of every client in `--owners`).
Each request picks a popularity rank by Zipf(`--exponent`, 1.2 by default)
and maps it to a path through a permutation drawn from `--seed` and the
current epoch (`(now - --t0) // --shift`): every client host uses the same
permutation at the same moment (one `time.monotonic()` clock for every
namespace of the kernel), so the hot paths move together, every `--shift`
seconds. Requests go to the path's MetaDataID through the switches, as any
client's would; `--writes` of them write a new value, if the path is this
host's own (`--client` is one of the owners), so that every path has one
writer and its acknowledged values one order.

Each acknowledged write is appended to `--acked` (as `workload` does), so
the run can check afterwards that nothing acknowledged was lost. Prints one
JSON line: requests completed per second (by the second they completed in,
from `--t0`), errors and the client's retry counters.

    python -m mininet_scenarios.zipf_load --owners c1,c2 --files 2000 --t0 123.4 --seconds 60 \\
        --acked /tmp/x/hot-c1.jsonl
"""

from __future__ import annotations

import argparse
import asyncio
import bisect
import itertools
import json
import random
import sys
import time
from collections import Counter

from client_lib.client import AsyncMetaFlowClient, MetaFlowError, RetryPolicy
from client_lib.constants import DEFAULT_SPACE_CIDR
from mininet_scenarios.workload import digest, paths_for


def zipf_cdf(n: int, exponent: float) -> list[float]:
    """Cumulative probabilities of ranks 1..n under Zipf(exponent)."""
    weights = [1 / rank ** exponent for rank in range(1, n + 1)]
    total = sum(weights)
    return [x / total for x in itertools.accumulate(weights)]


def hottest_share(n: int, exponent: float) -> float:
    """The share of all requests the single hottest path gets."""
    return zipf_cdf(n, exponent)[0]


def ranking(paths: list[str], seed: int, epoch: int) -> list[str]:
    """The paths in popularity order during `epoch` (the same on every host)."""
    order = list(paths)
    random.Random(f"{seed}/{epoch}").shuffle(order)
    return order


async def run(args: argparse.Namespace) -> dict[str, object]:
    paths = [p for owner in args.owners.split(",") for p in paths_for(owner, args.files)]
    mine = set(paths_for(args.client, args.files))   # written only by this host: one order per path
    cdf = zipf_cdf(len(paths), args.exponent)
    rng = random.Random(f"{args.seed}/{args.client}")
    done: Counter[int] = Counter()
    errors: list[str] = []
    orders: dict[int, list[str]] = {}
    end = args.t0 + args.seconds
    retry = RetryPolicy(attempts=40, base=0.01, cap=0.5)
    async with AsyncMetaFlowClient(space=args.space, timeout=3.0, deadline=30.0, retry=retry,
                                   max_idle=256) as client:
        with open(args.acked, "a") as acked:

            async def worker() -> None:
                n = 0
                while (now := time.monotonic()) < end:
                    epoch = int((now - args.t0) // args.shift)
                    if epoch not in orders:
                        orders[epoch] = ranking(paths, args.seed, epoch)
                    path = orders[epoch][min(bisect.bisect_left(cdf, rng.random()), len(paths) - 1)]
                    try:
                        if rng.random() < args.writes and path in mine:
                            n += 1
                            value = f"{args.client} {n} {now:.3f}".encode()
                            await client.put(path, value)
                            acked.write(json.dumps({"path": path, "mdid": client.mdid(path),
                                                    "digest": digest(value)}) + "\n")
                            acked.flush()
                        else:
                            await client.get(path)
                    except MetaFlowError as exc:
                        errors.append(f"{path}: {exc}")
                        continue
                    done[int(time.monotonic() - args.t0)] += 1

            await asyncio.gather(*(worker() for _ in range(args.concurrency)))
        stats = vars(client.stats)
    return {"client": args.client, "ops_per_s": [done[s] for s in range(int(args.seconds))],
            "errors": len(errors), "error_sample": errors[:3],
            "retries": stats["retries"], "moved": stats["moved"], "tryagain": stats["tryagain"]}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--client", required=True,
                   help="this host's name: its own paths are the ones it writes; seeds its choices")
    p.add_argument("--owners", required=True, help="comma-separated clients whose paths were written")
    p.add_argument("--files", type=int, required=True, help="paths written per owner")
    p.add_argument("--t0", type=float, required=True, help="the run's start on time.monotonic()")
    p.add_argument("--seconds", type=float, required=True)
    p.add_argument("--shift", type=float, default=30.0, help="seconds between hot-spot moves")
    p.add_argument("--exponent", type=float, default=1.2, help="Zipf exponent over the paths")
    p.add_argument("--writes", type=float, default=0.1, help="share of requests that are writes")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--concurrency", type=int, default=8)
    p.add_argument("--space", default=DEFAULT_SPACE_CIDR)
    p.add_argument("--acked", required=True, help="append acknowledged writes here (JSON lines)")
    args = p.parse_args(argv)
    print(json.dumps(asyncio.run(run(args))))
    return 0


if __name__ == "__main__":
    sys.exit(main())
