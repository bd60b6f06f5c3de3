"""MetaFlow for real: controller + Mininet scenario + agents, ready for clients.

`MetaFlowNet` starts `metaflow-controller` through the scenario's hook
(OpenFlow on loopback, REST on the management bridge), brings the scenario
up, has every host announce itself with one ARP (hosts are otherwise
silent, and the controller learns attachments from ARP packet-ins), and
waits until the controller has built the B-tree and programmed the switches.

In hybrid mode (`mode="hybrid"`) only the clients announce themselves (they
ARP for the gateway, as they must before any request); the controller finds
the storage servers with its own ARP probes. With `controller_later`, the
fabric comes up without a controller (forwarding on its `operator_flows`,
e.g. ``priority=0,actions=NORMAL``) and `start_controller` starts it.

    with MetaFlowNet(builders.fat_tree(4, servers=8), capacity=2000) as mf:
        mf.api.call(REST.tree)   # the controller's REST API, signed with the cluster's secret
        mf.flow_counts()         # MetaFlow entries per switch, read from OVS itself

With `controllers=2` (or more) it runs several controllers and one etcd
(`mininet_scenarios.etcd`): every bridge has every controller as a target,
every agent every controller's URL, and `view` reads the leader's.
"""

from __future__ import annotations

import argparse
import json
import re
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any, TypedDict, TypeVar

import networkx as nx

from btree.fake_network import FakeNetwork
from btree.flows import Table
from client_lib.api.admin import ADMIN
from client_lib.api.auth import load_secret
from client_lib.api.clients import ApiClient
from client_lib.api.rest import REST
from client_lib.api.route import Route
from client_lib.cidr import Block
from client_lib.constants import COOKIE_METAFLOW, DEFAULT_REPLICAS
from client_lib.errors import ApiError, MetaFlowError
from client_lib.mdid import DEFAULT_SPACE
from mininet_scenarios import ofdump
from mininet_scenarios.daemons import AgentProcess
from mininet_scenarios.etcd import EtcdProcess
from mininet_scenarios.mgmt import SUBNET_HELP
from mininet_scenarios.scenario import Scenario
from mininet_scenarios.syscmd import appctl
from nat_agent.ports import listen_port
from topology import builders
from topology.classify import discovered_graph, map_topology

ROOT = Path(__file__).resolve().parents[1]
BUILD_TIMEOUT_S = 60.0
PER_AGENT_S = 0.5
"""What one more agent adds to the bring-up's timeouts (measured: docs/testbed.md)."""

Resp = TypeVar("Resp")


class FlowCounts(TypedDict):
    """One switch's entries as OVS reports them (see `MetaFlowNet.flow_counts`)."""

    metaflow: int
    uprules: int
    routes: int
    layer: str | None


