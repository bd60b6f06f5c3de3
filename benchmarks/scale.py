"""`make bench-scale`: the real controller against emulated fat-trees, k = 4 to 32.

For each size, one real `metaflow-controller` (a subprocess on ports of its
own), the switch emulator (`benchmarks.ofemu`: one OpenFlow 1.0 connection
per switch) and the agent generator (`benchmarks.agentemu`: the signed
registration, heartbeats and the admin API of every storage server), then:

- switches: from the first switch's FEATURES_REPLY to every switch in the
  controller's topology view, and every link found by LLDP;
- registration: every server's signed registration accepted (a storage row
  powering up: all at once, 32 in flight);
- location: then every server's first ARP leaves its edge port, until the
  controller has located them all (it gives each new host a /32 route on
  every switch, confirmed by barriers, before it answers);
- the first build: from the last server located until the build operation
  has ended (its flows confirmed by barriers) and every switch holds exactly
  the table the controller's planner computed;
- the whole-fabric check: the emulated switches' tables, fed to
  `btree.fake_network.FakeNetwork` on the fabric as it is wired, deliver
  every ID of the space to the owner of its block from every edge switch
  (`misdelivered`), and agree entry for entry with
  the planner's (`REST.flows`: `planner.table` of the controller's tree);
- the steady state (`--steady`, 30 s): the built fabric's controller CPU
  with nothing to do but the agents' liveness and LLDP;
- optionally (`--faults`) the issue's faults at scale on the built fabric:
  `FLAPS` random switches disconnect and connect again (each keeps its table
  and is re-synced, `switch-resync`), then `RACK` servers lose power at once
  (a rack: whole edge switches' servers, their agents silent and their edge
  ports down), each followed by the same whole-fabric check;
- optionally (`--restart`) a rebuild by a successor: the controller is
  stopped and started again on the same ports (a new leader's path without
  etcd: it rebuilds from the agents and the switches' tables), timed from
  its start to the same check passing again;
- optionally (`--leader-change`) the same with two controllers elected
  through a real etcd: every switch connected to both (Nicira roles), the
  agents given both URLs; the leader is killed (SIGKILL) and the standby,
  which has heard the fabric all along, is timed from the kill to its
  election and to the same check passing again; `--leader-change storm`
  kills it instead when half the servers have registered (a registration
  storm), and the standby makes the first build;
- all along: the controller's CPU (% of one core) and RSS every 0.5 s from
  /proc, and the round trip of a REST view, which is computed on the decision
  thread, as the decision thread's queueing latency (the controller exposes no
  per-event latency of its own).

Writes benchmarks/results/scale.json and scale.png.

    python -m benchmarks.scale --k 4 8 16 --out benchmarks/results
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import functools
import json
import os
import random
import signal
import socket
import statistics
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable
from dataclasses import asdict, dataclass, field
from itertools import pairwise
from pathlib import Path
from typing import Any, TypeVar

from benchmarks.agentemu import AgentFarm
from benchmarks.cpu import cpu_seconds
from benchmarks.ofemu import Emulator
from benchmarks.sample import RealSample, outside, sample_edges, under_replicated
from btree.fake_network import FakeNetwork, misdelivered
from btree.flows import FlowEntry, Table
from client_lib.api.auth import load_secret, write_secret
from client_lib.api.clients import AsyncApiClient
from client_lib.api.rest import REST, ServerInfo
from client_lib.cidr import Block
from client_lib.constants import DEFAULT_REPLICAS, DEFAULT_SPACE_CIDR
from client_lib.errors import ApiError
from controller.settings import MODES, Mode
from mininet_scenarios.etcd import EtcdProcess
from topology import builders
from topology.classify import discovered_graph, map_topology

T = TypeVar("T")

SERVERS = {4: 16, 8: 128, 16: 1024, 32: 2000}
"""Storage servers per k: every host up to k=16, the paper's 2,000 at k=32."""
SAMPLE_S = 0.5
TARGET_S = 30.0
"""The issue's target for registration, the first build and a rebuild at k=32."""
HEARTBEAT_S = 1.0
"""The emulated agents' heartbeat interval (by datagram; a real agent's is
0.25 s): this process also plays every switch, on the same 2 cores."""
FLAPS = 50
"""`--faults`: switches that disconnect and connect again, one every `FLAP_EVERY_S`."""
FLAP_EVERY_S = 0.1
RACK = 100
"""`--faults`: servers that lose power at once."""
SAMPLE_FILES = 100
"""`--sample`: paths each sample client writes before the faults, and again after."""
SAMPLE_POLL_S = 1.0
"""How often the sample's steps ask the controller whether they are over: a
settled check reads `REST.flows`, every switch's plan (23,000 entries at
k=32), on the controller's decision thread, and polling it twice a second
kept that thread busy."""
LEASE_TTL_S = 3
"""The leader's etcd lease with `--leader-change` (`--lease-ttl`): the
controller's 1 s default is for a controller that never stalls for long,
and at k=32 on 2 cores this one does (a 3 s lease was lost once, 45 s into
a rebuild, under the registration storm)."""
MIN_TIMEOUT_S = 10.0
"""The controller's heartbeat timeout: four intervals, 10 s at least. On 2
cores shared with other work a shorter one failed servers over whose beats
were only late (k=8, load average 18)."""


