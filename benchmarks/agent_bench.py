"""What the agent costs on a request's path, measured side by side in one run.

1. Rewrite: the same daemon, store and client across a real veth between two
   network namespaces, with no rewrite (the client addresses the server
   directly), the kernel DNAT, and the paper's user-space NFQUEUE agent. The
   NFQUEUE worker's CPU time is read from /proc and set against the whole
   agent's, beside the paper's "up to 15 % of server CPU".
2. Service: the metadata service (LevelDB and Redis stores) against a raw
   redis-server on loopback, all driven by the same client library:
   sequential latency (connection reused, and one connection per request as
   in the paper) and throughput with concurrent client processes.

Modes and servers are interleaved over rounds, so a noisy neighbour hits all
of them alike; the tables report the median of the rounds.

    python -m benchmarks.agent_bench [--quick] [--out benchmarks/results]
"""

from __future__ import annotations

import argparse
import csv
import json
import multiprocessing
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping
from pathlib import Path

from tqdm import tqdm

from benchmarks.agent_load import run as run_load
from benchmarks.cpu import cpu_seconds, pid_of
from benchmarks.nat_cost import REQUEST_PATH_ONLY, SPACE, agent_in_pair
from client_lib.api.admin import ADMIN
from client_lib.client import MetaFlowClient
from mininet_scenarios.daemons import ROOT, AgentProcess
from nat_agent.redis_server import RedisServer

REWRITE_TARGET = 1.05   # kernel rewrite at most 5 % over no rewrite
LATENCY_TARGETS = {"agent leveldb": 1.2, "agent redis": 1.3}
"""Service p50 at most this times raw redis (issue 13 for LevelDB, the earlier target for Redis)."""
THROUGHPUT_TARGET = 0.8   # service ops/s at 16 clients at least 0.8x raw redis (issue 13)
REDIS_BENCHMARK_TARGET = 0.8   # `redis-benchmark -c 50` rps at least 0.8x raw (issue 13)
REDIS_BENCHMARK_CLIENTS = 50
REDIS_BENCHMARK_VALUE = "m" * 250   # the paper's metadata record size


def _median(values: list[float]) -> float:
    return round(statistics.median(values), 1)


# -- 1. rewrite -----------------------------------------------------------------

def rewrite_round(mode: str, ops: int, workdir: Path, progress: tqdm) -> dict:
    """One daemon in one mode; GET and SET latency from the client namespace."""
    with agent_in_pair(mode, workdir, mode, "mfbr") as (net, agent, via):
        result: dict = {"mode": mode}
        cpu_before = {"agent": cpu_seconds(pid_of(agent.proc))}
        worker = agent.call(ADMIN.stats).rewrite.get("pid")   # the NFQUEUE worker, if any
        if isinstance(worker, int):
            cpu_before["worker"] = cpu_seconds(worker)
        for workload in ("get", "set"):
            out = net.client.run(sys.executable, "-m", "benchmarks.agent_load", "--ops", str(ops),
                                 "--workload", workload, "--space", SPACE, *via,
                                 cwd=ROOT, timeout=600)
            report = json.loads(out.stdout)
            result[workload] = report["latency"][workload]
            progress.update(1)
        stats = agent.call(ADMIN.stats).rewrite
        agent_cpu = cpu_seconds(pid_of(agent.proc)) - cpu_before["agent"]
        if isinstance(worker, int):
            worker_cpu = cpu_seconds(worker) - cpu_before["worker"]
            result["nat_cpu_share"] = round(worker_cpu / (worker_cpu + agent_cpu), 3)
            result["us_per_packet_python"] = round(_number(stats, "us_translate_per_packet"), 1)
            result["us_per_packet_callback"] = round(_number(stats, "us_callback_per_packet"), 1)
            result["nat_cpu_us_per_op"] = round(worker_cpu * 1e6 / (2 * ops), 1)
    return result


def _number(stats: Mapping[str, object], key: str) -> float:
    value = stats.get(key)
    if not isinstance(value, (int, float)):
        raise RuntimeError(f"the agent's rewrite stats have {key}={value!r}, not a number")
    return value


