"""What ``--fsync`` costs a write: store write latency and throughput per mode.

The stores are called in-process (an embedded LevelDB, and a redis-server of
our own on a unix socket, as ``redis-server:DIR``), so the numbers are the
store's part of a SET without the network and RESP around it. Each mode is
measured with one writer (every write alone: its latency is the mode's cost)
and with concurrent writers (their writes can share a sync: throughput).
Modes are interleaved over rounds, so a noisy neighbour hits them alike; the
table shows the median of the rounds. The directory's file system decides
everything (tmpfs syncs for free), so it is printed with the results.

    python -m benchmarks.bench_fsync [--dir DIR] [--rounds 3] [--writes 2000] [--out FILE.json]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import tempfile
import time
from pathlib import Path

from nat_agent.store import FSYNC_MODES, FsyncMode, Store
from nat_agent.store_spec import open_store

SPECS = {"leveldb": "leveldb:{}", "redis": "redis-server:{}"}
WIDTH = 32


def filesystem_of(path: Path) -> str:
    """``fstype device`` of the mount holding ``path`` (the longest matching mount point)."""
    best = ("", "?", "?")
    with open("/proc/mounts") as mounts:
        for line in mounts:
            device, point, fstype = line.split()[:3]
            if str(path.resolve()).startswith(point) and len(point) > len(best[0]):
                best = (point, fstype, device)
    return f"{best[1]} on {best[2]}"


async def _writes(store: Store, writers: int, count: int, value: bytes) -> tuple[list[float], float]:
    """``count`` puts by ``writers`` coroutines; each put's latency, and the wall time."""
    latencies: list[float] = []

    async def writer(first: int) -> None:
        for i in range(first, count, writers):
            started = time.perf_counter()
            await store.put(i, f"/bench/{i}", value)
            latencies.append(time.perf_counter() - started)

    started = time.perf_counter()
    await asyncio.gather(*(writer(w) for w in range(writers)))
    return latencies, time.perf_counter() - started


async def measure(spec: str, mode: FsyncMode, writers: int, count: int, value: bytes) -> dict[str, float]:
    store = open_store(spec, WIDTH, mode)
    async with store:
        await _writes(store, writers, min(200, count), value)  # warm up
        latencies, elapsed = await _writes(store, writers, count, value)
    latencies.sort()
    return {"ops_per_s": count / elapsed,
            "p50_us": latencies[len(latencies) // 2] * 1e6,
            "p99_us": latencies[int(len(latencies) * 0.99)] * 1e6}


def run(directory: Path, rounds: int, count: int, concurrency: int,
        value_size: int) -> list[dict[str, object]]:
    value = os.urandom(value_size)
    samples: dict[tuple[str, str, int], list[dict[str, float]]] = {}
    for round_number in range(rounds):
        for kind, template in SPECS.items():
            for mode in FSYNC_MODES:
                for writers in (1, concurrency):
                    with tempfile.TemporaryDirectory(prefix="fs-", dir=directory) as work:
                        spec = template.format(Path(work) / "s")
                        result = asyncio.run(measure(spec, mode, writers, count, value))
                    samples.setdefault((kind, mode, writers), []).append(result)
                    print(f"round {round_number + 1}/{rounds} {kind:7} {mode:6} {writers:3} writers: "
                          f"{result['ops_per_s']:8.0f} ops/s", flush=True)
    return [{"store": kind, "fsync": mode, "writers": writers,
             **{name: round(statistics.median(r[name] for r in runs), 1) for name in runs[0]}}
            for (kind, mode, writers), runs in samples.items()]


def table(rows: list[dict[str, object]]) -> str:
    lines = ["| store | --fsync | writers | writes/s | p50 µs | p99 µs |", "|---|---|---:|---:|---:|---:|"]
    lines += [f"| {r['store']} | {r['fsync']} | {r['writers']} | {r['ops_per_s']:.0f} | "
              f"{r['p50_us']:.0f} | {r['p99_us']:.0f} |" for r in rows]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.bench_fsync",
                                     description=__doc__.split("\n")[0])
    parser.add_argument("--dir", type=Path, default=Path(tempfile.gettempdir()),
                        help="where the stores live (its file system is what is measured)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--writes", type=int, default=2000, help="writes per measurement")
    parser.add_argument("--concurrency", type=int, default=32, help="writers in the concurrent runs")
    parser.add_argument("--value-size", type=int, default=256, help="bytes per value")
    parser.add_argument("--out", type=Path, default=None, help="also write the rows as JSON")
    args = parser.parse_args(argv)
    rows = run(args.dir, args.rounds, args.writes, args.concurrency, args.value_size)
    print(f"\n{args.writes} writes of {args.value_size} B per run, median of {args.rounds} rounds, "
          f"in {args.dir} ({filesystem_of(args.dir)}), {os.cpu_count()} CPUs\n")
    print(table(rows))
    if args.out is not None:
        args.out.write_text(json.dumps({"dir": str(args.dir), "filesystem": filesystem_of(args.dir),
                                        "rows": rows}, indent=2) + "\n")


if __name__ == "__main__":
    main()
