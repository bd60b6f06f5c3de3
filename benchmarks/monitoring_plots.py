"""The main monitoring graphs of a MetaFlow run, drawn from a Prometheus.

The pictures on docs/operations.md: what a Grafana dashboard over
deploy/grafana/metaflow.json shows, drawn with matplotlib from Prometheus'
range API (`/api/v1/query_range`) so that no browser is needed. Four panels:
MetaFlow entries per switch, requests per second per agent, keys per server
and the operations the controller ran (splits, fail-overs, ...).

    python -m benchmarks.monitoring_plots --prometheus http://127.0.0.1:9090 \\
        --minutes 10 --out docs/img/monitoring.png

tests/e2e/test_prometheus_e2e.py draws them at the end of its Mininet run.
"""

from __future__ import annotations

import argparse
import json
import time
import urllib.parse
import urllib.request
from pathlib import Path
from typing import NamedTuple

from client_lib.api import metrics as m


class Panel(NamedTuple):
    """One graph: its title, y label, PromQL and the label naming each line."""

    title: str
    unit: str
    expr: str
    legend: str


PANELS = (
    Panel("MetaFlow entries per switch", "entries", m.SWITCH_ENTRIES.name, "switch"),
    Panel("Requests per second per agent", "requests/s",
          f"sum by (instance) (rate({m.REQUESTS.name}[5s]))", "instance"),
    Panel("Keys per server", "keys", m.SERVER_KEYS.name, "server"),
    Panel("Operations ended", "operations", f"sum by (kind) ({m.OPERATIONS.name})", "kind"),
)

Series = list[tuple[str, list[float], list[float]]]
"""Lines of one panel: (legend, times in seconds from the start, values)."""


def query_range(url: str, expr: str, start: float, end: float, step: float) -> list[dict]:
    """The matrix `expr` gives over [start, end] (Prometheus' HTTP API)."""
    params = urllib.parse.urlencode({"query": expr, "start": start, "end": end, "step": step})
    with urllib.request.urlopen(f"{url}/api/v1/query_range?{params}", timeout=30) as answer:
        body = json.loads(answer.read())
    if body["status"] != "success":
        raise RuntimeError(f"{expr}: {body}")
    return list(body["data"]["result"])


def series(url: str, panel: Panel, start: float, end: float, step: float) -> Series:
    """The panel's lines, in the order of their legends; an instance's port is dropped."""
    out = []
    for result in query_range(url, panel.expr, start, end, step):
        name = result["metric"].get(panel.legend, "").rsplit(":", 1)[0]
        out.append((name, [float(t) - start for t, _ in result["values"]],
                    [float(v) for _, v in result["values"]]))
    return sorted(out, key=lambda line: (len(line[0]), line[0]))   # switch 2 before switch 10


def plot(url: str, start: float, end: float, path: Path, step: float = 1.0) -> dict[str, Series]:
    """Draw the four panels over [start, end] into `path` (PNG); their data."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    data = {panel.title: series(url, panel, start, end, step) for panel in PANELS}
    fig, axes = plt.subplots(2, 2, figsize=(12, 7.5), sharex=True)
    for ax, panel in zip(axes.flat, PANELS, strict=True):
        for name, times, values in data[panel.title]:
            ax.plot(times, values, label=name, linewidth=1.2, drawstyle="steps-post")
        ax.set_title(panel.title)
        ax.set_ylabel(panel.unit)
        ax.grid(alpha=0.3)
        if data[panel.title]:
            ax.legend(fontsize=7, ncol=2, loc="upper left")
    for ax in axes[1]:
        ax.set_xlabel("seconds")
    fig.suptitle(f"MetaFlow through Prometheus, {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime(end))}")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return data


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--prometheus", default="http://127.0.0.1:9090", help="its base URL")
    p.add_argument("--minutes", type=float, default=10.0, help="how far back from now")
    p.add_argument("--step", type=float, default=1.0, help="seconds between points")
    p.add_argument("--out", type=Path, default=Path("monitoring.png"))
    args = p.parse_args(argv)
    end = time.time()
    plot(args.prometheus, end - 60 * args.minutes, end, args.out, args.step)
    print(args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
