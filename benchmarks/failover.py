"""Fail-over time: from kill -9 of a primary to the first successful write of each of its blocks.

A k=4 fat-tree in Mininet with 8 storage servers, two copies of every block
(LevelDB), the real controller and agents. Each trial picks a primary at
random, starts the probe (`mininet_scenarios.probe`: one key per block of
the victim, written in a tight loop from a client host, one attempt per
call), and kills the victim's agent with SIGKILL, in one of two ways,
alternating so that a noisy neighbour hits both alike:

* ``port-down``: the agent is killed and its edge link taken down at once;
  the switch's port status tells the controller (immediate detection);
* ``heartbeat``: only the agent is killed; the controller notices the
  missing heartbeats (``--heartbeat-timeout``, 1 s by default; agents beat
  every 0.25 s).

The time of a trial is, per block, from the kill to the completion of the
first write sent after it that succeeded. Where it goes, from the
controller's events (its clock is ``time.monotonic()``, the same as ours):

* detection: kill -> ``server-failed``;
* fail-over: ``server-failed`` -> ``takeover`` (the new roles assigned under
  a new epoch, the flows moved and confirmed by barriers, the promoted
  primary told to serve: the controller's one saga);
* client: ``takeover`` -> the probe's first success (the attempt under way
  when the flows moved times out, 0.25 s, or gets TRYAGAIN, then 5 ms pause).

Between trials the cluster settles (every block has its backup again) and
the victim comes back empty, as in the nemesis.

    python -m benchmarks.failover --kills 20 --out benchmarks/results

``--leader-kill`` (issue 25): two controllers and etcd; each trial kills the
leading controller with kill -9 and, right after it, a primary's agent. The
standby takes over and its rebuild fails the victim over (its backups
promoted: ``promoted-at-rebuild``). Measured from the leader's death: the
new leader elected (``leader-elected``), the fail-over decided (the first
event that moves a block of the victim's), and each block serving again.
Between trials the killed controller comes back as a standby.

    python -m benchmarks.failover --leader-kill --kills 10 --out benchmarks/results
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from client_lib.api.rest import REST
from client_lib.cidr import Block
from mininet_scenarios.metaflow_net import MetaFlowNet
from mininet_scenarios.mgmt import SUBNET_HELP
from mininet_scenarios.nemesis import back_in_service, settled
from topology import builders

DETECTIONS = ("port-down", "heartbeat")
TARGETS_S = {"port-down": 1.0, "heartbeat": 2.0}
"""Issue 11's targets for the p99."""
LEADER_TARGET_S = 3.0
"""Issue 25's: leader killed -> a fail-over decided by the new leader, p99."""
DECIDED = ("promoted-at-rebuild", "server-failed", "takeover")
"""The new leader's events that decide a fail-over (a rebuild's promotion, or a
victim that registered before it died failed by its heartbeats)."""


def percentile(samples: list[float], q: float) -> float:
    """Nearest-rank percentile (`q` in 0..1) of a non-empty list."""
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, max(0, math.ceil(q * len(ordered)) - 1))]


def trial(mf: MetaFlowNet, rng: random.Random, detection: str, settle_timeout: float) -> dict[str, Any]:
    """One kill: its per-block times and the controller's timeline of it."""
    servers = mf.view(REST.servers).servers
    victim = rng.choice(sorted(n for n, s in servers.items() if s.blocks and not s.failed))
    blocks = servers[victim].blocks
    probe = mf.start_probe(blocks)
    time.sleep(0.5)   # connections warm, writes flowing
    killed_at = time.monotonic()
    agent = mf.kill_agent(victim)
    if detection == "port-down":
        mf.set_link(victim, up=False)
    first_ok = mf.finish_probe(probe, killed_at)["first_ok_s"]
    settle_s = settled(mf, victim, settle_timeout)
    events = {e["event"]: e for e in mf.events() if e.get("server") == victim and e["t"] >= killed_at
              and e["event"] in ("server-failed", "takeover")}
    if detection == "port-down":
        mf.set_link(victim, up=True)
    mf.revive_agent(agent)
    if not back_in_service(mf, victim, settle_timeout):
        raise RuntimeError(f"{victim} did not rejoin: {mf.view(REST.servers).servers.get(victim)}")
    failed_t = events.get("server-failed", {}).get("t")
    takeover_t = events.get("takeover", {}).get("t")
    times = [v for v in first_ok.values() if v is not None]
    return {"detection": detection, "victim": victim, "blocks": len(blocks), "first_ok_s": first_ok,
            "unserved_blocks": sum(v is None for v in first_ok.values()),
            "max_s": round(max(times), 3) if times else None,
            "detection_s": _since(failed_t, killed_at),
            "failover_s": _since(takeover_t, failed_t),
            "saga_s": events.get("takeover", {}).get("seconds"),
            "client_s": round(max(times) - (takeover_t - killed_at), 3) if times and takeover_t else None,
            "settle_s": settle_s}