@dataclass
class Sample:
    t: float
    cpu_pct: float
    rss_mb: float
    view_ms: float | None
    flow_mods: int
    """Flow mods the emulated switches had received by then."""


@dataclass
class Sampler:
    """The controller's CPU and memory, and a decision-thread round trip, every `SAMPLE_S`."""

    pid: int
    client: AsyncApiClient
    flow_mods: Callable[[], int]
    start: float = field(default_factory=time.monotonic)
    samples: list[Sample] = field(default_factory=list)

    async def run(self) -> None:
        last_t, last_cpu = time.monotonic(), cpu_seconds(self.pid)
        while True:
            await asyncio.sleep(SAMPLE_S)
            began = time.monotonic()
            try:
                await self.client.call(REST.operations)
                view_ms: float | None = 1000 * (time.monotonic() - began)
            except ApiError:
                view_ms = None
            now, cpu = time.monotonic(), cpu_seconds(self.pid)
            pct = 100 * (cpu - last_cpu) / (now - last_t) if cpu >= last_cpu else 0.0
            self.samples.append(Sample(round(now - self.start, 2), round(pct, 1), rss_mb(self.pid),
                                       None if view_ms is None else round(view_ms, 1), self.flow_mods()))
            last_t, last_cpu = now, cpu


def peak_rate(samples: list[Sample]) -> float:
    """The highest flow-mod rate between two samples (per second)."""
    return max((round((b.flow_mods - a.flow_mods) / (b.t - a.t), 1) for a, b in pairwise(samples)
                if b.t > a.t), default=0.0)


def rss_mb(pid: int) -> float:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return round(int(line.split()[1]) / 1024, 1)
    except FileNotFoundError:
        pass
    return 0.0


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


async def until(what: str, check: Callable[[], Awaitable[T | None]], timeout: float,
                every: float = 0.25) -> T:
    """The first truthy result of `check`, asked every `every` s; TimeoutError naming `what`."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            got = await check()
        except ApiError:
            got = None
        if got:
            return got
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what}: not within {timeout:g} s")
        await asyncio.sleep(every)


class Controller:
    """One `metaflow-controller` subprocess on ports of its own."""

    def __init__(self, workdir: Path, args: list[str], name: str = "controller",
                 secret_file: Path | None = None) -> None:
        """`secret_file`: the cluster's, shared with other controllers (default: a new one)."""
        self.workdir, self.name = workdir, name
        self.secret_file = secret_file or write_secret(workdir / "secret")
        self.secret = load_secret(self.secret_file)
        self.of_port, self.rest_port = free_port(), free_port()
        self.rest_host = "127.0.0.1"
        """Where its REST API listens (a sample's agents need the management network's address)."""
        self.args = args
        self.proc: subprocess.Popen[bytes] | None = None
        self.starts = 0

    def start(self) -> None:
        self.starts += 1
        log = open(self.workdir / f"{self.name}-{self.starts}.log", "wb")
        cmd = [sys.executable, "-m", "controller.launcher", "--secret-file", str(self.secret_file),
               "--of-port", str(self.of_port), "--rest-host", self.rest_host,
               "--rest-port", str(self.rest_port), *self.args]
        self.proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)
        log.close()

    @property
    def url(self) -> str:
        return f"http://{self.rest_host}:{self.rest_port}"

    def kill(self) -> None:
        """SIGKILL: a leader that dies without handing anything over."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()

    def dump_threads(self) -> None:
        """SIGUSR1: the controller logs what each of its threads is doing."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGUSR1)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid


Tables = dict[int, Table]
"""A table per switch, by dpid."""


def planned_tables(flows: dict[str, list[Any]]) -> Tables:
    """`REST.flows` (the controller's planner, per switch) as tables."""
    return {int(dpid): {(f.priority, f.prefix): FlowEntry(f.priority, f.prefix, f.out_port, f.set_dl_dst)
                        for f in entries} for dpid, entries in flows.items()}


async def plan_and_tables(client: AsyncApiClient, emulator: Emulator) -> tuple[Tables, Tables]:
    """The controller's planned table for every switch of the fabric (empty
    where it plans nothing), and the tables the switches hold now."""
    plan = planned_tables((await client.call(REST.flows)).switches)
    return {dpid: plan.get(dpid, {}) for dpid in emulator.wiring.names}, emulator.tables()


def differing(plan: Tables, held: Tables) -> list[int]:
    """The switches whose table is not the plan."""
    return sorted(dpid for dpid in plan if held.get(dpid, {}) != plan[dpid])


