"""The replication benchmark's arithmetic, table and figure, from its JSON
(no I/O but the PNG): `benchmarks.replication` measures, this module judges.

Ratios are paired within a round (`benchmarks.bench.paired_ratio`): a round
measures both networks of a pair back to back, so the drift of a shared
machine cancels in a ratio of the same round and stays in a ratio of medians.
Re-replication is judged on windows of foreground load: each window belongs
to the phase its midpoint falls in (before the kill, the fail-over, a sync,
after), and a phase's percentiles come from all of its windows' requests
together, not from a median of per-window percentiles.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from benchmarks.bench import aggregate, paired_ratio
from benchmarks.bench_report import _save


@dataclass(frozen=True)
class Variant:
    """One way of running the network: copies per block and the agents' --fsync."""

    name: str
    replicas: int
    fsync: str


PAIRS = {"fsync batch": (Variant("r2", 2, "batch"), Variant("r1", 1, "batch")),
         "fsync off": (Variant("r2-fsync-off", 2, "off"), Variant("r1-fsync-off", 1, "off"))}
"""Replicated against unreplicated (the ratio's numerator first), with the
agents' default disk sync and without any: the second pair tells the cost of
the extra hop from the cost of the backup's disk sync."""
MODES = {"new": "new connection per write", "reused": "reused connection"}
TARGETS = {"latency_p50": 1.5, "throughput": 0.6}
PHASES = ("before", "failover", "sync", "gap", "after")


# -- latency and throughput ------------------------------------------------------

def summarize(runs: list[dict[str, Any]]) -> dict[str, dict[str, dict[str, float]]]:
    """variant -> level -> medians over rounds of p50, p99, ops/s and CPU us per op."""
    out: dict[str, dict[str, dict[str, float]]] = {}
    for name in dict.fromkeys(r["scheme"] for r in runs):
        mine = [r for r in runs if r["scheme"] == name]
        for level in sorted({r["level"] for r in mine}):
            at = [r for r in mine if r["level"] == level]
            row = {attr: round(statistics.median(r[attr] for r in at), 3)
                   for attr in ("p50_ms", "p99_ms", "ops_per_s")}
            for group in at[0]["cpu_us_per_op"]:
                cpu = statistics.median(r["cpu_us_per_op"][group] for r in at)
                row[f"{group}_cpu_us_per_op"] = round(cpu, 1)
            row["errors"] = sum(r["errors"] for r in at)
            out.setdefault(name, {})[str(level)] = row
    return out


def ratios(runs: dict[str, list[dict[str, Any]]], latency_levels: tuple[int, ...],
           saturation: int) -> dict[str, dict[str, float | None]]:
    """Per pair (fsync batch, fsync off): r=2 over r=1, paired within rounds,
    of p50 and p99 at each latency level in each connection mode, and of ops/s
    at saturation (new connections)."""
    out: dict[str, dict[str, float | None]] = {}
    present = {r["scheme"] for mode_runs in runs.values() for r in mode_runs}
    for label, (a_variant, b_variant) in PAIRS.items():
        a, b = a_variant.name, b_variant.name
        if a not in present or b not in present:
            continue
        row: dict[str, float | None] = {}
        for mode, mode_runs in runs.items():
            for level in latency_levels:
                for attr in ("p50_ms", "p99_ms"):
                    row[f"{attr[:3]}_c{level}_{mode}"] = _rounded(paired_ratio(mode_runs, a, b, attr,
                                                                               level, level))
        row[f"ops_c{saturation}_new"] = _rounded(paired_ratio(runs["new"], a, b, "ops_per_s",
                                                              saturation, saturation))
        out[label] = row
    return out


def _rounded(value: float | None) -> float | None:
    return None if value is None else round(value, 3)


