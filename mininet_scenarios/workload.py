"""A client host's share of the demo workload: write file metadata, read it back.

Runs inside a Mininet client host. Every request goes to the path's
MetaDataID (no lookup), through the switches. Each acknowledged write is
appended to `--acked` (one JSON line: path, MetaDataID, value digest) the
moment it is acknowledged, so the final check knows exactly what must exist
even if this process dies. Prints one JSON summary line at the end.

    python -m mininet_scenarios.workload --client c1 --files 2500 --acked /tmp/x/c1.jsonl
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import sys
import time
from collections.abc import Sequence

from client_lib.cidr import Block
from client_lib.client import AsyncMetaFlowClient, MetaFlowError, RetryPolicy
from client_lib.constants import DEFAULT_SPACE_CIDR
from client_lib.mdid import mdid
from client_lib.metadata import FileMetadata


def digest(value: bytes) -> str:
    return hashlib.blake2b(value, digest_size=8).hexdigest()


def path_of(client: str, i: int) -> str:
    """File `i` of a client's small namespace: directories of 50 files."""
    return f"/demo/{client}/d{i // 50:04d}/f{i:06d}.dat"


def paths_for(client: str, files: int, start: int = 0) -> list[str]:
    return [path_of(client, i) for i in range(start, start + files)]


def paths_within(client: str, files: int, blocks: Sequence[Block], space: Block, start: int = 0) -> list[str]:
    """The first `files` paths of the client's namespace, from number `start`
    on, whose MetaDataID lies in one of `blocks` (a client that reaches only
    part of the space); ValueError if the blocks hold too few of them."""
    share = sum(b.size for b in blocks if space.covers(b)) / space.size
    if share <= 0:
        raise ValueError(f"none of {[str(b) for b in blocks]} lies in the space {space}")
    out: list[str] = []
    limit = start + int(100 * files / share) + 1000   # far past what the blocks' share needs
    for i in range(start, limit):
        path = path_of(client, i)
        if any(b.contains(mdid(path, space)) for b in blocks):
            out.append(path)
            if len(out) == files:
                return out
    raise ValueError(f"only {len(out)} of {files} paths of {client} lie in the blocks")


async def write_all(client: AsyncMetaFlowClient, paths: list[str], acked, concurrency: int,
                    latencies: list[float], errors: list[str]) -> None:
    queue: asyncio.Queue[str] = asyncio.Queue()
    for path in paths:
        queue.put_nowait(path)
    now_ms = int(time.time() * 1000)

    async def worker() -> None:
        while not queue.empty():
            path = queue.get_nowait()
            meta = FileMetadata.new_file(path, 4096 * (len(path) % 97 + 1), now_ms)
            value = meta.to_bytes()
            started = time.perf_counter()
            try:
                await client.put(path, value)
            except MetaFlowError as exc:
                errors.append(f"put {path}: {exc}")
                continue
            latencies.append(time.perf_counter() - started)
            acked.write(json.dumps({"path": path, "mdid": client.mdid(path), "digest": digest(value)}) + "\n")
            acked.flush()

    await asyncio.gather(*(worker() for _ in range(concurrency)))


async def read_all(client: AsyncMetaFlowClient, paths: list[str], concurrency: int,
                   latencies: list[float], errors: list[str]) -> int:
    found = 0
    queue: asyncio.Queue[str] = asyncio.Queue()
    for path in paths:
        queue.put_nowait(path)

    async def worker() -> None:
        nonlocal found
        while not queue.empty():
            path = queue.get_nowait()
            started = time.perf_counter()
            try:
                meta = await client.stat(path)
            except MetaFlowError as exc:
                errors.append(f"stat {path}: {exc}")
                continue
            latencies.append(time.perf_counter() - started)
            found += meta is not None and meta.path == path

    await asyncio.gather(*(worker() for _ in range(concurrency)))
    return found


def _ms(samples: list[float], q: float) -> float:
    if not samples:
        return 0.0
    ordered = sorted(samples)
    return round(ordered[min(len(ordered) - 1, int(q * len(ordered)))] * 1000, 2)


async def main_async(args: argparse.Namespace) -> dict:
    paths = paths_within(args.client, args.files, args.within, Block.parse(args.space), args.start) \
        if args.within else paths_for(args.client, args.files, args.start)
    write_lat: list[float] = []
    read_lat: list[float] = []
    errors: list[str] = []
    retry = RetryPolicy(attempts=40, base=0.01, cap=0.5)
    # A call rides out a fail-over or a controller restart (the scenarios check none fails).
    async with AsyncMetaFlowClient(space=args.space, timeout=3.0, deadline=60.0, retry=retry,
                                   max_idle=256) as client:
        started = time.perf_counter()
        with open(args.acked, "a") as acked:
            await write_all(client, paths, acked, args.concurrency, write_lat, errors)
        wrote = time.perf_counter()
        found = await read_all(client, paths, args.concurrency, read_lat, errors) if args.read_back else 0
        finished = time.perf_counter()
        stats = vars(client.stats)
    return {"client": args.client, "written": len(write_lat), "read_back": found,
            "errors": len(errors), "error_sample": errors[:3],
            "write_s": round(wrote - started, 2), "read_s": round(finished - wrote, 2),
            "put_p50_ms": _ms(write_lat, 0.5), "put_p99_ms": _ms(write_lat, 0.99),
            "get_p50_ms": _ms(read_lat, 0.5), "get_p99_ms": _ms(read_lat, 0.99),
            "retries": stats["retries"], "moved": stats["moved"], "tryagain": stats["tryagain"],
            "timeouts": stats["timeouts"]}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--client", required=True, help="name used in the paths")
    p.add_argument("--files", type=int, default=2500)
    p.add_argument("--start", type=int, default=0, help="first file number")
    p.add_argument("--space", default=DEFAULT_SPACE_CIDR)
    p.add_argument("--concurrency", type=int, default=8)
    p.add_argument("--acked", required=True, help="append acknowledged writes here (JSON lines)")
    p.add_argument("--no-read-back", dest="read_back", action="store_false")
    p.add_argument("--within", type=Block.parse, action="append", default=[], metavar="CIDR",
                   help="only paths whose MetaDataID lies in this block (repeatable): a client that "
                        "reaches part of the space only")
    args = p.parse_args(argv)
    print(json.dumps(asyncio.run(main_async(args))))
    return 0


if __name__ == "__main__":
    sys.exit(main())
