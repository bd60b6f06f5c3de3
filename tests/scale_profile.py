"""Where the decision thread's time goes on a large fabric (issue 26), on the
in-memory fake world of `tests.unit.controller_world`: no OpenFlow I/O, no
HTTP, so what it measures is a lower bound of the real controller's cost.

It boots a k-ary fat-tree (1,280 switches at k=32), connects every switch,
registers every server, locates them by ARP, runs the first build; then a
heartbeat round of every server, a rebuild as a successor leader does it
after a takeover, one split, one fail-over and one load poll of every edge
switch. Per phase it prints the wall and CPU time, and the core's share
(time inside `MetaFlowCore.handle`; the rest is the fake switches and
agents carrying out its steps); per event type the core's latency (mean,
p99, max). `--profile` adds a cProfile summary of the core's top functions;
several `--k` give the side-by-side table of docs/decision-thread.md.

    python -m tests.scale_profile --k 32 --servers 2000 [--profile]
    python -m tests.scale_profile --k 4,8,16,32

Not a test (pytest does not collect it): measurements live in scripts.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import os
import pstats
import resource
import statistics
import time
from collections import defaultdict
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

from btree.tree import State
from client_lib.api.rest import Outcome
from controller.core import MetaFlowCore
from controller.steps import CallAgent, Event, FailNow, SplitNow, Step, StepDone, StepFailed
from tests.unit.controller_world import World, fill
from topology.builders import client_hosts, fat_tree, storage_hosts

TERM = 2
"""The successor's term in the takeover phase."""

DEFAULT_SERVERS = {4: 8, 8: 64, 16: 512, 32: 2000}
"""Storage servers per k when `--servers` is not given: k=4 and 8 as the
tests and the demo run them, k=32 the paper's 2,000."""


@dataclass
class Phase:
    """One phase: wall and CPU time of the whole (core and fake), and the
    core's share of each (on a shared machine the CPU time is the steadier)."""

    name: str
    wall: float = 0.0
    cpu: float = 0.0
    core: float = 0.0
    core_cpu: float = 0.0
    events: int = 0


@dataclass
class Meter:
    """Times every `MetaFlowCore.handle` call, by event type (an outcome by
    the type of the step it answers), and groups them into phases."""

    latencies: dict[str, list[float]] = field(default_factory=lambda: defaultdict(list))
    """Wall time of each `handle` call: the latency the event saw."""
    cpu: dict[str, float] = field(default_factory=lambda: defaultdict(float))
    """CPU time of the `handle` calls, per event type."""
    phases: list[Phase] = field(default_factory=list)
    kinds: dict[int, str] = field(default_factory=dict)
    profiler: cProfile.Profile | None = None
    _phase: Phase | None = None

    def install(self, core: MetaFlowCore) -> None:
        """Wrap this core's `handle` (a successor core is installed again)."""
        handle = core.handle

        def timed(event: Event) -> list[Step]:
            label = self._label(event)
            if self.profiler is not None:
                self.profiler.enable()
            start, cpu = time.perf_counter(), time.thread_time()
            steps = handle(event)
            spent, cpu = time.perf_counter() - start, time.thread_time() - cpu
            if self.profiler is not None:
                self.profiler.disable()
            self.latencies[label].append(spent)
            self.cpu[label] += cpu
            if self._phase is not None:
                self._phase.core += spent
                self._phase.core_cpu += cpu
                self._phase.events += 1
            for step in steps:
                self.kinds[step.id] = _kind(step)
            return steps

        core.handle = timed  # type: ignore[method-assign]

    def _label(self, event: Event) -> str:
        if isinstance(event, (StepDone, StepFailed)):
            return f"{type(event).__name__}({self.kinds.pop(event.step, '?')})"
        return type(event).__name__

    @contextmanager
    def phase(self, name: str) -> Iterator[Phase]:
        phase = self._phase = Phase(name)
        wall, cpu = time.perf_counter(), time.process_time()
        try:
            yield phase
        finally:
            phase.wall, phase.cpu = time.perf_counter() - wall, time.process_time() - cpu
            self.phases.append(phase)
            self._phase = None

    def get(self, name: str) -> Phase:
        return next(p for p in self.phases if p.name == name)


def _kind(step: Step) -> str:
    if isinstance(step, CallAgent) and step.route is not None:
        return f"CallAgent {step.route.template}"
    return type(step).__name__