def targets(pair_ratios: dict[str, dict[str, float | None]], level: int,
            saturation: int) -> dict[str, dict[str, Any]]:
    """The issue's two targets on the default variant (fsync batch): write p50
    at the moderate `level` at most 1.5x (in each connection mode), and
    throughput at saturation at least 0.6x."""
    row = pair_ratios["fsync batch"]
    out: dict[str, dict[str, Any]] = {}
    for mode in MODES:
        value = row.get(f"p50_c{level}_{mode}")
        if value is not None:
            out[f"latency_p50_{mode}"] = {"value": value, "target": TARGETS["latency_p50"],
                                          "met": value <= TARGETS["latency_p50"]}
    value = row.get(f"ops_c{saturation}_new")
    if value is not None:
        out["throughput"] = {"value": value, "target": TARGETS["throughput"],
                             "met": value >= TARGETS["throughput"]}
    return out


# -- re-replication ------------------------------------------------------------------

def phase_of(midpoint: float, killed: float, takeover: float | None,
             repairs: list[tuple[float, float]]) -> str:
    """Which phase a foreground window belongs to, by its midpoint: before the
    kill; the fail-over (until the take-over, or for good if there was none);
    a sync (inside a repair's interval); after the last repair; or a gap
    between repairs."""
    if midpoint < killed:
        return "before"
    if takeover is None or midpoint < takeover:
        return "failover"
    if any(start <= midpoint <= end for start, end in repairs):
        return "sync"
    if not repairs or midpoint > max(end for _, end in repairs):
        return "after"
    return "gap"


def merge_windows(windows: list[list[dict[str, Any]]]) -> list[dict[str, Any]]:
    """One result per client across windows (ops, seconds and errors summed,
    latencies joined), so that `aggregate` gives a phase's percentiles over
    all its requests and its rate over the time actually measured."""
    merged: dict[str, dict[str, Any]] = {}
    for results in windows:
        for r in results:
            into = merged.setdefault(r["client"], {"client": r["client"], "ops": 0, "seconds": 0.0,
                                                   "latency_us": [], "errors": 0, "error_sample": []})
            into["ops"] += r["ops"]
            into["seconds"] += r["seconds"]
            into["errors"] += r["errors"]
            into["latency_us"] = into["latency_us"] + list(r["latency_us"])
            into["error_sample"] = (into["error_sample"] + list(r["error_sample"]))[:3]
    return list(merged.values())


def foreground(windows: list[dict[str, Any]], killed: float, takeover: float | None,
               repairs: list[tuple[float, float]]) -> tuple[list[dict[str, Any]], dict[str, dict[str, Any]]]:
    """The timeline (one row per window: seconds since the kill, phase, p50,
    p99, ops/s, errors) and per phase the percentiles over its windows.
    A window is ``{"start", "end", "results"}`` (bench_client results)."""
    timeline = []
    by_phase: dict[str, list[list[dict[str, Any]]]] = {}
    for w in windows:
        mid = (w["start"] + w["end"]) / 2
        phase = phase_of(mid, killed, takeover, repairs)
        run = aggregate("window", 0, 0, w["results"], {})
        timeline.append({"t": round(mid - killed, 3), "phase": phase, "p50_ms": run.p50_ms,
                         "p99_ms": run.p99_ms, "ops_per_s": run.ops_per_s, "errors": run.errors})
        by_phase.setdefault(phase, []).append(w["results"])
    phases = {}
    for phase in PHASES:
        if phase in by_phase:
            run = aggregate(phase, 0, 0, merge_windows(by_phase[phase]), {})
            phases[phase] = {"windows": len(by_phase[phase]), "ops": run.ops, "p50_ms": run.p50_ms,
                             "p99_ms": run.p99_ms, "ops_per_s": run.ops_per_s, "errors": run.errors}
    return timeline, phases


def repair_intervals(events: list[dict[str, Any]], since: float) -> list[tuple[float, float]]:
    """[start, end] on the controller's clock of each successful re-replication
    after `since` (its ``replicated`` event: end ``t``, lasting ``seconds``)."""
    return [(e["t"] - e["seconds"], e["t"]) for e in events
            if e["event"] == "replicated" and e["t"] >= since and not e.get("failed")]