def leader_trial(mf: MetaFlowNet, rng: random.Random, settle_timeout: float) -> dict[str, Any]:
    """kill -9 of the leader and, right after, of a primary's agent."""
    servers = mf.view(REST.servers).servers
    victim = rng.choice(sorted(n for n, s in servers.items() if s.blocks and not s.failed))
    blocks = servers[victim].blocks
    probe = mf.start_probe(blocks)
    time.sleep(0.5)
    killed_at = time.monotonic()
    old = mf.kill_leader()
    agent = mf.kill_agent(victim)
    first_ok = mf.finish_probe(probe, killed_at)["first_ok_s"]
    new = mf.leader()
    settle_s = settled(mf, victim, settle_timeout)
    events = [e for e in mf.events() if e["t"] >= killed_at]
    elected = next((e["t"] for e in events if e["event"] == "leader-elected"), None)
    decided = next((e["t"] for e in events if e["event"] in DECIDED
                    and (e.get("server") == victim or _overlaps(e.get("block"), blocks))), None)
    mf.revive_agent(agent)
    if not back_in_service(mf, victim, settle_timeout):
        raise RuntimeError(f"{victim} did not rejoin: {mf.view(REST.servers).servers.get(victim)}")
    mf.revive_controller(old)
    mf.standby(old)
    times = [v for v in first_ok.values() if v is not None]
    return {"detection": "leader-kill", "victim": victim, "blocks": len(blocks), "first_ok_s": first_ok,
            "unserved_blocks": sum(v is None for v in first_ok.values()),
            "max_s": round(max(times), 3) if times else None, "old_leader": old, "new_leader": new,
            "elected_s": _since(elected, killed_at), "decided_s": _since(decided, killed_at),
            "settle_s": settle_s}


def _overlaps(block: str | None, blocks: list[Block]) -> bool:
    """`block` (an event's, as text) is one of `blocks`, or a part or a whole of one."""
    if block is None:
        return False
    mine = Block.parse(block)
    return any(mine.covers(b) or b.covers(mine) for b in blocks)


def summarize_leader(trials: list[dict[str, Any]]) -> dict[str, Any]:
    """p50/p99/max of the decision, the election and the blocks' serving again."""
    row: dict[str, Any] = {"kills": len(trials), "target_p99_s": LEADER_TARGET_S}
    decided = [t["decided_s"] for t in trials if t["decided_s"] is not None]
    serving = [v for t in trials for v in t["first_ok_s"].values() if v is not None]
    for name, values in (("decided", decided), ("serving", serving),
                         ("elected", [t["elected_s"] for t in trials if t["elected_s"] is not None])):
        if values:
            row.update({f"{name}_p50_s": round(percentile(values, 0.5), 3),
                        f"{name}_p99_s": round(percentile(values, 0.99), 3),
                        f"{name}_max_s": round(max(values), 3)})
    row["undecided"] = len(trials) - len(decided)
    row["unserved_blocks"] = sum(t["unserved_blocks"] for t in trials)
    row["target_met"] = bool(decided) and not row["undecided"] and row["decided_p99_s"] <= LEADER_TARGET_S
    return {"leader-kill": row}


@contextmanager
def _cluster(mgmt_subnet: str | None, controller_args: list[str],
             controllers: int = 1) -> Iterator[MetaFlowNet]:
    """The benchmark's fabric, with data to re-replicate after each kill."""
    with tempfile.TemporaryDirectory(prefix="mffailover") as tmp:
        with MetaFlowNet(builders.fat_tree(4, servers=8), capacity=1_000_000, workdir=Path(tmp),
                         controllers=controllers, controller_args=["--no-auto-split", *controller_args],
                         mgmt_subnet=mgmt_subnet) as mf:
            mf.run_clients(250, Path(tmp), read_back=False)
            yield mf


