"""`make demo`: MetaFlow end to end on a k=4 fat-tree in Mininet.

1. A k=4 fat-tree with 8 storage servers and 8 clients (`--topology` names
   another: `testbed`, the paper's 200 servers, or `fat-tree:8`, whose 128
   hosts are all servers and get a switch of clients), Open vSwitch in the
   userspace datapath, `metaflow-controller`, one `metaflow-agent` per
   server (LevelDB; `--store redis` for Redis). Two servers start busy, the
   rest idle, and the capacity is low, so servers split while clients write.
2. Every client writes the metadata of its share of the files and reads it
   back, each request sent to the path's MetaDataID with no lookup.
3. One busy server is killed (kill -9) while clients keep writing; every
   block has a backup on another rack (r=2), the controller notices the
   missing heartbeats, promotes the backups and moves the flows, and a probe
   measures the time from the kill to the first successful write of a key
   in each of the killed server's blocks; re-replication then restores the
   second copy in the background.
4. Every acknowledged write is checked: readable with the right content
   (none may be lost; with `--replicas 1` the killed server's blocks are
   lost, and the controller says so).

Prints the table sizes per switch, the splits and the take-over with their
times, and a summary; leaves nothing behind.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from client_lib.api.rest import REST
from client_lib.cidr import Block
from client_lib.constants import DEFAULT_REPLICAS
from mininet_scenarios.daemons import ROOT
from mininet_scenarios.metaflow_net import FlowCounts, MetaFlowNet, add_fabric_arguments
from topology import builders


def _say(text: str) -> None:
    print(text, flush=True)


def _print_flows(mf: MetaFlowNet, title: str) -> dict[str, FlowCounts]:
    counts = mf.flow_counts()
    _say(f"\n{title}: MetaFlow entries per switch (read back from OVS with ovs-ofctl dump-flows)")
    by_layer: dict[str | None, list[str]] = {}
    for switch, c in counts.items():
        by_layer.setdefault(c["layer"], []).append(f"{switch}={c['metaflow']}")
    for layer in ("core", "agg", "edge"):
        _say(f"  {layer:5s} {'  '.join(by_layer.get(layer, []))}")
    return counts


def _print_status(mf: MetaFlowNet) -> None:
    """What an operator sees: `metaflowctl status`, signed with the cluster's secret."""
    secret = mf.running.secret_file
    assert mf.api is not None and secret is not None
    _say(f"\n$ metaflowctl status --controller {mf.api.base_url} --secret-file {secret.name} --events 3")
    out = subprocess.run([sys.executable, "-m", "controller.ctl", "status", "--controller", mf.api.base_url,
                          "--secret-file", str(secret), "--events", "3"],
                         cwd=ROOT, capture_output=True, text=True, timeout=60)
    _say(out.stdout.rstrip() if out.returncode == 0 else f"  status failed ({out.returncode}): {out.stderr}")


