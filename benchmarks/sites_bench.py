"""`make bench-sites`: the multi-site paper's experiments (its section VI) at
this machine's scale, on real sites (`mininet_scenarios.sites_net`: a
border and an agent per site in network namespaces, kernel routes by
prefix, WAN links with the round trips of the paper's four Azure regions).

* **RTTs.** Each link's round trip measured with ping against the one asked.
* **Fig. 5: makespan against entries.** Nodes spread evenly over the sites,
  half writers and half readers (`benchmarks.sites_node`), for each strategy
  and each number of entries per node; a run's makespan is the average of
  its nodes' completion times, as the paper takes it.
* **Fig. 6: progress over time**, decentralized with and without local
  replication, in the largest run of Fig. 5, and the speedup of local
  replication at each point of progress (the paper: at least 1.25 between
  20 % and 70 %).
* **Fig. 7: throughput against nodes**, every strategy.
* **Fig. 10: workflows**, BuzzFlow and Montage (`benchmarks.sites_workflows`)
  in the three scenarios of the paper's Table I, each strategy; a run's
  makespan is the time to its last job's end.
* **Sites as fabrics.** Fig. 5's largest run once more for each strategy,
  with every site a MetaFlow fabric of its own (switches, a controller, two
  agents: `mininet_scenarios.site_fabric`), against the same run on the
  sites above, both without TCP Fast Open (the fabrics' agents start before
  the kernel could be told to take it).

Prints the tables (markdown) and writes the results (JSON) and one plot.

    python -m benchmarks.sites_bench --out benchmarks/results
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import re
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from tqdm import tqdm

from benchmarks.sites_workflows import SCENARIOS, WORKFLOWS, Scenario
from client_lib.cidr import Block
from client_lib.constants import DEFAULT_SPACE_CIDR
from client_lib.sites import SiteLayout, Strategy
from mininet_scenarios.sites_net import SitesNet
from mininet_scenarios.sites_topo import PAPER_REGIONS, PAPER_RTT_MS, SitesTopo, paper_layout

AGENT_FLAGS = ("--fsync", "off")
"""The agents keep the paper's in-memory registries' durability."""
FABRIC_AGENTS = 2
"""Storage servers in each site's fabric, for the run on fabrics."""
START_AFTER_S = 2.0
"""Nodes are started this long before they all begin (a Python start-up each)."""
PROGRESS = (0.2, 0.3, 0.4, 0.5, 0.6, 0.7)
"""The points of progress at which Fig. 6's speedup is read (the paper's 20 % to 70 %)."""


def measured_rtts(net: SitesNet, count: int = 10) -> list[dict[str, Any]]:
    """Each WAN link's round trip by ping, border to border, against the one asked."""
    rows = []
    for link in net.topo.links:
        a, b = net.topo.sites[link.a].name, net.topo.sites[link.b].name
        net.borders[link.a].run("ping", "-c", "2", "-i", "0.2", "-q", link.address_b, check=False)   # ARP
        out = net.borders[link.a].run("ping", "-c", str(count), "-i", "0.2", "-q", link.address_b).stdout
        found = re.search(r"= [\d.]+/([\d.]+)/", out)
        if not found:
            raise RuntimeError(f"ping {a} -> {b}: {out}")
        rtt = float(found.group(1))
        rows.append({"a": a, "b": b, "asked_ms": link.rtt_ms, "measured_ms": rtt,
                     "error": rtt / link.rtt_ms - 1 if link.rtt_ms else 0.0})
    return rows


