"""A MetaFlow network in Mininet, up and down as one context manager.

    with Scenario(builders.fat_tree(4, servers=8), controller=("127.0.0.1", 6653),
                  rest_port=8080, start_controller=my_hook) as sc:
        sc.ns("p3e1h1").run("redis-cli", "-h", "100.93.7.41", "-p", "9000", "PING")

Bring-up, in order (each phase's seconds end up in `timings`):

1. ``mgmt``: the out-of-band management bridge in the root namespace
   (`mgmt.ManagementNetwork`), so the controller can bind its REST API to
   `mgmt.root_ip` before anything else starts.
2. ``controller``: the optional `start_controller(scenario)` hook; it may
   return a callable that stops what it started (called at teardown).
3. ``build``: Mininet with the builder graph's dpids, ports, IPs and MACs
   (`topos.GraphTopo`); OVS in the userspace datapath (this kernel has no
   openvswitch module), OpenFlow 1.0, `fail_mode` "secure" (only the
   controller forwards) or "standalone" (a learning switch, for tests
   without a controller); `autoSetMacs` off. Every host then gets checksum
   offload off on its data interface (without it TCP through the userspace
   datapath hangs), IPv6 off (no stray router solicitations for the
   controller to see), and its ``-mgmt`` interface.
4. ``switches``: the bridges start, each given the `operator_flows` (an
   operator's own entries, e.g. ``priority=0,actions=NORMAL`` for a fabric
   that forwards on its own: hybrid mode); with a controller, and unless
   `await_controller` is off (a controller started later), wait until
   every switch has connected to it.
5. ``routes``: each client routes the MetaDataID `space` via `gateway`, a
   virtual address in the hosts' subnet whose ARP only the controller
   answers (default 10.255.255.254, which the builders never hand out).
6. ``agents``: one ``metaflow-agent`` per storage host, inside the host
   (data-plane address = the host's, admin API on its management address
   port 9001 and the replication stream on port 9002 there, so copies of
   writes do not compete with clients on the data plane; service on
   0.0.0.0:9000, the agent's default rewrite (``local``), store under the
   scenario's temporary directory), all started at once, then awaited
   until /health answers over the management network from the root
   namespace, as the controller will call them.

Teardown (`close`, also on an exception in ``with``, Ctrl-C or SIGTERM)
undoes exactly that: agents get SIGTERM and must exit 0, the controller
hook's stopper runs, Mininet stops (links, bridges, host shells), the
management bridge and veths go, anything else named with the prefix is
swept away, and the temporary directory is deleted. `leaks()` lists what
is left with the prefix (nothing, after a clean teardown).
"""

from __future__ import annotations

import ipaddress
import logging
import os
import shutil
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import ExitStack, contextmanager
from functools import partial
from pathlib import Path
from types import TracebackType

import networkx as nx
from mininet.link import OVSLink
from mininet.net import Mininet
from mininet.node import Host, OVSSwitch, RemoteController

from client_lib.api.auth import write_secret
from client_lib.constants import (
    ADMIN_PORT,
    DEFAULT_GATEWAY,
    METAFLOW_PORT,
    OPENFLOW_PORT,
    REPLICATION_PORT,
)
from client_lib.mdid import DEFAULT_SPACE
from mininet_scenarios.daemons import AgentProcess
from mininet_scenarios.hostns import HostNamespace
from mininet_scenarios.interrupts import SignalsHeld, SigtermAsInterrupt
from mininet_scenarios.leaks import leaks, netns_inode, sweep, unique_prefix
from mininet_scenarios.mgmt import ManagementNetwork
from mininet_scenarios.syscmd import ofctl, vsctl
from mininet_scenarios.topos import HOST_NETWORK, GraphTopo, host_number, mininet_name
from nat_agent.rules import DEFAULT_MODE
from topology import builders

log = logging.getLogger("metaflow.scenario")

STORES = {"leveldb": "leveldb:{dir}", "redis": "redis-server:{dir}"}  # redis: the agent's own redis-server

