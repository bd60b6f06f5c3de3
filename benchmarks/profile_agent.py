"""One agent under `redis-benchmark -c 50` SETs, its CPU per SET, and a perf profile of it.

What the write bench's tables are explained with (docs/benchmarks/agent.md):
an agent on a fresh LevelDB store in the given ``--fsync`` mode takes one
warming run (so later SETs find their keys), then ``--rounds`` runs whose
rate and agent CPU per SET it prints, then, with ``--perf FILE``, one more
run under ``perf record -g -p <agent>``; read it with
``perf report -i FILE --no-children --sort dso,sym -g none``.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchmarks.agent_bench import _redis_benchmark
from benchmarks.cpu import cpu_seconds, pid_of
from benchmarks.write_bench import _agent, _endpoint
from mininet_scenarios.daemons import private_secret
from nat_agent.store import FSYNC_MODES


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--fsync", choices=FSYNC_MODES, default="batch")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--requests", type=int, default=40_000)
    parser.add_argument("--perf", type=Path, help="record the agent under perf into this file")
    args = parser.parse_args(argv)
    secret = private_secret()
    try:
        with tempfile.TemporaryDirectory(prefix="mf-profile-") as work, \
                _agent(Path(work) / "store", args.fsync, secret, True) as agent:
            target, pid = _endpoint(agent), pid_of(agent.proc)
            _redis_benchmark(target, "SET", args.requests)
            for round_ in range(1, args.rounds + 1):
                before = cpu_seconds(pid)
                rate = _redis_benchmark(target, "SET", args.requests)["rps"]
                spent = (cpu_seconds(pid) - before) * 1e6 / args.requests
                print(f"round {round_}/{args.rounds} --fsync {args.fsync}: {rate:.0f} SETs/s, "
                      f"{spent:.1f} µs of agent CPU per SET", flush=True)
            if args.perf is not None:
                perf = subprocess.Popen(["perf", "record", "-g", "-o", str(args.perf), "-p", str(pid)],
                                        stderr=subprocess.DEVNULL)
                time.sleep(0.5)   # attached before the run starts
                _redis_benchmark(target, "SET", args.requests)
                perf.terminate()
                perf.wait()
                print(f"perf data: {args.perf}")
    finally:
        secret.unlink(missing_ok=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