async def fabric_check(client: AsyncApiClient, emulator: Emulator, space: Block) -> dict[str, Any]:
    """The whole-fabric check (module doc): entries that differ from the
    plan, and the edge switches from which some ID misses its owner."""
    started = time.monotonic()
    servers = (await client.call(REST.servers)).servers
    plan, held = await plan_and_tables(client, emulator)
    wrong_tables = differing(plan, held)
    # Forwarded over the wires as they are, not as discovered: LLDP finds a
    # reconnected switch's links again only within a round (102 s at k=32).
    wiring = emulator.wiring
    links = [(*a, *b) for a, b in wiring.links.items() if a < b]
    hosts = [(name, *wiring.hosts[name], wiring.macs[name], wiring.ips[name], "storage")
             for name in servers if name in wiring.hosts]
    graph = discovered_graph(sorted(wiring.names), links, hosts)
    _, _, fabric = map_topology(graph, space)
    partition = sorted((b, name) for name, s in servers.items() for b in s.blocks)
    edges = sorted({dpid for dpid, _ in fabric.hosts.values()})
    wrong = misdelivered(FakeNetwork(fabric, held), partition, space, edges)
    return {"switches": len(held), "entries": sum(len(t) for t in held.values()),
            "differing_from_plan": wrong_tables[:20], "differing_count": len(wrong_tables),
            "ingress_checked": len(edges), "misdelivered_from": [d for d, _ in wrong][:20],
            "owners": len({name for _, name in partition}), "ok": not wrong_tables and not wrong,
            "seconds": round(time.monotonic() - started, 2)}


async def events_since(client: AsyncApiClient, kind: str, since: float) -> list[dict[str, Any]]:
    """The controller's events of `kind` at or after `since` (its monotonic clock, shared with ours)."""
    return [e for e in (await client.call(REST.events)).events
            if e["event"] == kind and float(str(e["t"])) >= since]


async def built(client: AsyncApiClient, emulator: Emulator, since: float) -> dict[str, Any] | None:
    """The first build's (or a rebuild's) end: a `network-built` event after
    `since`, no build operation left, every switch holding the plan."""
    done = await events_since(client, "network-built", since)
    if not done:
        return None
    if any(op.kind == "build" for op in (await client.call(REST.operations)).operations):
        return None
    plan, held = await plan_and_tables(client, emulator)
    return done[-1] if any(plan.values()) and not differing(plan, held) else None


async def build_account(client: AsyncApiClient, since: float) -> dict[str, Any] | None:
    """The controller's account of its last build after `since` (`build-finished`:
    its seconds and each round of steps it waited for)."""
    done = await events_since(client, "build-finished", since)
    return {"seconds": done[-1]["seconds"], "rounds": done[-1]["rounds"]} if done else None


async def steady_state(sampler: Sampler, farm: AgentFarm, seconds: float) -> dict[str, Any]:
    """The controller's cost with nothing to do but liveness and LLDP: its
    CPU over `seconds` after the build, and the beats that came meanwhile."""
    began, beats, datagrams = time.monotonic() - sampler.start, farm.beats, farm.datagrams
    await asyncio.sleep(seconds)
    window = [s for s in sampler.samples if s.t > began + SAMPLE_S]
    cpu = [s.cpu_pct for s in window]
    return {"seconds": seconds, "cpu_pct_mean": round(statistics.fmean(cpu), 1) if cpu else None,
            "cpu_pct_max": max(cpu, default=None), "http_beats": farm.beats - beats,
            "datagrams": farm.datagrams - datagrams}


async def settled(client: AsyncApiClient, emulator: Emulator) -> bool:
    """No operation under way, and every switch holding the plan."""
    if (await client.call(REST.operations)).operations:
        return False
    plan, held = await plan_and_tables(client, emulator)
    return any(plan.values()) and not differing(plan, held)


async def faults(client: AsyncApiClient, emulator: Emulator, farm: AgentFarm, space: Block,
                 phase_s: float, flaps: int = FLAPS, rack: int = RACK, seed: int = 26) -> dict[str, Any]:
    """The built fabric through `flaps` switch disconnects and a rack of
    `rack` servers powered off (module doc): how long each took to settle,
    and the whole-fabric check after each."""
    rng = random.Random(seed)
    out: dict[str, Any] = {}
    dpids = rng.sample(sorted(emulator.switches), min(flaps, len(emulator.switches)))
    began = time.monotonic()
    for dpid in dpids:
        emulator.switches[dpid].close()   # its connection ends; it connects again, its table kept
        await asyncio.sleep(FLAP_EVERY_S)

    async def resynced() -> bool:
        return all(emulator.switches[d].connected for d in dpids) and \
            len((await client.call(REST.topology)).switches) == len(emulator.wiring.names) and \
            len(await events_since(client, "switch-resync", began)) >= len(dpids) and \
            await settled(client, emulator)

    await until("every flapped switch re-synced", resynced, phase_s, every=0.5)
    out["flaps"] = {"switches": len(dpids), "settled_s": round(time.monotonic() - began, 2),
                    "check": await fabric_check(client, emulator, space)}

    by_edge: dict[int, list[str]] = {}
    for name in farm.agents:
        by_edge.setdefault(emulator.wiring.hosts[name][0], []).append(name)
    victims: list[str] = []
    for edge in rng.sample(sorted(by_edge), len(by_edge)):
        victims += by_edge[edge][:rack - len(victims)]
        if len(victims) >= rack:
            break
    began = time.monotonic()
    farm.kill(victims)
    for name in victims:
        emulator.set_port(*emulator.wiring.hosts[name], up=False)

    async def failed_over() -> bool:
        servers = (await client.call(REST.servers)).servers
        return all(servers[v].failed and not servers[v].blocks for v in victims) and \
            await settled(client, emulator)

    await until("the rack failed over", failed_over, phase_s, every=0.5)
    out["rack"] = {"servers": len(victims), "edges": len({emulator.wiring.hosts[v][0] for v in victims}),
                   "settled_s": round(time.monotonic() - began, 2),
                   "takeovers": len(await events_since(client, "takeover", began)),
                   "data_lost": len(await events_since(client, "DATA-LOST", began)),
                   "check": await fabric_check(client, emulator, space)}
    return out


