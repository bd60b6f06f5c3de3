"""How long a block is unavailable for writes: the time from a kill to the
first successful write of a key in each of the killed server's blocks.

Runs inside a client host, started before the kill. It picks one path per
block (the first ``/probe/<block>/<n>`` whose MetaDataID falls in it) and
writes each in a tight loop (one attempt per call, a short timeout, no
client-side retries: the loop is the retry), so connections are warm and
the data path is the one clients use. It prints ``{"ready": true}``, then
waits for one line on stdin: the kill's time on ``time.monotonic()`` (the
same clock in every network namespace of this kernel). For each key it
reports the seconds from the kill to the completion of the first write that
was sent after the kill and succeeded; ``null`` if none did in
``--deadline`` seconds.

    python -m mininet_scenarios.probe --block 100.64.0.0/12 --block 100.96.0.0/13
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time

from client_lib.cidr import Block
from client_lib.client import AsyncMetaFlowClient, MetaFlowError, RetryPolicy
from client_lib.constants import DEFAULT_SPACE_CIDR
from client_lib.mdid import mdid


def path_in(block: Block, space: Block, tries: int = 1_000_000) -> str:
    """A path whose MetaDataID lies in `block`."""
    for n in range(tries):
        path = f"/probe/{block.first:x}-{block.plen}/{n}"
        if block.contains(mdid(path, space)):
            return path
    raise ValueError(f"no path of {tries} tried falls in {block}")


async def probe(blocks: list[Block], space: Block, timeout: float, deadline: float) -> dict[str, object]:
    paths = [path_in(b, space) for b in blocks]
    first: dict[str, float | None] = {p: None for p in paths}
    kill: float | None = None
    attempts = failures = 0
    stop = asyncio.Event()
    async with AsyncMetaFlowClient(space=str(space), timeout=timeout, deadline=timeout,
                                   retry=RetryPolicy(attempts=1)) as client:

        async def writer(path: str) -> None:
            nonlocal attempts, failures
            n = 0
            while not stop.is_set():
                n += 1
                sent = time.monotonic()
                try:
                    await client.put(path, f"probe {n}".encode())
                except MetaFlowError:
                    failures += 1
                    await asyncio.sleep(0.005)
                    continue
                finally:
                    attempts += 1
                if kill is not None and sent >= kill and first[path] is None:
                    first[path] = time.monotonic() - kill
                    if all(v is not None for v in first.values()):
                        stop.set()
                await asyncio.sleep(0.002)

        tasks = [asyncio.create_task(writer(p)) for p in paths]
        print(json.dumps({"ready": True}), flush=True)
        line = await asyncio.get_running_loop().run_in_executor(None, sys.stdin.readline)
        kill = float(line)
        try:
            await asyncio.wait_for(stop.wait(), max(0.0, kill + deadline - time.monotonic()))
        except TimeoutError:
            stop.set()
        await asyncio.gather(*tasks)
    return {"first_ok_s": {str(b): first[p] for b, p in zip(blocks, paths, strict=True)},
            "attempts": attempts, "failures": failures}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--block", action="append", required=True, type=Block.parse,
                   help="a block of the server to be killed (repeat)")
    p.add_argument("--space", type=Block.parse, default=Block.parse(DEFAULT_SPACE_CIDR))
    p.add_argument("--timeout", type=float, default=0.25, help="seconds per write attempt")
    p.add_argument("--deadline", type=float, default=30.0, help="give up this long after the kill")
    args = p.parse_args(argv)
    print(json.dumps(asyncio.run(probe(args.block, args.space, args.timeout, args.deadline))), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
