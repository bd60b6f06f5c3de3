"""`make bench-testbed`: what real agents cost in Mininet, up to the paper's testbed.

For each named topology (`builders.named`; by default the paper's testbed
with 1, 3, 6 and 20 servers per edge, i.e. 10 to 200 agents, and the k=8
fat-tree's 128), one `MetaFlowNet` with a real agent in every storage host:

1. bring-up, timed by phase (Mininet, agents until /health, discovery and
   the B-tree), and whether every switch connected and every agent registered;
2. idle: each agent's memory (RSS, PSS and USS from /proc/PID/smaps_rollup:
   PSS shares the pages of shared libraries among the processes mapping
   them, USS is what the process alone holds), threads, and CPU over
   `--idle` seconds for the agents, the controller and ovs-vswitchd;
3. load: every client host writes `--files` files and reads them back
   through the switches, with the same CPU figures and the operations per
   second; a write or read lost or misrouted is an error.

The machine is shared and every number is as noisy as the load average
printed beside it. `--heartbeat` sets the agents' heartbeat period and
`--heartbeat-timeout` the controller's: 1 s and 15 s here, since with the
daemons' defaults (0.25 s and 1 s) 200 agents' HTTP heartbeats on this
machine end in false take-overs (docs/testbed.md).

    python -m benchmarks.testbed [--topology testbed:servers_per_edge=3 ...] [--out benchmarks/results]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

from benchmarks.cpu import CpuMeter, pid_of
from client_lib.api.rest import REST
from mininet_scenarios.metaflow_net import MetaFlowNet
from topology import builders

DEFAULT_TOPOLOGIES = ("testbed:servers_per_edge=1", "testbed:servers_per_edge=3",
                      "testbed:servers_per_edge=6", "testbed", "fat-tree:8")
OVS_PIDFILE = Path("/var/run/openvswitch/ovs-vswitchd.pid")
MGMT_SUBNET = "10.227.0.0/16"
T = TypeVar("T")


def parse_rollup(text: str) -> dict[str, float]:
    """`/proc/PID/smaps_rollup` -> RSS, PSS and USS (private clean + dirty) in MB."""
    kb: dict[str, int] = {}
    for line in text.splitlines()[1:]:
        key, _, value = line.partition(":")
        kb[key.strip()] = int(value.split()[0])
    return {"rss_mb": kb["Rss"] / 1024, "pss_mb": kb["Pss"] / 1024,
            "uss_mb": (kb["Private_Clean"] + kb["Private_Dirty"]) / 1024}


def memory(pid: int) -> dict[str, float]:
    return parse_rollup(Path(f"/proc/{pid}/smaps_rollup").read_text())


def load_average() -> float:
    return float(Path("/proc/loadavg").read_text().split()[0])


def spread(values: list[float]) -> dict[str, float]:
    return {"mean": round(statistics.fmean(values), 2), "max": round(max(values), 2)}


def cpu_percent(meter: CpuMeter, work: Callable[[], T]) -> tuple[dict[str, float], float, T]:
    """CPU of each group in % of one core while `work()` runs; the
    percentages, the elapsed time and the work's result."""
    before, started = meter.snapshot(), time.monotonic()
    result = work()
    elapsed = time.monotonic() - started
    delta = CpuMeter.delta(before, meter.snapshot())
    return {name: round(100 * used / elapsed, 1) for name, used in delta.items()}, elapsed, result


