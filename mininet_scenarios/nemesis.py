"""The nemesis: Jepsen's method on a real MetaFlow in Mininet.

A k=4 fat-tree with 8 storage servers (two copies of every block, LevelDB
by default), the real controller and agents. Clients on the client hosts
(`mininet_scenarios.register_client`) read and write a small hot key set
that all of them share, and keys of their own, recording every operation,
while rounds of faults hit the servers:

* ``kill-primary``: kill -9 of a server that is the primary of blocks
  (detection: 1 s without heartbeats);
* ``kill-backup``: kill -9 of a server that holds backups only;
* ``link-down``: a primary's edge link goes down (detection: the port
  status); its agent lives on, cut off, and rejoins once the link is back;
* ``controller-during-failover``: kill -9 of a primary, and kill -9 of the
  controller while it fails the server over; a new controller rebuilds from
  the agents and finishes the job;
* ``kill-during-split``: a split is forced over REST, and its source or its
  target is killed while it copies, assigns or moves flows;

and, each class with its own count (``--pauses``, ``--partitions``,
``--slow-disks``; `mininet_scenarios.faults` has the mechanisms):

* pauses: SIGSTOP, then SIGCONT, of a primary's agent (``pause-primary``), of
  a backup's (``pause-backup``), of the leader controller
  (``pause-controller``), for half the heartbeat timeout up to four times it
  (`PAUSE_FACTORS`, in turn);
* partitions of the management network, for as long: an agent cut from the
  controller but not from its clients nor its peers
  (``cut-agent-from-controller``), the controller cut from every agent
  (``cut-controller-from-agents``);
* ``slow-disk``: a primary's writes to its disk throttled by the kernel for a
  few seconds, so every sync it makes waits;
* with more than one controller (``--controllers 2``: `Hooks.cluster`): the
  coordination service (etcd) paused (``pause-coordination``), the leader cut
  from etcd while the standby still reaches it (``cut-leader-from-peers``:
  the controllers share nothing else, so this cuts it from its peers), and
  the other side, the standby cut from etcd while the leader keeps it
  (``cut-coordination-side``: with one etcd member, a side of the
  coordination service is the set of controllers that still reach it);
* ``kill-leader`` (``--leader-kills``): kill -9 of the leading controller
  while the clients run; with two controllers the standby takes over and
  the killed one comes back as a standby, with one a new controller starts;
  no MetaFlow flow entry may leave a bridge meanwhile (`FlowWatch`).

A round of these waits until every ID is served again (``served_s``, from
the start of the fault), every server the controller failed over meanwhile
is back in service, and every block has its copies again.

One fault at a time, so at most one server of any replica set is down
(r - 1): a round waits until the controller has failed the server over and
every block has both copies again, then brings the server back (a killed
agent restarts on its old store directory, suspended, and the controller
tells it to rejoin empty; a cut-off one gets its link back), then checks:

* every client reads back every key (workers paused): each of its own keys
  must hold its last acknowledged value (or that of a write whose outcome it
  could not know); what does not is *lost*, what cannot be read *unreadable*;
* no MetaDataID is served by two servers: every live agent's /health, the
  blocks it is a serving primary of (not suspended, not withheld), must not
  overlap another's, must be what the controller routes to it
  (`REST.servers`), and together must cover the space. An inconsistency
  that goes away within a few seconds is reported as transient; one that
  stays is a *violation*;
* the controller said no ``DATA-LOST``.

At the end: a "ballast" of files written before the first fault (enough to
make a split take a moment) is read back in full (`MetaFlowNet.verify_acked`),
and every key's history is checked for linearizability
(`linearizability.check`: the hot keys are what makes it hard). The summary
is one JSON object; the exit status is 1 on any loss, violation, or
non-linearizable history.

    python -m mininet_scenarios.nemesis --kills 200 --seed 7
"""

from __future__ import annotations

import argparse
import json
import random
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import AbstractContextManager, contextmanager
from dataclasses import asdict, dataclass, field
from itertools import combinations
from pathlib import Path
from typing import Any

from client_lib.api.admin import ADMIN, Health
from client_lib.api.clients import ApiClient
from client_lib.api.rest import REST, ServerInfo
from client_lib.cidr import Block
from client_lib.constants import DEFAULT_REPLICAS
from client_lib.errors import ApiError
from controller.app import TICK_S
from controller.settings import Settings as ControllerSettings
from mininet_scenarios import linearizability
from mininet_scenarios.daemons import ROOT, AgentProcess
from mininet_scenarios.faults import ROOT_NS, HasProcess, cut_off, dropped, paused, port_rules, slow_disk
from mininet_scenarios.flowwatch import FlowWatch
from mininet_scenarios.hostns import HostNamespace
from mininet_scenarios.metaflow_net import MetaFlowNet
from mininet_scenarios.mgmt import SUBNET_HELP
from topology import builders

FAULTS = ("kill-primary", "kill-backup", "link-down", "controller-during-failover", "kill-during-split")
"""Every kind of kill round; each cycle of the schedule has all of them, in a random order."""
_CYCLE = (*FAULTS, "kill-primary", "kill-backup")
PAUSES = ("pause-primary", "pause-backup", "pause-controller", "pause-coordination")
PARTITIONS = ("cut-agent-from-controller", "cut-controller-from-agents", "cut-leader-from-peers",
              "cut-coordination-side")
SLOW_DISKS = ("slow-disk",)
LEADER_KILLS = ("kill-leader",)
CLASSES = {"kill": FAULTS, "pause": PAUSES, "partition": PARTITIONS, "slow-disk": SLOW_DISKS,
           "leader": LEADER_KILLS}
"""Each class of fault has its own count (`Settings`); a cycle of the schedule
has every kind of every class whose count is not reached yet."""
CLASS_OF = {fault: kind for kind, faults in CLASSES.items() for fault in faults}
NEEDS_HOOK = {"pause-coordination": "coordination", "cut-leader-from-peers": "isolate_leader",
              "cut-coordination-side": "split_coordination"}