class ControllerProcess:
    """`metaflow-controller` as a subprocess, stopped with SIGTERM (or killed)."""

    def __init__(self, of_port: int, rest_host: str, rest_port: int, secret_file: Path, log_path: Path,
                 extra: Sequence[str] = ()) -> None:
        self.argv = [sys.executable, "-m", "controller.launcher", "--of-host", "127.0.0.1",
                     "--of-port", str(of_port), "--rest-host", rest_host, "--rest-port", str(rest_port),
                     "--secret-file", str(secret_file), *extra]
        self.log_path = log_path
        self.proc: subprocess.Popen | None = None

    def start(self) -> ControllerProcess:
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(self.argv, cwd=ROOT, stdout=log, stderr=log)
        return self

    def kill(self) -> None:
        """SIGKILL: a controller dying mid-operation, with no chance to clean up."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()

    def stop(self, timeout: float = 15.0) -> int:
        if self.proc is None or self.proc.poll() is not None:
            return self.proc.returncode if self.proc else 0
        self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            return self.proc.wait()


def add_fabric_arguments(p: argparse.ArgumentParser) -> None:
    """The flags of a command that brings up a `MetaFlowNet` on a named fabric
    (`make demo`, `metaflowctl bench`): --topology, --heartbeat, --mgmt-subnet.
    A bad topology is refused by the parser."""
    def topology(spec: str) -> str:
        try:
            builders.named(spec)
        except ValueError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None
        return spec

    p.add_argument("--topology", type=topology, default=builders.DEFAULT_TOPOLOGY,
                   help="the fabric, by name: testbed (the paper's 200 servers; testbed:servers_per_edge=N "
                        "for fewer), fat-tree:8, three-tier:core=2,edges=4, ...; one whose hosts are all "
                        "storage servers gets a switch of client hosts under the core")
    p.add_argument("--heartbeat", type=float, nargs=2, metavar=("PERIOD", "TIMEOUT"), default=None,
                   help="the agents' --heartbeat and the controller's --heartbeat-timeout (default theirs; "
                        "a large fabric on a loaded machine needs longer ones: docs/testbed.md)")
    p.add_argument("--mgmt-subnet", default=None, help=SUBNET_HELP)


class MetaFlowNet:
    def __init__(self, graph: nx.Graph, *, capacity: int | None = None, store: str = "leveldb",
                 replicas: int = DEFAULT_REPLICAS, controller_args: Sequence[str] = (),
                 agent_args: Sequence[str] = (), build_timeout: float | None = None,
                 workdir: Path | None = None, mgmt_subnet: str | None = None,
                 silent_clients: bool = False, mode: str = "full", operator_flows: Sequence[str] = (),
                 controller_later: bool = False, controllers: int = 1, lease_ttl: int = 1,
                 heartbeat: Sequence[float] | None = None, space: str = str(DEFAULT_SPACE)) -> None:
        """`mgmt_subnet`: the management network's; another one lets this
        network run beside another scenario on the same machine.
        `silent_clients`: clients are not announced, so their first packet
        is also the controller's first word of them (a test of that path).
        `mode`: the controller's --mode. `operator_flows`: see `Scenario`.
        `controller_later`: bring the fabric up without a controller.
        `controllers`: how many run (more than one: with etcd, one leads).
        `build_timeout`: seconds for discovery and the B-tree, and the agents
        get as long to answer /health; by default 60 s plus `PER_AGENT_S` per
        storage server: every agent starts at once on the machine's few cores
        and the controller locates and registers each one. `heartbeat`: the
        agents' --heartbeat and the controller's --heartbeat-timeout (default
        theirs); a large fabric on a loaded machine needs longer ones
        (docs/testbed.md). `space`: the MetaDataIDs this fabric serves (a
        site's prefix, when several sites share the space)."""
        if controllers < 1:
            raise ValueError(f"at least one controller, not {controllers}")
        self.graph = graph
        self.mode = mode
        self.operator_flows = tuple(operator_flows)
        self.controller_later = controller_later
        self.silent_clients = silent_clients
        self.capacity = capacity
        self.replicas = replicas
        beat, dead = (["--heartbeat", str(heartbeat[0])], ["--heartbeat-timeout", str(heartbeat[1])]) \
            if heartbeat else ([], [])
        self.agent_args = [*agent_args, *beat]
        self.store = store
        self.controller_args = [*controller_args, *dead]
        servers = sum(1 for _, d in graph.nodes(data=True) if d.get("role") == "storage")
        self.build_timeout = build_timeout or BUILD_TIMEOUT_S + PER_AGENT_S * servers
        self.mgmt_subnet = mgmt_subnet
        self.of_ports = [listen_port() for _ in range(controllers)]
        self.rest_ports = [listen_port() for _ in range(controllers)]
        self.of_port, self.rest_port = self.of_ports[0], self.rest_ports[0]
        self.lease_ttl = lease_ttl
        self.space = space
        self.logdir = workdir or Path("/tmp")
        self.controller: ControllerProcess | None = None
        self.controllers: list[ControllerProcess] = []
        self.apis: list[ApiClient] = []
        self.etcd: EtcdProcess | None = None
        self.scenario: Scenario | None = None
        self.api: ApiClient | None = None
        self.timings: dict[str, float] = {}

    # -- bring-up -------------------------------------------------------------

    def _start_controller(self, scenario: Scenario):
        if len(self.rest_ports) > 1:
            # The agents, started after this hook, register with whichever
            # leads. Known only now: the management network's address is
            # chosen when it comes up, just before this hook.
            scenario.rest_urls = tuple(self.urls())
        if not self.controller_later:
            self._launch(scenario)
        return self._stop_controllers

    def _stop_controllers(self) -> None:
        """Whichever controllers run at teardown, then etcd."""
        for controller in self.controllers or ([self.controller] if self.controller else []):
            controller.stop()
        if self.etcd is not None:
            self.etcd.stop()

    def _launch(self, scenario: Scenario) -> None:
        extra = [*self.controller_args, "--gateway", scenario.gateway, "--space", scenario.space,
                 "--replicas", str(self.replicas), "--mode", self.mode]
        if self.capacity:
            extra += ["--capacity", str(self.capacity)]
        assert scenario.secret_file is not None
        if len(self.rest_ports) > 1:
            self._start_controllers(scenario, extra)
            return
        self.controller = ControllerProcess(self.of_port, scenario.mgmt.root_ip, self.rest_port,
                                            scenario.secret_file,
                                            self.logdir / f"controller-{self.rest_port}.log", extra).start()
        self.api = ApiClient(f"http://{scenario.mgmt.root_ip}:{self.rest_port}",
                             load_secret(scenario.secret_file), timeout=120)

    def _start_controllers(self, scenario: Scenario, extra: list[str]) -> None:
        """etcd, then every controller on it (`controllers` > 1), each on an
        etcd client port of its own (`EtcdProcess.extra_clients`)."""
        assert scenario.secret_file is not None
        self.etcd = EtcdProcess(self.logdir / f"etcd-{self.rest_port}",
                                extra_clients=len(self.of_ports) - 1).start()
        secret = load_secret(scenario.secret_file)
        for of_port, url, etcd_url in zip(self.of_ports, self.urls(), self.etcd.urls, strict=True):
            rest_port = int(url.rsplit(":", 1)[1])
            argv = [*extra, "--etcd", etcd_url, "--lease-ttl", str(self.lease_ttl),
                    "--advertise-url", url]
            log_path = self.logdir / f"controller-{rest_port}.log"
            self.controllers.append(ControllerProcess(of_port, scenario.mgmt.root_ip, rest_port,
                                                      scenario.secret_file, log_path, argv).start())
            self.apis.append(ApiClient(url, secret, timeout=120))
        self.controller, self.api = self.controllers[0], self.apis[0]

    def urls(self) -> list[str]:
        """Every controller's REST URL on the management network."""
        return [f"http://{self.running.mgmt.root_ip}:{port}" for port in self.rest_ports]

    def leader(self, timeout: float = 30.0) -> int:
        """The index of the controller that leads (waits until one does)."""
        deadline = time.monotonic() + timeout
        while True:
            for i, api in enumerate(self.apis):
                proc = self.controllers[i].proc
                try:
                    alive = proc is not None and proc.poll() is None
                    if alive and api.call(REST.leadership).state == "leader":
                        return i
                except (MetaFlowError, OSError):
                    continue
            if time.monotonic() > deadline:
                raise TimeoutError(f"no controller leads within {timeout} s")
            time.sleep(0.05)

    def __enter__(self) -> MetaFlowNet:
        started = time.monotonic()
        self.scenario = Scenario(self.graph, controller=("127.0.0.1", self.of_port),
                                 rest_port=self.rest_port, store=self.store,
                                 start_controller=self._start_controller, agent_args=self.agent_args,
                                 mgmt_subnet=self.mgmt_subnet, operator_flows=self.operator_flows,
                                 await_controller=not self.controller_later,
                                 standby_controllers=[("127.0.0.1", p) for p in self.of_ports[1:]],
                                 agent_timeout=self.build_timeout, space=self.space)
        self.scenario.__enter__()
        try:
            self.timings["scenario_up_s"] = round(time.monotonic() - started, 2)
            if not self.controller_later:
                self._until_built(started)
        except BaseException:
            self.scenario.__exit__(*sys.exc_info())
            raise
        return self

    def _until_built(self, started: float) -> None:
        self.announce()
        self.wait_built(every_host=True)
        self.timings["network_built_s"] = round(time.monotonic() - started, 2)

    def start_controller(self) -> float:
        """With `controller_later`: start the controller on the running fabric
        and wait until every switch has connected and the network is built;
        returns the seconds that took."""
        started = time.monotonic()
        scenario = self.running
        if self.controller is not None:
            raise RuntimeError("the controller is already running")
        self._launch(scenario)
        assert scenario.net is not None
        if not scenario.net.waitConnected(scenario.connect_timeout):
            raise RuntimeError("the switches did not connect to the controller started later")
        self._until_built(started)
        return time.monotonic() - started

    def __exit__(self, *exc) -> None:
        if self.scenario is not None:
            self.scenario.__exit__(*exc)

    @property
    def running(self) -> Scenario:
        """The scenario, once `with` has brought it up."""
        if self.scenario is None:
            raise RuntimeError("the MetaFlow network is not running")
        return self.scenario

    def announced(self) -> list[str]:
        """The hosts `announce` speaks for (in hybrid mode not the storage
        servers: the controller's probes find them)."""
        storage = [] if self.mode == "hybrid" else self.hosts("storage")
        return storage if self.silent_clients else storage + self.hosts("client")

    def announce(self) -> None:
        """One ARP per host: forget the gateway's address and ping it (the
        controller answers). Real hosts re-ARP on their own within a minute;
        emulated ones are otherwise silent."""
        scenario = self.running
        for node in self.announced():
            scenario.host(node).cmd(f"ip neigh del {scenario.gateway} dev "
                                    f"{scenario.host(node).defaultIntf()} 2>/dev/null; "
                                    f"ping -c1 -W1 {scenario.gateway} >/dev/null 2>&1 &")

    def restart_controller(self, kill: bool = False) -> float:
        """Stop (or SIGKILL) the controller and start a new one on the same
        ports; returns seconds until the new one has rebuilt the network from
        the switches and the agents."""
        started = time.monotonic()
        old, scenario = self.controller, self.running
        if old is None:
            raise RuntimeError("no controller to restart")
        assert scenario.secret_file is not None   # written before the controller first started
        if kill:
            old.kill()
        else:
            old.stop()
        self.controller = ControllerProcess(self.of_port, scenario.mgmt.root_ip, self.rest_port,
                                            scenario.secret_file, old.log_path,
                                            old.argv[old.argv.index("--secret-file") + 2:]).start()
        time.sleep(1.0)
        self.announce()
        self.wait_built()
        return time.monotonic() - started

    def kill_leader(self) -> int:
        """kill -9 of the leading controller (several controllers); its index."""
        lead = self.leader()
        self.controllers[lead].kill()
        return lead

    def revive_controller(self, index: int) -> None:
        """Start a killed controller again, same ports and flags (it joins as a standby)."""
        self.controllers[index].start()

    def standby(self, index: int, timeout: float = 60.0) -> None:
        """Until controller `index` is a standby that knows every switch, and
        every host and link the leader knows (published through etcd)."""
        leader = self.apis[self.leader()].call(REST.topology)
        want = {h.ip for h in leader.hosts}
        links = {frozenset([(a, pa), (b, pb)]) for a, pa, b, pb in leader.links}
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                api = self.apis[index]
                seen = api.call(REST.topology)
                if api.call(REST.leadership).state == "standby" and want <= {h.ip for h in seen.hosts} \
                        and len(seen.switches) == self.graph_switches() \
                        and links <= {frozenset([(a, pa), (b, pb)]) for a, pa, b, pb in seen.links}:
                    return
            except MetaFlowError:
                pass
            time.sleep(0.2)
        raise TimeoutError(f"controller {index} is no ready standby within {timeout} s")

    def graph_switches(self) -> int:
        return sum(1 for _, d in self.graph.nodes(data=True) if d.get("kind") == "switch")

    def kill_agent(self, server: str) -> AgentProcess:
        """kill -9 of storage server `server`'s agent (the controller's name
        for it), taken out of the scenario's hands (it would rightly complain
        at teardown that this agent did not exit cleanly); `revive_agent`
        brings it back."""
        agent = self.running.agents.pop(self.running.topo.graph_names[server])
        agent.kill()
        return agent

    def revive_agent(self, agent: AgentProcess, timeout: float = 30.0) -> None:
        """Start a killed agent again: same host, flags and store directory (a
        server rebooted after a crash); returns once its /health answers."""
        scenario = self.running
        agent.launch().wait_ready(timeout)
        scenario.agents[scenario.topo.graph_names[agent.name]] = agent

    def add_rack(self, grown: nx.Graph, switch: str) -> list[str]:
        """Plug a new edge switch with its servers into the running fabric
        (`Scenario.add_rack`: `grown` is this network's graph plus `switch`,
        its links and hosts) and have its hosts announce themselves; the
        controller's names of its storage servers."""
        scenario = self.running
        storage = scenario.add_rack(grown, switch)
        self.graph = grown
        self.announce()
        return [scenario.topo.names[node] for node in storage]

    def set_link(self, server: str, up: bool) -> None:
        """Take storage server `server`'s edge link down or bring it back up
        (both ends; the switch reports the port's state to the controller)."""
        scenario = self.running
        host = scenario.topo.graph_names[server]
        (edge,) = list(self.graph.neighbors(host))
        assert scenario.net is not None   # running
        scenario.net.configLinkStatus(server, scenario.topo.names[edge], "up" if up else "down")

    def wait_built(self, every_host: bool = False) -> None:
        """Until the tree is built, and with `every_host` (at bring-up) until
        every announced host is located too: the build needs only the
        servers, and a client whose ARP is still on its way is unreachable
        (the controller never floods). Not after a controller restart: a
        host cut off by then cannot be located. The storage servers are
        always among them (hybrid mode's probes find those not announced)."""
        scenario = self.running
        located = set(self.announced()) | set(self.hosts("storage"))
        want = {scenario.host(node).IP() for node in located} if every_host else set()
        deadline = time.monotonic() + self.build_timeout
        while time.monotonic() < deadline:
            try:
                if self.view(REST.tree).built and (
                        not want or want <= {h.ip for h in self.view(REST.topology).hosts}):
                    return
            except ApiError:
                pass
            time.sleep(0.5)
            if int(time.monotonic() * 2) % 6 == 0:
                self.announce()  # a host whose first ARP raced the switches' connection
        raise TimeoutError(f"controller did not build the network in {self.build_timeout} s; "
                           f"topology: {self.view(REST.topology)}")

    def wait_served(self, timeout: float = 60.0) -> None:
        """Until every live server's agent holds the blocks the controller
        gave it (`ADMIN.blocks`): the build only sends the roles, and a
        client that finds a server by itself (the benchmarks' hash mapping)
        is answered MOVED until they arrive, which on a large fabric is
        seconds after `wait_built`."""
        deadline = time.monotonic() + timeout
        while True:
            servers = self.view(REST.servers).servers
            behind = {}
            for node, agent in self.running.agents.items():
                want = set(servers[self.running.topo.names[node]].blocks)
                have = {b.block for b in agent.call(ADMIN.blocks).blocks}
                if not want <= have:
                    behind[agent.name] = sorted(map(str, want - have))
            if not behind:
                return
            if time.monotonic() > deadline:
                raise TimeoutError(f"agents without their blocks after {timeout} s: {behind}")
            time.sleep(0.5)

    # -- use ---------------------------------------------------------------------

    def hosts(self, role: str | None = None) -> list[str]:
        return [n for n, d in self.graph.nodes(data=True)
                if d.get("kind") == "host" and (role is None or d.get("role") == role)]

    def view(self, route: Route[None, Resp]) -> Resp:
        """One of the controller's REST views (`REST.tree`, `REST.servers`, ...); the leader's."""
        if len(self.apis) > 1:
            self.api = self.apis[self.leader()]
        assert self.api is not None
        return self.api.call(route)

    def events(self, kind: str | None = None) -> list[dict[str, Any]]:
        return [e for e in self.view(REST.events).events if kind is None or e["event"] == kind]

    def start_clients(self, files_each: int, workdir: Path, start: int = 0, read_back: bool = True,
                      concurrency: int = 8) -> list[subprocess.Popen]:
        """Every client host runs `mininet_scenarios.workload` on its own share
        of paths, appending acknowledged writes to `workdir/<client>.jsonl`."""
        procs = []
        scenario = self.running
        for node in self.hosts("client"):
            argv = [sys.executable, "-m", "mininet_scenarios.workload", "--client", node,
                    "--files", str(files_each), "--start", str(start), "--concurrency", str(concurrency),
                    "--acked", str(workdir / f"{node}.jsonl"), "--space", scenario.space]
            if not read_back:
                argv.append("--no-read-back")
            procs.append(subprocess.Popen(scenario.ns(node).command(*argv), cwd=ROOT,
                                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
        return procs

    def replicated(self) -> bool:
        """Every block a live server serves has a backup on another live server."""
        servers = self.view(REST.servers).servers
        backups = {b for s in servers.values() if not s.failed for b in s.backups}
        return all(b in backups for s in servers.values() if not s.failed for b in s.blocks)

    def wait_replicated(self, timeout: float) -> float | None:
        """Seconds until `replicated()` holds (None if not within `timeout`)."""
        started = time.monotonic()
        while time.monotonic() - started < timeout:
            if self.replicated():
                return time.monotonic() - started
            time.sleep(0.25)
        return None

    def start_probe(self, blocks: Sequence[Block], client: str | None = None) -> subprocess.Popen:
        """`mininet_scenarios.probe` on a client host, writing one key per
        block in a loop; returns once it is writing (see `finish_probe`)."""
        scenario = self.running
        argv = [sys.executable, "-m", "mininet_scenarios.probe", "--space", scenario.space,
                *[arg for b in blocks for arg in ("--block", str(b))]]
        proc = subprocess.Popen(scenario.ns(client or self.hosts("client")[0]).command(*argv), cwd=ROOT,
                                stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                text=True)
        assert proc.stdout is not None
        ready = proc.stdout.readline()
        if not ready.strip():
            raise RuntimeError(f"probe did not start: {proc.communicate(timeout=10)[1][-2000:]}")
        return proc

    @staticmethod
    def finish_probe(proc: subprocess.Popen, killed_at: float, timeout: float = 60) -> dict[str, Any]:
        """Tell the probe when the kill happened (`time.monotonic()`); its
        report: seconds to the first successful write per block."""
        stdout, stderr = proc.communicate(f"{killed_at!r}\n", timeout=timeout)
        if proc.returncode:
            raise RuntimeError(f"probe failed: {stderr[-2000:]}")
        return dict(json.loads(stdout.strip().splitlines()[-1]))

    @staticmethod
    def collect(procs: list[subprocess.Popen], timeout: float = 600) -> list[dict]:
        """The clients' JSON summaries; a client that failed raises with its stderr."""
        out = []
        for proc in procs:
            stdout, stderr = proc.communicate(timeout=timeout)
            if proc.returncode:
                raise RuntimeError(f"client failed: {stderr[-2000:]}")
            out.append(json.loads(stdout.strip().splitlines()[-1]))
        return out

    def run_clients(self, files_each: int, workdir: Path, start: int = 0,
                    read_back: bool = True) -> list[dict]:
        return self.collect(self.start_clients(files_each, workdir, start, read_back))

    def verify_acked(self, workdir: Path, lost: list[Block]) -> dict:
        """Read back, from one client host, every acknowledged write in
        `workdir/*.jsonl` except those whose ID lies in a `lost` block.
        Returns `mininet_scenarios.verify`'s counts plus `acked` and
        `lost_with_killed_server`."""
        acked: dict[str, dict] = {}
        for path in workdir.glob("*.jsonl"):
            for line in path.read_text().splitlines():
                record = json.loads(line)
                acked[record["path"]] = record
        gone = {p for p, r in acked.items() if any(b.contains(r["mdid"]) for b in lost)}
        check = workdir / "check.json"
        check.write_text(json.dumps({p: r["digest"] for p, r in acked.items() if p not in gone}))
        scenario = self.running
        out = scenario.ns(self.hosts("client")[0]).run(
            sys.executable, "-m", "mininet_scenarios.verify", str(check), "--space", scenario.space,
            cwd=ROOT, check=False, timeout=600)
        result = json.loads(out.stdout.strip().splitlines()[-1])
        result.update(acked=len(acked), lost_with_killed_server=len(gone))
        return result

    def dump_flows(self, switch: str) -> str:
        """What one OVS bridge really holds (`ovs-ofctl -O OpenFlow10 dump-flows`)."""
        return ofdump.dump(self.running.topo.names[switch])

    def metaflow_packets(self, switch: str, beyond: int | None = None, timeout: float = 15.0) -> int:
        """The packets that `switch`'s MetaFlow entries have carried; with
        `beyond`, once the count passes it (or as it stands after `timeout`).
        OVS credits most packets to an OpenFlow entry only when a revalidator
        thread next dumps the datapath flow that carried them (every half
        second, later on a loaded machine: a CI run read 57 right after the
        clients' 60 files, hundreds of packets), so each read first waits for
        one full revalidation round."""
        deadline = time.monotonic() + timeout
        while True:
            appctl("revalidator/wait")
            count = sum(int(n) for n in re.findall(rf"cookie={COOKIE_METAFLOW:#x},.*?n_packets=(\d+)",
                                                   self.dump_flows(switch)))
            if beyond is None or count > beyond or time.monotonic() > deadline:
                return count
            time.sleep(0.5)

    def real_network(self) -> tuple[FakeNetwork, dict[str, list[Block]], list[str]]:
        """A fake network of the entries the switches really hold, on the fabric
        as the controller sees it; with each storage server's blocks (from the
        controller) and the client host ids to send from."""
        topo = self.view(REST.topology)
        servers = self.view(REST.servers).servers
        storage = {s.data_ip: name for name, s in servers.items()}
        hosts = [(storage.get(h.ip, f"h{h.ip}"), h.dpid, h.port, h.mac, h.ip,
                  "storage" if h.ip in storage else "client") for h in topo.hosts]
        graph = discovered_graph([s.dpid for s in topo.switches], topo.links, hosts)
        _, _, fabric = map_topology(graph, Block.parse(self.running.space))
        blocks = {name: list(s.blocks) for name, s in servers.items()}
        clients = [h[0] for h in hosts if h[5] == "client"]
        return FakeNetwork(fabric, self.switch_tables()), blocks, clients

    def switch_tables(self) -> dict[int, Table]:
        """Every switch's MetaFlow entries as OVS holds them now, by dpid (no
        REST call: it reads the switches even while no controller runs)."""
        return {data["dpid"]: ofdump.parse_dump(self.dump_flows(node))
                for node, data in self.graph.nodes(data=True) if data.get("kind") == "switch"}

    def flow_counts(self) -> dict[str, FlowCounts]:
        """Per switch, as OVS reports them: MetaFlow prefix entries (priority
        >= 2000; one per prefix, not per protocol), up-rules, host routes."""
        out: dict[str, FlowCounts] = {}
        for node, data in self.graph.nodes(data=True):
            if data.get("kind") != "switch":
                continue
            text = self.dump_flows(node)
            table = ofdump.parse_dump(text)
            out[node] = {"metaflow": sum(not e.is_uprule for e in table.values()),
                         "uprules": sum(e.is_uprule for e in table.values()),
                         "routes": len(re.findall(r"priority=1000,", text)), "layer": data.get("layer")}
        return out