def owners(servers: dict[str, ServerInfo]) -> list[tuple[Block, str]]:
    """(block, primary) of every server in service."""
    return [(b, name) for name, info in servers.items() if not info.failed for b in info.blocks]


class SampleRun:
    """The sample's real agents (`benchmarks.sample`) on the built fabric, in
    three parts around the rest of the run: `prepare` (the spares join, each
    client writes `SAMPLE_FILES` paths owned in its own edge), `faults` (a
    server powered off, a split, a drain, each followed by the whole-fabric
    check, then the same writes again) and `read_back` (every acknowledged
    write read through the bridge of its owner's edge, after whatever the
    run did in between: the issue's faults, a leader change)."""

    def __init__(self, sample: RealSample, emulator: Emulator, space: Block, phase_s: float,
                 workdir: Path) -> None:
        self.sample, self.emulator, self.space, self.phase_s = sample, emulator, space, phase_s
        self.workdir = workdir
        self.acked = workdir / "sample-acked.jsonl"
        self.out: dict[str, Any] = {"servers": len(sample.servers), "edges": sample.edges}

    async def _servers(self, client: AsyncApiClient) -> dict[str, ServerInfo]:
        return (await client.call(REST.servers)).servers

    async def _write(self, client: AsyncApiClient, start: int) -> list[dict[str, Any]]:
        by_edge: dict[str, list[Block]] = {}
        for block, name in owners(await self._servers(client)):
            if name in self.sample.servers:
                by_edge.setdefault(self.sample.edge_of(name), []).append(block)
        return [await asyncio.to_thread(self.sample.write, edge, blocks, SAMPLE_FILES, start, self.acked)
                for edge, blocks in sorted(by_edge.items())]

    async def prepare(self, client: AsyncApiClient) -> None:
        sample, out = self.sample, self.out
        self.acked.unlink(missing_ok=True)
        out["outside"] = outside(await self._servers(client), sample.servers)
        began = time.monotonic()
        await asyncio.to_thread(sample.start_spares)

        async def joined() -> bool:
            held = await self._servers(client)
            return all(n in held and held[n].state == "idle" for n in sample.spares)

        await until("the sample's spares joined", joined, self.phase_s, every=SAMPLE_POLL_S)
        out["spares"] = {"servers": sample.spares, "joined_s": round(time.monotonic() - began, 2)}
        out["writes"] = await self._write(client, 0)

    async def _step(self, client: AsyncApiClient, what: str, done: Callable[[dict[str, ServerInfo]], bool],
                    began: float) -> dict[str, Any]:
        async def over() -> bool:
            held = await self._servers(client)
            return done(held) and not under_replicated(held, DEFAULT_REPLICAS) \
                and await settled(client, self.emulator)

        await until(f"the sample's {what}", over, self.phase_s, every=SAMPLE_POLL_S)
        return {"settled_s": round(time.monotonic() - began, 2),
                "check": await fabric_check(client, self.emulator, self.space)}

    async def faults(self, client: AsyncApiClient) -> None:
        sample, out = self.sample, self.out
        first, last = sample.edges[0], sample.edges[-1]

        async def leader(what: str, fits: Callable[[str], bool]) -> str:
            """A sample server that leads a block now and `fits`, one of the last edge first."""
            async def found() -> str | None:
                held = await self._servers(client)
                return next((n for n in sorted(sample.servers, key=lambda n: sample.edge_of(n) != last)
                             if n in held and held[n].blocks and fits(n)), None)

            return await until(f"a sample server leading a block {what}", found, self.phase_s,
                               every=SAMPLE_POLL_S)

        victim = await leader(f"under {first}", lambda n: sample.edge_of(n) == first)
        began = time.monotonic()
        await asyncio.to_thread(sample.power_off, victim)
        out["fail_over"] = {"server": victim, **await self._step(
            client, "fail-over", lambda held: bool(held[victim].failed) and not held[victim].blocks, began)}
        split = await leader("to split", lambda n: True)
        began = time.monotonic()
        outcome = await client.call(REST.split, name=split)
        out["split"] = {"server": split, "ok": outcome.ok, "detail": outcome.detail,
                        **await self._step(client, "split", lambda held: True, began)}
        drained = await leader(f"to drain (not {split})", lambda n: n != split)
        began = time.monotonic()
        await client.call(REST.drain, name=drained)

        async def drain_over() -> bool:
            return (await client.call(REST.drains)).drains[drained].state != "draining"

        await until("the sample's drain", drain_over, self.phase_s, every=SAMPLE_POLL_S)
        out["drain"] = {"server": drained, "state": (await client.call(REST.drains)).drains[drained].state,
                        **await self._step(client, "drain", lambda held: True, began)}
        out["writes_after"] = await self._write(client, 1_000_000)

    async def read_back(self, client: AsyncApiClient) -> dict[str, Any]:
        sample, out = self.sample, self.out
        held = await self._servers(client)
        table = owners(held)
        expected: dict[str, dict[str, str]] = {}
        unreachable = 0
        for line in self.acked.read_text().splitlines():
            record = json.loads(line)
            owner = next((name for block, name in table if block.contains(record["mdid"])), None)
            if owner in sample.servers:
                expected.setdefault(sample.edge_of(owner), {})[record["path"]] = record["digest"]
            else:
                unreachable += 1
        reads = [await asyncio.to_thread(sample.verify, edge, paths, self.workdir / f"sample-{edge}.json")
                 for edge, paths in sorted(expected.items())]
        out["acked"] = sum(len(paths) for paths in expected.values()) + unreachable
        out["read_back"] = {**{n: sum(r[n] for r in reads) for n in ("checked", "missing", "wrong")},
                            "owned_outside_the_sample": unreachable,
                            "sample": [x for r in reads for x in r["sample"]][:5]}
        out["outside_at_end"] = outside(held, sample.servers)
        out["ok"] = out["split"]["ok"] and out["drain"]["state"] == "drained" \
            and not out["outside"] and not out["outside_at_end"] and not unreachable \
            and out["read_back"]["missing"] == out["read_back"]["wrong"] == 0 \
            and all(out[s]["check"]["ok"] for s in ("fail_over", "split", "drain"))
        return out


