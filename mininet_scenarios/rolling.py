"""A rolling restart in Mininet: every agent in turn, then the controller, while clients write.

Each agent's turn is what an operator does with the systemd units
(docs/rolling-restart.md), done here to the scenario's processes:

1. **drain**: ``POST /metaflow/servers/NAME/drain``, then ``GET /metaflow/drains``
   until it is drained, progress printed as `metaflowctl drain` prints it;
2. **stop**: SIGTERM (``systemctl stop metaflow-agent@NAME``), which must end in
   a clean exit, 0;
3. **start**: the same command line and store, until its admin API answers and
   the controller has registered it (what the unit's ``READY=1`` waits for);
4. **undrain**: back to the idle pool (``metaflowctl undrain NAME``).

Then the controller: SIGTERM, started again on the same ports, until it has
rebuilt the network from the agents' claims. While it is down and rebuilding,
every switch's table is read back from Open vSwitch (``ovs-ofctl dump-flows``)
over and over, and each read must still deliver every ID of the space, from
every switch with hosts, to the one owner of its block: the entries are never
emptied, nor wrong for a moment.

`Writers` keeps every client host writing new files (and reading them back)
in waves for the whole time; its summaries count the calls that failed past
the client's retries.

    python -m mininet_scenarios.rolling --servers 6 --files 1200
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType

from btree.fake_network import FakeNetwork, misdelivered
from client_lib.api.rest import REST, DrainInfo
from client_lib.cidr import Block
from client_lib.errors import Conflict
from controller.core import BUSY
from controller.drainctl import progress
from mininet_scenarios.daemons import AgentProcess
from mininet_scenarios.metaflow_net import MetaFlowNet
from topology import builders

POLL_S = 0.25
"""Seconds between reads of a drain's progress or of the registration."""


class RollingError(RuntimeError):
    """A step of the rolling restart did not end as it must; the message says
    which and why. What was done before it stays done."""


@dataclass(frozen=True)
class AgentTurn:
    """One agent's turn, with the seconds of each step."""

    server: str
    blocks: int
    """Blocks it owned as primary when its drain started."""
    backups: int
    """Blocks it kept a backup copy of."""
    keys_moved: int
    drain_s: float
    stop_s: float
    start_s: float
    """From the start of the process until the controller had registered it."""
    undrain_s: float

    @property
    def total_s(self) -> float:
        return self.drain_s + self.stop_s + self.start_s + self.undrain_s

    def timings(self) -> str:
        return (f"{self.total_s:.2f} s (drain {self.drain_s:.2f}, stop {self.stop_s:.2f}, "
                f"start {self.start_s:.2f}, undrain {self.undrain_s:.2f})")


@dataclass(frozen=True)
class ControllerTurn:
    """The controller's restart, and what the switches held meanwhile."""

    stop_s: float
    """From SIGTERM until the old controller had exited (cleanly: 0)."""
    rebuild_s: float
    """From then until the new controller had rebuilt the network."""
    reads: int
    """Reads of every switch's table taken during the restart."""
    entries_before: dict[str, int]
    """Per switch, its MetaFlow entries (up-rules included) before the restart."""
    fewest_entries: dict[str, int]
    """Per switch, the fewest MetaFlow entries any read during the restart saw."""
    misrouted: list[str]
    """Reads in which some ID of the space, entering at some switch with hosts,
    missed its one owner: the read and the switch (at most 20)."""


@dataclass
class Report:
    """What `RollingRestart.run` did, turn by turn."""

    agents: list[AgentTurn] = field(default_factory=list)
    controller: ControllerTurn | None = None
    fail_overs: list[dict[str, object]] = field(default_factory=list)
    """Take-overs and DATA-LOST the controller logged before its own restart
    (a drained server is stopped without either: none may appear)."""
    seconds: float = 0.0


