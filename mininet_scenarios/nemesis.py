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
  target is killed while it copies, assigns or moves flows.

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
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from itertools import combinations
from pathlib import Path
from typing import Any

from client_lib.api.admin import ADMIN, Health
from client_lib.api.rest import REST, ServerInfo
from client_lib.cidr import Block
from client_lib.constants import DEFAULT_REPLICAS
from client_lib.errors import ApiError
from mininet_scenarios import linearizability
from mininet_scenarios.daemons import ROOT, AgentProcess
from mininet_scenarios.metaflow_net import MetaFlowNet
from mininet_scenarios.mgmt import DEFAULT_SUBNET
from topology import builders

FAULTS = ("kill-primary", "kill-backup", "link-down", "controller-during-failover", "kill-during-split")
"""Every kind of round; each cycle of the schedule has all of them, in a random order."""
_CYCLE = (*FAULTS, "kill-primary", "kill-backup")
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
    seconds: float = 0.0
    checked: int = 0
    lost: int = 0
    unreadable: int = 0
    violations: list[str] = field(default_factory=list)
    transient: list[str] = field(default_factory=list)
    stranded: list[str] = field(default_factory=list)
    """Servers that came back and were not taken back into service (`Nemesis._rejoin`)."""


@dataclass
class Settings:
    kills: int = 20
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
    mgmt_subnet: str = DEFAULT_SUBNET
    """Another one runs the nemesis beside another scenario."""


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
                 say: Callable[[str], None]) -> None:
        self.mf = mf
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

    def schedule(self) -> Iterator[str]:
        while True:
            cycle = list(_CYCLE)
            self.rng.shuffle(cycle)
            yield from cycle

    def run(self) -> None:
        kills = 0
        for fault in self.schedule():
            if kills >= self.settings.kills:
                return
            started = time.monotonic()
            report = getattr(self, "_" + fault.replace("-", "_"))(Round(len(self.rounds) + 1, fault, ""))
            self.rounds.append(report)
            try:
                self.check(report)
            finally:
                report.seconds = round(time.monotonic() - started, 2)
            kills += report.kills
            self.say(f"round {report.number:3d} [{kills}/{self.settings.kills} kills] {report.fault:27s} "
                     f"{report.victim:10s} {report.detail}; settled {report.settle_s:.1f} s, back "
                     f"{report.rejoin_s:.1f} s; read back {report.checked} keys: {report.lost} lost, "
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
        controller = self.mf.controller
        assert controller is not None
        with paused([agents[h] for h in heirs]):
            agent = self.mf.kill_agent(victim)
            self.mf.set_link(victim, up=False)
            report.kills += 1
            step = self._wait_for_step("failover", victim, ("fence",),
                                       lambda: bool(self.servers()[victim].failed), timeout=0.5)
            controller.kill()
        report.controller_kills += 1
        report.detail = (f"controller killed at the fail-over's {step} step" if step
                         else "controller killed, the fail-over not seen")
        self.mf.restart_controller(kill=True)
        self._recover(report, agent, relink=True)
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

    def _rejoin(self, report: Round, started: float | None = None) -> None:
        """Wait until the victim is back in service (empty, a leaf of the tree).

        A server that was dead while a new controller rebuilt the network is
        not in its tree, and registering does not put it there: it would
        stay out of service for good, and the run would run out of servers.
        That breaks the issue's contract (a server that comes back rejoins)
        and is counted (`stranded`); the way on is a restart of the
        controller (SIGTERM), whose rebuild takes it in."""
        started = time.monotonic() if started is None else started
        victim = report.victim
        for restarts in range(2):
            back = back_in_service(self.mf, victim, self.settings.rejoin_timeout)
            if back:
                report.rejoin_s = round(time.monotonic() - started, 2)
                return
            if back is None or restarts:
                break
            report.stranded.append(victim)
            self.mf.restart_controller()
            report.detail += "; controller restarted to take the server back"
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
        for attempt in range(attempts):
            problems = self.ownership()
            if not problems:
                return
            if attempt < attempts - 1:
                report.transient += problems
                time.sleep(1.0)
        report.violations += problems

    def ownership(self) -> list[str]:
        """Who serves what, from every live agent at once, against the controller's view."""
        agents = list(self.mf.running.agents.values())
        with ThreadPoolExecutor(max_workers=len(agents)) as pool:
            answers = list(pool.map(_health, agents))
        problems = [f"{agent.name}: /health failed: {answer}" for agent, answer in zip(agents, answers,
                                                                                          strict=True)
                    if not isinstance(answer, Health)]
        served = {h.name: serving(h) for h in answers if isinstance(h, Health)}
        routed = {n: list(s.blocks) for n, s in self.servers().items() if not s.failed}
        return problems + ownership_problems(served, routed, self.space)


@contextmanager
def paused(agents: list[AgentProcess]) -> Iterator[None]:
    """The agents stopped (SIGSTOP: alive, answering nothing) inside the block."""
    stopped = []
    try:
        for agent in agents:
            if agent.proc is not None and agent.proc.poll() is None:
                os.kill(agent.proc.pid, signal.SIGSTOP)
                stopped.append(agent.proc.pid)
        yield
    finally:
        for pid in stopped:
            os.kill(pid, signal.SIGCONT)


def _health(agent: AgentProcess) -> Health | str:
    try:
        return agent.call(ADMIN.health)
    except (ApiError, RuntimeError) as exc:
        return str(exc)


# -- the run --------------------------------------------------------------------------


def run(settings: Settings, say: Callable[[str], None] = print, keep: Path | None = None) -> dict[str, Any]:
    """The whole nemesis run; its summary (see `main`). `keep`: a directory
    for the histories and logs that outlives the run (else a temporary one)."""
    started = time.monotonic()
    rng = random.Random(settings.seed)
    summary: dict[str, Any] = {"settings": asdict(settings)}
    with tempfile.TemporaryDirectory(prefix="mfnemesis") as tmp:
        workdir = Path(keep or tmp)
        (workdir / "ballast").mkdir(parents=True)
        graph = builders.fat_tree(4, servers=8)
        with MetaFlowNet(graph, capacity=1_000_000, store=settings.store, replicas=settings.replicas,
                         workdir=workdir, controller_args=["--no-auto-split"],
                         mgmt_subnet=settings.mgmt_subnet) as mf:
            say(f"nemesis: k=4 fat-tree, 8 servers ({settings.store}, r={settings.replicas}), "
                f"{settings.clients} clients; network up in {mf.timings['network_built_s']} s")
            ballast = mf.run_clients(settings.ballast, workdir / "ballast", read_back=False)
            say(f"ballast: {sum(c['written'] for c in ballast)} files written by {len(ballast)} client hosts")
            clients = Clients(mf, mf.hosts("client")[:settings.clients], workdir, settings)
            nemesis = Nemesis(mf, clients, rng, settings, say)
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
        "events": dict(nemesis.events),
        "round_log": [asdict(r) for r in rounds],
    }


