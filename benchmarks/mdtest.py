"""An mdtest-style driver (mdtest itself is not packaged here): N processes,
each in a directory of its own under DIR, run the phases one after another,
all processes starting each phase together; a phase's rate is all of its
operations over the time from the common start to the last one's end.

    python -m benchmarks.mdtest DIR [--procs 4] [--files 500]

Phases, per process and file: create (open O_CREAT|O_EXCL, close), stat,
readdir (its directory listed, with a stat of each entry as ``ls -l`` does,
counted per entry), rename (to a new name in the same directory), remove
(unlink). Prints one JSON line: ops/s and seconds per phase.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import sys
import time
from collections.abc import Callable, Sequence
from multiprocessing.synchronize import Barrier
from pathlib import Path

PHASES = ("create", "stat", "readdir", "rename", "remove")


def _create(home: Path, i: int) -> None:
    os.close(os.open(home / f"f{i}", os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644))


def _stat(home: Path, i: int) -> None:
    os.stat(home / f"f{i}")


def _rename(home: Path, i: int) -> None:
    os.rename(home / f"f{i}", home / f"r{i}")


def _remove(home: Path, i: int) -> None:
    os.unlink(home / f"r{i}")


_PER_FILE: dict[str, Callable[[Path, int], None]] = {
    "create": _create, "stat": _stat, "rename": _rename, "remove": _remove}


def _readdir(home: Path, files: int) -> None:
    with os.scandir(home) as listing:
        names = [entry.name for entry in listing if entry.stat(follow_symlinks=False)]
    if len(names) != files:
        raise RuntimeError(f"{home}: listed {len(names)} entries, expected {files}")


def _worker(home: Path, files: int, start: Barrier, end: Barrier) -> None:
    try:
        home.mkdir()
        for phase in PHASES:
            start.wait()
            if phase == "readdir":
                _readdir(home, files)
            else:
                operation = _PER_FILE[phase]
                for i in range(files):
                    operation(home, i)
            end.wait()
        home.rmdir()
    except BaseException:
        start.abort()   # the others (and the parent) get BrokenBarrierError, not a hang
        end.abort()
        raise


def run(directory: Path, procs: int, files: int) -> dict[str, dict[str, float]]:
    """Each phase's ops/s and seconds, over `procs` processes of `files` files."""
    start = multiprocessing.Barrier(procs + 1)
    end = multiprocessing.Barrier(procs + 1)
    stamp = f"{os.getpid()}-{time.monotonic_ns()}"
    workers = [multiprocessing.Process(target=_worker, args=(directory / f"mdtest-{stamp}-{n}", files,
                                                             start, end)) for n in range(procs)]
    for worker in workers:
        worker.start()
    results: dict[str, dict[str, float]] = {}
    try:
        for phase in PHASES:
            start.wait(timeout=600)
            began = time.monotonic()
            end.wait(timeout=3600)
            seconds = time.monotonic() - began
            results[phase] = {"ops_per_s": round(procs * files / seconds, 1), "seconds": round(seconds, 3)}
    except BaseException:
        for worker in workers:
            worker.kill()
        raise
    for worker in workers:
        worker.join(60)
        if worker.exitcode:
            raise RuntimeError(f"an mdtest process failed (exit {worker.exitcode})")
    return results


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.mdtest", description=__doc__.split("\n\n")[0])
    p.add_argument("directory", type=Path)
    p.add_argument("--procs", type=int, default=4)
    p.add_argument("--files", type=int, default=500, help="files per process")
    args = p.parse_args(argv)
    print(json.dumps(run(args.directory, args.procs, args.files)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