def sync_rates(syncs: list[dict[str, Any]], repairs: list[tuple[float, float]]) -> dict[str, Any]:
    """Keys a second: each sync's own (its records over its copy's seconds, as
    the primary reports them) and the restore as a whole (every record over
    the span from the first repair's start to the last one's end, assignments
    and concurrent syncs included)."""
    per_sync = [round(s["records"] / s["seconds"], 1) for s in syncs if s["seconds"] > 0]
    records = sum(s["records"] for s in syncs)
    span = max(e for _, e in repairs) - min(s for s, _ in repairs) if repairs else 0.0
    return {"per_sync_keys_per_s": per_sync, "records": records, "span_s": round(span, 3),
            "overall_keys_per_s": round(records / span, 1) if span > 0 else None}


# -- report ---------------------------------------------------------------------------

def _fmt(value: float | None, digits: int = 2) -> str:
    return "—" if value is None else f"{value:.{digits}f}"


def format_report(result: dict[str, Any]) -> str:
    cfg = result["config"]
    levels, sat = tuple(cfg["latency_levels"]), cfg["saturation"]
    lines = [f"Replication: k={cfg['k']} fat-tree, {cfg['servers']} storage servers (LevelDB), "
             f"{cfg['clients']} client hosts, writes only ({cfg['entries']} paths, zipf {cfg['zipf']}), "
             f"r=1 and r=2 up side by side, {cfg['rounds']} interleaved round(s) of {cfg['seconds']} s per "
             f"measurement; medians over rounds, ratios paired within a round; total {result['total_s']} s",
             "",
             "## Write latency and throughput", "",
             "| variant | conn | " + " | ".join(f"p50 / p99 ms @{c}" for c in levels)
             + f" | ops/s @{sat} | agents CPU µs/op @{sat} | OVS µs/op | clients µs/op |",
             "|---|---|" + "---|" * (len(levels) + 4)]
    for v in (v for pair in PAIRS.values() for v in reversed(pair)):
        for mode in MODES:
            rows = result["summary"][mode].get(v.name)
            if not rows:
                continue
            cells = [f"{_fmt(rows[str(c)]['p50_ms'])} / {_fmt(rows[str(c)]['p99_ms'])}"
                     if str(c) in rows else "—" for c in levels]
            top = rows.get(str(sat))
            tail = (f"{top['ops_per_s']:.0f} | {top['agents_cpu_us_per_op']:.0f} | "
                    f"{top['ovs_cpu_us_per_op']:.0f} | {top['clients_cpu_us_per_op']:.0f}") if top \
                else "— | — | — | —"
            lines.append(f"| {v.name} | {mode} | " + " | ".join(cells) + f" | {tail} |")
    lines += ["", "r=2 over r=1 (paired within rounds):", "",
              "| disk sync | " + " | ".join(f"p50 / p99 @{c}, {mode}" for mode in MODES for c in levels)
              + f" | ops/s @{sat} |", "|---|" + "---|" * (len(levels) * len(MODES) + 1)]
    for label, row in result["ratios"].items():
        cells = [f"{_fmt(row.get(f'p50_c{c}_{mode}'))} / {_fmt(row.get(f'p99_c{c}_{mode}'))}"
                 for mode in MODES for c in levels]
        lines.append(f"| {label} | " + " | ".join(cells) + f" | {_fmt(row.get(f'ops_c{sat}_new'))} |")
    lines.append("")
    for name, t in result["targets"].items():
        bound = ">=" if name == "throughput" else "<="
        lines.append(f"target {name}: {t['value']} (target {bound} {t['target']}) "
                     f"{'met' if t['met'] else 'MISSED'}")
    if result["rereplication"]:
        lines += ["", "## Re-replication after kill -9 of a server (r=2, fsync batch)", "",
                  "| --sync-rate | keys copied | keys/s per sync | keys/s overall | kill to r copies s "
                  "| p50 / p99 ms before | during sync | after | sync windows |",
                  "|---|---|---|---|---|---|---|---|---|"]
        for rr in result["rereplication"]:
            ph, rate = rr["phases"], rr["rates"]
            cells = [f"{_fmt(ph[p]['p50_ms'])} / {_fmt(ph[p]['p99_ms'])}" if p in ph else "—"
                     for p in ("before", "sync", "after")]
            lines.append(f"| {rr['sync_rate']} | {rate['records']} | "
                         f"{', '.join(f'{v:.0f}' for v in rate['per_sync_keys_per_s'])} | "
                         f"{_fmt(rate['overall_keys_per_s'], 0)} | {_fmt(rr['restored_s'], 1)} | "
                         + " | ".join(cells) + f" | {ph.get('sync', {}).get('windows', 0)} |")
    return "\n".join(lines)