class RollingRestart:
    """The rolling restart of a running `MetaFlowNet`; `say` prints progress."""

    def __init__(self, mf: MetaFlowNet, say: Callable[[str], None] = print,
                 drain_timeout: float = 300.0, start_timeout: float = 60.0) -> None:
        self.mf = mf
        self.say = say
        self.drain_timeout = drain_timeout
        self.start_timeout = start_timeout

    def run(self, servers: list[str] | None = None) -> Report:
        """Every agent in turn (default: every registered server, by name),
        then the controller."""
        started = time.monotonic()
        report = Report()
        names = servers if servers is not None else sorted(self.mf.view(REST.servers).servers)
        for n, name in enumerate(names, 1):
            self.say(f"[{n}/{len(names)}] {name}")
            report.agents.append(self.agent_turn(name))
        report.fail_overs = self.mf.events("takeover") + self.mf.events("DATA-LOST")
        self.say("[controller]")
        report.controller = self.controller_turn()
        report.seconds = time.monotonic() - started
        return report

    def agent(self, server: str) -> AgentProcess:
        """The scenario's process of storage server `server`."""
        scenario = self.mf.running
        return scenario.agents[scenario.topo.graph_names[server]]

    def _start_drain(self, server: str) -> None:
        """Ask for the drain, again while the controller refuses it because the
        server is busy (a re-replication or a split involving it: "try again
        when it ends", as an operator would); a CI run once met a repair's sync."""
        assert self.mf.api is not None
        deadline = time.monotonic() + self.drain_timeout
        while True:
            try:
                self.mf.api.call(REST.drain, name=server)
                return
            except Conflict as refused:
                if BUSY not in str(refused) or time.monotonic() > deadline:
                    raise
                time.sleep(POLL_S)

    def agent_turn(self, server: str) -> AgentTurn:
        """Drain, stop, start and undrain one agent; raises `RollingError` when
        a step fails (a drain that stops short leaves the agent running)."""
        assert self.mf.api is not None
        api, agent = self.mf.api, self.agent(server)
        held = self.mf.view(REST.servers).servers[server]
        blocks, backups = len(held.blocks), len(held.backups)
        t0 = time.monotonic()
        self._start_drain(server)
        self.say(f"  drain: {blocks} blocks as primary, {backups} backup copies")
        info = self._drained(server)
        t1 = time.monotonic()
        code = agent.stop()
        if code != 0:
            raise RollingError(f"{server}'s agent exited with {code} on SIGTERM: {agent.log()[-1000:]}")
        t2 = time.monotonic()
        self.say(f"  stopped (exit 0) in {t2 - t1:.2f} s")
        agent.launch().wait_ready(self.start_timeout)
        self._registered(server, since=t2)
        t3 = time.monotonic()
        self.say(f"  started, registered in {t3 - t2:.2f} s")
        outcome = api.call(REST.undrain, name=server)
        t4 = time.monotonic()
        self.say(f"  undrained: {outcome.detail.get('note', outcome.operation)}")
        turn = AgentTurn(server, blocks, backups, info.keys_moved, t1 - t0, t2 - t1, t3 - t2, t4 - t3)
        self.say(f"  turn of {server}: {turn.timings()}")
        return turn

    def _drained(self, server: str) -> DrainInfo:
        """Poll the drain until it ends; its final progress, or `RollingError`."""
        deadline = time.monotonic() + self.drain_timeout
        last = ""
        while time.monotonic() < deadline:
            info = self.mf.view(REST.drains).drains.get(server)
            if info is None:
                raise RollingError(f"the controller has no drain of {server} (it restarted?)")
            line = progress(server, info)
            if line != last:
                self.say(f"  {line}")
                last = line
            if info.state == "drained":
                return info
            if info.state == "stopped":
                raise RollingError(f"the drain of {server} stopped: {info.reason}")
            time.sleep(POLL_S)
        raise RollingError(f"{server} was not drained within {self.drain_timeout:g} s")

    def _registered(self, server: str, since: float) -> None:
        """Until the controller logs `server`'s registration after `since`
        (its events' ``t`` is the machine's monotonic clock, as here)."""
        deadline = time.monotonic() + self.start_timeout
        while time.monotonic() < deadline:
            if any(e.get("name") == server and isinstance(t := e["t"], (int, float)) and t >= since
                   for e in self.mf.events("agent-registered")):
                return
            time.sleep(POLL_S)
        raise RollingError(f"{server} did not register with the controller within {self.start_timeout:g} s")

    def controller_turn(self) -> ControllerTurn:
        """Restart the controller while reading every switch's table again and again."""
        net, blocks, _ = self.mf.real_network()
        space = Block.parse(self.mf.running.space)
        partition = sorted(((b, name) for name, bs in blocks.items() for b in bs), key=lambda p: p[0].first)
        ingress = sorted({dpid for dpid, _ in net.fabric.hosts.values()})
        names = {d["dpid"]: n for n, d in self.mf.graph.nodes(data=True) if d.get("kind") == "switch"}
        before = {names[dpid]: len(t) for dpid, t in self.mf.switch_tables().items()}
        controller = self.mf.controller
        assert controller is not None
        reads: list[dict[int, int]] = []
        wrong: list[str] = []
        failed: list[BaseException] = []
        done = threading.Event()

        def watch() -> None:
            try:
                while not done.is_set():
                    tables = self.mf.switch_tables()
                    reads.append({dpid: len(t) for dpid, t in tables.items()})
                    if len(wrong) < 20:
                        wrong.extend(f"read {len(reads)}: switch {names[dpid]}" for dpid, _ in
                                     misdelivered(FakeNetwork(net.fabric, tables), partition, space, ingress))
            except BaseException as exc:   # raised in the caller's thread, below
                failed.append(exc)

        reader = threading.Thread(target=watch, name="flow-reader", daemon=True)
        reader.start()
        try:
            t0 = time.monotonic()
            code = controller.stop()
            t1 = time.monotonic()
            if code != 0:
                raise RollingError(f"the controller exited with {code} on SIGTERM")
            self.say(f"  stopped (exit 0) in {t1 - t0:.2f} s")
            self.mf.restart_controller()   # its stop finds the old one gone
            t2 = time.monotonic()
        finally:
            done.set()
            reader.join()
        if failed:
            raise RollingError(f"reading the switches' tables failed: {failed[0]}") from failed[0]
        fewest = {names[dpid]: min(r[dpid] for r in reads) for dpid in names} if reads else {}
        dipped = sorted(n for n in fewest if fewest[n] < before[n])
        self.say(f"  started and rebuilt in {t2 - t1:.2f} s; {len(reads)} reads of every switch meanwhile, "
                 f"{len(dipped)} switches with fewer MetaFlow entries than before at some read, "
                 f"{len(wrong)} (read, switch) where some ID missed its owner")
        return ControllerTurn(t1 - t0, t2 - t1, len(reads), before, fewest, wrong[:20])


