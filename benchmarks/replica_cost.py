"""What a backup spends applying a primary's turn (``RMSET``), in one process.

Issue 27's r=2 row: the backup's listener is Python (`nat_agent.replica`),
and this splits its CPU per turn into what it does per record and what a
``--fsync batch`` sync costs it, and measures the event loop's hop to a
worker thread and back that each sync takes (`nat_agent.group_commit`),
beside the same write and sync made inline. No sockets: each ``RMSET`` is
handed to `ReplicaServer.execute` as the listener hands it; CPU is this
process's (`time.process_time`), so the numbers hold on a busy machine
better than wall times do.

    python -m benchmarks.replica_cost [--turns 400] [--records 1,25]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

import uvloop

from client_lib.api.admin import AssignRequest, Member, Role
from client_lib.api.auth import Verifier
from client_lib.cidr import Block
from client_lib.constants import DEFAULT_SPACE_CIDR, MAX_VALUE
from client_lib.mdid import mdid
from nat_agent.agent import Agent, Identity
from nat_agent.leveldb_store import LevelDBStore
from nat_agent.replica import ReplicaServer
from nat_agent.store import FsyncMode, record_key

SPACE = Block.parse(DEFAULT_SPACE_CIDR)
PRIMARY = "p"
VALUE = b"x" * 250
"""As the write bench's values."""
MODES: tuple[FsyncMode, ...] = ("off", "batch")
"""Without a sync, then with the default's group commit."""


class _Sender:
    """What `ReplicaServer` asks of a connection: who it is from."""

    sender = PRIMARY


async def _cpu(turns: int, act: Callable[[int], Awaitable[object]]) -> tuple[float, float]:
    """CPU and wall microseconds per call of `act`, over `turns` calls."""
    cpu, wall = time.process_time(), time.perf_counter()
    for turn in range(turns):
        await act(turn)
    return (time.process_time() - cpu) * 1e6 / turns, (time.perf_counter() - wall) * 1e6 / turns


def _rmsets(turns: int, records: int, seed: int = 1) -> list[list[bytes]]:
    rng, label = random.Random(seed), str(SPACE).encode()
    commands = []
    for _ in range(turns):
        command = [b"RMSET", label, b"1"]
        for _ in range(records):
            path = f"/rb/{rng.randrange(100_000):012d}"
            command += [str(mdid(path, SPACE)).encode(), path.encode(), VALUE]
        commands.append(command)
    return commands


async def apply_cost(directory: Path, fsync: FsyncMode, turns: int, records: int) -> dict[str, float]:
    """A backup agent of the whole space applying `turns` RMSETs of `records` records each."""
    identity = Identity("b", None, None, 0, "http://b", 1, "")
    backup = Agent(identity, LevelDBStore(directory, SPACE.width, fsync), SPACE)
    try:
        server = ReplicaServer(backup, Verifier(b"s" * 32), MAX_VALUE)
        members = [Member(PRIMARY, "127.0.0.1:1"), Member("b", "127.0.0.1:2")]
        await backup.assign(AssignRequest([Role(SPACE, 1, False, members)]))
        commands, sender = _rmsets(turns, records), _Sender()

        async def apply(turn: int) -> None:
            reply = await server.execute(sender, commands[turn])   # type: ignore[arg-type]
            if reply != b"+OK\r\n":
                raise RuntimeError(f"RMSET refused: {reply!r}")

        cpu, wall = await _cpu(turns, apply)
    finally:
        await backup.store.close()
    return {"cpu_us_per_rmset": round(cpu, 1), "cpu_us_per_record": round(cpu / records, 1),
            "wall_us_per_rmset": round(wall, 1)}


async def sync_cost(directory: Path, turns: int) -> dict[str, float]:
    """One record written and synced: through the event loop's group commit
    (a worker thread runs the sync), and inline in this thread."""
    store = LevelDBStore(directory, SPACE.width, "batch")
    try:
        group = store._group   # the store's own: what `put` waits on
        assert group is not None

        async def through_loop(turn: int) -> None:
            await store.put(SPACE.first + turn, f"/loop/{turn}", VALUE)

        async def inline(turn: int) -> None:
            key = record_key(SPACE.first + turn, f"/inline/{turn}", store.width)
            ticket = store._apply([key], lambda: store._records.put(key, VALUE))   # as `put` writes
            assert ticket is not None
            group.ledger.sync_through(ticket)

        loop_cpu, loop_wall = await _cpu(turns, through_loop)
        inline_cpu, inline_wall = await _cpu(turns, inline)
    finally:
        await store.close()
    return {"loop_cpu_us": round(loop_cpu, 1), "loop_wall_us": round(loop_wall, 1),
            "inline_cpu_us": round(inline_cpu, 1), "inline_wall_us": round(inline_wall, 1)}


async def hop_cost(turns: int) -> dict[str, float]:
    """The event loop's `run_in_executor` of a call that does nothing."""
    loop = asyncio.get_running_loop()

    async def hop(_: int) -> None:
        await loop.run_in_executor(None, os.getpid)

    cpu, wall = await _cpu(turns, hop)
    return {"cpu_us": round(cpu, 1), "wall_us": round(wall, 1)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--turns", type=int, default=400, help="RMSETs (and syncs) per measurement")
    parser.add_argument("--records", default="1,25", help="records per RMSET, comma-separated")
    args = parser.parse_args(argv)

    async def run() -> None:
        with tempfile.TemporaryDirectory(prefix="mf-replica-cost-") as work:
            for fsync in MODES:
                for records in (int(n) for n in args.records.split(",")):
                    found = await apply_cost(Path(work) / f"{fsync}-{records}", fsync, args.turns, records)
                    print(f"RMSET of {records} records, --fsync {fsync}: {found}", flush=True)
            print(f"write and sync of one record: {await sync_cost(Path(work) / 'sync', args.turns)}")
            print(f"run_in_executor of a call that does nothing: {await hop_cost(args.turns * 5)}")

    uvloop.run(run())   # the agent's loop (`nat_agent.daemon`)
    return 0


if __name__ == "__main__":
    sys.exit(main())