def run_round(net: SitesNet, strategy: Strategy, per_site: int, entries: int, tag: str,
              central: str, registry: bool = False, fast_open: bool = True) -> dict[str, Any]:
    """One run: `per_site` nodes in each site, even-numbered ones writers;
    every node does `entries` operations; through the sites' registries
    instead of MetaFlow with `registry` (the baseline); `fast_open`: the
    nodes open connections with TCP Fast Open."""
    sites = [site.name for site in net.topo.sites]
    nodes = [(site, i * per_site + n) for i, site in enumerate(sites) for n in range(per_site)]
    writers = [number for _, number in nodes if number % 2 == 0]
    start = time.time() + START_AFTER_S + 0.05 * len(nodes)
    procs = []
    for site, number in nodes:
        role = "writer" if number % 2 == 0 else "reader"
        argv = ["--layout", str(net.layout_file), "--site", site, "--strategy", strategy.value,
                "--central", central, "--role", role, "--id", str(number), "--writers", *map(str, writers),
                "--entries", str(entries), "--start", f"{start:.3f}", "--seed", str(number), "--tag", tag,
                *(["--registry", str(net.registry_file)] if registry else []),
                *["--fast-open"] * fast_open]
        procs.append(net.node(site, sys.executable, "-m", "benchmarks.sites_node", *argv,
                              stdout=-1, stderr=-1))
    results = [_collected(proc) for proc in procs]
    drained = 0.0
    if strategy is Strategy.REPLICATED:
        began = time.time()
        for sync in net.syncs:
            sync.wait_drained(600)
        drained = time.time() - began
    seconds = [r["seconds"] for r in results]
    return {"strategy": strategy.value, "registry": registry, "fast_open": fast_open, "nodes": len(nodes),
            "entries": entries,
            "makespan": statistics.mean(seconds), "last": max(seconds),
            "throughput": sum(r["ops"] for r in results) / max(seconds),
            "misses": sum(r["misses"] for r in results), "failures": sum(r["failures"] for r in results),
            "propagation_tail_s": drained, "nodes_detail": results}


def run_workflow(net: SitesNet, strategy: Strategy, workflow: str, scenario: Scenario, nodes: int,
                 tag: str, central: str) -> dict[str, Any]:
    """One workflow run: its jobs, one node each, all started together."""
    jobs = WORKFLOWS[workflow]([site.name for site in net.topo.sites], nodes, scenario, tag)
    start = time.time() + START_AFTER_S + 0.05 * len(jobs)
    procs = []
    for number, job in enumerate(jobs):
        path = net.workdir / f"{tag}-job{number}.json"
        path.write_text(json.dumps(job.as_json()))
        argv = ["--layout", str(net.layout_file), "--site", job.site, "--strategy", strategy.value,
                "--central", central, "--role", "job", "--job", str(path), "--id", str(number),
                "--start", f"{start:.3f}", "--fast-open"]
        procs.append(net.node(job.site, sys.executable, "-m", "benchmarks.sites_node", *argv,
                              stdout=-1, stderr=-1))
    results = [_collected(proc) for proc in procs]
    return {"strategy": strategy.value, "workflow": workflow, "scenario": scenario.name, "jobs": len(jobs),
            "ops": sum(r["ops"] for r in results), "makespan": max(r["finished"] for r in results),
            "failures": sum(r["failures"] for r in results)}


def _collected(proc: subprocess.Popen[str]) -> dict[str, Any]:
    """A node's report, once it has ended."""
    out, err = proc.communicate(timeout=1800)
    if proc.returncode:
        raise RuntimeError(f"a node failed ({proc.returncode}): {err[-2000:]}")
    report: dict[str, Any] = json.loads(out)
    return report


def progress_curve(run: dict[str, Any]) -> list[tuple[float, float]]:
    """(fraction of the run's operations done, mean seconds to get there over its nodes)."""
    points: dict[float, list[float]] = {}
    for node in run["nodes_detail"]:
        for k, seconds in node["progress"]:
            points.setdefault(round(k / node["ops"], 3), []).append(seconds)
    return sorted((fraction, statistics.mean(times)) for fraction, times in points.items())


def time_at(curve: list[tuple[float, float]], fraction: float) -> float:
    """When `curve` reaches `fraction` (interpolated between its points)."""
    before = (0.0, 0.0)
    for point in curve:
        if point[0] >= fraction:
            span = point[0] - before[0]
            return before[1] + (point[1] - before[1]) * ((fraction - before[0]) / span if span else 1.0)
        before = point
    return curve[-1][1]


def speedups(plain: dict[str, Any], local: dict[str, Any]) -> dict[float, float]:
    """Decentralized's time over local replication's at each point of `PROGRESS`."""
    a, b = progress_curve(plain), progress_curve(local)
    return {f: time_at(a, f) / time_at(b, f) for f in PROGRESS}