class Writers:
    """Every client host writes (and reads back) `files` new files per wave,
    wave after wave, until the `with` block ends; the acknowledged writes go to
    `workdir/<client>.jsonl` (what `MetaFlowNet.verify_acked` checks).
    `results`: every client's summary of every wave."""

    def __init__(self, mf: MetaFlowNet, workdir: Path, files: int, start: int, concurrency: int = 4) -> None:
        self.mf = mf
        self.workdir = workdir
        self.files = files
        self.next_file = start
        self.concurrency = concurrency
        self.results: list[dict] = []
        self.failure: BaseException | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._waves, name="writers", daemon=True)

    def _waves(self) -> None:
        try:
            while not self._stop.is_set():
                procs = self.mf.start_clients(self.files, self.workdir, start=self.next_file, read_back=True,
                                              concurrency=self.concurrency)
                self.next_file += self.files
                self.results += self.mf.collect(procs)
        except BaseException as exc:   # said by __exit__, in the caller's thread
            self.failure = exc

    @property
    def written(self) -> int:
        return sum(r["written"] for r in self.results)

    @property
    def errors(self) -> int:
        """Client calls that failed past their retries."""
        return sum(r["errors"] for r in self.results)

    def __enter__(self) -> Writers:
        self._thread.start()
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        """The wave under way finishes (its writes are checked too)."""
        self._stop.set()
        self._thread.join()
        if self.failure is not None and kind is None:
            raise RollingError(f"the clients failed: {self.failure}") from self.failure