async def leads(client: AsyncApiClient) -> bool:
    return (await client.call(REST.leadership)).state == "leader"


async def run_size(k: int, servers: int, workdir: Path, restart: bool, settle: float,
                   phase_s: float = 600.0, heartbeat_s: float = HEARTBEAT_S,
                   mode: Mode = "full", steady_s: float = 0.0, leader_change: str | None = None,
                   fault_sizes: tuple[int, int] | None = None,
                   lease_ttl: int = LEASE_TTL_S, sample_size: int = 0) -> dict[str, Any]:
    """One size, measured (module doc); `phase_s`: how long a phase may take
    before the run stops there; `mode`: the controller's --mode (hybrid
    installs no host routes); `steady_s`: how long to measure the built
    fabric's steady cost (`steady_state`); `leader_change`: two controllers
    and etcd, the leader killed after the build ("built") or when half the
    servers have registered ("storm"); `fault_sizes`: (switches
    that flap, servers of the rack that fails) for `faults`; `sample_size`:
    edge switches made real, with real agents (`benchmarks.sample`), put
    through `SampleRun` after the first build."""
    workdir.mkdir(parents=True, exist_ok=True)
    graph = builders.fat_tree(k, servers=servers)
    space = Block.parse(DEFAULT_SPACE_CIDR)
    interval = heartbeat_s
    timeout = max(MIN_TIMEOUT_S, 4 * interval)
    etcd = EtcdProcess(workdir / "etcd").start() if leader_change else None
    args = ["--settle", str(settle), "--heartbeat-timeout", str(timeout), "--locate-timeout", "300",
            "--barrier-timeout", "60", "--agent-timeout", "60", "--mode", mode, "--log-level", "WARNING"]
    if etcd is not None:
        args += ["--etcd", etcd.url, "--lease-ttl", str(lease_ttl)]
    controller = Controller(workdir, args)
    controllers = [controller, *([Controller(workdir, args, "standby", controller.secret_file)]
                                 if leader_change else [])]
    real_args = ["--heartbeat", str(min(interval, 1.0)), "--liveness-datagrams"]
    of_targets = [("127.0.0.1", c.of_port) for c in controllers]
    sample = RealSample(graph, sample_edges(graph, sample_size), of_targets, controller.secret_file,
                        workdir / "sample-logs", real_args) if sample_size else None
    if sample is not None:
        sample.up()   # (the management network first: the controllers listen on it)
        for each in controllers:
            each.rest_host = sample.root_ip
    emulator = Emulator(graph, real=sample.dpids if sample is not None else ())
    n_switches = len(emulator.wiring.names)
    n_links = len(emulator.wiring.links) // 2
    client = AsyncApiClient(controller.url, controller.secret, timeout=60.0)
    result: dict[str, Any] = {"k": k, "mode": mode, "switches": n_switches, "links": n_links,
                              "servers": servers, "controllers": len(controllers),
                              "heartbeat_interval_s": interval, "heartbeat_timeout_s": timeout,
                              "settle_s": settle, "load_before": os.getloadavg()}
    emulated = [h for h in builders.storage_hosts(graph) if sample is None or h not in sample.servers]
    farm = AgentFarm(graph, [c.url for c in controllers], controller.secret, space, servers=emulated)
    controller.start()
    sampler = Sampler(controller.pid, client, lambda: emulator.counters.flow_mods)
    sampling = asyncio.create_task(sampler.run())
    try:
        await until("the controller leading", lambda: leads(client), 30)
        for standby in controllers[1:]:   # after the first leads: that one is the leader
            standby.start()
            asked = AsyncApiClient(standby.url, standby.secret)
            await until("the standby's REST", functools.partial(asked.call, REST.leadership), 30)
        await farm.start()
        if sample is not None:
            sample.attach(emulator)
        t0 = time.monotonic()
        await emulator.start([("127.0.0.1", c.of_port) for c in controllers])

        async def switches_up() -> bool:
            return len((await client.call(REST.topology)).switches) == n_switches

        await until("every switch connected", switches_up, max(120.0, phase_s))
        t_switches = time.monotonic()
        first = min(emulator.counters.connected.values())
        result["switches_connected_s"] = round(t_switches - first, 2)

        async def links_found() -> bool:
            return len((await client.call(REST.topology)).links) == n_links

        await until("every link found by LLDP", links_found, max(120.0, phase_s))
        result["links_found_s"] = round(time.monotonic() - t0, 2)

        async def take_over() -> float:
            """SIGKILL to the leader, and the standby's election timed; when it was killed."""
            nonlocal client
            successor = controllers[1]
            client = AsyncApiClient(successor.url, successor.secret, timeout=60.0)
            with contextlib.suppress(ApiError):   # what the standby had heard (k=32 once: 1,080 of 1,280)
                result["standby_switches_at_kill"] = len((await client.call(REST.topology)).switches)
            # how many controllers each emulated switch is connected to (2: both)
            channels = [len(sw.channels) for sw in emulator.switches.values()]
            result["emulated_channels_at_kill"] = {n: channels.count(n) for n in sorted(set(channels))}
            controller.kill()
            killed = time.monotonic()
            sampler.pid, sampler.client = successor.pid, client
            await until("the standby elected", lambda: leads(client), 60, every=0.1)
            result["leader_elected_s"] = round(time.monotonic() - killed, 2)
            return killed

        t_reg = time.monotonic()
        half, registered = asyncio.Event(), 0

        def counted(_: object) -> None:
            nonlocal registered
            registered += 1
            if registered >= servers // 2:
                half.set()

        farm.on_registered = counted
        farm.start_beating(interval)
        registering = asyncio.create_task(farm.register_all())
        urls = [c.url for c in controllers]
        real_agents = asyncio.create_task(asyncio.to_thread(sample.start_agents, urls)) \
            if sample is not None else None
        if leader_change == "storm":
            halfway = asyncio.create_task(half.wait())
            await asyncio.wait([halfway, registering], timeout=phase_s, return_when=asyncio.FIRST_COMPLETED)
            halfway.cancel()
            if not half.is_set():   # the storm ended (or stalled) short of half: no kill to time
                raise TimeoutError(f"half the servers registered: {registered} of {servers} in "
                                   f"{time.monotonic() - t_reg:.1f} s; last refusals: {farm.refusals(5)}")
            result["killed_at_registered"] = registered
            await take_over()
        failed = await registering
        if real_agents is not None:
            await real_agents
            result["sample_agents_started_s"] = round(time.monotonic() - t_reg, 2)
        t_registered = time.monotonic()
        result["registration_s"] = round(t_registered - t_reg, 2)
        result["registration_failed"] = failed
        if failed:
            result["registration_refusals"] = farm.refusals(5)

        # The servers talk: each one's ARP reaches its edge switch (and after a
        # restart, each one registered again asks again at once).
        emulator.announce(farm.agents)
        farm.on_registered = lambda agent: emulator.announce([agent.name])

        async def located() -> bool:
            return not (await client.call(REST.topology)).missing_servers

        await until("every server located", located, phase_s, every=1.0)
        t_located = time.monotonic()
        result["locate_s"] = round(t_located - t_registered, 2)

        async def first_build() -> dict[str, Any] | None:
            return await built(client, emulator, t_reg)

        event = await until("the first build", first_build, phase_s, every=1.0)
        t_built = time.monotonic()
        result["build_s"] = round(t_built - t_located, 2)
        result["build_planned_at_s"] = round(float(event["t"]) - t_located, 2)
        result["entries"] = event.get("entries")
        result["flow_mods"] = emulator.counters.flow_mods
        result["barriers"] = emulator.counters.barriers
        result["build_account"] = await build_account(client, t_reg)
        result["check"] = await fabric_check(client, emulator, space)
        result["load_after_build"] = os.getloadavg()
        sample_run = SampleRun(sample, emulator, space, phase_s, workdir) if sample is not None else None
        if sample_run is not None:
            result["sample"] = sample_run.out   # (filled in as it goes)
            await sample_run.prepare(client)
        if steady_s > 0:
            result["steady"] = await steady_state(sampler, farm, steady_s)
        if fault_sizes is not None:
            result["faults"] = await faults(client, emulator, farm, space, phase_s, *fault_sizes)
        if sample_run is not None:
            await sample_run.faults(client)
        if restart:
            await asyncio.sleep(2 * interval)   # every agent beats the built tree at least once
            controller.stop()
            t_restart = time.monotonic()
            controller.start()
            sampler.pid = controller.pid
            await until("controller REST after the restart", lambda: client.call(REST.leadership), 30)
            event = await until("the rebuild", first_build, phase_s, every=1.0)
            result["rebuild_s"] = round(time.monotonic() - t_restart, 2)
            # A successor builds no sooner than one heartbeat timeout after it starts (`core.build_after`).
            result["rebuild_planned_at_s"] = round(float(event["t"]) - t_restart, 2)
            result["check_after_rebuild"] = await fabric_check(client, emulator, space)
            events = (await client.call(REST.events)).events
            result["rebuild_events"] = [{**e, "t": round(float(str(e["t"])) - t_restart, 2)}
                                        for e in events if e["event"] != "agent-registered"][:20]
        if leader_change == "built":
            await asyncio.sleep(2 * interval)   # every agent beats the built tree at least once
            t_kill = await take_over()
            event = await until("the rebuild by the new leader", lambda: built(client, emulator, t_kill),
                                phase_s, every=1.0)
            result["leader_rebuild_s"] = round(time.monotonic() - t_kill, 2)
            result["leader_rebuild_planned_at_s"] = round(float(event["t"]) - t_kill, 2)
            result["leader_rebuild_account"] = await build_account(client, t_kill)
            result["check_after_leader_change"] = await fabric_check(client, emulator, space)
            # more than one: the new leader lost its lease and took over again (starved of CPU)
            result["successor_takeovers"] = (await client.call(REST.leadership)).takeovers
            events = (await client.call(REST.events)).events
            result["leader_change_events"] = [{**e, "t": round(float(str(e["t"])) - t_kill, 2)}
                                              for e in events if e["event"] != "agent-registered"][:20]
        if sample_run is not None:
            await sample_run.read_back(client)
    except (TimeoutError, ApiError) as exc:   # a phase that did not end: said, with what was reached
        result["error"] = str(exc)
        reached: dict[str, Any] = {"flow_mods": emulator.counters.flow_mods,
                                   "barriers": emulator.counters.barriers, "load": os.getloadavg(),
                                   "registration_refusals": farm.refusals(5)}
        with contextlib.suppress(ApiError):   # a controller that answers nothing any more adds nothing
            topo = await client.call(REST.topology)
            reached.update(switches=len(topo.switches), links=len(topo.links), hosts=len(topo.hosts),
                           missing_servers=len(topo.missing_servers))
            named = set(topo.missing_servers[:5])   # what the controller last said of a few
            reached["missing_events"] = [e for e in (await client.call(REST.events)).events
                                         if named & {str(v) for v in e.values()}][-20:]
            known = (await client.call(REST.servers)).servers
            reached["servers_failed"] = sum(1 for s in known.values() if s.failed)
            under_way = (await client.call(REST.operations)).operations
            reached["operations"] = [asdict(op) for op in under_way][:10]
            reached["last_events"] = [e for e in (await client.call(REST.events)).events
                                      if e["event"] not in ("agent-registered", "controller-stalled")][-15:]
            plan, held = await plan_and_tables(client, emulator)
            reached["tables_differing"] = [  # (dpid, entries held, planned, the first few that differ)
                (dpid, len(held.get(dpid, {})), len(plan[dpid]),
                 [str(e) for k, e in held.get(dpid, {}).items() if plan[dpid].get(k) != e][:3] +
                 [str(e) for k, e in plan[dpid].items() if held.get(dpid, {}).get(k) != e][:3])
                for dpid in differing(plan, held)[:10]]
        result["at_error"] = reached
        for each in controllers:   # where their threads wait, in their logs (`controller.threads`)
            each.dump_threads()
    finally:
        sampling.cancel()
        await asyncio.gather(sampling, return_exceptions=True)
        await emulator.close()
        await farm.close()
        for each in controllers:
            each.stop()
        if sample is not None:   # after the controllers (`Scenario`'s teardown says why)
            sample.close()
        if etcd is not None:
            etcd.stop()
    result.update(http_beats=farm.beats, datagrams=farm.datagrams, beat_errors=farm.beat_errors,
                  switch_session_errors=emulator.counters.session_errors,
                  switch_probes_failed=emulator.counters.probes_failed,
                  switch_echo_rtt_max_s=round(emulator.counters.echo_rtt_max, 2),
                  emulator_loop_lag_max_s=round(emulator.counters.loop_lag_max, 2))
    result["samples"] = [asdict(s) for s in sampler.samples]
    cpu = [s.cpu_pct for s in sampler.samples]
    views = [s.view_ms for s in sampler.samples if s.view_ms is not None]
    result["cpu_pct_mean"] = round(statistics.fmean(cpu), 1) if cpu else None
    result["rss_mb_max"] = max((s.rss_mb for s in sampler.samples), default=None)
    result["view_ms_p50"] = round(statistics.median(views), 1) if views else None
    result["view_ms_max"] = max(views, default=None)
    result["flow_mods_per_s_peak"] = peak_rate(sampler.samples)
    return result