def run_one(spec: str, args: argparse.Namespace, workdir: Path) -> dict:
    graph = builders.with_clients(builders.named(spec))
    servers = len(builders.storage_hosts(graph))
    out: dict = {"topology": spec, "name": graph.graph["name"], "switches": len(builders.switches(graph)),
                 "servers": servers, "clients": len(builders.client_hosts(graph)),
                 "load_before": load_average(), "heartbeat_s": args.heartbeat,
                 "heartbeat_timeout_s": args.heartbeat_timeout}
    with MetaFlowNet(graph, capacity=1_000_000, replicas=1, workdir=workdir, mgmt_subnet=args.mgmt_subnet,
                     heartbeat=(args.heartbeat, args.heartbeat_timeout),
                     controller_args=["--bootstrap", f"preallocate:{servers}"]) as mf:
        scenario = mf.running
        out["bring_up_s"] = {**scenario.timings, **mf.timings}
        topo = mf.view(REST.topology)
        registered = mf.view(REST.servers).servers
        out["switches_connected"] = len(topo.switches)
        out["agents_registered"] = len(registered)
        agents = [pid_of(a.proc) for a in scenario.agents.values()]
        assert mf.controller is not None
        controller = pid_of(mf.controller.proc)
        ovs = [int(OVS_PIDFILE.read_text())] if OVS_PIDFILE.exists() else []
        meter = CpuMeter({"agents": agents, "controller": [controller], "ovs": ovs})
        time.sleep(2)   # the bring-up's last ARP and registration traffic
        mems = [memory(p) for p in agents]
        out["agent_memory_mb"] = {k: spread([m[k] for m in mems]) for k in mems[0]}
        out["agent_threads"] = spread([len(os.listdir(f"/proc/{p}/task")) for p in agents])
        out["controller_memory_mb"] = {k: round(v, 1) for k, v in memory(controller).items()}
        out["agents_pss_gb"] = round(sum(m["pss_mb"] for m in mems) / 1024, 2)
        idle, _, _ = cpu_percent(meter, lambda: time.sleep(args.idle))
        out["idle_cpu_pct"] = {**idle, "per_agent": round(idle["agents"] / servers, 2),
                               "load": load_average()}
        files = max(args.files // out["clients"], 1)
        busy, elapsed, results = cpu_percent(meter, lambda: mf.run_clients(files, workdir))
        done = sum(r["written"] + r["read_back"] for r in results)
        out["load"] = {"files": files * out["clients"], "ops": done, "ops_per_s": round(done / elapsed, 1),
                       "errors": sum(r["errors"] for r in results),
                       "error_sample": [e for r in results for e in r.get("error_sample", [])][:3],
                       "put_p50_ms": statistics.median(r["put_p50_ms"] for r in results),
                       "get_p50_ms": statistics.median(r["get_p50_ms"] for r in results),
                       "cpu_pct": {**busy, "per_agent": round(busy["agents"] / servers, 2)},
                       "load": load_average()}
        check = mf.verify_acked(workdir, [])
        out["load"]["missing_or_wrong"] = check["missing"] + check["wrong"]
        # a server declared failed (missed heartbeats on a loaded machine) is taken over
        out["takeovers"] = len(mf.events("takeover"))
    out["teardown_s"] = scenario.timings.get("teardown")
    out["leaks"] = scenario.leaks()
    return out


def format_row(r: dict) -> str:
    m, idle, load, up = r["agent_memory_mb"], r["idle_cpu_pct"], r["load"], r["bring_up_s"]
    mem = " ".join(f"{k[:3].upper()} {v['mean']:.1f}" for k, v in m.items())
    return (f"{r['name']:22s} {r['switches']:3d} sw {r['servers']:4d} agents "
            f"({r['agents_registered']} reg, {r['switches_connected']} sw conn) "
            f"up {up.get('network_built_s')} s (agents {up.get('agents')} s) | agent {mem} MB, "
            f"{r['agents_pss_gb']} GB PSS in all | idle: agent {idle['per_agent']} %, "
            f"all agents {idle['agents']} %, controller {idle['controller']} %, ovs {idle['ovs']} % "
            f"(load {idle['load']}) | "
            f"load: {load['ops_per_s']} ops/s, put/get p50 {load['put_p50_ms']}/{load['get_p50_ms']} ms, "
            f"agents {load['cpu_pct']['agents']} %, controller {load['cpu_pct']['controller']} %, "
            f"ovs {load['cpu_pct']['ovs']} %, errors {load['errors'] + load['missing_or_wrong']}, "
            f"take-overs {r['takeovers']} "
            f"(load {load['load']})")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--topology", action="append", default=None,
                   help=f"a named topology, repeatable (default: {', '.join(DEFAULT_TOPOLOGIES)})")
    p.add_argument("--idle", type=float, default=10.0, help="seconds of idle CPU measured")
    p.add_argument("--files", type=int, default=4000,
                   help="files written and read back, all clients together")
    p.add_argument("--heartbeat", type=float, default=1.0, help="the agents' heartbeat period (s)")
    p.add_argument("--mgmt-subnet", default=MGMT_SUBNET)
    p.add_argument("--out", default="benchmarks/results", help="directory for testbed.json")
    p.add_argument("--heartbeat-timeout", type=float, default=15.0, help="the controller's (s)")
    args = p.parse_args(argv)
    specs = args.topology or list(DEFAULT_TOPOLOGIES)
    for spec in specs:
        builders.named(spec)   # refuse a bad name before anything starts
    rows = []
    for spec in specs:
        with tempfile.TemporaryDirectory(prefix="mftestbed-") as tmp:
            rows.append(run_one(spec, args, Path(tmp)))
        print(format_row(rows[-1]), flush=True)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "testbed.json").write_text(json.dumps({"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
                                                  "runs": rows}, indent=1))
    return 0 if all(r["load"]["errors"] + r["load"]["missing_or_wrong"] == 0 and not r["leaks"]
                    for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