def bench_rewrite(rounds: int, ops: int, workdir: Path, progress: tqdm) -> dict:
    modes = ("none", "local", "kernel", "nfqueue")
    runs: dict[str, list[dict]] = {m: [] for m in modes}
    for r in range(rounds):
        for mode in (modes if r % 2 == 0 else reversed(modes)):
            runs[mode].append(rewrite_round(mode, ops, workdir, progress))
    table = {}
    for mode, results in runs.items():
        row = {f"{w}_{k}": _median([res[w][k] for res in results])
               for w in ("get", "set") for k in ("mean_us", "p50_us", "p99_us")}
        for extra in ("nat_cpu_share", "us_per_packet_python", "us_per_packet_callback", "nat_cpu_us_per_op"):
            if extra in results[0]:
                row[extra] = round(statistics.median(r[extra] for r in results), 3)
        table[mode] = row
    for mode in modes[1:]:
        for w in ("get", "set"):
            table[mode][f"{w}_ratio"] = round(table[mode][f"{w}_p50_us"] / table["none"][f"{w}_p50_us"], 3)
    return table


# -- 2. service vs raw redis ------------------------------------------------------

def _latency(target: tuple[str, int], ops: int, fresh: bool) -> dict:
    with MetaFlowClient(space=SPACE, route=lambda _a: target, reuse=not fresh) as client:
        return {w: run_load(client, w, ops, "/svc", 250)["latency"][w] for w in ("get", "set")}


def _closed_loop(target: tuple[str, int], seconds: float, seed: int, out: multiprocessing.Queue) -> None:
    """One client process: the paper's mix (20 % get, 80 % put), 250-byte values."""
    import random
    rng = random.Random(seed)
    value = b"m" * 250
    done = 0
    with MetaFlowClient(space=SPACE, route=lambda _a: target) as client:
        paths = [f"/tp/{seed}/{i}" for i in range(200)]
        for p in paths:
            client.put(p, value)
        end = time.perf_counter() + seconds
        while time.perf_counter() < end:
            path = paths[rng.randrange(len(paths))]
            if rng.random() < 0.2:
                client.get(path)
            else:
                client.put(path, value)
            done += 1
    out.put(done)


def _throughput(target: tuple[str, int], clients: int, seconds: float) -> float:
    ctx = multiprocessing.get_context("fork")
    queue = ctx.Queue()
    procs = [ctx.Process(target=_closed_loop, args=(target, seconds, i, queue)) for i in range(clients)]
    for p in procs:
        p.start()
    total = sum(queue.get(timeout=seconds + 60) for _ in procs)
    for p in procs:
        p.join()
    return round(total / seconds, 1)


def _python_floor(ready: multiprocessing.Queue) -> None:
    """The cheapest RESP server Python can be: uvloop protocol callbacks that
    answer every request without parsing, storing or checking anything. Its
    latency is what any Python service pays before doing its job."""
    import asyncio

    import uvloop

    class Floor(asyncio.Protocol):
        def connection_made(self, transport):
            self.transport = transport

        def data_received(self, data):
            self.transport.write(b"+OK\r\n" if b"SET" in data[:16] else b"$250\r\n" + b"m" * 250 + b"\r\n")

    async def serve():
        server = await asyncio.get_running_loop().create_server(Floor, "127.0.0.1", 0)
        ready.put(server.sockets[0].getsockname()[1])
        await asyncio.Event().wait()

    uvloop.run(serve())


def bench_service(rounds: int, ops: int, concurrency: list[int], seconds: float,
                  workdir: Path, progress: tqdm) -> dict:
    ctx = multiprocessing.get_context("fork")
    ready = ctx.Queue()
    floor = ctx.Process(target=_python_floor, args=(ready,), daemon=True)
    floor.start()
    try:
        return _bench_service(rounds, ops, concurrency, seconds, workdir, progress,
                              ("127.0.0.1", ready.get(timeout=30)))
    finally:
        floor.kill()
        floor.join()