def run_leader(kills: int, seed: int, settle_timeout: float = 60.0, mgmt_subnet: str | None = None,
               say: Callable[[str], object] = print) -> dict[str, Any]:
    rng = random.Random(seed)
    trials: list[dict[str, Any]] = []
    started = time.monotonic()
    load_before = os.getloadavg()[0]
    with _cluster(mgmt_subnet, [], controllers=2) as mf:
        mf.standby(1 - mf.leader())
        say(f"leader-kill benchmark: k=4 fat-tree, 8 servers, r={mf.replicas}, 2 controllers, etcd lease "
            f"{mf.lease_ttl} s; {kills} kills")
        for n in range(kills):
            result = leader_trial(mf, rng, settle_timeout)
            trials.append(result)
            say(f"kill {n + 1:3d}/{kills} leader {result['old_leader']} + {result['victim']}: elected "
                f"{result['elected_s']} s, fail-over decided {result['decided_s']} s, slowest block "
                f"{result['max_s']} s; settled in {result['settle_s']} s")
    return {"mode": "leader-kill", "kills": kills, "seed": seed, "cpus": os.cpu_count(),
            "loadavg_1min": [round(load_before, 2), round(os.getloadavg()[0], 2)],
            "date": time.strftime("%Y-%m-%d", time.gmtime()),
            "seconds": round(time.monotonic() - started, 1), "summary": summarize_leader(trials),
            "trials": trials}


def leader_table(results: dict[str, Any]) -> str:
    r = results["summary"]["leader-kill"]
    met = "met" if r["target_met"] else "MISSED"
    return "\n".join([
        "| kills | elected p50 / p99 s | fail-over decided p50 / p99 / max s | target p99 | "
        "blocks serving p50 / p99 s |", "|---:|---|---|---|---|",
        f"| {r['kills']} | {r.get('elected_p50_s')} / {r.get('elected_p99_s')} | {r.get('decided_p50_s')} / "
        f"{r.get('decided_p99_s')} / {r.get('decided_max_s')} | ≤ {LEADER_TARGET_S:g} s {met} | "
        f"{r.get('serving_p50_s')} / {r.get('serving_p99_s')} |"])


def _since(later: float | None, earlier: float | None) -> float | None:
    return round(later - earlier, 3) if later is not None and earlier is not None else None


def summarize(trials: list[dict[str, Any]]) -> dict[str, Any]:
    """Per detection: p50/p99/max of the per-block times, and the median of each part."""
    out: dict[str, Any] = {}
    for detection in DETECTIONS:
        mine = [t for t in trials if t["detection"] == detection]
        samples = [v for t in mine for v in t["first_ok_s"].values() if v is not None]
        if not samples:
            continue
        unserved = sum(t["unserved_blocks"] for t in mine)
        row: dict[str, Any] = {"kills": len(mine), "blocks": len(samples) + unserved,
                               "unserved_blocks": unserved,
                               "p50_s": round(percentile(samples, 0.5), 3),
                               "p99_s": round(percentile(samples, 0.99), 3),
                               "max_s": round(max(samples), 3), "target_p99_s": TARGETS_S[detection]}
        row["target_met"] = row["p99_s"] <= row["target_p99_s"] and not row["unserved_blocks"]
        for part in ("detection_s", "failover_s", "saga_s", "client_s"):
            values = [t[part] for t in mine if t[part] is not None]
            row[f"median_{part}"] = round(statistics.median(values), 3) if values else None
            row[f"max_{part}"] = round(max(values), 3) if values else None
        out[detection] = row
    return out