"""Faults of a cluster with several controllers: scheduled only when the `Hooks` have what they need."""
HEARTBEAT_TIMEOUT_S = ControllerSettings.heartbeat_timeout_s
"""The controller's (the nemesis runs it with its default)."""
PAUSE_FACTORS = (1.5, 0.5, 4.0, 0.9, 2.5)
"""A pause or a cut lasts one of these times the heartbeat timeout, in turn for each kind of fault:
from well below it (nothing is failed over) to well above (the victim is)."""
AFTERMATH_S = 2 * HEARTBEAT_TIMEOUT_S + TICK_S
"""After a pause or a cut, the controller's grace (two heartbeat timeouts)
and one tick: a server it fails over then is this fault's doing, and
belongs to its round."""
SERVED_POLL_S = 0.5
"""How long the watch of who serves what waits for an agent's /health during a fault."""
SLOW_DISK_S = (4.0, 8.0)
SLOW_DISK_IOPS = 10
"""Write requests a second for a slowed agent: a sync takes about 0.3 s instead of milliseconds."""
_SPLIT_STEPS = ("copy", "assign", "flows", "commit")


class Stuck(RuntimeError):
    """The cluster did not recover from a fault in time: the run stops injecting faults."""


@dataclass
class Round:
    """What one round did and found."""

    number: int
    fault: str
    victim: str
    detail: str = ""
    kills: int = 0
    controller_kills: int = 0
    settle_s: float = 0.0
    rejoin_s: float = 0.0
    fault_s: float = 0.0
    """How long a pause, a cut or a slow disk lasted."""
    served_s: float = 0.0
    """From the start of a pause, cut or slow disk until every ID was served by exactly one agent again."""
    failovers: int = 0
    """Servers the controller declared failed in the round."""
    new_leader: bool = False
    """The round ended under another leader's term than it began with."""
    seconds: float = 0.0
    checked: int = 0
    lost: int = 0
    unreadable: int = 0
    violations: list[str] = field(default_factory=list)
    transient: list[str] = field(default_factory=list)
    stranded: list[str] = field(default_factory=list)
    """Servers that came back and were not taken back into service (`Nemesis._rejoin`)."""


@dataclass
class Hooks:
    """What the nemesis asks of the cluster around it, beyond one `MetaFlowNet`:
    the faults of a cluster with several controllers. Each None leaves its
    faults out of the schedule (one controller, no coordination service)."""

    leader: Callable[[], HasProcess | None]
    """The controller that leads now (today's only one); paused by ``pause-controller``."""
    controller_addresses: Callable[[], list[str]]
    """Where the agents reach the controllers on the management network (cut by the partitions)."""
    kill_leader: Callable[[], Callable[[], None]]
    """kill -9 of the leader now; returns what waits until a controller leads
    again with the network built (and the killed one is back, as a standby
    when there are several)."""
    coordination: Callable[[], list[HasProcess]] | None = None
    """The coordination service's processes (etcd members), paused together."""
    isolate_leader: Callable[[], AbstractContextManager[object]] | None = None
    """The leader cut from the other controllers while entered."""
    split_coordination: Callable[[], AbstractContextManager[object]] | None = None
    """One side of the coordination service cut from the rest while entered."""

    @classmethod
    def single(cls, mf: MetaFlowNet) -> Hooks:
        """One controller, no coordination service: today's `MetaFlowNet`."""
        def kill_leader() -> Callable[[], None]:
            assert mf.controller is not None
            mf.controller.kill()
            return lambda: None if mf.restart_controller(kill=True) else None
        return cls(leader=lambda: mf.controller, controller_addresses=lambda: [mf.running.mgmt.root_ip],
                   kill_leader=kill_leader)

    @classmethod
    def cluster(cls, mf: MetaFlowNet) -> Hooks:
        """Several controllers and one etcd (`MetaFlowNet(controllers=N)`), all
        in the root namespace: each controller reaches etcd on a client port
        of its own, so a packet filter on that port (`port_rules`) cuts one
        controller from etcd and leaves the others alone."""
        assert mf.etcd is not None
        etcd = mf.etcd
        tag = f"{mf.running.prefix}nemesis"

        def kill_leader() -> Callable[[], None]:
            index = mf.kill_leader()

            def recover() -> None:
                mf.leader(60.0)
                mf.announce()
                mf.wait_built()
                mf.revive_controller(index)
                mf.standby(index)
            return recover

        def cut(leaders: bool) -> AbstractContextManager[None]:
            lead = mf.leader()
            ports = [p for i, p in enumerate(etcd.client_ports) if (i == lead) == leaders]
            return dropped([ROOT_NS], port_rules(ports, tag))

        return cls(leader=lambda: mf.controllers[mf.leader()],
                   controller_addresses=lambda: [mf.running.mgmt.root_ip], kill_leader=kill_leader,
                   coordination=lambda: [etcd], isolate_leader=lambda: cut(True),
                   split_coordination=lambda: cut(False))

    @classmethod
    def of(cls, mf: MetaFlowNet) -> Hooks:
        """`cluster` when `mf` runs several controllers, else `single`."""
        return cls.cluster(mf) if len(mf.controllers) > 1 else cls.single(mf)

    def unavailable(self) -> dict[str, str]:
        """The faults these hooks cannot inject, and why."""
        return {fault: f"no {hook} hook (one controller, no coordination service)"
                for fault, hook in NEEDS_HOOK.items() if getattr(self, hook) is None}