def failed(summary: dict[str, Any]) -> bool:
    """Anything lost or unreadable, a violation, a stranded server, a history that is not
    linearizable, or a stuck cluster."""
    return bool(summary["lost"] or summary["unreadable"] or summary["violations"] or summary["stranded"]
                or not summary["linearizable"] or "stuck" in summary)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--kills", type=int, default=20, help="stop after this many kill -9s of servers")
    p.add_argument("--seed", type=int, default=1, help="picks the faults and their victims")
    p.add_argument("--clients", type=int, default=4, help="client hosts running register clients (1-8)")
    p.add_argument("--store", choices=("leveldb", "redis"), default="leveldb")
    p.add_argument("--hot", type=int, default=Settings.hot, help="hot keys shared by every client")
    p.add_argument("--unique", type=int, default=Settings.unique, help="keys of each client alone")
    p.add_argument("--out", type=Path, help="also write the summary (JSON) here")
    p.add_argument("--mgmt-subnet", default=DEFAULT_SUBNET,
                   help="the management network (another one runs beside another scenario)")
    p.add_argument("--keep", type=Path, help="keep histories and logs in this (new) directory")
    args = p.parse_args(argv)
    settings = Settings(kills=args.kills, seed=args.seed, clients=args.clients, store=args.store,
                        hot=args.hot, unique=args.unique, mgmt_subnet=args.mgmt_subnet)
    summary = run(settings, lambda text: print(text, flush=True), args.keep)
    text = json.dumps({k: v for k, v in summary.items() if k != "round_log"}, indent=2)
    print(text)
    if args.out is not None:
        args.out.write_text(json.dumps(summary, indent=2) + "\n")
    return 1 if failed(summary) else 0


if __name__ == "__main__":
    sys.exit(main())