def plot(result: dict[str, Any], path: Path) -> Path:
    """Left: the ratios against their targets; then per --sync-rate the
    foreground write latency around the kill, the syncs shaded."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    cfg = result["config"]
    levels, sat = tuple(cfg["latency_levels"]), cfg["saturation"]
    rr = result["rereplication"]
    fig, axes = plt.subplots(1, 1 + len(rr), figsize=(6 + 4.2 * len(rr), 4.2), squeeze=False)
    ax = axes[0][0]
    groups = [f"p50 @{c}" for c in levels] + [f"p99 @{c}" for c in levels] + [f"ops/s @{sat}"]
    keys = [f"p50_c{c}" for c in levels] + [f"p99_c{c}" for c in levels]
    bars = [(label, mode) for label in result["ratios"] for mode in MODES]
    width = 0.8 / len(bars)
    for i, (label, mode) in enumerate(bars):
        row = result["ratios"][label]
        values = [row.get(f"{k}_{mode}") for k in keys] + [row.get(f"ops_c{sat}_new") if mode == "new"
                                                            else None]
        xs = [g + (i - (len(bars) - 1) / 2) * width for g in range(len(groups))]
        ax.bar(xs, [v if v is not None else 0.0 for v in values], width, label=f"{label}, {MODES[mode]}")
    ax.hlines(TARGETS["latency_p50"], -0.45, len(levels) - 0.55, colors="k", linestyles="--",
              label="targets (p50 <= 1.5x, ops/s >= 0.6x)")
    ax.hlines(TARGETS["throughput"], len(groups) - 1.45, len(groups) - 0.55, colors="k", linestyles="--")
    ax.axhline(1.0, color="gray", linewidth=0.8)
    ax.set_ylim(0, 1.5 * max([TARGETS["latency_p50"], *(v for row in result["ratios"].values()
                                                        for v in row.values() if v is not None)]))
    ax.set_xticks(range(len(groups)), groups)
    ax.set_ylabel("r=2 / r=1 (paired within rounds)")
    ax.set_title("Cost of the second copy")
    ax.legend(fontsize=7, loc="upper left", ncol=2)
    for ax, run in zip(axes[0][1:], rr, strict=True):
        t = [w["t"] for w in run["timeline"]]
        ax.plot(t, [w["p50_ms"] for w in run["timeline"]], "o-", markersize=3, label="p50")
        ax.plot(t, [w["p99_ms"] for w in run["timeline"]], "s:", markersize=3, label="p99")
        for start, end in run["repairs_since_kill"]:
            ax.axvspan(start, end, color="tab:green", alpha=0.2)
        if run["takeover_s"] is not None:
            ax.axvspan(0, run["takeover_s"], color="tab:red", alpha=0.15)
        ax.axvline(0, color="tab:red", linewidth=0.8)
        ax.set_yscale("log")
        ax.set_xlabel("seconds since kill -9 (red: fail-over, green: syncs)")
        ax.set_ylabel(f"write latency ms, {cfg['latency_levels'][-1]} in flight")
        ax.set_title(f"--sync-rate {run['sync_rate']}: "
                     f"{_fmt(run['rates']['overall_keys_per_s'], 0)} keys/s overall")
        ax.legend(fontsize=7)
    return _save(fig, path)