def run(args: argparse.Namespace, workdir: Path) -> int:
    """The demo; `workdir` holds the clients' records of acknowledged writes
    and the controller's log while it runs."""
    started = time.monotonic()
    graph = builders.with_clients(builders.named(args.topology))
    _say(f"MetaFlow demo: {graph.graph['name']}, {len(builders.switches(graph))} switches, "
         f"{len(builders.storage_hosts(graph))} storage servers ({args.store}), "
         f"{len(builders.client_hosts(graph))} clients, "
         f"{args.files} files, capacity {args.capacity} keys per server, {args.replicas} copies of each")
    with MetaFlowNet(graph, capacity=args.capacity, store=args.store, workdir=workdir,
                     replicas=args.replicas, controller_args=["--bootstrap", "preallocate:2"],
                     mgmt_subnet=args.mgmt_subnet, heartbeat=args.heartbeat) as mf:
        _say(f"network up in {mf.timings['network_built_s']} s "
             f"(Mininet + agents {mf.timings['scenario_up_s']} s, then discovery and B-tree)")
        first_request = time.monotonic()
        _print_flows(mf, "after bootstrap")
        _say(f"\nphase 1: clients write {args.files} files (splits happen as servers fill up), "
             "then read them back")
        share = args.files // len(mf.hosts("client"))
        phase1 = mf.run_clients(share, workdir)
        splits = mf.view(REST.splits).splits
        for s in splits:
            _say(f"  split {s['server']} -> {s['target']}: {s['keys_moved']} of {s['keys_total']} keys, "
                 f"{s['flow_mods']} flow mods on {s['switches']} switches, copy {s['copy_s']} s, "
                 f"flows+barrier {s['flows_s']} s, total {s['total_s']} s")
        counts = _print_flows(mf, "after the splits")
        _print_status(mf)
        servers = mf.view(REST.servers).servers
        victim = max((n for n, s in servers.items() if s.state == "busy"), key=lambda n: servers[n].keys)
        blocks = servers[victim].blocks
        _say(f"\nphase 2: kill -9 of server {victim} ({servers[victim].keys} keys, primary of "
             f"{', '.join(map(str, blocks))}) while clients keep writing")
        probe = mf.start_probe(blocks)
        clients = mf.start_clients(share // 4, workdir, start=args.files, read_back=False)
        time.sleep(1.0)   # the clients are writing
        # Out of the scenario's hands: it would (rightly) complain at teardown
        # that this agent did not exit cleanly.
        mf.running.agents.pop(mf.running.topo.graph_names[victim]).kill()
        kill_time = time.monotonic()
        outage = mf.finish_probe(probe, kill_time)["first_ok_s"]
        phase2 = mf.collect(clients)
        takeover = next((e for e in mf.events("takeover") if e["server"] == victim), None)
        lost = mf.events("DATA-LOST")
        if takeover:
            how = (f"promoted the backups of {len(takeover['promoted'])} blocks" if takeover["promoted"]
                   else f"{takeover['successor']} took {takeover['blocks']} blocks ({takeover['why']})")
            _say(f"  take-over of {victim}: {how}, {takeover['seconds']} s from decision to serving")
        for block, seconds in outage.items():
            _say(f"  first successful write in {block}: "
                 + (f"{seconds:.2f} s after the kill" if seconds is not None else "none within 30 s"))
        if args.replicas > 1 and mf.wait_replicated(60) is not None:
            _say(f"  every block has {args.replicas} copies again {time.monotonic() - kill_time:.1f} s "
                 f"after the kill ({len(mf.events('replicated'))} re-replications)")
        for event in lost:
            _say(f"  DATA LOST (said loudly by the controller): blocks {', '.join(event['blocks'])} "
                 f"of {event['server']}, up to {event['keys_lost_at_most']} keys")
        lost_blocks = [Block.parse(b) for e in lost for b in e["blocks"]]
        _say("\nphase 3: checking every acknowledged write")
        check = mf.verify_acked(workdir, lost_blocks)
        final = _print_flows(mf, "at the end")
        ops = sum(c["written"] + c["read_back"] for c in phase1) + sum(c["written"] for c in phase2)
        _say("\nsummary")
        rows = [
            ("time to first request served", f"{round(first_request - started, 1)} s"),
            ("operations (puts + gets)", ops),
            ("put latency p50 / p99 (phase 1)",
             f"{_median(phase1, 'put_p50_ms')} / {_median(phase1, 'put_p99_ms')} ms"),
            ("get latency p50 / p99 (phase 1)",
             f"{_median(phase1, 'get_p50_ms')} / {_median(phase1, 'get_p99_ms')} ms"),
            ("client retries (MOVED / TRYAGAIN)", f"{sum(c['retries'] for c in phase1 + phase2)} "
                                                  f"({sum(c['moved'] for c in phase1 + phase2)} / "
                                                  f"{sum(c['tryagain'] for c in phase1 + phase2)})"),
            ("splits", len(splits)),
            ("acknowledged writes", check["acked"]),
            ("  lost with the killed server" + (" (r=1: no copy)" if args.replicas == 1 else " (must be 0)"),
             check["lost_with_killed_server"]),
            ("  missing or wrong otherwise (must be 0)", check["missing"] + check["wrong"]),
            ("kill -9 to first successful write of an affected key, max",
             _seconds(max((v for v in outage.values() if v is not None), default=None))),
            ("entries per switch, mean core / agg / edge", _means(final)),
            ("entries per switch before the kill, max", max(c["metaflow"] for c in counts.values())),
        ]
        for name, value in rows:
            _say(f"  {name:58s} {value}")
    _say(f"\ndone in {round(time.monotonic() - started, 1)} s; everything torn down")
    lost_ok = args.replicas == 1 or check["lost_with_killed_server"] == 0
    return 0 if check["missing"] + check["wrong"] == 0 and lost_ok else 1


def _seconds(value: float | None) -> str:
    return "none" if value is None else f"{value:.2f} s"


def _median(rows: list[dict], key: str) -> float:
    values = sorted(r[key] for r in rows)
    return values[len(values) // 2]


def _means(counts: dict) -> str:
    out = []
    for layer in ("core", "agg", "edge"):
        values = [c["metaflow"] for c in counts.values() if c["layer"] == layer]
        out.append(f"{sum(values) / len(values):.1f}" if values else "-")
    return " / ".join(out)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_fabric_arguments(p)
    p.add_argument("--files", type=int, default=20_000, help="files written in phase 1")
    p.add_argument("--capacity", type=int, default=8000,
                   help="keys per server (its backups' included) before it splits")
    p.add_argument("--store", choices=("leveldb", "redis"), default="leveldb")
    p.add_argument("--replicas", type=int, default=DEFAULT_REPLICAS, help="copies of each block")
    args = p.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="mfdemo") as workdir:
        return run(args, Path(workdir))


if __name__ == "__main__":
    sys.exit(main())