def _redis_benchmark(target: tuple[str, int], command: str, requests: int) -> dict:
    """`redis-benchmark -c 50` with one custom command on random paths
    (``__rand_int__``: a 12-digit number, so ``/rb/000000012345``)."""
    host, port = target
    argv = ["redis-benchmark", "-h", host, "-p", str(port), "-c", str(REDIS_BENCHMARK_CLIENTS),
            "-n", str(requests), "-r", "100000", "-q", "--csv", command, "/rb/__rand_int__"]
    if command == "SET":
        argv.append(REDIS_BENCHMARK_VALUE)
    out = subprocess.run(argv, capture_output=True, text=True, timeout=300, check=True).stdout
    row = next(csv.DictReader(out.splitlines()))
    return {"rps": float(row["rps"]), "p50_us": float(row["p50_latency_ms"]) * 1000}


def _bench_service(rounds: int, ops: int, concurrency: list[int], seconds: float,
                   workdir: Path, progress: tqdm, floor: tuple[str, int]) -> dict:
    def leveldb(name: str, *flags: str) -> AgentProcess:
        return AgentProcess(f"leveldb:{workdir / name}", *REQUEST_PATH_ONLY, *flags, own=[SPACE])

    with RedisServer(workdir / "raw", port=0) as raw, RedisServer(workdir / "backing", port=0) as backing, \
            leveldb("svc-leveldb") as ldb, leveldb("svc-2", "--workers", "2") as two, \
            leveldb("svc-loop", "--workers", "0") as on_loop, \
            leveldb("svc-python", "--request-path", "python") as py_path, \
            AgentProcess(f"{backing.url}/0?prefix=bench:", *REQUEST_PATH_ONLY, own=[SPACE]) as rds:
        assert raw.port is not None   # port=0: a free TCP port, chosen at start
        targets = {"raw redis": ("127.0.0.1", raw.port), "python floor": floor,
                   "agent leveldb": (ldb.host, ldb.port),
                   "agent leveldb, 2 workers": (two.host, two.port),
                   "agent leveldb, event loop": (on_loop.host, on_loop.port),
                   "agent leveldb, python path": (py_path.host, py_path.port),
                   "agent redis": (rds.host, rds.port)}
        samples: dict[str, dict[str, list[float]]] = {name: {} for name in targets}
        for r in range(rounds):
            order = list(targets) if r % 2 == 0 else list(reversed(targets))
            for name in order:
                for fresh in (False, True):
                    lat = _latency(targets[name], ops if not fresh else max(200, ops // 5), fresh)
                    tag = "fresh" if fresh else "reused"
                    for w in ("get", "set"):
                        for k in ("p50_us", "p99_us", "mean_us"):
                            samples[name].setdefault(f"{w}_{tag}_{k}", []).append(lat[w][k])
                    progress.update(1)
                for c in concurrency:
                    rate = _throughput(targets[name], c, seconds)
                    samples[name].setdefault(f"ops_per_s_{c}", []).append(rate)
                    progress.update(1)
                if name != "python floor":   # it answers without parsing: no custom command means anything
                    for command in ("SET", "GET"):
                        run = _redis_benchmark(targets[name], command, max(20_000, ops * 10))
                        for k, v in run.items():
                            samples[name].setdefault(f"rb_{command.lower()}_{k}", []).append(v)
                    progress.update(1)
    table = {name: {k: _median(v) for k, v in cols.items()} for name, cols in samples.items()}
    raw_row = table["raw redis"]
    for name, row in table.items():
        if name == "raw redis":
            continue
        for key in ("get_reused_p50_us", "set_reused_p50_us", "get_fresh_p50_us", "set_fresh_p50_us"):
            row[key.replace("_p50_us", "_ratio")] = round(row[key] / raw_row[key], 3)
        for key in [f"ops_per_s_{c}" for c in concurrency] + ["rb_set_rps", "rb_get_rps"]:
            if key in row:
                row[key + "_ratio"] = round(row[key] / raw_row[key], 3)
    return table


# -- report -------------------------------------------------------------------------

def format_report(results: dict) -> str:
    rw, svc = results["rewrite"], results["service"]
    lines = ["## Rewrite on the request path (veth between two namespaces, LevelDB store)", "",
             "| rewrite | GET p50 µs | GET p99 µs | SET p50 µs | SET p99 µs | GET ratio | SET ratio "
             "| NAT CPU share | µs/packet (Python / callback) |",
             "|---|---|---|---|---|---|---|---|---|"]
    for mode, row in rw.items():
        share = f"{row['nat_cpu_share'] * 100:.0f} %" if "nat_cpu_share" in row else "—"
        pkt = (f"{row['us_per_packet_python']} / {row['us_per_packet_callback']}"
               if "us_per_packet_python" in row else "—")
        lines.append(f"| {mode} | {row['get_p50_us']} | {row['get_p99_us']} | {row['set_p50_us']} | "
                     f"{row['set_p99_us']} | {row.get('get_ratio', 1.0)} | {row.get('set_ratio', 1.0)} | "
                     f"{share} | {pkt} |")
    kernel = max(rw["kernel"]["get_ratio"], rw["kernel"]["set_ratio"])
    lines += ["", f"Target: kernel rewrite at most {REWRITE_TARGET}x no rewrite: measured {kernel}x "
              f"({'met' if kernel <= REWRITE_TARGET else 'MISSED'}). "
              "The paper reports its NAT agent at up to "
              f"15 % of server CPU; ours (NFQUEUE worker CPU / whole agent CPU): "
              f"{rw['nfqueue'].get('nat_cpu_share', 0) * 100:.0f} %.", "",
              "## Metadata service against a raw redis-server (loopback, same client library)", "",
              "| server | GET p50 µs | SET p50 µs | GET ratio | SET ratio | GET p50 µs, new conn "
              "| SET p50 µs, new conn | ratio, new conn (GET/SET) | "
              + " | ".join(f"ops/s, {c} clients" for c in results["concurrency"]) + " |",
              "|---" * (8 + len(results["concurrency"])) + "|"]
    for name, row in svc.items():
        ratios = (f"{row.get('get_reused_ratio', 1.0)} | {row.get('set_reused_ratio', 1.0)}")
        fresh = f"{row.get('get_fresh_ratio', 1.0)} / {row.get('set_fresh_ratio', 1.0)}"
        ops = " | ".join(f"{row[f'ops_per_s_{c}']:.0f}" for c in results["concurrency"])
        lines.append(f"| {name} | {row['get_reused_p50_us']} | {row['set_reused_p50_us']} | {ratios} | "
                     f"{row['get_fresh_p50_us']} | {row['set_fresh_p50_us']} | {fresh} | {ops} |")
    lines += ["", f"`redis-benchmark -c {REDIS_BENCHMARK_CLIENTS}` with custom commands on random paths "
              f"(`SET /rb/__rand_int__ <250 bytes>`, `GET /rb/__rand_int__`):", "",
              "| server | SET rps | GET rps | SET p50 µs | GET p50 µs | SET ratio | GET ratio |",
              "|---|---|---|---|---|---|---|"]
    for name, row in svc.items():
        if "rb_set_rps" in row:
            lines.append(f"| {name} | {row['rb_set_rps']:.0f} | {row['rb_get_rps']:.0f} | "
                         f"{row['rb_set_p50_us']:.0f} | {row['rb_get_p50_us']:.0f} | "
                         f"{row.get('rb_set_rps_ratio', 1.0)} | {row.get('rb_get_rps_ratio', 1.0)} |")
    for name, target in LATENCY_TARGETS.items():
        worst = max(svc[name]["get_reused_ratio"], svc[name]["set_reused_ratio"])
        lines.append(f"\nTarget: {name} latency at most {target}x raw redis: measured {worst}x "
                     f"({'met' if worst <= target else 'MISSED'}).")
    top = f"ops_per_s_{max(results['concurrency'])}_ratio"
    rate = svc["agent leveldb"].get(top, 0.0)
    lines.append(f"\nTarget: agent leveldb throughput at {max(results['concurrency'])} clients at least "
                 f"{THROUGHPUT_TARGET}x raw redis: measured {rate}x "
                 f"({'met' if rate >= THROUGHPUT_TARGET else 'MISSED'}).")
    rb = min(svc["agent leveldb"]["rb_set_rps_ratio"], svc["agent leveldb"]["rb_get_rps_ratio"])
    lines.append(f"\nTarget: agent leveldb under `redis-benchmark -c {REDIS_BENCHMARK_CLIENTS}` at least "
                 f"{REDIS_BENCHMARK_TARGET}x raw: measured {rb}x "
                 f"({'met' if rb >= REDIS_BENCHMARK_TARGET else 'MISSED'}).")
    compiled, python = svc["agent leveldb"], svc["agent leveldb, python path"]
    lines.append(f"\nThe compiled request path (one worker thread, the default) against the Python one "
                 f"(`--request-path python`): GET p50 {compiled['get_reused_p50_us']} against "
                 f"{python['get_reused_p50_us']} µs, SET p50 {compiled['set_reused_p50_us']} against "
                 f"{python['set_reused_p50_us']} µs.")
    two, loop = svc["agent leveldb, 2 workers"], svc["agent leveldb, event loop"]
    top_clients = f"ops_per_s_{max(results['concurrency'])}"
    lines.append(f"\nWorkers (`--workers`), 1 / 2 / 0 (the lane on the event loop): "
                 f"{compiled[top_clients]:.0f} / {two[top_clients]:.0f} / {loop[top_clients]:.0f} ops/s at "
                 f"{max(results['concurrency'])} clients; `redis-benchmark` SET "
                 f"{compiled['rb_set_rps']:.0f} / {two['rb_set_rps']:.0f} / {loop['rb_set_rps']:.0f}, GET "
                 f"{compiled['rb_get_rps']:.0f} / {two['rb_get_rps']:.0f} / {loop['rb_get_rps']:.0f} "
                 "requests/s.")
    floor = max(svc["python floor"]["get_reused_ratio"], svc["python floor"]["set_reused_ratio"])
    agent_over_floor = round(svc["agent leveldb"]["get_reused_p50_us"]
                             / svc["python floor"]["get_reused_p50_us"], 2)
    lines.append(f"\nFor scale: a Python server that only answers (no parsing, no store, `python floor`) "
                 f"is already {floor}x raw redis; the agent over LevelDB is "
                 f"{agent_over_floor}x "
                 f"(GET) that floor.")
    lines += ["", f"{results['rounds']} interleaved rounds, {results['ops']} sequential requests per "
              f"latency sample, {results['seconds']} s per throughput sample; medians over rounds. "
              f"Machine: {multiprocessing.cpu_count()} cores, clients and servers on the same cores."]
    return "\n".join(lines)


def plot(results: dict, path: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(12, 4.5))
    rw = results["rewrite"]
    modes = list(rw)
    for i, w in enumerate(("get", "set")):
        left.bar([x + i * 0.38 for x in range(len(modes))], [rw[m][f"{w}_p50_us"] for m in modes],
                 width=0.38, label=w.upper())
    left.set_xticks([x + 0.19 for x in range(len(modes))], modes)
    left.set_ylabel("round trip p50 (µs)")
    left.set_title("Rewrite mode (client and server namespaces)")
    left.legend()
    svc = results["service"]
    for name, row in svc.items():
        right.plot(results["concurrency"], [row[f"ops_per_s_{c}"] for c in results["concurrency"]],
                   marker="o", label=name)
    right.set_xlabel("concurrent client processes")
    right.set_ylabel("ops/s (20 % GET, 80 % SET)")
    right.set_title("Service vs raw redis-server (loopback)")
    right.set_xscale("log", base=2)
    right.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="fewer rounds and requests (about a minute)")
    p.add_argument("--out", type=Path, default=None, help="write agent.json, agent.md, agent.png here")
    args = p.parse_args(argv)
    rounds, ops, seconds = (1, 1000, 1.0) if args.quick else (3, 3000, 3.0)
    concurrency = [1, 4, 16]
    steps = rounds * 3 * 2 + rounds * 7 * (2 + len(concurrency)) + rounds * 6
    with tempfile.TemporaryDirectory(prefix="mfbench") as tmp, \
            tqdm(total=steps, desc="agent bench", disable=not sys.stderr.isatty()) as progress:
        workdir = Path(tmp)
        results = {"rounds": rounds, "ops": ops, "seconds": seconds, "concurrency": concurrency,
                   "rewrite": bench_rewrite(rounds, ops, workdir, progress),
                   "service": bench_service(rounds, ops, concurrency, seconds, workdir, progress)}
    report = format_report(results)
    print(report)
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "agent.json").write_text(json.dumps(results, indent=2) + "\n")
        (args.out / "agent.md").write_text(report + "\n")
        plot(results, args.out / "agent.png")
    return 0


if __name__ == "__main__":
    sys.exit(main())
