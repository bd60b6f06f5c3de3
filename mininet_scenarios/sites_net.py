"""Several sites on this machine, for real (issue 29): network namespaces,
veth links, kernel routes by prefix, WAN links with their round trips
(`mininet_scenarios.delay_line`, ``tbf`` for the rate), a real
`metaflow-agent` per block in ``--rewrite local`` mode, and (if asked) each
site's propagation agent, all as `mininet_scenarios.sites_topo` plans them.
With ``fabric=True`` each site is instead a MetaFlow fabric in Mininet, with
its own switches, controller and agents (`mininet_scenarios.site_fabric`),
and its border one of the fabric's client hosts.

    with SitesNet(topo, workdir) as net:
        net.run_node("east", sys.executable, "-m", "benchmarks.sites_node", ...)
        net.cut("east", "west")      # the WAN link's carrier goes: routes withdrawn
        net.mend("east", "west")

Every name (namespaces, interfaces) starts with ``mfs`` and this process's
id, so concurrent runs never collide and a crashed run's leftovers can be
found; everything made is removed on exit, also when the body raises.
"""

from __future__ import annotations

import itertools
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from types import TracebackType

from client_lib.constants import METAFLOW_PORT, SITE_SYNC_PORT
from mininet_scenarios.daemons import ROOT, AgentProcess, SiteSyncProcess
from mininet_scenarios.delay_line import prepare
from mininet_scenarios.netns_pair import Namespace
from mininet_scenarios.site_fabric import SiteFabric, site_graph
from mininet_scenarios.sites_topo import SitesTopo, WanLink
from mininet_scenarios.syscmd import delete_link, ip

_counter = itertools.count()

REGISTRY_PORT = 6379
"""Where each site's registry listens, for the baseline (Redis's own port)."""
CLIENT_FAST_OPEN = 0x1 | 0x4
"""``net.ipv4.tcp_fastopen`` where the nodes run: send data in the SYN, even
without a cookie from that server (each MetaDataID is a server address never
seen before)."""
SERVER_FAST_OPEN = 0x2 | 0x200 | 0x400
"""...and where the agents run: accept data in a SYN without a cookie, on
every listener without a socket option."""