def run(kills: int, seed: int, heartbeat_timeout: float = 1.0, settle_timeout: float = 60.0,
        mgmt_subnet: str | None = None, say: Callable[[str], object] = print) -> dict[str, Any]:
    """`kills` per detection, interleaved; the trials and their summary."""
    rng = random.Random(seed)
    trials: list[dict[str, Any]] = []
    started = time.monotonic()
    load_before = os.getloadavg()[0]
    with _cluster(mgmt_subnet, ["--heartbeat-timeout", str(heartbeat_timeout)]) as mf:
        say(f"fail-over benchmark: k=4 fat-tree, 8 servers, r={mf.replicas}, heartbeat timeout "
            f"{heartbeat_timeout} s; {kills} kills per detection")
        for n in range(2 * kills):
            result = trial(mf, rng, DETECTIONS[n % 2], settle_timeout)
            trials.append(result)
            say(f"kill {n + 1:3d}/{2 * kills} {result['detection']:9s} {result['victim']}: "
                f"{result['blocks']} blocks, slowest {result['max_s']} s (detection "
                f"{result['detection_s']} s, fail-over {result['failover_s']} s, client "
                f"{result['client_s']} s); settled in {result['settle_s']} s")
    return {"kills_per_detection": kills, "seed": seed, "heartbeat_timeout_s": heartbeat_timeout,
            "cpus": os.cpu_count(), "loadavg_1min": [round(load_before, 2), round(os.getloadavg()[0], 2)],
            "seconds": round(time.monotonic() - started, 1), "summary": summarize(trials), "trials": trials}


def table(results: dict[str, Any]) -> str:
    lines = ["| detection | kills | blocks | p50 s | p99 s | max s | target p99 | detection s | fail-over s "
             "| client s |", "|---|---:|---:|---:|---:|---:|---|---:|---:|---:|"]
    for detection, r in results["summary"].items():
        met = "met" if r["target_met"] else "MISSED"
        lines.append(f"| {detection} | {r['kills']} | {r['blocks']} | {r['p50_s']:.2f} | {r['p99_s']:.2f} | "
                     f"{r['max_s']:.2f} | ≤ {r['target_p99_s']:g} s {met} | "
                     f"{r['median_detection_s']} | {r['median_failover_s']} | {r['median_client_s']} |")
    lines.append("\nParts are medians over the kills: detection = kill -> server-failed, fail-over = "
                 "server-failed -> takeover (roles, flows + barriers, activation), client = takeover -> "
                 "the probe's first success.")
    return "\n".join(lines)


def plot(results: dict[str, Any], path: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(12, 4.5))
    for detection in results["summary"]:
        samples = sorted(v for t in results["trials"] if t["detection"] == detection
                         for v in t["first_ok_s"].values() if v is not None)
        fractions = [0.0, *((i + 1) / len(samples) for i in range(len(samples)))]
        left.step([0.0, *samples], fractions, where="post",
                  label=f"{detection} (target p99 ≤ {TARGETS_S[detection]:g} s)")
        left.axvline(TARGETS_S[detection], linestyle=":", color="grey")
    left.set_xlabel("kill -9 to first successful write of a block (s)")
    left.set_ylabel("fraction of blocks")
    left.set_title("Fail-over time per affected block")
    left.legend()
    names = list(results["summary"])
    bottom = [0.0] * len(names)
    for part, label in (("detection_s", "detection"), ("failover_s", "controller fail-over"),
                        ("client_s", "client (retry)")):
        values = [results["summary"][n][f"median_{part}"] or 0.0 for n in names]
        right.bar(names, values, bottom=bottom, label=label)
        bottom = [b + v for b, v in zip(bottom, values, strict=True)]
    right.set_ylabel("seconds (medians)")
    right.set_title("Where the time goes")
    right.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--kills", type=int, default=20, help="kills per detection")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--heartbeat-timeout", type=float, default=1.0, help="the controller's (seconds)")
    p.add_argument("--out", type=Path, default=None, help="write failover.json and failover.png here")
    p.add_argument("--mgmt-subnet", default=None, help=SUBNET_HELP)
    p.add_argument("--leader-kill", action="store_true",
                   help="two controllers and etcd: kill -9 the leader and a primary in each trial")
    args = p.parse_args(argv)
    if args.leader_kill:
        results = run_leader(args.kills, args.seed, mgmt_subnet=args.mgmt_subnet,
                             say=lambda s: print(s, flush=True))
        print(leader_table(results))
        if args.out:
            args.out.mkdir(parents=True, exist_ok=True)
            (args.out / "failover-leader.json").write_text(json.dumps(results, indent=2) + "\n")
        return 0
    results = run(args.kills, args.seed, args.heartbeat_timeout, mgmt_subnet=args.mgmt_subnet,
                  say=lambda s: print(s, flush=True))
    print(table(results))
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "failover.json").write_text(json.dumps(results, indent=2) + "\n")
        plot(results, args.out / "failover.png")
    return 0


if __name__ == "__main__":
    sys.exit(main())
