"""Balance under a moving hot spot: per-server load over time with the
controller's rebalancing, and beside it today's static partition, in one run.

A k=4 fat-tree in Mininet with 10 storage servers (8 own blocks, 2 idle),
the real controller and agents. Every client host first writes its share of
paths (`mininet_scenarios.workload`); then `--load-hosts` client hosts send
a Zipf(1.2) load over all of them (`mininet_scenarios.zipf_load`), the hot
spot moving every `--shift` seconds. The controller's view of load
(`GET /metaflow/load`: the switches' counters, packets a second per server)
is read every second. The same run is made twice, on fresh networks: with
rebalancing, and with `--no-rebalance` (the static partition); at the end of
each, every acknowledged write is read back.

What it reports, per mode: requests a second (the clients' own count); the
max/mean server load each second, in requests (each busy agent's `/ops`:
what the target is about) and in packets (the switches' counters: what the
controller acts on; pipelined requests share packets, so it is flatter);
for each shift of the hot spot the seconds until max/mean in requests is at
or under 1.2 for three samples in a row (issue 14's target: within 5 s);
and the keys each rebalance moved against the keys stored (target: at most
5 %).
It also says what no prefix move can fix: the share of all requests the
single hottest path takes, and the max/mean that alone forces.

    python -m benchmarks.hotspot --out benchmarks/results            # about 5 minutes
    python -m benchmarks.hotspot --seconds 40 --shift 20             # about 3 minutes
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from benchmarks.publish import publish
from client_lib.api.auth import load_secret
from client_lib.api.clients import ApiClient
from client_lib.api.rest import REST
from client_lib.cidr import Block
from controller.status import block_loads
from mininet_scenarios.metaflow_net import ROOT, MetaFlowNet
from mininet_scenarios.mgmt import SUBNET_HELP
from mininet_scenarios.zipf_load import hottest_share
from topology import builders

MODES = ("rebalance", "static")
TARGET_MAX_OVER_MEAN = 1.2
TARGET_RECOVERY_S = 5.0
TARGET_KEYS_PER_REBALANCE = 0.05
SERVERS, BUSY = 10, 8


def phase(mode: str, args: argparse.Namespace, say: Any,
          inspect: Callable[[MetaFlowNet], object] | None = None) -> dict[str, Any]:
    """One mode on a fresh network: the load timeline, the clients' counts, the
    rebalances; `inspect` looks at the network once the load has stopped."""
    controller = ["--no-auto-split", "--bootstrap", f"preallocate:{BUSY}", "--load-poll", "1",
                  "--load-capacity", str(args.load_capacity), "--imbalance-threshold", str(args.threshold)]
    if mode == "static":
        controller.append("--no-rebalance")
    with tempfile.TemporaryDirectory(prefix="mfhot") as tmp:
        workdir = Path(tmp)
        with MetaFlowNet(builders.fat_tree(4, servers=SERVERS), capacity=10**7, workdir=workdir,
                         controller_args=controller, mgmt_subnet=args.mgmt_subnet) as mf:
            clients = mf.hosts("client")
            # the keys written, not the servers' counts: their heartbeats may not have caught up yet
            stored = sum(r["written"] for r in mf.run_clients(args.files, workdir, read_back=False))
            say(f"[{mode}] {len(clients)} clients wrote {stored} keys; load from {args.load_hosts} of them")
            t0 = time.monotonic() + 2.0
            procs = [_start_load(mf, node, clients, t0, args, workdir) for node in clients[:args.load_hosts]]
            samples = _sample(mf, t0, args.seconds, say, mode)
            reports = MetaFlowNet.collect(procs, timeout=args.seconds + 120)
            events = [e for e in mf.events()
                      if e["event"] in ("rebalance", "rebalance-refused", "imbalanced")]
            check = mf.verify_acked(workdir, lost=[])
            if inspect is not None:
                inspect(mf)
    ops = [sum(r["ops_per_s"][s] for r in reports) for s in range(int(args.seconds))]
    moves = [e for e in events if e["event"] == "rebalance"]
    return {"mode": mode, "stored_keys": stored, "samples": samples, "ops_per_s": ops,
            "throughput": round(sum(ops) / len(ops), 1), "errors": sum(r["errors"] for r in reports),
            "retries": sum(r["retries"] for r in reports),
            "rebalances": [{"t": round(e["t"] - t0, 2), "keys_moved": e["keys_moved"],
                            "keys_share": round(e["keys_moved"] / max(stored, 1), 4),
                            "moves": len(e["moves"]), "to_idle": sum(m["to_idle"] for m in e["moves"]),
                            "retired": sum("retired" in m for m in e["moves"])}
                           for e in moves],
            "refusals": [{"t": round(e["t"] - t0, 2), "reason": e["reason"]}
                         for e in events if e["event"] == "rebalance-refused"],
            "imbalanced": sum(e["event"] == "imbalanced" for e in events),
            "recovery_s": recovery(samples, args.shift, args.seconds, "requests_max_over_mean"),
            "recovery_packets_s": recovery(samples, args.shift, args.seconds, "max_over_mean"),
            "within_target": share_within(samples, "requests_max_over_mean"),
            "within_target_packets": share_within(samples, "max_over_mean"),
            "verify": check}


def _start_load(mf: MetaFlowNet, node: str, owners: list[str], t0: float, args: argparse.Namespace,
                workdir: Path) -> subprocess.Popen:
    scenario = mf.running
    argv = [sys.executable, "-m", "mininet_scenarios.zipf_load", "--client", node,
            "--owners", ",".join(owners), "--files", str(args.files), "--t0", repr(t0),
            "--seconds", str(args.seconds),
            "--shift", str(args.shift), "--exponent", str(args.exponent),
            "--seed", str(args.seed), "--concurrency", str(args.concurrency),
            "--space", scenario.space, "--acked", str(workdir / f"{node}.jsonl")]
    return subprocess.Popen(scenario.ns(node).command(*argv), cwd=ROOT, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


def _sample(mf: MetaFlowNet, t0: float, seconds: float, say: Any, mode: str) -> list[dict[str, Any]]:
    """Once a second from t0 for `seconds`: the controller's load view (packets
    a second, from the switches) and each busy server's requests a second
    (its agent's `/ops` over the whole space: what the target is about)."""
    assert mf.running.secret_file is not None and mf.api is not None
    secret = load_secret(mf.running.secret_file)
    space = Block.parse(mf.running.space)
    out: list[dict[str, Any]] = []
    while (now := time.monotonic()) < t0 + seconds:
        time.sleep(max(0.0, t0 + len(out) + 1 - now))
        view = mf.view(REST.load)
        busy = {n: s for n, s in mf.view(REST.servers).servers.items() if s.blocks and not s.failed}
        requests = {name: block_loads(ApiClient(s.admin_url, secret, timeout=5), [space])[str(space)] or 0.0
                    for name, s in busy.items()}
        out.append({"t": round(time.monotonic() - t0, 2), "servers": view.servers,
                    "max_over_mean": view.max_over_mean, "imbalance": view.imbalance,
                    "requests": requests, "requests_max_over_mean": max_over_mean(requests)})
        if len(out) % 10 == 0:
            say(f"[{mode}] {out[-1]['t']:5.1f} s: max/mean {out[-1]['requests_max_over_mean']:.2f} in "
                f"requests, {view.max_over_mean:.2f} in packets; imbalance factor {view.imbalance:.3f}")
    return out


def max_over_mean(loads: dict[str, float]) -> float:
    mean = sum(loads.values()) / len(loads) if loads else 0.0
    return round(max(loads.values()) / mean, 3) if mean > 0 else 0.0


def recovery(samples: list[dict[str, Any]], shift: float, seconds: float, key: str) -> list[float | None]:
    """For each shift of the hot spot (at 0, shift, 2 shift, ...): seconds from
    it to the first of three samples in a row with `key` (a max/mean) at or
    under the target; None if that does not happen before the next shift."""
    out: list[float | None] = []
    start = 0.0
    while start < seconds:
        window = [s for s in samples if start < s["t"] <= start + shift]
        ok = [0 < s[key] <= TARGET_MAX_OVER_MEAN for s in window]
        first = next((i for i in range(len(ok) - 2) if all(ok[i:i + 3])), None)
        out.append(None if first is None else round(window[first]["t"] - start, 2))
        start += shift
    return out


def share_within(samples: list[dict[str, Any]], key: str) -> float:
    """Of the samples, the share with `key` at or under the target."""
    values = [s[key] for s in samples if s[key] > 0]
    return round(sum(v <= TARGET_MAX_OVER_MEAN for v in values) / len(values), 3) if values else 0.0


def run(args: argparse.Namespace, say: Any = print) -> dict[str, Any]:
    started = time.monotonic()
    paths = args.files * len(builders.client_hosts(builders.fat_tree(4, servers=SERVERS)))
    share = hottest_share(paths, args.exponent)
    results: dict[str, Any] = {"servers": SERVERS, "busy": BUSY, "paths": paths, "shift_s": args.shift,
                               "seconds": args.seconds, "exponent": args.exponent,
                               "load_capacity": args.load_capacity, "imbalance_threshold": args.threshold,
                               "hottest_path_share": round(share, 4),
                               "max_over_mean_floor": round(max(1.0, share * BUSY), 2)}
    for mode in MODES:
        results[mode] = phase(mode, args, say)
    r, s = results["rebalance"], results["static"]
    results["throughput_ratio"] = round(r["throughput"] / s["throughput"], 3) if s["throughput"] else None
    results["wall_s"] = round(time.monotonic() - started, 1)
    return results


def table(results: dict[str, Any]) -> str:
    lines = ["| mode | requests/s | max/mean, median (requests; packets) | seconds at or under 1.2 | "
             "shifts back to ≤ 1.2 within 5 s (s after each shift) | rebalances | "
             "most keys moved by one | acked lost |", "|---|---:|---|---|---|---:|---:|---:|"]
    for mode in MODES:
        r = results[mode]
        back = sum(1 for x in r["recovery_s"] if x is not None and x <= TARGET_RECOVERY_S)
        largest = max((x["keys_share"] for x in r["rebalances"]), default=0.0)
        lines.append(f"| {mode} | {r['throughput']:.0f} | {_median(r, 'requests_max_over_mean'):.2f}; "
                     f"{_median(r, 'max_over_mean'):.2f} | {r['within_target']:.0%}; "
                     f"{r['within_target_packets']:.0%} | {back} of {len(r['recovery_s'])} "
                     f"({r['recovery_s']}) | {len(r['rebalances'])} | {largest:.1%} | "
                     f"{r['verify'].get('missing', 0) + r['verify'].get('wrong', 0)} |")
    lines.append(f"\nThroughput, rebalance against static: {results['throughput_ratio']}x. The hottest "
                 f"single path takes {results['hottest_path_share']:.1%} of all requests, so with "
                 f"{results['busy']} busy servers max/mean in requests cannot go below "
                 f"{results['max_over_mean_floor']} by moving prefixes: a single ID cannot be split.")
    return "\n".join(lines)


def _median(phase_result: dict[str, Any], key: str) -> float:
    values = sorted(s[key] for s in phase_result["samples"] if s[key] > 0)
    return values[len(values) // 2] if values else 0.0


def plot(results: dict[str, Any], path: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(3, 1, figsize=(11, 10), sharex=True)
    for ax, mode in zip(axes, MODES, strict=False):
        samples = results[mode]["samples"]
        names = sorted({n for s in samples for n in s["requests"]})
        for name in names:
            ax.plot([s["t"] for s in samples], [s["requests"].get(name, 0.0) for s in samples], label=name,
                    linewidth=1)
        for e in results[mode]["rebalances"]:
            ax.axvline(e["t"], color="grey", linestyle=":", linewidth=0.8)
        ax.set_ylabel("requests/s (agents' /ops)")
        ax.set_title(f"{mode}: per-server load ({results[mode]['throughput']:.0f} requests/s)")
        ax.legend(fontsize=6, ncol=5)
    for mode in MODES:
        samples = results[mode]["samples"]
        axes[2].plot([s["t"] for s in samples], [s["requests_max_over_mean"] for s in samples],
                     label=f"{mode} (requests)")
        axes[2].plot([s["t"] for s in samples], [s["max_over_mean"] for s in samples], linestyle=":",
                     label=f"{mode} (packets, the controller's signal)")
    axes[2].axhline(TARGET_MAX_OVER_MEAN, color="green", linestyle="--", label="target 1.2")
    axes[2].axhline(results["max_over_mean_floor"], color="black", linestyle="-.",
                    label="floor: the hottest path alone")
    shift = results["shift_s"]
    for k in range(int(results["seconds"] // shift) + 1):
        for ax in axes:
            ax.axvline(k * shift, color="black", linewidth=0.6, alpha=0.4)
    axes[2].set_ylabel("max / mean server load")
    axes[2].set_xlabel("seconds (black lines: the hot spot moves; dotted: a rebalance)")
    axes[2].legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--seconds", type=float, default=120.0, help="load per mode")
    p.add_argument("--shift", type=float, default=30.0, help="seconds between hot-spot moves")
    p.add_argument("--files", type=int, default=400, help="paths each client host writes first")
    p.add_argument("--load-hosts", type=int, default=2, help="client hosts sending the Zipf load")
    p.add_argument("--concurrency", type=int, default=8, help="requests in flight per load host")
    p.add_argument("--load-capacity", type=float, default=1500.0,
                   help="the controller's --load-capacity (packets/s a server takes)")
    p.add_argument("--threshold", type=float, default=0.03,
                   help="the controller's --imbalance-threshold (0.03: about 1.2x the mean with 8 servers)")
    p.add_argument("--exponent", type=float, default=1.2, help="Zipf exponent over the paths")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--out", type=Path, default=None, help="write hotspot.json and hotspot.png here")
    p.add_argument("--mgmt-subnet", default=None, help=SUBNET_HELP)
    return p


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    results = run(args, say=lambda s: print(s, flush=True))
    if args.out:
        publish(results, args.out, "hotspot", plot, table)
    else:
        print(table(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
