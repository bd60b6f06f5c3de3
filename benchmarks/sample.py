"""Real agents behind real Open vSwitch bridges inside an emulated fabric.

`benchmarks.scale` emulates every switch and agent of a k=32 fat-tree; with
`--sample N` the first N edge switches are real instead (`RealSample`), so that
a split, a fail-over and a drain run end to end on real agents, with real
data, at that scale:

- the sample's edge switches are Open vSwitch bridges (userspace datapath)
  with the topology's dpids and port numbers, connected to every
  controller, built by `mininet_scenarios.scenario.Scenario` from
  `sample_graph`;
- each of their storage hosts is a real `metaflow-agent` in its own
  namespace, registering under its topology name, its admin API,
  replication stream and controller calls on the management network;
- each edge also has one client host, on a port past the topology's
  (`client_port`), whose requests cross the real bridge;
- each uplink (a port to an emulated aggregation switch) is a veth pair:
  one end is the bridge's port of that number, the other is read and
  written by the emulator through an AF_PACKET socket (`Uplink`). LLDP
  crosses it both ways, so the controller finds those links like any other;
  other frames are dropped (the emulated fabric carries no data), so a
  client reaches the servers of its own edge only.

Why the first edges: in a packed fat-tree the first build gives the first
half of each edge's servers a block and places each block's backup on the
least loaded server of another edge, first in tree order, which for the
first two edges is the other one: their replica sets stay inside the
sample, and a fail-over promotes a real backup. `outside` checks that on
the controller's view instead of trusting it.
"""

from __future__ import annotations

import asyncio
import ipaddress
import json
import shutil
import socket
import subprocess
import sys
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from benchmarks.ofemu import Emulator
from btree.fabric import Port
from btree.flows import Table
from client_lib.api.rest import ServerInfo
from client_lib.cidr import Block
from mininet_scenarios.leaks import unique_prefix
from mininet_scenarios.ofdump import dump, parse_dump
from mininet_scenarios.scenario import Scenario
from mininet_scenarios.syscmd import delete_link, ip, vsctl
from mininet_scenarios.topos import HOST_NETWORK
from topology import builders
from topology.builders import Topology

ROOT = Path(__file__).resolve().parent.parent
ETH_P_ALL = 0x0003
FRAME_MAX = 65535


# -- what is real (pure) ------------------------------------------------------------


def sample_edges(graph: Topology, count: int) -> list[str]:
    """The first `count` edge switches (by dpid) with storage hosts."""
    edges = sorted((s for s in builders.switches(graph) if graph.nodes[s]["layer"] == "edge"
                    and any(graph.nodes[h]["kind"] == "host" and graph.nodes[h]["role"] == "storage"
                            for h in graph.adj[s])), key=lambda s: graph.nodes[s]["dpid"])
    if count > len(edges):
        raise ValueError(f"a sample of {count} edge switches, but the fabric has {len(edges)} with servers")
    return edges[:count]


def client_port(graph: Topology, edge: str) -> int:
    """The port of an edge's sample client: past every port of the topology's."""
    return max(builders.port(graph, edge, peer) for peer in graph.adj[edge]) + 1


def sample_graph(graph: Topology, edges: Sequence[str]) -> Topology:
    """`edges` and their hosts, as in `graph` (dpids, ports, addresses,
    roles), plus a client host on each edge (`client_port`), numbered past
    every host of `graph` so its address and MAC are nobody's."""
    hosts = [h for e in edges for h in graph.adj[e] if graph.nodes[h]["kind"] == "host"]
    out: Topology = graph.subgraph([*edges, *hosts]).copy()
    last = max(int(ipaddress.IPv4Address(graph.nodes[h]["ip"])) for h in builders.hosts(graph))
    for i, edge in enumerate(edges, start=1):
        n = last + i
        if ipaddress.IPv4Address(n) not in HOST_NETWORK:
            raise ValueError(f"no address left in {HOST_NETWORK} for {edge}'s client")
        name = f"{edge}c"
        out.add_node(name, kind="host", role="client", ip=str(ipaddress.IPv4Address(n)),
                     mac=":".join(f"{b:02x}" for b in n.to_bytes(6, "big")))
        out.add_edge(edge, name, ports={edge: client_port(graph, edge), name: 0})
    return out