def run(k: int, servers: int, clients: int | None, replicas: int, mode: str, profile: bool,
        say: Callable[[str], None]) -> Meter:
    """Every phase, once, at one size. `clients`: how many client hosts make
    themselves known by ARP (None: all); each located host is a /32 route on
    every switch in full mode."""
    meter = Meter(profiler=cProfile.Profile() if profile else None)
    with meter.phase("world"):   # the fake's own set-up: not the controller's
        world = World(fat_tree(k, servers=servers), replicas=replicas, heartbeat_timeout_s=5.0,
                      load_poll_s=1.0, mode=mode)
    meter.install(world.core)
    g = world.graph
    say(f"k={k}: {len(world.switches)} switches, {len(world.agents)} servers, "
        f"replicas={replicas}, {mode} mode")
    with meter.phase("connect"):
        world._announce([n for n, d in g.nodes(data=True) if d["kind"] == "switch"])
        world.run()
    with meter.phase("register"):
        world.register_all()
    with meter.phase("locate"):
        for host in storage_hosts(g) + client_hosts(g)[:clients]:
            world.arp(host)
        world.run()
    with meter.phase("first build"):
        while world.core.tree is None:
            world.advance(world.settings.settle_s)
            world.heartbeats()
            world.tick()
    say(f"  built: {len(world.tree.leaves())} leaves, "
        f"{sum(len(s.flows) for s in world.switches.values())} entries, "
        f"peak RSS {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:.0f} MiB")
    with meter.phase("heartbeat round"):
        world.heartbeats()
    with meter.phase("takeover rebuild"):
        world.core = world.core.successor(TERM)
        meter.install(world.core)
        world.register_all()
        world.advance(world.settings.heartbeat_timeout_s)
        world.register(next(iter(world.agents.values())))
        world.run()
        assert world.core.tree is not None, "the successor did not build"
    tree = world.tree
    busy = tree.leaves_in(State.BUSY)
    fill(world, busy[0], 40)
    world.heartbeats()
    with meter.phase("split"):
        outcome = world.ask(SplitNow, name=busy[0])
    assert isinstance(outcome, Outcome) and outcome.ok, outcome
    with meter.phase("fail-over"):
        outcome = world.ask(FailNow, name=busy[1], reason="scale profile")
    assert isinstance(outcome, Outcome) and outcome.ok, outcome
    world.advance(world.settings.load_poll_s)
    world.tick()   # the poll after the fail-over: the next one reads steady counters
    with meter.phase("load poll"):
        world.advance(world.settings.load_poll_s)
        world.tick()
    with meter.phase("host arrives"):   # a client heard for the first time: its routes everywhere
        world.arp(client_hosts(g)[-1])
        world.run()
    return meter


def _ms(seconds: float) -> str:
    return f"{seconds * 1e3:9.2f}"


def report(meter: Meter, say: Callable[[str], None]) -> None:
    say(f"  {'phase':<18}{'wall s':>9}{'cpu s':>9}{'core wall':>11}{'core cpu':>10}{'events':>9}")
    for p in meter.phases:
        say(f"  {p.name:<18}{p.wall:9.2f}{p.cpu:9.2f}{p.core:11.2f}{p.core_cpu:10.2f}{p.events:9d}")
    say(f"  {'event type (core, wall)':<44}{'count':>8}{'mean ms':>10}{'p99 ms':>10}{'max ms':>10}"
        f"{'total s':>9}{'cpu s':>8}")
    for label, times in sorted(meter.latencies.items(), key=lambda kv: -sum(kv[1])):
        say(f"  {label:<44}{len(times):8d}{_ms(statistics.fmean(times)):>10}"
            f"{_ms(_p99(times)):>10}{_ms(max(times)):>10}{sum(times):9.2f}{meter.cpu[label]:8.2f}")


def _p99(times: list[float]) -> float:
    ordered = sorted(times)
    return ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))]


def side_by_side(meters: dict[int, Meter], say: Callable[[str], None]) -> None:
    """The per-operation costs against k: the core's CPU time, ms (the phase's wall in brackets)."""
    rows = ["connect", "register", "first build", "heartbeat round", "takeover rebuild",
            "split", "fail-over", "load poll", "host arrives"]
    say("  core cpu ms (wall) " + "".join(f"{f'k={k}':>22}" for k in meters))
    for row in rows:
        cells = []
        for meter in meters.values():
            p = meter.get(row)
            cells.append(f"{p.core_cpu * 1e3:.1f} ({p.wall * 1e3:.0f})")
        say(f"  {row:<18} " + "".join(f"{c:>22}" for c in cells))
    beats = {k: statistics.fmean(m.latencies["Heartbeat"]) for k, m in meters.items()}
    say(f"  {'per heartbeat':<18} " + "".join(f"{f'{b * 1e6:.0f} us':>22}" for b in beats.values()))


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m tests.scale_profile", description=__doc__.split("\n\n")[0])
    p.add_argument("--k", default="32", help="fat-tree arity, or several separated by commas (default: 32)")
    p.add_argument("--servers", type=int, default=None,
                   help="storage servers (default by k: " + ", ".join(f"{k}: {n}" for k, n in
                                                                      DEFAULT_SERVERS.items()) + ")")
    p.add_argument("--clients", type=int, default=0,
                   help="client hosts located by ARP at boot (default: none; in full mode each is a "
                        "/32 route on every switch, 1,280 x 8,192 entries for all of k=32's)")
    p.add_argument("--replicas", type=int, default=2)
    p.add_argument("--mode", choices=("full", "hybrid"), default="full",
                   help="the controller's mode (hybrid: no host routes, docs/deploy.md#hybrid-mode)")
    p.add_argument("--profile", action="store_true", help="a cProfile summary of the core's top functions")
    p.add_argument("--top", type=int, default=25, help="functions in the profile summary")
    args = p.parse_args(argv)
    try:
        ks = [int(k) for k in args.k.split(",")]
    except ValueError:
        p.error(f"--k: a list of even integers, got {args.k!r}")
    say = print
    say(f"load average {os.getloadavg()[0]:.2f} {os.getloadavg()[1]:.2f} (before)")
    meters: dict[int, Meter] = {}
    for k in ks:
        servers = args.servers if args.servers is not None else DEFAULT_SERVERS.get(k, k ** 3 // 4)
        meter = meters[k] = run(k, servers, args.clients, args.replicas, args.mode, args.profile, say)
        report(meter, say)
        if meter.profiler is not None:
            out = io.StringIO()
            pstats.Stats(meter.profiler, stream=out).sort_stats("cumulative").print_stats(args.top)
            say(out.getvalue())
    if len(meters) > 1:
        side_by_side(meters, say)
    say(f"load average {os.getloadavg()[0]:.2f} {os.getloadavg()[1]:.2f} (after)")


if __name__ == "__main__":
    main()
