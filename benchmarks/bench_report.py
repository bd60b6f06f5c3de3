"""The benchmark's table and figures, from its JSON (no I/O but the PNGs).

Figures, after the paper's: throughput against offered concurrency (Fig. 14
is against cluster size, which one machine cannot grow; the simulator
covers that), latency and the share of it spent finding the server (Figs.
16 and 19), server CPU per operation split into storage, lookup and NAT
(Fig. 18), and flow-table entries per switch layer (Fig. 17).
"""

from __future__ import annotations

from pathlib import Path

PAPER = {  # the MetaFlow paper's testbed with 200 Redis servers (Figs. 14, 16, 18)
    "latency_vs_hash": "1.4-1.6x", "throughput_vs_chord": "up to 3.2x (simulated, 2000 servers)",
    "nat_cpu": "up to 15 % of CPU (Redis)", "chord_latency_vs_hash": "6.7x", "onehop_latency_vs_hash": "2.1x",
}
PAPER_TESTBED = {  # Figs. 14 and 16, 200 servers: (throughput x ideal, latency x hash), read off the text
    "redis": {"metaflow": (0.85, 1.6), "onehop": (0.55, 2.1), "chord": (0.30, 6.7)},
    "leveldb": {"metaflow": (0.85, 1.0), "onehop": (0.60, 1.6), "chord": (0.35, 5.5)},   # LevelDB (SSD)
}
"""The paper's testbed per scheme, beside which a run (its x hash: hash has no
lookup, the paper's ideal and latency baseline) is printed."""
ORDER = ("metaflow", "hash", "central", "onehop", "chord", "ghba")
COLORS = {"metaflow": "tab:red", "hash": "tab:gray", "central": "tab:purple", "onehop": "tab:blue",
          "chord": "tab:green", "ghba": "tab:orange"}


def _schemes(report: dict) -> list[str]:
    return [s for s in ORDER if s in report["schemes"]]


def format_report(report: dict) -> str:
    schemes = report["schemes"]
    cfg = report["config"]
    lines = [f"{cfg['topology']}, {cfg['servers']} servers, {cfg['clients']} client hosts, "
             f"{cfg['store']} store, "
             f"{cfg['entries']} entries, {int(cfg['get_fraction'] * 100)} % get, zipf {cfg['zipf']}, "
             f"{'reused' if cfg['reuse'] else 'one'} connection{'s' if cfg['reuse'] else ' per request'}, "
             f"{cfg['reps']} reps x {cfg['seconds']} s per level; total {report['timings']['total_s']} s",
             "ops/s at each scheme's best level (@conc), latency at the lowest; 'x hash' = median of "
             "the ratios within each round",
             "",
             f"{'scheme':9} {'ops/s':>8} {'x hash':>6} {'@conc':>5} {'p50 ms':>7} {'p99 ms':>7} "
             f"{'x hash':>6} {'rpcs/op':>7} {'server':>7} {'lookup':>7} {'nat':>5} {'ovs':>6} {'client':>7}"
             "  (CPU us/op)"]
    for name in _schemes(report):
        s = schemes[name]
        tput = s.get("throughput_vs_hash") or float("nan")   # paired within rounds
        lat = s.get("latency_vs_hash") or float("nan")
        lines.append(f"{name:9} {s['ops_per_s']:8.0f} {tput:6.2f} {s['peak_concurrency']:5d} "
                     f"{s['p50_ms']:7.2f} {s['p99_ms']:7.2f} {lat:6.2f} {s['lookup_rpcs_per_op']:7.2f} "
                     f"{s['server_cpu_us_per_op']:7.0f} {s['lookup_cpu_us_per_op']:7.0f} "
                     f"{s['nat_cpu_us_per_op']:5.1f} {s['ovs_cpu_us_per_op']:6.0f} "
                     f"{s['client_cpu_us_per_op']:7.0f}")
    lines.append("")
    for name, t in report["targets"].items():
        bound = "<=" if name in ("latency_vs_hash", "nat_share") else ">="
        lines.append(f"target {name}: {t['value']} (target {bound} {t['target']}) "
                     f"{'met' if t['met'] else 'MISSED'}")
    nat = report.get("nat")
    if nat:
        lines.append(f"address handling (A/B against no rule, {nat['rounds']} rounds of "
                     f"{nat['ops_per_round']} ops; the service itself "
                     f"{nat['service_cpu_us_per_op']} us CPU per op): " + "; ".join(
                         f"{mode}{' (in use)' if mode == nat['mode'] else ''} {cost['cpu_us_per_op']} us = "
                         f"{cost['share_of_service'] * 100:.1f} %, per round {cost['per_round_diff_us']}"
                         for mode, cost in nat["by_mode"].items()))
        lines.append(f"  kernel's parts: connection tracking {nat['conntrack_cpu_us_per_op']} us, "
                     f"the DNAT rule itself {nat['rule_cpu_us_per_op']} us")
    if "ghba" in schemes and "levels" in schemes["ghba"]:
        ghba = schemes["ghba"]
        lines.append(f"G-HBA lookups ended at: {ghba['levels']} (group size {ghba['group_size']})")
    if report.get("mdtest"):
        lines.append("")
        lines.append("mdtest phases (ops/s, lookup RPCs/op): " + "; ".join(
            f"{name} " + " ".join(f"{ph} {v['ops_per_s']:.0f}/{v['lookup_rpcs_per_op']:.1f}"
                                  for ph, v in phases.items())
            for name, phases in report["mdtest"].items()))
    lines.append("flow entries (MetaFlow prefixes) per switch: " + ", ".join(
        f"{sw} {c['metaflow']}" for sw, c in sorted(report["flows"].items())))
    lines.append(f"paper (testbed, 200 Redis servers): MetaFlow latency {PAPER['latency_vs_hash']} hash; "
                 f"Chord {PAPER['chord_latency_vs_hash']}, One-Hop {PAPER['onehop_latency_vs_hash']}; "
                 f"throughput vs Chord {PAPER['throughput_vs_chord']}; NAT {PAPER['nat_cpu']}")
    paper = PAPER_TESTBED.get(cfg["store"], {})
    store = "Redis" if cfg["store"] == "redis" else "LevelDB, SSD"
    nan = float("nan")
    lines.append(f"throughput / latency x hash, here at {cfg['servers']} servers and the paper's testbed "
                 f"at 200 ({store}): " + "; ".join(
                     f"{name} {schemes[name].get('throughput_vs_hash') or nan:.2f} / "
                     f"{schemes[name].get('latency_vs_hash') or nan:.2f} (paper {tput:.2f} / {lat:.1f})"
                     for name, (tput, lat) in paper.items() if name in schemes))
    return "\n".join(lines)