def plot(results: dict[str, Any], path: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 4, figsize=(21, 4.6))
    for strategy in Strategy:
        runs = [r for r in results["fig5"] if r["strategy"] == strategy.value]
        axes[0].plot([r["entries"] * r["nodes"] for r in runs], [r["makespan"] for r in runs], marker="o",
                     label=strategy.value)
        runs = [r for r in results["fig7"] if r["strategy"] == strategy.value]
        axes[2].plot([r["nodes"] for r in runs], [r["throughput"] for r in runs], marker="o",
                     label=strategy.value)
    axes[0].set(xlabel="operations in the run (all nodes)", ylabel="makespan, s (mean over nodes)",
                title=f"Fig. 5: makespan, {results['fig5'][0]['nodes']} nodes")
    for name, run in (("decentralized", results["fig6"]["decentralized"]),
                      ("local-replication", results["fig6"]["local-replication"])):
        curve = progress_curve(run)
        axes[1].plot([t for _, t in curve], [100 * f for f, _ in curve], marker=".", label=name)
    axes[1].set(xlabel="seconds from the start (mean over nodes)", ylabel="operations done, %",
                title="Fig. 6: progress")
    axes[2].set(xlabel="nodes", ylabel="operations/s", title="Fig. 7: throughput")
    runs = results.get("fig10", [])
    shapes = sorted({(r["workflow"], r["scenario"]) for r in runs})
    width = 0.8 / len(Strategy)
    for k, strategy in enumerate(Strategy):
        heights = [next(r["makespan"] for r in runs if (r["workflow"], r["scenario"]) == shape
                        and r["strategy"] == strategy.value) for shape in shapes]
        axes[3].bar([x + k * width for x in range(len(shapes))], heights, width, label=strategy.value)
    axes[3].set_xticks([x + 0.4 - width / 2 for x in range(len(shapes))],
                       [f"{w} {sc}" for w, sc in shapes], fontsize=7, rotation=25, ha="right")
    axes[3].set(ylabel="makespan, s", title="Fig. 10: workflows")
    for ax in axes:
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def report(results: dict[str, Any]) -> str:
    """The tables, in markdown."""
    lines = ["| link | asked RTT, ms | measured, ms | error |", "|---|---|---|---|"]
    lines += [f"| {r['a']} – {r['b']} | {r['asked_ms']:.1f} | {r['measured_ms']:.1f} "
              f"| {100 * r['error']:+.1f} % |" for r in results["rtts"]]
    lines += ["", "Fig. 5 (makespan, s, mean over nodes; centralized in "
              f"{results['central']}):", "",
              "| operations | " + " | ".join(s.value for s in Strategy) + " | decentralized / centralized |",
              "|---" * (len(Strategy) + 2) + "|"]
    for entries in results["entries"]:
        row = {r["strategy"]: r for r in results["fig5"] if r["entries"] == entries}
        ops = entries * next(iter(row.values()))["nodes"]
        ratio = row["decentralized"]["makespan"] / row["centralized"]["makespan"]
        lines.append(f"| {ops:,} | " + " | ".join(f"{row[s.value]['makespan']:.2f}" for s in Strategy)
                     + f" | {ratio:.2f} |")
    lines += ["", "Fig. 6 (speedup of local replication over decentralized, by progress):", "",
              "| progress | " + " | ".join(f"{round(100 * f)} %" for f in PROGRESS) + " |",
              "|---" * (len(PROGRESS) + 1) + "|",
              "| speedup | " + " | ".join(f"{v:.2f}" for v in results["fig6"]["speedup"].values()) + " |"]
    lines += ["", "Fig. 7 (throughput, operations/s):", "",
              "| nodes | " + " | ".join(s.value for s in Strategy) + " |", "|---" * (len(Strategy) + 1) + "|"]
    for nodes in sorted({r["nodes"] for r in results["fig7"]}):
        row = {r["strategy"]: r for r in results["fig7"] if r["nodes"] == nodes}
        lines.append(f"| {nodes} | " + " | ".join(f"{row[s.value]['throughput']:.0f}" for s in Strategy)
                     + " |")
    plains = {r["strategy"]: r for r in results.get("plain", [])}
    if results.get("registry"):
        most = max(results["entries"])
        lines += ["", f"Against the paper's registry layout (a redis-server per site; {most} operations "
                  "a node, the most of Fig. 5):", "",
                  "| strategy | MetaFlow, s | MetaFlow without fast open, s | registry, s "
                  "| MetaFlow / registry | without fast open / registry |", "|---|---|---|---|---|---|"]
        for base in results["registry"]:
            plain = plains[base["strategy"]]
            ours = next(r for r in results["fig5"] if r["strategy"] == base["strategy"]
                        and r["entries"] == base["entries"])
            lines.append(f"| {base['strategy']} | {ours['makespan']:.2f} | {plain['makespan']:.2f} | "
                         f"{base['makespan']:.2f} | {ours['makespan'] / base['makespan']:.2f} | "
                         f"{plain['makespan'] / base['makespan']:.2f} |")
    if results.get("fabric"):
        lines += ["", f"Sites as MetaFlow fabrics ({FABRIC_AGENTS} agents and a controller each) against the "
                  "sites above, both without fast open (Fig. 5's largest run):", "",
                  "| strategy | sites above, s | fabrics, s | fabrics / sites above | failures on fabrics |",
                  "|---|---|---|---|---|"]
        for fab in results["fabric"]:
            plain = plains[fab["strategy"]]
            lines.append(f"| {fab['strategy']} | {plain['makespan']:.2f} | {fab['makespan']:.2f} | "
                         f"{fab['makespan'] / plain['makespan']:.2f} | {fab['failures']} |")
    if results.get("fig10"):
        lines += ["", "Fig. 10 (workflow makespan, s):", "",
                  "| workflow | scenario | " + " | ".join(s.value for s in Strategy)
                  + " | best decentralized / centralized |", "|---" * (len(Strategy) + 3) + "|"]
        for workflow in WORKFLOWS:
            for scenario in SCENARIOS:
                row = {r["strategy"]: r["makespan"] for r in results["fig10"]
                       if r["workflow"] == workflow and r["scenario"] == scenario.name}
                if not row:
                    continue
                best = min(row["decentralized"], row["local-replication"]) / row["centralized"]
                lines.append(f"| {workflow} | {scenario.name} | "
                             + " | ".join(f"{row[s.value]:.1f}" for s in Strategy) + f" | {best:.2f} |")
    return "\n".join(lines)