@dataclass
class Settings:
    kills: int = 20
    pauses: int = 0
    partitions: int = 0
    slow_disks: int = 0
    leader_kills: int = 0
    controllers: int = 1
    """More than one: with etcd, and the faults of the leader and of etcd (`Hooks.cluster`)."""
    seed: int = 1
    clients: int = 4
    store: str = "leveldb"
    replicas: int = DEFAULT_REPLICAS
    hot: int = 16
    unique: int = 150
    ballast: int = 250
    """Files each client host writes before the first fault (read back at the end)."""
    think: float = 0.01
    settle_timeout: float = 60.0
    rejoin_timeout: float = 20.0
    mgmt_subnet: str | None = None
    """Another one runs the nemesis beside another scenario."""
    liveness_datagrams: bool = False
    """Agents beat by liveness datagram (their ``--liveness-datagrams``), not HTTP."""


# -- what the agents say they serve ------------------------------------------------------


def serving(health: Health) -> list[Block]:
    """The blocks an agent answers clients for: those it is a serving primary
    of, unless it is suspended or holds the block back (fenced, degraded)."""
    if health.suspended:
        return []
    withheld: list[Block] = list(getattr(health, "withheld", []))   # a newer contract's field
    return [r.block for r in health.roles
            if r.primary and r.serving and not any(w.covers(r.block) for w in withheld)]


def ranges(blocks: Iterable[Block]) -> list[tuple[int, int]]:
    """The IDs of `blocks` as merged inclusive ranges: two lists of blocks
    cover the same IDs exactly when their ranges are equal."""
    out: list[tuple[int, int]] = []
    for first, last in sorted((b.first, b.last) for b in blocks):
        if out and first <= out[-1][1] + 1:
            out[-1] = (out[-1][0], max(out[-1][1], last))
        else:
            out.append((first, last))
    return out


def ownership_problems(served: dict[str, list[Block]], routed: dict[str, list[Block]],
                       space: Block) -> list[str]:
    """What is wrong with who serves what: `served` is each live agent's
    serving blocks, `routed` the controller's blocks per server (its flows)."""
    problems = []
    for (a, mine), (b, theirs) in combinations(sorted(served.items()), 2):
        for x in mine:
            for y in theirs:
                if x.covers(y) or y.covers(x):
                    problems.append(f"{x} served by {a} and {y} by {b}")
    for name, blocks in sorted(served.items()):
        expected = routed.get(name, [])
        if ranges(blocks) != ranges(expected):
            problems.append(f"{name} serves {sorted(map(str, blocks))}, the controller routes "
                            f"{sorted(map(str, expected))} to it")
    everything = ranges(b for blocks in served.values() for b in blocks)
    if everything != [(space.first, space.last)]:
        problems.append(f"the serving primaries cover {len(everything)} ranges, not the whole space: "
                        f"{[(space.address(a), space.address(z)) for a, z in everything][:6]}")
    return problems


# -- recovery ------------------------------------------------------------------------------


def settled(mf: MetaFlowNet, victim: str, timeout: float) -> float:
    """Seconds until the controller has declared `victim` failed, moved
    everything off it, and every block has all its copies again."""
    started = time.monotonic()
    while time.monotonic() - started < timeout:
        try:
            state = mf.view(REST.servers).servers.get(victim)
            quiet = not mf.view(REST.operations).operations
            # A restarted controller may not know a dead server at all.
            gone = state is None or (state.failed and not state.blocks and not state.backups)
            if gone and quiet and mf.replicated():
                return round(time.monotonic() - started, 2)
        except ApiError:
            pass   # a controller restarting
        time.sleep(0.2)
    raise Stuck(f"{victim}: not failed over and re-replicated within {timeout} s: "
                f"{mf.view(REST.servers).servers.get(victim)}, "
                f"operations {mf.view(REST.operations).operations}")


def quiet(mf: MetaFlowNet, timeout: float) -> float:
    """Seconds until the controller runs no operation and every block has all its copies."""
    started = time.monotonic()
    while time.monotonic() - started < timeout:
        try:
            if not mf.view(REST.operations).operations and mf.replicated():
                return round(time.monotonic() - started, 2)
        except ApiError:
            pass   # a controller waking up
        time.sleep(0.2)
    raise Stuck(f"not quiet and re-replicated within {timeout} s: operations "
                f"{mf.view(REST.operations).operations}")


def back_in_service(mf: MetaFlowNet, victim: str, timeout: float, stranded_after: float = 8.0) -> bool | None:
    """True once `victim` is a leaf of the tree again (it came back: restarted,
    or its link is up); False once it has been registered and in service for
    `stranded_after` seconds without being one; None if neither happened in `timeout`."""
    deadline = time.monotonic() + timeout
    announced = 0.0
    outside: float | None = None
    while time.monotonic() < deadline:
        state = mf.view(REST.servers).servers.get(victim)
        if state is not None and not state.failed:
            if state.state is not None:
                return True
            outside = outside or time.monotonic()
            if time.monotonic() - outside > stranded_after:
                return False
        if time.monotonic() - announced > 2.0:
            mf.announce()   # a host whose link came back is silent until it ARPs
            announced = time.monotonic()
        time.sleep(0.2)
    return None


# -- the clients ---------------------------------------------------------------------------