def plot(report: dict, out: Path, prefix: str = "bench") -> list[Path]:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    schemes = report["schemes"]
    names = _schemes(report)
    paths = []

    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4))
    for name in names:
        sweep = schemes[name]["sweep"]
        conc = [p["concurrency"] for p in sweep]
        ax1.plot(conc, [p["ops_per_s"] for p in sweep], "o-", label=name, color=COLORS[name])
        ax2.plot(conc, [p["mean_ms"] for p in sweep], "o-", label=name, color=COLORS[name])
    for ax, label in ((ax1, "throughput (ops/s)"), (ax2, "mean latency (ms)")):
        ax.set_xscale("log", base=2)
        ax.set_xlabel("requests in flight (all clients)")
        ax.set_ylabel(label)
        ax.grid(alpha=0.3)
    ax1.legend()
    cfg = report["config"]
    fig.suptitle(f"Measured in Mininet: {cfg['topology']}, {cfg['servers']} servers")
    paths.append(_save(fig, out / f"{prefix}_throughput.png"))

    hash_mean = schemes["hash"]["mean_ms"] if "hash" in schemes else None
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4))
    x = range(len(names))
    ax1.bar([i - 0.2 for i in x], [schemes[n]["p50_ms"] for n in names], 0.4, label="p50")
    ax1.bar([i + 0.2 for i in x], [schemes[n]["p99_ms"] for n in names], 0.4, label="p99")
    ax1.set_ylabel("latency at the lowest concurrency (ms)")
    ax1.legend()
    if hash_mean:
        ax2.bar(x, [max(0.0, 1 - hash_mean / schemes[n]["mean_ms"]) * 100 for n in names],
                color=[COLORS[n] for n in names])
        ax2.set_ylabel("% of latency spent finding the server\n(mean latency over hash mapping's)")
    for ax in (ax1, ax2):
        ax.set_xticks(list(x), names)
    paths.append(_save(fig, out / f"{prefix}_latency.png"))

    fig, ax = plt.subplots(figsize=(7, 4))
    bottom = [0.0] * len(names)
    for part, label in (("storage_cpu_us_per_op", "storage (agent)"),
                        ("lookup_cpu_us_per_op", "lookup servers"),
                        ("nat_cpu_us_per_op", "address handling (A/B)"),
                        ("ovs_cpu_us_per_op", "Open vSwitch")):
        values = [schemes[n][part] for n in names]
        ax.bar(names, values, bottom=bottom, label=label)
        bottom = [b + v for b, v in zip(bottom, values, strict=True)]
    ax.set_ylabel("CPU microseconds per operation")
    ax.legend()
    paths.append(_save(fig, out / f"{prefix}_cpu.png"))

    fig, ax = plt.subplots(figsize=(7, 4))
    flows = report["flows"]
    for layer in ("core", "agg", "edge"):
        counts = sorted(c["metaflow"] for c in flows.values() if c.get("layer") == layer)
        if counts:
            ax.plot(range(len(counts)), counts, "o-", label=f"{layer} ({len(counts)} switches)")
    ax.set_xlabel("switch (sorted)")
    ax.set_ylabel("MetaFlow flow entries")
    ax.legend()
    paths.append(_save(fig, out / f"{prefix}_flows.png"))
    return paths


def _save(fig, path: Path) -> Path:
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    import matplotlib.pyplot as plt
    plt.close(fig)
    return path