def plot(results: list[dict[str, Any]], path: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (cpu_ax, rss_ax, times_ax) = plt.subplots(1, 3, figsize=(15, 4.5))
    for r in results:
        label = f"k={r['k']} {r.get('mode', 'full')} ({r['switches']} sw, {r['servers']} srv)"
        ts = [s["t"] for s in r["samples"]]
        cpu_ax.plot(ts, [s["cpu_pct"] for s in r["samples"]], label=label)
        rss_ax.plot(ts, [s["rss_mb"] for s in r["samples"]], label=label)
    cpu_ax.set(title="controller CPU", xlabel="s", ylabel="% of one core")
    rss_ax.set(title="controller RSS", xlabel="s", ylabel="MB")
    names = ["switches_connected_s", "links_found_s", "registration_s", "locate_s", "build_s", "rebuild_s",
             "leader_rebuild_s"]
    xs = [f"k={r['k']}" + (" hybrid" if r.get("mode") == "hybrid" else "") for r in results]
    width = 0.8 / len(names)
    for i, name in enumerate(names):
        times_ax.bar([j + i * width for j in range(len(xs))], [r.get(name) or 0 for r in results], width,
                     label=name.removesuffix("_s"))
    times_ax.axhline(TARGET_S, color="grey", linestyle="--", linewidth=1)
    times_ax.set_xticks([j + 0.4 - width / 2 for j in range(len(xs))], xs)
    times_ax.set(title="phases (target 30 s at k=32)", ylabel="s")
    for ax in (cpu_ax, rss_ax, times_ax):
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--k", type=int, nargs="+", default=[4, 8, 16, 32], help="fat-tree arities, in order")
    defaults = ", ".join(f"k={k}: {n}" for k, n in SERVERS.items())
    p.add_argument("--servers", type=int, nargs="*", default=None,
                   help=f"storage servers per k (default: {defaults})")
    p.add_argument("--restart", action="store_true", help="also time a successor's rebuild (a restart)")
    p.add_argument("--leader-change", nargs="?", const="built", choices=("built", "storm"),
                   help="two controllers and etcd: kill the leader once the fabric is built and time the "
                        "standby's rebuild (built, the default), or when half the servers have registered "
                        "(storm)")
    p.add_argument("--lease-ttl", type=int, default=LEASE_TTL_S, help="the controllers' etcd lease (s)")
    p.add_argument("--faults", action="store_true",
                   help=f"after the build: {FLAPS} switch disconnects, then {RACK} servers powered off "
                        "at once")
    p.add_argument("--sample", type=int, default=0, metavar="EDGES",
                   help="make the first EDGES edge switches real Open vSwitch bridges with real agents and a "
                        "client each (measured with --mode hybrid), and put them through a fail-over, a "
                        "split and a drain after the build, every acknowledged write read back")
    p.add_argument("--settle", type=float, default=2.0, help="the controller's --settle")
    p.add_argument("--mode", choices=MODES, default="full",
                   help="the controller's --mode (hybrid: no host routes; NORMAL carries replies)")
    p.add_argument("--heartbeat", type=float, default=HEARTBEAT_S,
                   help="the emulated agents' heartbeat interval")
    p.add_argument("--phase-timeout", type=float, default=600.0,
                   help="seconds a phase (location, build, rebuild) may take before the size stops there")
    p.add_argument("--steady", type=float, default=30.0,
                   help="seconds of the built fabric's steady cost (CPU with liveness and LLDP only)")
    p.add_argument("--out", type=Path, default=Path("benchmarks/results"))
    p.add_argument("--append", action="store_true",
                   help="keep the other sizes of an earlier scale.json (each result says its command)")
    p.add_argument("--workdir", type=Path, default=Path("/tmp/metaflow-scale"))
    args = p.parse_args(argv)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))   # unwinds: the controller is stopped
    if args.sample and args.faults:
        # The rack's blocks would go to the sample's idle spares, and their new copies to
        # emulated servers, which cannot take a real copy: the two are measured apart.
        p.error("--sample and --faults are measured in separate runs")
    if args.servers and len(args.servers) != len(args.k):
        p.error("--servers needs one count per --k")
    sizes = list(zip(args.k, args.servers or [SERVERS.get(k, k**3 // 4) for k in args.k], strict=True))
    args.out.mkdir(parents=True, exist_ok=True)
    earlier = args.out / "scale.json"
    results = [r for r in json.loads(earlier.read_text())["results"]
               if (r["k"], r.get("mode", "full")) not in {(k, args.mode) for k in args.k}] \
        if args.append and earlier.exists() else []
    for k, servers in sizes:
        print(f"k={k}, {args.mode} mode: {servers} servers ...", flush=True)
        result = asyncio.run(run_size(k, servers, args.workdir / f"k{k}", args.restart, args.settle,
                                      args.phase_timeout, args.heartbeat, args.mode, args.steady,
                                      args.leader_change, (FLAPS, RACK) if args.faults else None,
                                      args.lease_ttl, args.sample))
        results.append(result)
        results.sort(key=lambda r: (int(r["k"]), r.get("mode", "full")))
        print(json.dumps({key: v for key, v in result.items() if key != "samples"}), flush=True)
        result["command"] = " ".join(sys.argv)
        result["date"] = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
        report = {"cpus": os.cpu_count(), "results": results}
        (args.out / "scale.json").write_text(json.dumps(report, indent=1) + "\n")
    done = [r for r in results if "samples" in r]
    if done:
        plot(done, args.out / "scale.png")
    return 0 if all("error" not in r and all(check["ok"] for check in checks(r))
                    and r.get("sample", {"ok": True}).get("ok") is True for r in results) else 1


def checks(result: dict[str, Any]) -> list[dict[str, Any]]:
    """Every whole-fabric check a result holds."""
    faults = result.get("faults", {})
    sample = result.get("sample", {})
    named = ("check", "check_after_rebuild", "check_after_leader_change")
    return [result[c] for c in named if c in result] + \
        [faults[f]["check"] for f in ("flaps", "rack") if f in faults] + \
        [sample[s]["check"] for s in ("fail_over", "split", "drain") if s in sample]


if __name__ == "__main__":
    raise SystemExit(main())