def spares(servers: int) -> int:
    """How many of an edge's sample servers start after the first build: a
    quarter, at least two (`RealSample.start_spares`)."""
    return max(2, servers // 4)


def uplinks(graph: Topology, edges: Sequence[str]) -> list[tuple[str, Port]]:
    """(bridge switch, its port) for every link from an edge of the sample to
    a switch outside it."""
    inside = set(edges)
    return [(e, (graph.nodes[e]["dpid"], builders.port(graph, e, peer))) for e in edges
            for peer in graph.adj[e] if graph.nodes[peer]["kind"] == "switch" and peer not in inside]


def members(servers: Mapping[str, ServerInfo], in_service: bool = True) -> dict[Block, set[str]]:
    """Every block led by a server, with the servers that hold it (its
    primary and its backups); `in_service`: failed servers left out."""
    counted = {n: info for n, info in servers.items() if not (in_service and info.failed)}
    held: dict[Block, set[str]] = {}
    for name, info in counted.items():
        for block in (*info.blocks, *info.backups):
            held.setdefault(block, set()).add(name)
    led = {b for info in counted.values() for b in info.blocks}
    return {b: names for b, names in held.items() if b in led}


def outside(servers: Mapping[str, ServerInfo], sample: Iterable[str]) -> list[str]:
    """The blocks a sample server leads whose replica set has a member
    outside the sample (a fail-over there would promote an emulated copy)."""
    inside, held = set(sample), members(servers, in_service=False)   # a failed holder's copy too
    return sorted(str(b) for name in inside if name in servers for b in servers[name].blocks
                  if not held.get(b, set()) <= inside)


def under_replicated(servers: Mapping[str, ServerInfo], replicas: int) -> list[str]:
    """The blocks held by fewer than `replicas` servers in service: a
    fail-over's repair has not yet copied them again (the controller starts
    it on a later turn, and holds the set's members busy while it runs)."""
    return sorted(str(b) for b, names in members(servers).items() if len(names) < replicas)


# -- one uplink: a veth pair between a bridge and the emulator ------------------------


class Uplink:
    """A real bridge's port wired to an emulated switch: `inside` is the
    bridge's port (`port`'s number), `outside` its veth peer in the root
    namespace, read and written by the emulator through an AF_PACKET socket."""

    def __init__(self, bridge: str, port: Port, inside: str, outside: str) -> None:
        self.bridge, self.port, self.inside, self.outside = bridge, port, inside, outside
        self.sock: socket.socket | None = None
        self.emulator: Emulator | None = None
        self.loop: asyncio.AbstractEventLoop | None = None

    def up(self) -> None:
        ip("link", "add", self.inside, "type", "veth", "peer", "name", self.outside)
        for name in (self.inside, self.outside):
            ip("link", "set", name, "up")
        vsctl("add-port", self.bridge, self.inside, "--", "set", "Interface", self.inside,
              f"ofport_request={self.port[1]}")
        sock = self.sock = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.htons(ETH_P_ALL))
        sock.bind((self.outside, 0))
        sock.setblocking(False)

    def attach(self, emulator: Emulator, loop: asyncio.AbstractEventLoop) -> None:
        """Frames both ways from now on (`Emulator.attach`, `Emulator.from_real`)."""
        assert self.sock is not None, "up first"
        self.emulator, self.loop = emulator, loop
        emulator.attach(self.port, self.send)
        loop.add_reader(self.sock.fileno(), self._read)

    def send(self, frame: bytes) -> None:
        if self.sock is not None:
            try:
                self.sock.send(frame)
            except OSError:   # the link went down: the frame is lost, as on a wire
                pass

    def _read(self) -> None:
        assert self.sock is not None and self.emulator is not None
        while True:
            try:
                frame, address = self.sock.recvfrom(FRAME_MAX)
            except (BlockingIOError, InterruptedError):
                return
            if address[2] != socket.PACKET_OUTGOING:   # (not what `send` wrote)
                self.emulator.from_real(self.port, frame)

    def close(self) -> None:
        if self.loop is not None and self.sock is not None:
            self.loop.remove_reader(self.sock.fileno())
        if self.sock is not None:
            self.sock.close()
            self.sock = None
        vsctl("--if-exists", "del-port", self.bridge, self.inside)
        delete_link(self.outside)   # (and its peer)


# -- the sample ---------------------------------------------------------------------