class SitesNet:
    """The sites of `topo`, their agents' stores and logs under `workdir`,
    and the layout file the nodes read (`layout_file`, each site's
    propagation agent on its border); `sync` also starts those agents."""

    def __init__(self, topo: SitesTopo, workdir: Path, *, sync: bool = False, registry: bool = False,
                 fast_open: bool = False, agent_extra: tuple[str, ...] = (), fabric: bool = False,
                 controllers: int = 1, replicas: int = 2) -> None:
        """`fast_open`: the kernels of borders and agents allow TCP Fast Open
        without cookies (`CLIENT_FAST_OPEN`, `SERVER_FAST_OPEN`), for clients
        that ask for it. `fabric`: each site a MetaFlow fabric of
        ``topo.agents`` servers with its own controller (`SiteFabric`),
        instead of agents behind the border's kernel routes, with
        `controllers` controllers each (more than one: a leader and standbys)
        and `replicas` copies of each block."""
        if fabric and fast_open:
            raise ValueError("fast_open needs the agents' kernels set before they listen: "
                             "not with fabric (the fabric starts its own agents)")
        if fabric and topo.agents < 2:
            raise ValueError("a site's fabric needs at least 2 agents")
        self.fabric, self.controllers, self.replicas = fabric, controllers, replicas
        self.fabrics: list[SiteFabric] = []
        self.topo, self.workdir, self.sync, self.registry = topo, workdir, sync, registry
        self.fast_open = fast_open
        self.agent_extra = agent_extra
        self.base = f"mfs{os.getpid():x}x{next(_counter):x}"
        if len(self.base) + 4 > 15:
            raise ValueError(f"interface names from {self.base!r} would exceed 15 characters")
        n = len(topo.sites)
        self.borders = [Namespace(f"{self.base}b{i:x}") for i in range(n)]
        self.agent_ns = [[Namespace(f"{self.base}a{i:x}{j}") for j in range(topo.agents)] for i in range(n)]
        self.wire = Namespace(f"{self.base}w")
        self.agents: list[list[AgentProcess]] = []
        self.syncs: list[SiteSyncProcess] = []
        self.lines: dict[tuple[int, int], subprocess.Popen[str]] = {}
        self.layout_file = workdir / "sites.toml"
        self.registry_file = workdir / "registries.json"
        self._made: list[Namespace] = []
        self._mgmt_links: list[str] = []

    # -- names -----------------------------------------------------------------

    def wan_if(self, i: int, far: int) -> str:
        """Border `i`'s end of its link to site `far`."""
        return f"{self.base}l{i:x}{far:x}"

    def wire_if(self, i: int, far: int) -> str:
        """The wire namespace's end facing border `i` on its link to `far`."""
        return f"{self.base}x{i:x}{far:x}"

    # -- life ------------------------------------------------------------------

    def __enter__(self) -> SitesNet:
        try:
            self._build()
            self._start()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()

    def _namespace(self, ns: Namespace) -> None:
        ip("netns", "add", ns.name)
        self._made.append(ns)
        ns.run("ip", "link", "set", "lo", "up")

    def _build(self) -> None:
        topo = self.topo
        self.workdir.mkdir(parents=True, exist_ok=True)
        self._namespace(self.wire)
        for i, border in enumerate(self.borders):
            if self.fabric:
                self._fabric_border(i)
            else:
                self._namespace(border)
            border.run("sysctl", "-qw", "net.ipv4.ip_forward=1", "net.ipv4.conf.all.rp_filter=0",
                       "net.ipv4.conf.default.rp_filter=0")
            border.run("ip", "addr", "add", f"{topo.border_address(i)}/32", "dev", "lo")
            if self.fast_open:
                border.run("sysctl", "-qw", f"net.ipv4.tcp_fastopen={CLIENT_FAST_OPEN | SERVER_FAST_OPEN}")
            border.run("ip", "route", "add", "unreachable", str(topo.layout.space), "metric", "4000")
            here, there = topo.mgmt_link(i)
            mgmt = f"{self.base}m{i:x}"
            ip("link", "add", mgmt, "type", "veth", "peer", "name", f"{mgmt}p", "netns", border.name)
            self._mgmt_links.append(mgmt)
            ip("addr", "add", f"{here}/30", "dev", mgmt)
            ip("link", "set", mgmt, "up")
            border.run("ip", "addr", "add", f"{there}/30", "dev", f"{mgmt}p")
            border.run("ip", "link", "set", f"{mgmt}p", "up")
            if not self.fabric:
                self._agents_behind(i)
        for link in topo.links:
            for i, far, address in ((link.a, link.b, link.address_a), (link.b, link.a, link.address_b)):
                border = self.borders[i]
                ip("link", "add", self.wan_if(i, far), "netns", border.name, "type", "veth",
                   "peer", "name", self.wire_if(i, far), "netns", self.wire.name)
                border.run("ip", "addr", "add", f"{address}/30", "dev", self.wan_if(i, far))
                border.run("ip", "link", "set", self.wan_if(i, far), "up")
                border.run("ethtool", "-K", self.wan_if(i, far), "tx", "off", "tso", "off", "gso", "off")
                prepare(self.wire_if(i, far), topo.rate_mbit, self.wire.command())
        for i in range(len(self.borders)):
            self._route_wan(i)

    def _agents_behind(self, i: int) -> None:
        """Site `i`'s agents in namespaces of their own behind its border,
        which routes each one's block to it."""
        topo, border = self.topo, self.borders[i]
        for j, (agent_ns, block) in enumerate(zip(self.agent_ns[i], topo.blocks(i), strict=True)):
            self._namespace(agent_ns)
            if self.fast_open:
                agent_ns.run("sysctl", "-qw", f"net.ipv4.tcp_fastopen={SERVER_FAST_OPEN}")
            near, beyond = topo.agent_link(i, j)
            inside, outside = f"{self.base}a{i:x}{j}", f"{self.base}r{i:x}{j}"
            ip("link", "add", outside, "netns", border.name, "type", "veth",
               "peer", "name", inside, "netns", agent_ns.name)
            border.run("ip", "addr", "add", f"{near}/24", "dev", outside)
            agent_ns.run("ip", "addr", "add", f"{beyond}/24", "dev", inside)
            for ns, intf in ((border, outside), (agent_ns, inside)):
                ns.run("ip", "link", "set", intf, "up")
                ns.run("ethtool", "-K", intf, "tx", "off")
            agent_ns.run("ip", "route", "add", "default", "via", near)
            border.run("ip", "route", "add", str(block), "via", beyond)

    def _fabric_border(self, i: int) -> None:
        """Site `i` as a MetaFlow fabric (`SiteFabric`), its border namespace
        the fabric's border host's, given this net's name for it (``ip netns
        attach``; deleting the name leaves the namespace to Mininet). What
        arrives over the WAN enters the fabric from the border's own address."""
        site = self.topo.sites[i]
        (self.workdir / site.name).mkdir(parents=True, exist_ok=True)
        fabric = SiteFabric(site_graph(self.topo.agents), site.prefix, self.workdir / site.name,
                            agent_args=self.agent_extra, controllers=self.controllers,
                            replicas=self.replicas)
        self.fabrics.append(fabric.__enter__())
        border = self.borders[i]
        ip("netns", "attach", border.name, str(fabric.border_ns.pid))
        self._made.append(border)
        border.run("iptables", "-t", "nat", "-A", "POSTROUTING", "-o", fabric.border_interface,
                   "-j", "MASQUERADE")

    def _route_wan(self, i: int, only: WanLink | None = None) -> None:
        for destination, hop, link in self.topo.wan_routes(i):
            if only is None or link == only:
                self.borders[i].run("ip", "route", "replace", destination, "via", hop)

    def _start(self) -> None:
        topo = self.topo
        for link in topo.links:
            line = self.wire.popen(sys.executable, "-m", "mininet_scenarios.delay_line",
                                   self.wire_if(link.a, link.b), self.wire_if(link.b, link.a),
                                   "--rtt-ms", str(link.rtt_ms), cwd=ROOT, text=True,
                                   stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
            assert line.stdout is not None
            if line.stdout.readline().strip() != "ready":
                raise RuntimeError(f"the delay line {link} did not start")
            self.lines[(link.a, link.b)] = line
        if not self.fabric:   # a fabric's agents are up with it
            self._start_agents()
        rows = "".join(f'[[site]]\nname = "{site.name}"\nprefix = "{site.prefix}"\n'
                       f'sync = "{topo.border_address(i)}:{SITE_SYNC_PORT}"\n'
                       for i, site in enumerate(topo.sites))
        self.layout_file.write_text(f'space = "{topo.layout.space}"\n{rows}')
        if self.sync:
            self._start_syncs()
        if self.registry:
            self._start_registries()

    def _start_agents(self) -> None:
        """An agent in each agent namespace, owning its block of the site's prefix."""
        topo = self.topo
        for i, site in enumerate(topo.sites):
            row = []
            for j, block in enumerate(topo.blocks(i)):
                _, address = topo.agent_link(i, j)
                name = f"{site.name}-{j}"
                agent = AgentProcess(f"leveldb:{self.workdir / name}", "--space", str(site.prefix),
                                     "--data-ip", address, *self.agent_extra, own=[str(block)],
                                     rewrite="local", host="0.0.0.0", port=METAFLOW_PORT,
                                     netns=self.agent_ns[i][j], name=name,
                                     log_path=self.workdir / f"{name}.log")
                row.append(agent.launch())
            self.agents.append(row)
        for agent in (a for row in self.agents for a in row):
            agent.wait_ready(60)

    def _start_syncs(self) -> None:
        topo = self.topo
        for i, site in enumerate(topo.sites):
            sync = SiteSyncProcess(self.layout_file, site.name, self.workdir / f"{site.name}.sqlite",
                                   port=SITE_SYNC_PORT, host="0.0.0.0", reach=topo.mgmt_link(i)[1],
                                   netns=self.borders[i], log_path=self.workdir / f"{site.name}-sync.log",
                                   extra=("--backoff-cap", "0.5", *["--fast-open"] * self.fast_open))
            self.syncs.append(sync.launch())
        for sync in self.syncs:
            sync.wait_ready(30)

    def _start_registries(self) -> None:
        """The baseline's registries: a redis-server on every border's address
        (in memory only, as the paper's cache), their addresses in `registry_file`."""
        where = {}
        for i, site in enumerate(self.topo.sites):
            address = self.topo.border_address(i)
            self.borders[i].popen("redis-server", "--bind", address, "--port", str(REGISTRY_PORT),
                                  "--save", "", "--appendonly", "no", "--protected-mode", "no", "--logfile",
                                  str(self.workdir / f"{site.name}-registry.log"),
                                  stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            where[site.name] = (address, REGISTRY_PORT)
        for i, (address, port) in enumerate(where.values()):
            deadline = time.monotonic() + 20
            while self.borders[i].run("redis-cli", "-h", address, "-p", str(port), "ping",
                                      check=False).stdout.strip() != "PONG":
                if time.monotonic() > deadline:
                    raise RuntimeError(f"the registry of site {self.topo.sites[i].name} did not start")
                time.sleep(0.05)
        self.registry_file.write_text(json.dumps(where))

    # -- faults ----------------------------------------------------------------

    def cut(self, a: str, b: str) -> None:
        """The link between sites `a` and `b` loses its carrier: both borders'
        routes over it go, and requests for the far site are refused at once."""
        link = self.topo.link_of(a, b)
        for i, far in ((link.a, link.b), (link.b, link.a)):
            self.borders[i].run("ip", "link", "set", self.wan_if(i, far), "down")

    def mend(self, a: str, b: str) -> None:
        link = self.topo.link_of(a, b)
        for i, far in ((link.a, link.b), (link.b, link.a)):
            self.borders[i].run("ip", "link", "set", self.wan_if(i, far), "up")
        for i in (link.a, link.b):
            self._route_wan(i, link)

    def silence(self, a: str, b: str, cut: bool = True) -> None:
        """The link between `a` and `b` drops every frame (or, `cut` False,
        carries them again) while its carrier stays up: nothing tells the
        borders, so requests wait for their timeouts."""
        link = self.topo.link_of(a, b)
        self.lines[(link.a, link.b)].send_signal(signal.SIGUSR1 if cut else signal.SIGUSR2)

    def fabric_of(self, site: str) -> SiteFabric:
        """`site`'s fabric (`fabric` only): its controllers, to kill and restart."""
        return self.fabrics[self.topo.index(site)]

    # -- nodes -----------------------------------------------------------------

    def node(self, site: str, *argv: str, **kwargs: object) -> subprocess.Popen[str]:
        """Start a node's process in `site`'s border namespace (it stops with the net)."""
        kwargs.setdefault("cwd", ROOT)
        kwargs.setdefault("text", True)
        return self.borders[self.topo.index(site)].popen(*argv, **kwargs)

    def run_node(self, site: str, *argv: str, timeout: float = 600) -> subprocess.CompletedProcess[str]:
        return self.borders[self.topo.index(site)].run(*argv, timeout=timeout, cwd=ROOT)

    # -- teardown --------------------------------------------------------------

    def close(self) -> None:
        """Stop everything started (agents and propagation agents with SIGTERM,
        insisting on a clean exit) and delete every namespace and link made."""
        failures = []
        procs = [*self.syncs, *(a for row in self.agents for a in row)]
        for proc in procs:
            proc.terminate()
        for proc in procs:
            try:
                if proc.stop() != 0:
                    failures.append(f"{proc.what} exited uncleanly: {proc.log()[-1000:]}")
            except subprocess.TimeoutExpired:
                failures.append(f"{proc.what} did not stop")
        for ns in self._made:
            ns.stop_processes()
        for ns in reversed(self._made):
            ip("netns", "del", ns.name)
        self._made.clear()
        for link in self._mgmt_links:
            delete_link(link)
        self._mgmt_links.clear()
        self.agents, self.syncs = [], []
        while self.fabrics:
            try:
                self.fabrics.pop().__exit__(None, None, None)
            except Exception as failure:   # the other sites' fabrics still go
                failures.append(f"a site's fabric: {failure}")
        if failures:
            raise RuntimeError("; ".join(failures))