class Clients:
    """The register clients, one process per client host, driven over stdin."""

    def __init__(self, mf: MetaFlowNet, hosts: list[str], workdir: Path, settings: Settings) -> None:
        self.workdir = workdir
        self.procs: dict[str, subprocess.Popen[str]] = {}
        self.pool = ThreadPoolExecutor(max_workers=len(hosts))
        scenario = mf.running
        for i, node in enumerate(hosts):
            argv = [sys.executable, "-m", "mininet_scenarios.register_client", "--client", node,
                    "--history", str(self.history(node)), "--space", scenario.space,
                    "--hot", str(settings.hot), "--unique", str(settings.unique),
                    "--think", str(settings.think), "--seed", str(settings.seed * 1000 + i)]
            with open(workdir / f"{node}.err", "w") as err:
                self.procs[node] = subprocess.Popen(scenario.ns(node).command(*argv), cwd=ROOT, text=True,
                                                    stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=err)
        for node in hosts:
            self._answer(node, 60)

    def history(self, node: str) -> Path:
        return self.workdir / f"{node}.history"

    def ask(self, command: str, timeout: float = 120) -> list[dict[str, Any]]:
        """Send `command` to every client at once; their answers."""
        for proc in self.procs.values():
            assert proc.stdin is not None
            proc.stdin.write(command + "\n")
            proc.stdin.flush()
        return [self._answer(node, timeout) for node in self.procs]

    def _answer(self, node: str, timeout: float) -> dict[str, Any]:
        proc = self.procs[node]
        assert proc.stdout is not None
        line = self.pool.submit(proc.stdout.readline).result(timeout)
        if not line:
            raise RuntimeError(f"client {node} exited ({proc.wait(10)}): "
                               f"{(self.workdir / f'{node}.err').read_text()[-2000:]}")
        return dict(json.loads(line))

    def stop(self) -> list[dict[str, Any]]:
        summaries = self.ask("stop")
        for proc in self.procs.values():
            proc.wait(30)
        self.pool.shutdown()
        return summaries

    def kill(self) -> None:
        """After a failure: no client outlives the run."""
        for proc in self.procs.values():
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        self.pool.shutdown(wait=False, cancel_futures=True)

    def histories(self) -> list[linearizability.Op]:
        lines: list[str] = []
        for node in self.procs:
            lines += self.history(node).read_text().splitlines()
        return linearizability.parse_history(lines)


# -- the faults -------------------------------------------------------------------------


