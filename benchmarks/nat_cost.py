"""What handling MetaDataID addresses costs in CPU per operation, measured A/B.

In `kernel` mode the rewrite is an iptables DNAT rule, and in `local` mode
there is no rewrite (the space is local, conntrack bypassed), so no process
of ours does the work: the kernel does it in the packet path and charges
the time to whichever process was running (the client's send on a veth,
the agent's reply). So the cost is measured as a difference: the same
agent, the same client and the same requests (a connection per request, as
in the main benchmark), sent to MetaDataIDs (`kernel`, `local`) and once to
the server's own address with no rule at all (`none`); CPU of the agent
(from /proc) plus the client's own CPU during the run, per operation.
A further mode, `conntrack`, sends to the server's address with a NAT rule
loaded that never matches: the kernel then tracks every connection, as it
does for our DNAT, so kernel - conntrack is the rule's own cost and
conntrack - none is connection tracking's (which any server with a
stateful firewall pays already). Rounds rotate the modes; medians are
reported, and the headline is the cost of the mode the agent runs by
default (`nat_agent.rules.DEFAULT_MODE`).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from benchmarks.cpu import TICK, cpu_seconds, pid_of
from client_lib.constants import DEFAULT_SPACE_CIDR, METAFLOW_PORT
from mininet_scenarios.daemons import ROOT, AgentProcess
from mininet_scenarios.netns_pair import NetnsPair
from nat_agent.rules import DEFAULT_MODE

SPACE = DEFAULT_SPACE_CIDR


# These benchmarks time the request path. A disk sync per SET (the agent's
# default --fsync batch) would hide it, and the raw redis-server set beside the
# agent syncs once a second (appendfsync everysec), as --fsync off does. What a
# sync costs is measured on its own (benchmarks.bench_fsync).
REQUEST_PATH_ONLY = ("--fsync", "off")

MODES = ("none", "conntrack", "kernel", "local")
REWRITES = ("kernel", "local")
"""The modes that send to MetaDataIDs; each is costed against `none`."""
# A DNAT rule for a documentation address nobody sends to: loads the nat
# table (and so connection tracking) without touching our traffic.
IDLE_NAT_RULE = ("iptables", "-t", "nat", "-A", "PREROUTING", "-d", "192.0.2.1/32", "-p", "tcp",
                 "-j", "DNAT", "--to-destination", "192.0.2.2")


@contextmanager
def agent_in_pair(rewrite: str, workdir: Path, name: str,
                  prefix: str) -> Iterator[tuple[NetnsPair, AgentProcess, list[str]]]:
    """An agent (LevelDB, owning the whole space) in the server namespace of a
    fresh pair, and the `agent_load` arguments that reach it: its MetaDataIDs
    through the rewrite, or the server's own address when there is none."""
    with NetnsPair(prefix=prefix) as net:
        agent = AgentProcess(f"leveldb:{workdir / name}", own=[SPACE], rewrite=rewrite, host="0.0.0.0",
                             port=METAFLOW_PORT, netns=net.server, log_path=workdir / f"{name}.log")
        agent.argv += ["--data-ip", net.server_ip, *REQUEST_PATH_ONLY]
        with agent:
            yield net, agent, ["--via", f"{net.server_ip}:{METAFLOW_PORT}"] if rewrite == "none" else []


def nat_round(mode: str, ops: int, workdir: Path, reused: bool = False) -> dict:
    """One mode's round: SETs on a new connection each (the paper's client),
    or with `reused`, on connections kept open (the per-packet cost alone)."""
    rewrite = mode if mode in REWRITES else "none"
    connections = [] if reused else ["--fresh"]
    with agent_in_pair(rewrite, workdir, f"nat-{mode}", "mfbn") as (net, agent, via):
        if mode == "conntrack":
            net.server.run(*IDLE_NAT_RULE)   # goes with the namespace
        before = cpu_seconds(pid_of(agent.proc))
        out = net.client.run(sys.executable, "-m", "benchmarks.agent_load", "--ops", str(ops),
                             "--workload", "set", *connections, "--space", SPACE, *via, cwd=ROOT, timeout=600)
        service = cpu_seconds(pid_of(agent.proc)) - before
    report = json.loads(out.stdout)
    return {"mode": mode, "service_us_per_op": service * 1e6 / ops,
            "total_us_per_op": (service + report["cpu_s"]) * 1e6 / ops,
            "p50_us": report["latency"]["set"]["p50_us"]}


def measure(rounds: int, ops: int, workdir: Path, progress=None, reused: bool = False) -> dict:
    """Rotating rounds of every mode. A rewrite's CPU per op is the median
    total (client + agent) difference between it and `none`, compared with
    the service's own CPU per op (the agent without any rule)."""
    runs: dict[str, list[dict]] = {mode: [] for mode in MODES}
    for r in range(rounds):
        for mode in MODES[r % len(MODES):] + MODES[:r % len(MODES)]:
            runs[mode].append(nat_round(mode, ops, workdir, reused))
            if progress is not None:
                progress.update(1)
    med = {mode: {k: statistics.median(run[k] for run in rs)
                  for k in ("service_us_per_op", "total_us_per_op", "p50_us")} for mode, rs in runs.items()}
    total = {mode: m["total_us_per_op"] for mode, m in med.items()}
    service = med["none"]["service_us_per_op"]
    if service <= 0:
        # /proc counts CPU in clock ticks: a round under one tick of the agent's CPU measures 0.
        raise ValueError(f"{ops} operations per round cost the agent less than one clock tick of CPU "
                         f"(1/{TICK} s): too few to measure a share of it; run more")
    cost = {mode: total[mode] - total["none"] for mode in REWRITES}
    return {"rounds": rounds, "ops_per_round": ops, "reused_connections": reused, "mode": DEFAULT_MODE,
            "nat_cpu_us_per_op": round(cost[DEFAULT_MODE], 2),
            "nat_share_of_service": round(cost[DEFAULT_MODE] / service, 4),
            "by_mode": {mode: {"cpu_us_per_op": round(cost[mode], 2),
                               "share_of_service": round(cost[mode] / service, 4),
                               "per_round_diff_us": [round(a["total_us_per_op"] - n["total_us_per_op"], 1)
                                                     for a, n in zip(runs[mode], runs["none"], strict=True)]}
                        for mode in REWRITES},
            "rule_cpu_us_per_op": round(total["kernel"] - total["conntrack"], 2),
            "conntrack_cpu_us_per_op": round(total["conntrack"] - total["none"], 2),
            "service_cpu_us_per_op": round(service, 1),
            "modes": {m: {k: round(v, 1) for k, v in d.items()} for m, d in med.items()}}


def main(argv: list[str] | None = None) -> int:
    """Print the A/B as JSON (`make bench` runs it too, before the sweep)."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=4)
    p.add_argument("--ops", type=int, default=3000)
    p.add_argument("--reused", action="store_true",
                   help="keep connections open (per-packet cost) instead of one per request")
    args = p.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="mf-nat-cost-") as workdir:
        print(json.dumps(measure(args.rounds, args.ops, Path(workdir), reused=args.reused), indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