def summary(report: Report, writers: Writers) -> list[tuple[str, str]]:
    """The rolling restart's numbers, as rows of (what, value)."""
    turns = report.agents
    rows = [(f"turn of {t.server} ({t.blocks} blocks, {t.backups} copies, {t.keys_moved} keys moved)",
             t.timings()) for t in turns]
    if turns:
        rows.append(("agent turn, mean / max", f"{sum(t.total_s for t in turns) / len(turns):.2f} / "
                                               f"{max(t.total_s for t in turns):.2f} s"))
    if report.controller is not None:
        c = report.controller
        dipped = sum(c.fewest_entries[n] < c.entries_before[n] for n in c.fewest_entries)
        rows += [("controller: stop (exit 0) / start and rebuild", f"{c.stop_s:.2f} / {c.rebuild_s:.2f} s"),
                 ("table reads during it / switches that lost entries / misrouted",
                  f"{c.reads} / {dipped} / {len(c.misrouted)}")]
    rows += [("whole rolling restart", f"{report.seconds:.2f} s"),
             ("fail-overs or DATA-LOST during the agents' turns", str(len(report.fail_overs))),
             ("files written meanwhile, in waves", f"{writers.written} ({len(writers.results)} client runs)"),
             ("client calls failed past their retries", str(writers.errors))]
    return rows


def run(args: argparse.Namespace, workdir: Path, say: Callable[[str], None] = print) -> int:
    """The whole run for the command line: bring-up, first files, the rolling
    restart while clients write, then every acknowledged write read back."""
    graph = builders.fat_tree(4, servers=args.servers)
    controller_args = ["--bootstrap", f"preallocate:{args.owners}", "--no-auto-split"]
    with MetaFlowNet(graph, capacity=args.capacity, store=args.store, workdir=workdir,
                     controller_args=controller_args) as mf:
        clients = len(mf.hosts("client"))
        say(f"network up in {mf.timings['network_built_s']} s: k=4 fat-tree, {args.servers} servers "
            f"({args.owners} owning the space), {clients} clients")
        first = mf.collect(mf.start_clients(args.files // clients, workdir, read_back=False, concurrency=8))
        say(f"{sum(r['written'] for r in first)} files written; rolling restart while the clients write")
        with Writers(mf, workdir, args.wave, start=args.files // clients) as writers:
            report = RollingRestart(mf, say).run()
        check = mf.verify_acked(workdir, [])
        for name, value in summary(report, writers):
            say(f"  {name:64s} {value}")
        say(f"  {'acknowledged writes read back: checked / missing / wrong':64s} "
            f"{check['checked']} / {check['missing']} / {check['wrong']}")
    failed = (check["missing"] + check["wrong"] + writers.errors + len(report.fail_overs)
              + len(report.controller.misrouted if report.controller else []))
    return 0 if failed == 0 else 1


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--servers", type=int, default=6,
                   help="storage servers of the k=4 fat-tree (the rest of its 16 hosts are clients)")
    p.add_argument("--owners", type=int, default=3, help="servers owning the space at the start")
    p.add_argument("--files", type=int, default=1200, help="files written before the restart")
    p.add_argument("--wave", type=int, default=100, help="files each client writes per wave during it")
    p.add_argument("--capacity", type=int, default=1_000_000, help="keys per server")
    p.add_argument("--store", choices=("leveldb", "redis"), default="leveldb")
    args = p.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="mfroll") as workdir:
        return run(args, Path(workdir), lambda text: print(text, flush=True))


if __name__ == "__main__":
    try:
        sys.exit(main())
    except (RollingError, subprocess.SubprocessError) as exc:
        print(f"rolling restart failed: {exc}", file=sys.stderr)
        sys.exit(1)
