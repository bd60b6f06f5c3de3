"""Check acknowledged writes from a client host: each path readable, same content.

    python -m mininet_scenarios.verify expected.json   # {path: digest}

Prints one JSON line: how many were checked, missing, and wrong.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys

from client_lib.client import AsyncMetaFlowClient, MetaFlowError, RetryPolicy
from client_lib.constants import DEFAULT_SPACE_CIDR
from mininet_scenarios.workload import digest


async def check(expected: dict[str, str], space: str, concurrency: int) -> dict:
    missing, wrong, errors = [], [], []
    paths = list(expected)
    async with AsyncMetaFlowClient(space=space, timeout=3.0, deadline=60.0, retry=RetryPolicy(40, 0.01, 0.5),
                                   max_idle=256) as client:
        async def worker(share: list[str]) -> None:
            for path in share:
                try:
                    value = await client.get(path)
                except MetaFlowError as exc:
                    errors.append(f"{path}: {exc}")
                    continue
                if value is None:
                    missing.append(path)
                elif digest(value) != expected[path]:
                    wrong.append(path)
        await asyncio.gather(*(worker(paths[i::concurrency]) for i in range(concurrency)))
    return {"checked": len(paths), "missing": len(missing) + len(errors), "wrong": len(wrong),
            "sample": (missing + wrong + errors)[:5]}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("expected", help="JSON file {path: digest}")
    p.add_argument("--space", default=DEFAULT_SPACE_CIDR)
    p.add_argument("--concurrency", type=int, default=16)
    args = p.parse_args(argv)
    with open(args.expected) as f:
        expected = json.load(f)
    result = asyncio.run(check(expected, args.space, args.concurrency))
    print(json.dumps(result))
    return 0 if result["missing"] + result["wrong"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