class Nemesis:
    """Injects one fault per round and checks the cluster after it (module docstring)."""

    def __init__(self, mf: MetaFlowNet, clients: Clients, rng: random.Random, settings: Settings,
                 say: Callable[[str], None], hooks: Hooks | None = None) -> None:
        self.mf = mf
        self.hooks = hooks or Hooks.single(mf)
        self.clients = clients
        self.rng = rng
        self.settings = settings
        self.say = say
        self.space = Block.parse(mf.running.space)
        self.rounds: list[Round] = []
        self.events: Counter[str] = Counter()
        self._seen: set[str] = set()

    # -- views -----------------------------------------------------------------------

    def servers(self) -> dict[str, ServerInfo]:
        return self.mf.view(REST.servers).servers

    def live(self) -> dict[str, ServerInfo]:
        """Servers in service whose agent runs."""
        running = {agent.name for agent in self.mf.running.agents.values()}
        return {n: s for n, s in self.servers().items() if not s.failed and n in running}

    def new_events(self) -> list[dict[str, Any]]:
        """The controller's events since the last call (its log is a bounded deque)."""
        fresh = []
        for event in self.mf.view(REST.events).events:
            key = json.dumps(event, sort_keys=True, default=str)
            if key not in self._seen:
                self._seen.add(key)
                fresh.append(event)
                self.events[str(event["event"])] += 1
        return fresh

    # -- the schedule ----------------------------------------------------------------

    def budget(self) -> dict[str, int]:
        """Rounds (kills, for the kill class) each class of fault has left."""
        s = self.settings
        spent = Counter(CLASS_OF[r.fault] for r in self.rounds)
        spent["kill"] = sum(r.kills for r in self.rounds)
        wanted = {"kill": s.kills, "pause": s.pauses, "partition": s.partitions, "slow-disk": s.slow_disks,
                  "leader": s.leader_kills}
        return {kind: max(n - spent[kind], 0) for kind, n in wanted.items()}

    def schedule(self) -> Iterator[str]:
        """Cycles of every kind of fault whose class has rounds left, each in a random order."""
        unavailable = self.hooks.unavailable()
        others = [f for kind, faults in CLASSES.items() if kind != "kill" for f in faults
                  if f not in unavailable]
        while any(self.budget().values()):
            cycle = [*_CYCLE, *others]
            self.rng.shuffle(cycle)
            yield from cycle

    def run(self) -> None:
        for fault in self.schedule():
            if not self.budget()[CLASS_OF[fault]]:
                continue
            started = time.monotonic()
            term = self.mf.view(REST.leadership).term
            report = getattr(self, "_" + fault.replace("-", "_"))(Round(len(self.rounds) + 1, fault, ""))
            self.rounds.append(report)
            try:
                self.check(report)
            finally:
                report.seconds = round(time.monotonic() - started, 2)
            report.new_leader = self.mf.view(REST.leadership).term != term
            left = ", ".join(f"{n} {kind}" for kind, n in self.budget().items() if n)
            self.say(f"round {report.number:3d} [left: {left or 'none'}] {report.fault:27s} "
                     f"{report.victim:10s} {report.detail}; settled {report.settle_s:.1f} s, served "
                     f"{report.served_s:.1f} s, {report.failovers} fail-overs"
                     f"{', new leader' if report.new_leader else ''}, back {report.rejoin_s:.1f} s; "
                     f"read back {report.checked} keys: {report.lost} lost, "
                     f"{report.unreadable} unreadable; {len(report.violations)} violations"
                     f"{f' ({len(report.transient)} transient)' if report.transient else ''}; "
                     f"{report.seconds:.1f} s")

    def _pick(self, candidates: dict[str, ServerInfo], why: str) -> str:
        if not candidates:
            raise Stuck(f"no server to pick ({why}): {self.servers()}")
        return self.rng.choice(sorted(candidates))

    def _primaries(self) -> dict[str, ServerInfo]:
        return {n: s for n, s in self.live().items() if s.blocks}

    def _kill_primary(self, report: Round) -> Round:
        report.victim = self._pick(self._primaries(), "a primary")
        self._kill_and_recover(report)
        return report

    def _kill_backup(self, report: Round) -> Round:
        live = self.live()
        backups_only = {n: s for n, s in live.items() if s.backups and not s.blocks}
        if not backups_only:
            report.fault = "kill-primary"
            report.detail = "(no server holds backups only)"
            backups_only = {n: s for n, s in live.items() if s.backups}
        report.victim = self._pick(backups_only, "a backup")
        self._kill_and_recover(report)
        return report

    def _kill_and_recover(self, report: Round) -> None:
        agent = self.mf.kill_agent(report.victim)
        report.kills += 1
        self._recover(report, agent)

    def _link_down(self, report: Round) -> Round:
        victim = report.victim = self._pick(self._primaries(), "a primary")
        self.mf.set_link(victim, up=False)
        report.detail = "edge link down"
        try:
            report.settle_s = settled(self.mf, victim, self.settings.settle_timeout)
        finally:
            self.mf.set_link(victim, up=True)
        self._rejoin(report)
        return report

    def _controller_during_failover(self, report: Round) -> Round:
        """A fail-over takes a few tens of milliseconds, too short to hit by
        polling; so it is held in its first step: the victim's backups (which
        the fence assigns first) are paused (SIGSTOP) for the moment it takes
        to see the step, and the victim is detected by its port going down
        at once, so the pause stays far below the heartbeat timeout."""
        victim = report.victim = self._pick(self._primaries(), "a primary")
        agents = {a.name: a for a in self.mf.running.agents.values()}
        roles = agents[victim].call(ADMIN.health).roles
        heirs = sorted({m.name for r in roles if r.primary for m in r.members[1:]} & set(agents))
        with paused([agents[h] for h in heirs]):
            agent = self.mf.kill_agent(victim)
            self.mf.set_link(victim, up=False)
            report.kills += 1
            step = self._wait_for_step("failover", victim, ("fence",),
                                       lambda: bool(self.servers()[victim].failed), timeout=0.5)
            recover = self.hooks.kill_leader()
        report.controller_kills += 1
        report.detail = (f"controller killed at the fail-over's {step} step" if step
                         else "controller killed, the fail-over not seen")
        recover()
        self._recover(report, agent, relink=True)
        return report

    def _kill_leader(self, report: Round) -> Round:
        """kill -9 of the leader while the clients run; served again once a
        controller leads and the view it routes by is what the agents serve.
        No MetaFlow entry may leave a bridge meanwhile (`FlowWatch`): the new
        leader reads the tables back and sends only differences."""
        report.victim = "controller"
        started = time.monotonic()
        with self._watching(report), FlowWatch(self.mf) as flows:
            recover = self.hooks.kill_leader()
            report.controller_kills += 1
            recover()
        if flows.removed:
            report.violations.append(f"the takeover removed {len(flows.removed)} MetaFlow entries: "
                                     f"{sorted(flows.removed)[:4]}")
        report.detail = (f"leader killed, a controller leading and the killed one back in "
                         f"{time.monotonic() - started:.1f} s; {flows.polls} polls of the bridges, "
                         f"{len(flows.removed)} entries removed")
        report.settle_s = quiet(self.mf, self.settings.settle_timeout)
        return report

    def _kill_during_split(self, report: Round) -> Round:
        """A split of the busiest primary, and a kill of its source or its
        target once it reaches a step picked at random (or a later one)."""
        source = max(self._primaries().items(), key=lambda item: item[1].keys)[0]
        aim = self.rng.randrange(len(_SPLIT_STEPS))
        splitting = threading.Thread(target=self._split, args=(source,), daemon=True)
        splitting.start()
        step = self._wait_for_step("split", source, _SPLIT_STEPS[aim:], lambda: not splitting.is_alive())
        targets = sorted(n for n, s in self.servers().items() if s.operation == "split" and n != source)
        kill_target = bool(targets) and self.rng.random() < 0.5
        victim = report.victim = self.rng.choice(targets) if kill_target else source
        agent = self.mf.kill_agent(victim)
        report.kills += 1
        if step:
            report.detail = f"{'target' if kill_target else 'source'} of a split killed at its {step} step"
        else:
            report.fault = "kill-primary"
            report.detail = f"(the split of {source} ended before its {_SPLIT_STEPS[aim]} step could be hit)"
        splitting.join(30)
        self._recover(report, agent)
        return report

    # -- pauses, partitions, a slow disk: the victims live on -----------------------------

    def _pause_primary(self, report: Round) -> Round:
        report.victim = self._pick(self._primaries(), "a primary")
        return self._pause_agent(report)

    def _pause_backup(self, report: Round) -> Round:
        live = self.live()
        backups = {n: s for n, s in live.items() if s.backups and not s.blocks}
        report.victim = self._pick(backups or {n: s for n, s in live.items() if s.backups}, "a backup")
        return self._pause_agent(report)

    def _pause_agent(self, report: Round) -> Round:
        agent = self._agent(report.victim)
        return self._disturb(report, "paused", lambda: paused([agent]))

    def _pause_controller(self, report: Round) -> Round:
        leader = self.hooks.leader()
        if leader is None:
            raise Stuck("no leader controller to pause")
        report.victim = "controller"
        return self._disturb(report, "paused", lambda: paused([leader]))

    def _pause_coordination(self, report: Round) -> Round:
        assert self.hooks.coordination is not None   # else not scheduled
        members = self.hooks.coordination()
        report.victim = "coordination"
        return self._disturb(report, "paused", lambda: paused(members))

    def _cut_agent_from_controller(self, report: Round) -> Round:
        report.victim = self._pick(self._primaries(), "a primary")
        hosts = [self.mf.running.ns(self.mf.running.topo.graph_names[report.victim])]
        return self._disturb(report, "cut from the controller", lambda: self._cut(hosts))

    def _cut_controller_from_agents(self, report: Round) -> Round:
        report.victim = "controller"
        scenario = self.mf.running
        hosts = [scenario.ns(node) for node in scenario.agents]
        return self._disturb(report, "cut from every agent", lambda: self._cut(hosts))

    def _cut_leader_from_peers(self, report: Round) -> Round:
        assert self.hooks.isolate_leader is not None   # else not scheduled
        report.victim = "controller"
        return self._disturb(report, "cut from the other controllers", self.hooks.isolate_leader)

    def _cut_coordination_side(self, report: Round) -> Round:
        assert self.hooks.split_coordination is not None   # else not scheduled
        report.victim = "coordination"
        return self._disturb(report, "one side cut off", self.hooks.split_coordination)

    def _slow_disk(self, report: Round) -> Round:
        victim = report.victim = self._pick(self._primaries(), "a primary")
        scenario = self.mf.running
        assert scenario.workdir is not None   # the agents' stores are under it
        seconds = self.rng.choice(SLOW_DISK_S)
        name = f"{scenario.prefix}slow{report.number}"
        with self._watching(report), slow_disk(self._agent(victim), scenario.workdir / victim,
                                               SLOW_DISK_IOPS, name) as throttle:
            time.sleep(seconds)
        report.fault_s = seconds
        report.detail = (f"{throttle.write_iops} writes/s to {throttle.device} for {seconds:g} s: "
                         f"{throttle.writes} writes slowed")
        self._after_disturbance(report)
        return report

    def _agent(self, server: str) -> AgentProcess:
        scenario = self.mf.running
        return scenario.agents[scenario.topo.graph_names[server]]

    def _cut(self, hosts: list[HostNamespace]) -> AbstractContextManager[None]:
        return cut_off(hosts, self.hooks.controller_addresses(), f"{self.mf.running.prefix}nemesis")

    def _disturb(self, report: Round, what: str,
                 fault: Callable[[], AbstractContextManager[object]]) -> Round:
        """`fault` held for the next of `PAUSE_FACTORS` times the heartbeat
        timeout (per kind of fault), then the cluster brought back."""
        done = sum(r.fault == report.fault for r in self.rounds)
        seconds = round(PAUSE_FACTORS[done % len(PAUSE_FACTORS)] * HEARTBEAT_TIMEOUT_S, 2)
        with self._watching(report):
            with fault():
                time.sleep(seconds)
        report.fault_s = seconds
        report.detail = f"{what} for {seconds:g} s"
        self._after_disturbance(report)
        return report

    @contextmanager
    def _watching(self, report: Round) -> Iterator[None]:
        """Who serves what, polled from the start of the fault until every ID
        is served again after its end: `Round.served_s`, from the start of the
        fault to the end of the last moment some ID was not (0 if none was).
        An agent that does not answer within `SERVED_POLL_S` serves nothing
        (paused, it serves no client either)."""
        started = time.monotonic()
        over = threading.Event()
        served: list[float] = []

        def watch() -> None:
            unserved_until: float | None = None
            deadline = started + self.settings.settle_timeout
            while time.monotonic() < deadline:
                polled = time.monotonic()
                try:
                    clean = not self.ownership(SERVED_POLL_S, answerless_serve_nothing=True)
                except (ApiError, TimeoutError):
                    clean = False   # no controller answering (paused, none leads yet): nothing known
                if not clean:
                    unserved_until = None
                elif unserved_until is None:
                    unserved_until = polled
                if clean and over.is_set():
                    break
                time.sleep(0.1)
            served.append(deadline - started if unserved_until is None else unserved_until - started)

        watcher = threading.Thread(target=watch, daemon=True)
        watcher.start()
        try:
            yield
        finally:
            over.set()
            watcher.join()
            report.served_s = round(max(served[0], 0.0), 2) if served else 0.0

    def _after_disturbance(self, report: Round) -> None:
        """Until every server the controller failed over meanwhile is back,
        and every block has its copies again: what `check` then looks at is
        the steady state."""
        started = time.monotonic()
        time.sleep(AFTERMATH_S)
        running = {agent.name for agent in self.mf.running.agents.values()}
        out = sorted(n for n, s in self.servers().items() if s.failed and n in running)
        for victim in out:
            self._rejoin(report, started, victim)
        report.settle_s = quiet(self.mf, self.settings.settle_timeout)

    def _split(self, source: str) -> None:
        """A split asked over REST; its answer may die with its source."""
        assert self.mf.api is not None
        try:
            self.mf.api.call(REST.split, name=source)
        except ApiError:
            pass

    def _wait_for_step(self, kind: str, server: str, steps: tuple[str, ...], over: Callable[[], bool],
                       timeout: float = 10.0) -> str | None:
        """Poll the controller's operations (fast: a step may take a few
        milliseconds) until one of `kind` on `server` is at one of `steps`;
        None if it is `over` first (or never came)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            ops = [op for op in self.mf.view(REST.operations).operations
                   if op.kind == kind and op.server == server]
            for op in ops:
                if op.step in steps:
                    return op.step
            if not ops and over():
                return None
            time.sleep(0.003)
        return None

    # -- recovery --------------------------------------------------------------------

    def _recover(self, report: Round, agent: AgentProcess, relink: bool = False) -> None:
        """Wait for the fail-over and the re-replication, then restart the
        killed agent (its edge link back up first, if it was taken down)."""
        report.settle_s = settled(self.mf, report.victim, self.settings.settle_timeout)
        started = time.monotonic()
        if relink:
            self.mf.set_link(report.victim, up=True)
        self.mf.revive_agent(agent)
        self._rejoin(report, started)

    def _rejoin(self, report: Round, started: float | None = None, victim: str | None = None) -> None:
        """Wait until the victim is back in service (empty, a leaf of the tree).

        A server that was dead while a new controller rebuilt the network is
        not in its tree, and registering does not put it there: it would
        stay out of service for good, and the run would run out of servers.
        That breaks the issue's contract (a server that comes back rejoins)
        and is counted (`stranded`); the way on is a new leader (the
        leader killed: `Hooks.kill_leader`), whose rebuild takes it in."""
        started = time.monotonic() if started is None else started
        victim = victim or report.victim
        for restarts in range(2):
            back = back_in_service(self.mf, victim, self.settings.rejoin_timeout)
            if back:
                report.rejoin_s = round(time.monotonic() - started, 2)
                return
            if back is None or restarts:
                break
            report.stranded.append(victim)
            self.hooks.kill_leader()()
            report.detail += "; leader killed, so that a new one takes the server back"
        raise Stuck(f"{victim} did not rejoin within {self.settings.rejoin_timeout} s: "
                    f"{self.servers().get(victim)}")

    # -- checks --------------------------------------------------------------------------

    def check(self, report: Round, attempts: int = 4) -> None:
        """The round's checks (module docstring); a problem seen again after
        retrying for a few seconds is a violation, one that went away transient."""
        for answer in self.clients.ask("verify"):
            report.checked += answer["checked"]
            report.lost += answer["lost"]
            report.unreadable += answer["unreadable"]
            if answer["lost"] or answer["unreadable"]:
                report.violations.append(f"client {answer['client']}: {answer['sample']}")
        for event in self.new_events():
            if event["event"] == "DATA-LOST":
                report.violations.append(f"the controller said DATA-LOST: {event}")
            report.failovers += event["event"] == "server-failed"
        for attempt in range(attempts):
            problems = self.ownership()
            if not problems:
                return
            if attempt < attempts - 1:
                report.transient += problems
                time.sleep(1.0)
        report.violations += problems

    def ownership(self, timeout: float | None = None, answerless_serve_nothing: bool = False) -> list[str]:
        """Who serves what, from every live agent at once, against the
        controller's view. `timeout`: for each agent's /health (its admin
        client's default if None); an agent that does not answer is a problem,
        or with `answerless_serve_nothing` one that serves nothing."""
        agents = list(self.mf.running.agents.values())
        with ThreadPoolExecutor(max_workers=len(agents)) as pool:
            answers = list(pool.map(lambda agent: _health(agent, timeout), agents))
        problems = [f"{agent.name}: /health failed: {answer}" for agent, answer in zip(agents, answers,
                                                                                          strict=True)
                    if not isinstance(answer, Health) and not answerless_serve_nothing]
        served = {h.name: serving(h) for h in answers if isinstance(h, Health)}
        routed = {n: list(s.blocks) for n, s in self.servers().items() if not s.failed}
        return problems + ownership_problems(served, routed, self.space)


def _health(agent: AgentProcess, timeout: float | None = None) -> Health | str:
    try:
        if timeout is None:
            return agent.call(ADMIN.health)
        return ApiClient(agent.admin_url, agent.secret, timeout).call(ADMIN.health)
    except (ApiError, RuntimeError) as exc:
        return str(exc)


# -- the run --------------------------------------------------------------------------


def run(settings: Settings, say: Callable[[str], None] = print, keep: Path | None = None,
        hooks: Callable[[MetaFlowNet], Hooks] = Hooks.of) -> dict[str, Any]:
    """The whole nemesis run; its summary (see `main`). `keep`: a directory
    for the histories and logs that outlives the run (else a temporary one).
    `hooks`: the faults of the cluster beyond the one `MetaFlowNet` (`Hooks`)."""
    started = time.monotonic()
    rng = random.Random(settings.seed)
    summary: dict[str, Any] = {"settings": asdict(settings)}
    with tempfile.TemporaryDirectory(prefix="mfnemesis") as tmp:
        workdir = Path(keep or tmp)
        (workdir / "ballast").mkdir(parents=True)
        graph = builders.fat_tree(4, servers=8)
        with MetaFlowNet(graph, capacity=1_000_000, store=settings.store, replicas=settings.replicas,
                         workdir=workdir, controller_args=["--no-auto-split"],
                         agent_args=["--liveness-datagrams"] if settings.liveness_datagrams else [],
                         mgmt_subnet=settings.mgmt_subnet, controllers=settings.controllers) as mf:
            say(f"nemesis: k=4 fat-tree, 8 servers ({settings.store}, r={settings.replicas}), "
                f"{settings.clients} clients, {settings.controllers} controller(s); "
                f"network up in {mf.timings['network_built_s']} s")
            ballast = mf.run_clients(settings.ballast, workdir / "ballast", read_back=False)
            say(f"ballast: {sum(c['written'] for c in ballast)} files written by {len(ballast)} client hosts")
            clients = Clients(mf, mf.hosts("client")[:settings.clients], workdir, settings)
            nemesis = Nemesis(mf, clients, rng, settings, say, hooks(mf))
            try:
                nemesis.new_events()
                try:
                    nemesis.run()
                except Stuck as exc:
                    summary["stuck"] = str(exc)
                    say(f"STUCK: {exc}")
                operations = clients.stop()
            except BaseException:
                clients.kill()
                raise
            say("reading back the ballast")
            check = mf.verify_acked(workdir / "ballast", [])
            nemesis.new_events()
            history = clients.histories()
            if keep is not None:   # the agents' logs go with the scenario
                assert mf.running.workdir is not None
                for log in mf.running.workdir.glob("*.log"):
                    shutil.copy(log, workdir / f"agent-{log.name}")
        say(f"checking {len(history)} operations for linearizability")
        checked = time.monotonic()
        verdict = linearizability.check(history)
        summary.update(_summary(nemesis, operations, check, history, verdict,
                                round(time.monotonic() - checked, 1)))
    summary["seconds"] = round(time.monotonic() - started, 1)
    return summary


def _summary(nemesis: Nemesis, operations: list[dict[str, Any]], ballast: dict[str, Any],
             history: list[linearizability.Op], verdict: linearizability.Result,
             check_s: float) -> dict[str, Any]:
    rounds = nemesis.rounds
    ops: Counter[str] = Counter()
    reasons: Counter[str] = Counter()
    for client in operations:
        ops.update(client["operations"])
        reasons.update(client["reasons"])
    hot = sum(op.key.startswith("/nemesis/hot/") for op in history)
    seconds = sorted(r.seconds for r in rounds) or [0.0]
    return {
        "rounds": len(rounds),
        "kills": sum(r.kills for r in rounds),
        "controller_kills": sum(r.controller_kills for r in rounds),
        "faults": dict(Counter(r.fault for r in rounds)),
        "acknowledged_writes": ops["write_ok"] + ballast["acked"],
        "operations": dict(ops),
        "failed_attempts": dict(reasons.most_common(12)),
        "lost": sum(r.lost for r in rounds) + ballast["missing"] + ballast["wrong"],
        "unreadable": sum(r.unreadable for r in rounds),
        "violations": [v for r in rounds for v in r.violations],
        "transient": sum(len(r.transient) for r in rounds),
        "stranded": sum(len(r.stranded) for r in rounds),
        "ballast": ballast,
        "linearizable": verdict.ok,
        "linearizability": verdict.explain(),
        "history": {"operations": len(history), "hot_operations": hot, "keys": verdict.keys,
                    "check_s": check_s},
        "round_s": {"median": seconds[len(seconds) // 2], "max": seconds[-1]},
        "settle_s_max": max((r.settle_s for r in rounds), default=0.0),
        "classes": fault_classes(rounds),
        "unavailable": nemesis.hooks.unavailable(),
        "events": dict(nemesis.events),
        "round_log": [asdict(r) for r in rounds],
    }


def fault_classes(rounds: list[Round]) -> dict[str, dict[str, Any]]:
    """Per kind of fault: rounds injected, fail-overs the controller made,
    rounds that ended under a new leader, how
    long the faults lasted, and seconds until every ID was served again
    (pauses, partitions, slow disks) or the victim was failed over and its
    blocks had their copies again (kills)."""
    out: dict[str, dict[str, Any]] = {}
    for fault in sorted({r.fault for r in rounds}, key=lambda f: (list(CLASS_OF).index(f), f)):
        mine = [r for r in rounds if r.fault == fault]
        served = sorted(r.served_s if CLASS_OF[fault] != "kill" else r.settle_s for r in mine)
        out[fault] = {"class": CLASS_OF[fault], "injected": len(mine),
                      "failovers": sum(r.failovers for r in mine),
                      "leader_changes": sum(r.new_leader for r in mine),
                      "fault_s": sorted({r.fault_s for r in mine}),
                      "served_s": {"median": served[len(served) // 2], "max": served[-1]}}
    return out


def failed(summary: dict[str, Any]) -> bool:
    """Anything lost or unreadable, a violation, a stranded server, a history that is not
    linearizable, or a stuck cluster."""
    return bool(summary["lost"] or summary["unreadable"] or summary["violations"] or summary["stranded"]
                or not summary["linearizable"] or "stuck" in summary)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--kills", type=int, default=20, help="stop after this many kill -9s of servers")
    p.add_argument("--pauses", type=int, default=0,
                   help="rounds of SIGSTOP/SIGCONT of an agent (primary, backup) or the leader controller "
                        "(and of etcd, with --controllers 2)")
    p.add_argument("--partitions", type=int, default=0,
                   help="rounds of management-network cuts (an agent from the controller, the "
                        "controller from every agent; with --controllers 2 also the leader, or the "
                        "standby, cut from etcd)")
    p.add_argument("--slow-disks", type=int, default=0,
                   help="rounds of a primary's disk writes throttled by the kernel (blkio)")
    p.add_argument("--leader-kills", type=int, default=0,
                   help="rounds of kill -9 of the leading controller while the clients run")
    p.add_argument("--controllers", type=int, default=1,
                   help="controllers (more than one: with etcd, and the faults of the leader and of etcd: "
                        "pauses of etcd, the leader or the standby cut from etcd)")
    p.add_argument("--seed", type=int, default=1, help="picks the faults and their victims")
    p.add_argument("--clients", type=int, default=4, help="client hosts running register clients (1-8)")
    p.add_argument("--store", choices=("leveldb", "redis"), default="leveldb")
    p.add_argument("--hot", type=int, default=Settings.hot, help="hot keys shared by every client")
    p.add_argument("--unique", type=int, default=Settings.unique, help="keys of each client alone")
    p.add_argument("--out", type=Path, help="also write the summary (JSON) here")
    p.add_argument("--mgmt-subnet", default=None, help=SUBNET_HELP)
    p.add_argument("--keep", type=Path, help="keep histories and logs in this (new) directory")
    p.add_argument("--liveness-datagrams", action="store_true",
                   help="agents beat by signed liveness datagram instead of HTTP (docs/liveness.md)")
    args = p.parse_args(argv)
    settings = Settings(kills=args.kills, pauses=args.pauses, partitions=args.partitions,
                        slow_disks=args.slow_disks, leader_kills=args.leader_kills,
                        controllers=args.controllers, seed=args.seed, clients=args.clients, store=args.store,
                        hot=args.hot, unique=args.unique, mgmt_subnet=args.mgmt_subnet,
                        liveness_datagrams=args.liveness_datagrams)
    summary = run(settings, lambda text: print(text, flush=True), args.keep)
    text = json.dumps({k: v for k, v in summary.items() if k != "round_log"}, indent=2)
    print(text)
    if args.out is not None:
        args.out.write_text(json.dumps(summary, indent=2) + "\n")
    return 1 if failed(summary) else 0


if __name__ == "__main__":
    sys.exit(main())