def topology(sites: int, rate_mbit: float | None) -> SitesTopo:
    """The paper's four regions and their round trips, or the first two of them."""
    space = Block.parse(DEFAULT_SPACE_CIDR)
    if sites == 4:
        layout = paper_layout(space)
    else:
        layout = SiteLayout.equal(space, list(PAPER_REGIONS[:sites]))
    names = [site.name for site in layout.sites]
    rtts = {pair: rtt for pair, rtt in PAPER_RTT_MS.items() if pair <= set(names)}
    return SitesTopo(layout, rtts, rate_mbit=rate_mbit)


def run(args: argparse.Namespace, workdir: Path) -> dict[str, Any]:
    topo = topology(args.sites, args.rate_mbit)
    central = args.central or topo.sites[0].name
    per_site = (args.fig5_nodes or max(args.nodes)) // len(topo.sites)
    largest = max(args.entries)
    rounds = [("fig5", s, per_site, e) for e in args.entries for s in Strategy]
    rounds += [("fig7", s, n // len(topo.sites), args.fig7_entries) for n in args.nodes for s in Strategy]
    flows = [(w, sc, s) for w in args.workflows for sc in SCENARIOS for s in Strategy]
    baseline = [s for s in Strategy if s is not Strategy.REPLICATED]
    fabrics = list(Strategy) if args.fabric else []
    results: dict[str, Any] = {"date": time.strftime("%Y-%m-%d"), "sites": [s.name for s in topo.sites],
                               "central": central, "entries": args.entries, "fig5": [], "fig7": [],
                               "fig10": [], "workflow_nodes": args.workflow_nodes, "registry": [],
                               "plain": [], "fabric": []}
    with tqdm(total=len(rounds) + len(flows) + len(baseline) + len(Strategy) + len(fabrics),
              desc="bench-sites") as bar:
        with SitesNet(topo, workdir, sync=True, registry=True, fast_open=True,
                      agent_extra=AGENT_FLAGS) as net:
            results["rtts"] = measured_rtts(net)
            for number, (figure, strategy, per, entries) in enumerate(rounds):
                bar.set_postfix_str(f"{figure} {strategy.value} {per * len(topo.sites)} nodes x {entries}")
                results[figure].append(run_round(net, strategy, per, entries, f"r{number}", central))
                bar.update()
            for strategy in baseline:
                bar.set_postfix_str(f"registry {strategy.value}")
                results["registry"].append(run_round(net, strategy, per_site, largest,
                                                     f"reg-{strategy.value}", central, registry=True))
                bar.update()
            for strategy in Strategy:
                bar.set_postfix_str(f"no fast open {strategy.value}")
                results["plain"].append(run_round(net, strategy, per_site, largest,
                                                  f"plain-{strategy.value}", central, fast_open=False))
                bar.update()
            for number, (workflow, scenario, strategy) in enumerate(flows):
                bar.set_postfix_str(f"fig10 {workflow} {scenario.name} {strategy.value}")
                results["fig10"].append(run_workflow(net, strategy, workflow, scenario, args.workflow_nodes,
                                                     f"wf{number}", central))
                bar.update()
        if fabrics:
            with SitesNet(dataclasses.replace(topo, agents=FABRIC_AGENTS), workdir / "fabrics", sync=True,
                          agent_extra=AGENT_FLAGS, fabric=True, replicas=1) as net:
                for strategy in fabrics:
                    bar.set_postfix_str(f"fabrics {strategy.value}")
                    results["fabric"].append(run_round(net, strategy, per_site, largest,
                                                       f"fab-{strategy.value}", central, fast_open=False))
                    bar.update()
    by = {r["strategy"]: r for r in results["fig5"] if r["entries"] == largest}
    results["fig6"] = {"decentralized": by["decentralized"], "local-replication": by["local-replication"],
                       "speedup": speedups(by["decentralized"], by["local-replication"])}
    return results


def kept(results: dict[str, Any]) -> dict[str, Any]:
    """What is written to disk: every run without its nodes' details, but
    for Fig. 6's two (their progress curves)."""
    def lean(run: dict[str, Any]) -> dict[str, Any]:
        return {key: value for key, value in run.items() if key != "nodes_detail"}
    out = {key: [lean(r) for r in value] if key in ("fig5", "fig7", "registry", "plain", "fabric") else value
           for key, value in results.items()}
    return out


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m benchmarks.sites_bench", description=__doc__.split("\n\n")[0])
    p.add_argument("--sites", type=int, choices=(2, 4), default=4)
    p.add_argument("--entries", type=int, nargs="+", default=[25, 50, 100, 200],
                   help="Fig. 5: operations per node")
    p.add_argument("--fig5-nodes", type=int, default=None,
                   help="Fig. 5's nodes (default: the most of --nodes)")
    p.add_argument("--nodes", type=int, nargs="+", default=[4, 8, 16],
                   help="Fig. 7: nodes (multiples of the sites)")
    p.add_argument("--fig7-entries", type=int, default=50, help="Fig. 7: operations per node")
    p.add_argument("--workflows", nargs="*", default=list(WORKFLOWS), choices=list(WORKFLOWS),
                   help="Fig. 10: the workflow shapes (none: skip it)")
    p.add_argument("--workflow-nodes", type=int, default=8, help="Fig. 10: nodes (one job each)")
    p.add_argument("--central", default=None, help="the centralized strategy's site (default: the first)")
    p.add_argument("--rate-mbit", type=float, default=100.0, help="each WAN link's rate cap")
    p.add_argument("--no-fabric", dest="fabric", action="store_false",
                   help="skip the run on sites that are MetaFlow fabrics")
    p.add_argument("--out", type=Path, default=None, help="write sites.json there, and the plot to docs/img")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = parser().parse_args(argv)
    if any(n % args.sites for n in args.nodes):
        parser().error(f"--nodes must be multiples of {args.sites}")
    with tempfile.TemporaryDirectory(prefix="mf-sites-") as tmp:
        results = run(args, Path(tmp))
    table = report(results)
    print(table)
    if args.out is not None:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "sites.json").write_text(json.dumps(kept(results), indent=1))
        plot(results, Path(__file__).resolve().parents[1] / "docs" / "img" / "sites.png")
    return 0


if __name__ == "__main__":
    sys.exit(main())