# start_controller(scenario) -> a stopper, or None if nothing needs stopping
ControllerHook = Callable[["Scenario"], Callable[[], object] | None]


class TeardownError(RuntimeError):
    """Something could not be undone cleanly; the message lists every failed step."""


class Scenario:
    """Mininet + management network + agents for one builder graph.

    After ``__enter__``: `net` (the Mininet), `topo` (`GraphTopo`), `mgmt`
    (`ManagementNetwork`; the controller is reachable at `mgmt.root_ip`),
    `agents` (builder host name -> `AgentProcess`, storage hosts only),
    `mgmt_ips` (builder host name -> management address), `workdir`,
    `secret_file` (the cluster's secret, shared by the agents and the controller),
    `timings` (phase -> seconds; ``teardown`` after `close`). Nodes are
    addressed by their builder names throughout: `host`, `ns`.
    """

    def __init__(self, graph: nx.Graph, *, controller: tuple[str, int] | None = ("127.0.0.1", OPENFLOW_PORT),
                 fail_mode: str = "secure", start_controller: ControllerHook | None = None,
                 rest_port: int | None = None, store: str = "leveldb", rewrite: str = DEFAULT_MODE,
                 space: str = str(DEFAULT_SPACE), gateway: str = DEFAULT_GATEWAY,
                 mgmt_subnet: str | None = None, prefix: str | None = None,
                 agent_args: Sequence[str] = (), connect_timeout: float = 30.0,
                 agent_timeout: float = 30.0, operator_flows: Sequence[str] = (),
                 await_controller: bool = True, standby_controllers: Sequence[tuple[str, int]] = (),
                 rest_urls: Sequence[str] = (), agents_at_start: bool = True,
                 builder_names: bool = False, secret_file: Path | None = None) -> None:
        """`controller` is the OpenFlow controller's address as seen from the
        root namespace (OVS runs there), None for no controller (then
        `fail_mode` must be "standalone"). `rest_port`: the controller's REST
        port on `mgmt.root_ip`; agents register there when given.
        `agent_args` are appended to every agent's command line.
        `operator_flows` (``ovs-ofctl add-flow`` syntax) are added to every
        bridge as soon as it exists, before a controller that is not running
        yet can connect (`await_controller` False: nothing waits for it).
        `standby_controllers`: more OpenFlow targets of every bridge (several
        controllers, one leader: issue 25); `rest_urls`: every controller's
        REST URL, for the agents' --controller (default: the one at `rest_port`).
        `agents_at_start` off: no agent starts at bring-up (`start_agents`
        starts them, e.g. once controllers started after the management
        network, and told `rest_urls`, are running). `builder_names`: agents
        register under their builder host names (``p0e0h3``) instead of their
        Mininet names, as the hosts of an emulated fabric around them do.
        `secret_file`: the cluster's secret, shared with controllers made
        elsewhere (default: a new one in the scenario's directory)."""
        if fail_mode not in ("secure", "standalone"):
            raise ValueError(f"fail_mode must be 'secure' or 'standalone', got {fail_mode!r}")
        if controller is None and fail_mode == "secure" and not operator_flows:
            raise ValueError("without a controller, switches in fail_mode 'secure' forward nothing")
        if store not in STORES:
            raise ValueError(f"store must be one of {sorted(STORES)}, got {store!r}")
        if ipaddress.IPv4Address(gateway) not in HOST_NETWORK:
            raise ValueError(f"gateway {gateway} is not in the hosts' subnet {HOST_NETWORK}")
        if gateway in {graph.nodes[h]["ip"] for h in builders.hosts(graph)}:
            raise ValueError(f"gateway {gateway} is a host's address")
        self.graph = graph
        self.prefix = prefix or unique_prefix()
        self.topo = GraphTopo(graph, prefix=self.prefix)
        self.mgmt = ManagementNetwork(self.prefix, mgmt_subnet)
        self.controller = controller
        self.standby_controllers = tuple(standby_controllers)
        self.rest_urls = tuple(rest_urls)
        self.fail_mode = fail_mode
        self.start_controller = start_controller
        self.rest_port = rest_port
        self.store = store
        self.rewrite = rewrite
        self.space = space
        self.gateway = gateway
        self.agent_args = tuple(agent_args)
        self.connect_timeout = connect_timeout
        self.agent_timeout = agent_timeout
        self.operator_flows = tuple(operator_flows)
        self.await_controller = await_controller
        self.agents_at_start = agents_at_start
        self.builder_names = builder_names
        self.net: Mininet | None = None
        self.workdir: Path | None = None
        self.secret_file: Path | None = secret_file
        self.agents: dict[str, AgentProcess] = {}
        self.mgmt_ips: dict[str, str] = {}
        self.netns_inodes: list[int] = []
        self.timings: dict[str, float] = {}
        self._stop_controller: Callable[[], object] | None = None
        self._signals = ExitStack()
        self._closed = False

    # -- addressing nodes by their builder names -------------------------------------

    def host(self, node: str) -> Host:
        """The Mininet host for builder host `node`."""
        if self.net is None:
            raise RuntimeError(f"scenario {self.prefix} has no network: bring it up with `with`")
        return self.net[self.topo.names[node]]

    def ns(self, node: str) -> HostNamespace:
        """Run commands inside builder host `node` (with exit codes, unlike ``host.cmd``)."""
        host = self.host(node)
        return HostNamespace(host.name, host.pid)

    def leaks(self) -> dict[str, list[str]]:
        """Everything still there with this scenario's prefix, by kind (see `leaks.leaks`)."""
        return leaks(self.prefix, self.netns_inodes)

    # -- bring-up --------------------------------------------------------------------

    def __enter__(self) -> Scenario:
        self._signals.enter_context(SigtermAsInterrupt())
        try:
            self._bring_up()
        except BaseException as exc:
            self._teardown(exc)
            raise
        return self

    def _bring_up(self) -> None:
        _preflight()
        workdir = self.workdir = Path(tempfile.mkdtemp(prefix=f"{self.prefix}-"))
        if self.secret_file is None:
            self.secret_file = write_secret(workdir / "cluster.secret")
        with self._timed("mgmt"):
            self.mgmt.up()
        if self.start_controller is not None:
            with self._timed("controller"):
                self._stop_controller = self.start_controller(self)
        with self._timed("build"):
            net = self._build()
        with self._timed("switches"):
            net.start()
            for switch in net.switches:
                for flow in self.operator_flows:
                    ofctl("add-flow", switch.name, flow)
            if self.controller is not None and self.await_controller \
                    and not net.waitConnected(self.connect_timeout):
                stray = [s.name for s in net.switches if not s.connected()]
                raise RuntimeError(f"switches {stray} did not connect to the controller at "
                                   f"{self.controller[0]}:{self.controller[1]} in {self.connect_timeout} s")
        with self._timed("routes"):
            for node in builders.client_hosts(self.graph):
                self.ns(node).run("ip", "route", "add", self.space, "via", self.gateway,
                                  "dev", self.host(node).defaultIntf().name)
        if self.agents_at_start:
            self.start_agents()

    def _build(self) -> Mininet:
        switch = partial(OVSSwitch, datapath="user", protocols="OpenFlow10", failMode=self.fail_mode)
        net = self.net = Mininet(topo=self.topo, switch=switch, host=Host, link=OVSLink, controller=None,
                                 build=False, autoSetMacs=False, autoStaticArp=False, cleanup=False)
        if self.controller is not None:
            for i, (ip, port) in enumerate([self.controller, *self.standby_controllers]):
                net.addController(f"{self.prefix}c{i or ''}", controller=RemoteController, ip=ip, port=port)
        net.build()
        for node in builders.hosts(self.graph):
            self._set_up_host(node)
        return net

    def _set_up_host(self, node: str) -> None:
        """Checksum offload and IPv6 off on a host's data interface, and its
        ``-mgmt`` interface."""
        host, ns = self.host(node), self.ns(node)
        self.netns_inodes.append(netns_inode(host.pid))
        ns.run("ethtool", "-K", host.defaultIntf().name, "tx", "off")
        ns.run("sysctl", "-q", "-w", "net.ipv6.conf.all.disable_ipv6=1",
               "net.ipv6.conf.default.disable_ipv6=1")
        self.mgmt_ips[node] = self.mgmt.attach(ns, host_number(self.graph, node))

    def start_agents(self, nodes: Sequence[str] | None = None) -> None:
        """One agent per storage host (of `nodes`, default all), awaited until
        /health answers; timed as the ``agents`` phase."""
        if self.net is None or self.workdir is None or self.secret_file is None:
            raise RuntimeError(f"scenario {self.prefix} is not running")
        with self._timed("agents"):
            self._start_agents(self.workdir, self.secret_file, nodes)

    def _start_agents(self, workdir: Path, secret_file: Path,
                      nodes: Sequence[str] | None = None) -> None:
        urls = self.rest_urls or ([f"http://{self.mgmt.root_ip}:{self.rest_port}"] if self.rest_port else [])
        controller = ["--controller", ",".join(urls)] if urls else []
        started = []
        for node in builders.storage_hosts(self.graph) if nodes is None else nodes:
            name = self.topo.names[node]
            store = STORES[self.store].format(dir=workdir / name)
            self.agents[node] = AgentProcess(
                store, "--data-ip", self.graph.nodes[node]["ip"], "--space", self.space, *controller,
                *self.agent_args, name=node if self.builder_names else name, rewrite=self.rewrite,
                host="0.0.0.0", port=METAFLOW_PORT,
                admin_host=self.mgmt_ips[node], admin_port=ADMIN_PORT, replication_port=REPLICATION_PORT,
                netns=self.ns(node),
                admin_from_here=True, log_path=workdir / f"{name}.log", secret_file=secret_file)
            self.agents[node].launch()
            started.append(self.agents[node])
        deadline = time.monotonic() + self.agent_timeout
        for agent in started:
            agent.wait_ready(max(deadline - time.monotonic(), 0.1))

    # -- growing the running network ---------------------------------------------------

    def add_rack(self, grown: nx.Graph, switch: str) -> list[str]:
        """Plug builder switch `switch` of `grown` (this scenario's graph plus
        that switch, its links and its hosts) into the running network: the
        bridge starts connected to the controller, its links to the running
        switches come up (OVS patch ports, as at bring-up), its hosts are set
        up like the others and their agents started. Returns the storage
        hosts."""
        net = self.net
        if net is None or self.workdir is None or self.secret_file is None:
            raise RuntimeError(f"scenario {self.prefix} is not running")
        hosts = [h for h in grown.adj[switch] if grown.nodes[h]["kind"] == "host"]
        self.graph = grown
        for node in (switch, *hosts):
            name = mininet_name(grown, node, self.prefix)
            self.topo.names[node], self.topo.graph_names[name] = name, node
        bridge = net.addSwitch(self.topo.names[switch], dpid=f"{grown.nodes[switch]['dpid']:016x}")
        for host in hosts:
            data = grown.nodes[host]
            net.addHost(self.topo.names[host], ip=f"{data['ip']}/{HOST_NETWORK.prefixlen}", mac=data["mac"])
        for neighbour in grown.adj[switch]:
            ports = grown.edges[switch, neighbour]["ports"]
            link = net.addLink(self.topo.names[neighbour], bridge, port1=ports[neighbour],
                               port2=ports[switch])
            other = net[self.topo.names[neighbour]]
            if isinstance(other, OVSSwitch):   # a running bridge takes its end of the patch link
                other.vsctl(f"add-port {other} {link.intf1}" + other.intfOpts(link.intf1))
        bridge.start(net.controllers)
        for host in hosts:
            net[self.topo.names[host]].configDefault()
            self._set_up_host(host)
        storage = [h for h in hosts if grown.nodes[h]["role"] == "storage"]
        self._start_agents(self.workdir, self.secret_file, storage)
        return storage

    # -- teardown --------------------------------------------------------------------

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self._teardown(exc)

    def close(self) -> None:
        """Tear everything down (idempotent); raises TeardownError if a step failed."""
        self._teardown(None)

    def _teardown(self, in_flight: BaseException | None) -> None:
        """Run every step even if one fails; report failures by raising, or by
        logging them when an exception (`in_flight`) is already propagating."""
        if self._closed:
            return
        self._closed = True
        failures: list[str] = []
        with SignalsHeld() as held, self._timed("teardown"):
            # The controller first: one that outlives the agents takes their
            # going for failures and keeps re-assigning and re-syncing blocks
            # to agents that are shutting down.
            steps: list[tuple[str, Callable[[], object]]] = []
            if self._stop_controller is not None:
                steps.append(("stop controller", self._stop_controller))
            steps.append(("stop agents", lambda: self._stop_agents(failures)))
            if self.net is not None:
                steps.append(("stop Mininet", partial(stop_mininet, self.net)))
            steps += [("remove management network", self.mgmt.close),
                      ("sweep", self._sweep)]
            if self.workdir is not None:
                steps.append(("remove workdir", partial(shutil.rmtree, self.workdir, ignore_errors=True)))
            for what, step in steps:
                try:
                    step()
                except Exception as exc:  # keep going: the other steps still free their part
                    failures.append(f"{what}: {type(exc).__name__}: {exc}")
        self._signals.close()
        if in_flight is not None:
            for failure in failures:
                log.error("teardown of %s after %r: %s", self.prefix, in_flight, failure)
        elif failures:
            raise TeardownError("; ".join(failures))
        elif held.received:
            raise KeyboardInterrupt(f"signal {held.received[0]} during teardown")

    def _stop_agents(self, failures: list[str]) -> None:
        """SIGTERM to all at once, then wait for each: a clean exit is 0."""
        for agent in self.agents.values():
            agent.terminate()
        for node, agent in self.agents.items():
            code: int | str
            try:
                code = agent.stop()
            except subprocess.TimeoutExpired:
                code = "timeout (killed)"
            if code != 0:
                failures.append(f"agent {agent.name} ({node}) exited with {code}: {agent.log()[-1000:]}")

    def _sweep(self) -> None:
        removed = sweep(self.prefix)
        if removed:
            log.warning("teardown of %s: swept leftovers %s", self.prefix, removed)

    @contextmanager
    def _timed(self, phase: str) -> Iterator[None]:
        start = time.monotonic()
        try:
            yield
        finally:
            self.timings[phase] = round(time.monotonic() - start, 3)


def stop_mininet(net: Mininet) -> None:
    """`Mininet.stop`, then every node's shell by its PID, whatever `stop` did.

    The RemoteController node's `stop` is a no-op, so Mininet would leave
    its bash running; and after an interrupt in the middle of a node's
    ``cmd`` that node's shell refuses further commands, so `stop` fails
    halfway. `terminate` only signals (idempotent); `sweep` then removes
    bridges and links `stop` did not get to.
    """
    try:
        net.stop()
    finally:
        for node in (*net.hosts, *net.switches, *net.controllers):
            node.terminate()


def _preflight() -> None:
    """Fail with a hint before Mininet does (its OVS check calls exit())."""
    if os.geteuid() != 0:
        raise PermissionError("Mininet needs root")
    if shutil.which("mnexec") is None:
        raise FileNotFoundError("mnexec not found: install Debian's mininet package (make setup)")
    try:
        vsctl("show")
    except RuntimeError as exc:
        raise RuntimeError(f"Open vSwitch is not answering ({exc}); start it with "
                           "/usr/share/openvswitch/scripts/ovs-ctl start --system-id=random") from None
