"""Requests per file system call through `metaflow-fs`: what the kernel asks
the mount (FUSE requests, by type) and what the mount asks the service
(requests, by command), for each common call (issue 28: "count and minimize
round trips per operation").

One standalone agent (``--metrics-port``: its request counters are read
before and after), one mount with ``--debug`` (it logs every FUSE request),
first without kernel caching (``--attr-timeout 0 --entry-timeout 0``, as
the mdtest phases of `make bench-fs` run: the most the kernel ever asks),
then with the default 1 s. Each
call is made `--repeat` times on names of its own, in a directory below the
root; the table gives the means.

    python -m benchmarks.fs_requests [--repeat 20] [--out benchmarks/results]
"""

from __future__ import annotations

import argparse
import os
import re
import secrets
import socket
import sys
import tempfile
import time
import urllib.request
from collections import Counter
from collections.abc import Callable
from pathlib import Path

from benchmarks.publish import publish
from client_lib.api.metrics import REQUESTS
from client_lib.constants import DEFAULT_SPACE_CIDR
from client_lib.fs.fuse_session import REQUEST_LOGGED
from mininet_scenarios.daemons import AgentProcess
from mininet_scenarios.fs_mount import FuseMount

LISTING = 100
"""Entries in the directory the readdir row lists."""

_SERVED = re.compile(rf'^{REQUESTS.name}\{{command="(\w+)",outcome="served"\}} (\S+)$', re.M)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _served(port: int) -> Counter[str]:
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
    return Counter({command: int(float(count)) for command, count in _SERVED.findall(text)})


def calls(home: Path) -> dict[str, tuple[Callable[[int], None], Callable[[int], None] | None]]:
    """Each row: (the call for repetition i, what prepares it, untimed)."""
    def create(i: int) -> None:
        os.close(os.open(home / f"c{i}", os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644))

    def make(prefix: str) -> Callable[[int], None]:
        return lambda i: os.close(os.open(home / f"{prefix}{i}", os.O_CREAT | os.O_WRONLY, 0o644))

    def write(i: int) -> None:
        with open(home / f"w{i}", "r+b") as f:
            f.write(b"x" * 4096)

    def listing(i: int) -> None:
        with os.scandir(home / f"l{i}") as entries:
            assert sum(1 for e in entries if e.stat(follow_symlinks=False)) == LISTING

    def fill(i: int) -> None:
        (home / f"l{i}").mkdir()
        for n in range(LISTING):
            os.close(os.open(home / f"l{i}" / f"e{n}", os.O_CREAT | os.O_WRONLY, 0o644))

    (home / "other").mkdir()
    return {
        "stat a file": (lambda i: None if os.stat(home / f"s{i}") else None, make("s")),
        "create (O_CREAT with O_EXCL), close": (create, None),
        "mkdir": (lambda i: (home / f"m{i}").mkdir(), None),
        "write 4 KiB and close": (write, make("w")),
        "unlink": (lambda i: os.unlink(home / f"u{i}"), make("u")),
        "rename in one directory": (lambda i: os.rename(home / f"r{i}", home / f"r{i}.new"), make("r")),
        "rename to another directory": (lambda i: os.rename(home / f"x{i}", home / "other" / f"x{i}"),
                                        make("x")),
        f"ls -l of {LISTING} entries": (listing, fill),
    }


def measure(repeat: int, cache: float, say: Callable[[str], None]) -> list[dict]:
    rows = []
    with tempfile.TemporaryDirectory(prefix="mf-fs-requests-") as tmp:
        work = Path(tmp)
        metrics = _free_port()
        with AgentProcess(f"leveldb:{work / 'db'}", "--metrics-port", str(metrics),
                          own=[DEFAULT_SPACE_CIDR]) as agent, \
                FuseMount(work / "mnt", "--debug", via=f"{agent.host}:{agent.port}",
                          root=secrets.randbits(62) | 2, attr_timeout=cache, entry_timeout=cache,
                          log_path=work / "fs.log") as mount:
            home = mount.path / "home"
            home.mkdir()
            for name, (call, prepare) in calls(home).items():
                for i in range(repeat):
                    if prepare is not None:
                        prepare(i)
                time.sleep(0.2)   # the kernel's late requests (a release) land before the count
                logged, served = len(mount.log()), _served(metrics)
                for i in range(repeat):
                    call(i)
                time.sleep(0.2)
                fuse = Counter(REQUEST_LOGGED.findall(mount.log()[logged:]))
                service = _served(metrics) - served
                rows.append({"call": name,
                             "fuse": {op: round(n / repeat, 1) for op, n in sorted(fuse.items())},
                             "service": {cmd: round(n / repeat, 1) for cmd, n in sorted(service.items())}})
                say(f"cache {cache:g} s, {name}: {rows[-1]['fuse']} {rows[-1]['service']}")
    return rows


def _cell(counts: dict[str, float]) -> str:
    total = sum(counts.values())
    parts = ", ".join(f"{op.lower()} {n:g}" for op, n in counts.items())
    return f"**{total:g}**: {parts}" if parts else "0"


CACHES = {"no kernel caching (`--attr-timeout 0 --entry-timeout 0`)": 0.0,
          "the default caching (1 s for names and attributes)": 1.0}


def report(results: dict) -> str:
    lines = [f"## Requests per call through the mount (means of {results['repeat']} calls)"]
    for title, rows in results["tables"].items():
        lines += ["", f"With {title}:", "",
                  "| call | FUSE requests the kernel sends | requests the mount sends the service |",
                  "|---|---|---|"]
        lines += [f"| {r['call']} | {_cell(r['fuse'])} | {_cell(r['service'])} |" for r in rows]
    return "\n".join(lines)


def plot(results: dict, path: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    tables = results["tables"]
    first = next(iter(tables.values()))
    fig, axes = plt.subplots(1, len(tables), figsize=(12, 0.5 * len(first) + 1.8), sharey=True)
    for ax, (title, rows) in zip(axes, tables.items(), strict=True):
        y = range(len(rows))
        ax.barh([i + 0.2 for i in y], [sum(r["fuse"].values()) for r in rows], height=0.4,
                label="FUSE requests")
        ax.barh([i - 0.2 for i in y], [sum(r["service"].values()) for r in rows], height=0.4,
                label="service requests")
        ax.set_yticks(list(y), [r["call"] for r in rows])
        ax.set_xscale("symlog")
        ax.set_xlabel("requests per call (mean)")
        ax.set_title(title.split(" (")[0], fontsize=10)
    axes[0].invert_yaxis()
    axes[0].legend()
    fig.suptitle("metaflow-fs: requests per call")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--repeat", type=int, default=20)
    p.add_argument("--out", type=Path, default=None, help="write fs_requests.json and .png here")
    args = p.parse_args(argv)
    def say(line: str) -> None:
        print(line, file=sys.stderr, flush=True)
    results = {"repeat": args.repeat,
               "tables": {title: measure(args.repeat, cache, say) for title, cache in CACHES.items()}}
    if args.out is None:
        print(report(results))
    else:
        publish(results, args.out, "fs_requests", plot, report)
    return 0


if __name__ == "__main__":
    sys.exit(main())