class RealSample:
    """`edges` of `graph` real (module doc), up from `up` to `close`, which
    must run on the main thread (the scenario holds SIGTERM meanwhile)."""

    def __init__(self, graph: Topology, edges: Sequence[str], controllers: Sequence[tuple[str, int]],
                 secret_file: Path, logs: Path, agent_args: Sequence[str] = ()) -> None:
        """`logs`: where the agents' logs are copied at `close`."""
        self.graph, self.edges, self.logs = graph, list(edges), logs
        self.real = sample_graph(graph, edges)
        # `unique_prefix` less its "mf", led by "s": 5 characters, so that
        # "<prefix>h8193-mgmt" (a client's management interface) fits Linux's 15.
        self.prefix = "s" + unique_prefix()[2:]
        self.scenario = Scenario(self.real, controller=controllers[0], standby_controllers=controllers[1:],
                                 prefix=self.prefix, agent_args=agent_args, await_controller=False,
                                 agents_at_start=False, builder_names=True, secret_file=secret_file,
                                 agent_timeout=120.0)
        bridges = self.scenario.topo.names
        self.uplinks = [Uplink(bridges[edge], port, f"{self.prefix}u{i}", f"{self.prefix}v{i}")
                        for i, (edge, port) in enumerate(uplinks(graph, edges))]
        self.servers = [h for e in edges for h in graph.adj[e]
                        if graph.nodes[h]["kind"] == "host" and graph.nodes[h]["role"] == "storage"]
        by_edge = {e: [h for h in self.servers if h in graph.adj[e]] for e in edges}
        self.spares = [h for hosts in by_edge.values() for h in hosts[len(hosts) - spares(len(hosts)):]]
        """Servers that start only after the first build (`start_spares`)."""
        self.clients = {edge: f"{edge}c" for edge in edges}
        self.dpids = [graph.nodes[e]["dpid"] for e in edges]

    @property
    def root_ip(self) -> str:
        """The management network's address in the root namespace: where the
        controllers' REST API must listen for the sample's agents."""
        return self.scenario.mgmt.root_ip

    def up(self) -> None:
        self.scenario.__enter__()
        try:
            for uplink in self.uplinks:
                uplink.up()
        except BaseException:
            self.close()
            raise

    def attach(self, emulator: Emulator) -> None:
        """Wire the uplinks to `emulator` and let it read the bridges' tables."""
        loop = asyncio.get_running_loop()
        for uplink in self.uplinks:
            uplink.attach(emulator, loop)
        emulator.real_tables = self.tables

    def start_agents(self, rest_urls: Sequence[str]) -> None:
        """The agents of every sample server but the spares, registering with
        `rest_urls` (blocks until each answers)."""
        self.scenario.rest_urls = tuple(rest_urls)
        first = [h for h in self.servers if h not in self.spares]
        self.scenario.start_agents(first)
        self.announce(first)

    def start_spares(self) -> None:
        """The spares' agents: servers that join the built tree idle, the
        least loaded of all, so that the replicas, splits and drains of the
        sample's blocks land on them rather than on emulated servers, which
        cannot take a real copy."""
        self.scenario.start_agents(self.spares)
        self.announce(self.spares)

    def announce(self, servers: Sequence[str]) -> None:
        """Each server's ARP for the gateway, as the emulated servers send
        theirs when they come up (`Emulator.announce`): the controller
        locates a server by it (hybrid mode's own probes find a late server
        too, but at k=32 one a round, every 2 s)."""
        gateway = self.scenario.gateway
        pings = [subprocess.Popen(self.scenario.ns(node).command("ping", "-c1", "-W1", gateway),
                                  stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL) for node in servers]
        for ping in pings:   # (no answer until the controller has located it: that is fine)
            ping.wait(timeout=30)

    def tables(self) -> dict[int, Table]:
        """The bridges' MetaFlow entries as Open vSwitch holds them, by dpid."""
        names = self.scenario.topo.names
        return {self.graph.nodes[e]["dpid"]: parse_dump(dump(names[e])) for e in self.edges}

    def edge_of(self, server: str) -> str:
        (edge,) = [n for n in self.graph.adj[server] if self.graph.nodes[n]["kind"] == "switch"]
        return edge

    def power_off(self, server: str) -> None:
        """A server that loses power: its agent killed (SIGKILL), its link down
        (the bridge reports the port down, as a dead host's NIC does)."""
        self.scenario.agents.pop(server).kill()   # (gone: the teardown stops the others)
        assert self.scenario.net is not None
        self.scenario.net.configLinkStatus(self.scenario.topo.names[server],
                                           self.scenario.topo.names[self.edge_of(server)], "down")

    def write(self, edge: str, blocks: Sequence[Block], files: int, start: int,
              acked: Path) -> dict[str, Any]:
        """`mininet_scenarios.workload` on `edge`'s client: `files` paths in
        `blocks` written (and read back), acknowledged ones appended to `acked`."""
        argv = [sys.executable, "-m", "mininet_scenarios.workload", "--client", edge, "--files", str(files),
                "--start", str(start), "--acked", str(acked), "--space", self.scenario.space,
                *[arg for b in blocks for arg in ("--within", str(b))]]
        return self._json(edge, argv)

    def verify(self, edge: str, expected: Mapping[str, str], check: Path) -> dict[str, Any]:
        """`mininet_scenarios.verify` on `edge`'s client: each path of
        `expected` (path -> digest) read back through the bridge."""
        check.write_text(json.dumps(dict(expected)))
        return self._json(edge, [sys.executable, "-m", "mininet_scenarios.verify", str(check),
                                 "--space", self.scenario.space], check=False)

    def _json(self, edge: str, argv: list[str], check: bool = True) -> dict[str, Any]:
        done = self.scenario.ns(self.clients[edge]).run(*argv, cwd=ROOT, check=check, timeout=600)
        try:
            return dict(json.loads(done.stdout.strip().splitlines()[-1]))
        except (IndexError, json.JSONDecodeError):
            raise RuntimeError(f"{argv[2]} on {edge}'s client printed no result: "
                               f"{done.stderr[-2000:]}") from None

    def close(self) -> None:
        workdir = self.scenario.workdir
        if workdir is not None and workdir.exists():
            self.logs.mkdir(parents=True, exist_ok=True)
            for log in workdir.glob("*.log"):
                shutil.copy(log, self.logs / log.name)
        for uplink in self.uplinks:
            try:
                uplink.close()
            except RuntimeError:   # (the bridge went first; the sweep takes the rest)
                pass
        self.scenario.close()

