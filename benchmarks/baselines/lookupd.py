"""`metaflow-lookupd`: the baselines' lookup subsystem, one per storage server.

It runs beside the server's `metaflow-agent` (same host, its own process, so
/proc tells lookup CPU from storage CPU) and answers where a key lives, the
way each baseline would; the metadata request itself then goes to the
owner's agent at its data address, exactly as for MetaFlow. Every scheme
places keys where the MetaFlow partition does (`membership.json` carries
each server's blocks), so only the lookup differs.

Commands (RESP; a key is the normalized path, a position its MetaDataID's
offset in the space; every answer is `[owner data IP, forwards, level]`,
forwards = RPCs this lookup cost between servers):

    WHO pos             central coordinator and One-Hop: the full table here
    CHORD pos [node]    Chord: resolve here or forward to the next finger's
                        server (recursive, one RPC per hop)
    GHBA key [bad...]   G-HBA at the client's home server: LRU, segment
                        array, group multicast (GPROBE), global multicast
                        (GHAS); `bad` = candidates that turned out wrong
    GPROBE key / GHAS key   the multicasts' questions
    GADD keys           keys this server now stores (its own filter), NUL-separated
                        in one argument (paths never hold NUL)
    GFILTER / GSYNC     hand out our filter / fetch the replicas we hold
    STATS               JSON counters

    python -m benchmarks.baselines.lookupd --name s1 --membership m.json
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import signal
import sys
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path

from benchmarks.baselines.ghba import BloomFilter, GhbaLayout, GhbaNode, Probe, resolve
from benchmarks.baselines.placement import Chord
from benchmarks.baselines.rpc import RpcError, RpcPool, expect
from client_lib.cidr import Block
from client_lib.constants import LOOKUP_PORT
from client_lib.resp import ErrorReply, Reply
from client_lib.version import add_version_flag
from nat_agent.connection import Client, Connection, PythonPathHost
from nat_agent.resp_commands import encode_reply

log = logging.getLogger("metaflow.lookupd")


@dataclass(frozen=True)
class Membership:
    """The static cluster every lookup server starts from."""

    space: Block
    data_ip: dict[str, str]          # server -> data-plane address (agent on :9000)
    lookup: dict[str, str]           # server -> "ip:port" of its lookupd
    blocks: dict[str, list[Block]]   # server -> MetaFlow partition blocks
    coordinator: str
    group_size: int

    @classmethod
    def load(cls, data: dict) -> Membership:
        servers = data["servers"]
        return cls(space=Block.parse(data["space"]),
                   data_ip={n: s["data_ip"] for n, s in servers.items()},
                   lookup={n: s["lookup"] for n, s in servers.items()},
                   blocks={n: [Block.parse(b) for b in s["blocks"]] for n, s in servers.items()},
                   coordinator=data["coordinator"], group_size=int(data["group_size"]))

    def chord(self) -> Chord:
        return Chord.over_partition(self.blocks, self.space)


class CommandError(Exception):
    pass


class LookupService(PythonPathHost):
    """The `nat_agent.connection.Host` of every lookup connection."""

    max_bulk = 64 << 20   # GADD batches and filters

    def __init__(self, name: str, membership: Membership) -> None:
        if name not in membership.data_ip:
            raise ValueError(f"{name} is not in the membership ({sorted(membership.data_ip)})")
        self.name = name
        self.members = membership
        self.chord = membership.chord()
        self.ghba = GhbaNode(name, GhbaLayout(tuple(sorted(membership.data_ip)), membership.group_size))
        self.peers = RpcPool()
        super().__init__()
        self._server: asyncio.AbstractServer | None = None
        self._commands: dict[bytes, Callable[[list[bytes]], Awaitable[Reply]]] = {
            b"PING": self._ping, b"WHO": self._who, b"CHORD": self._chord, b"GHBA": self._ghba,
            b"GPROBE": self._gprobe, b"GHAS": self._ghas, b"GADD": self._gadd,
            b"GFILTER": self._gfilter, b"GSYNC": self._gsync, b"STATS": self._stats}

    # -- lifecycle and connections -------------------------------------------

    async def start(self, host: str, port: int) -> int:
        self._server = await asyncio.get_running_loop().create_server(
            lambda: Connection(self), host, port, backlog=1024, reuse_address=True)
        return self._server.sockets[0].getsockname()[1]

    async def stop(self) -> None:
        if self._server is None:
            return
        self._server.close()
        self.close_connections()
        self.peers.close()
        await self._server.wait_closed()

    async def execute(self, command: list[bytes], conn: Client) -> bytes:
        handler = self._commands.get(command[0].upper())
        if handler is None:
            name = command[0][:64].decode("utf-8", "replace")
            return encode_reply(ErrorReply(f"ERR unknown command '{name}'"))
        self.stats["cmd_" + command[0].decode().lower()] += 1
        try:
            return encode_reply(await handler(command[1:]))
        except (CommandError, ValueError, IndexError) as exc:
            self.stats["errors"] += 1
            return encode_reply(ErrorReply(f"ERR {exc or 'wrong number of arguments'}"))
        except RpcError as exc:
            self.stats["peer_errors"] += 1
            return encode_reply(ErrorReply(f"ERR peer failed: {exc}"))
        except Exception as exc:   # a bug must cost one request, not the connection
            self.stats["internal_errors"] += 1
            log.exception("%s failed", command[0][:64])
            return encode_reply(ErrorReply(f"ERR internal error: {exc!r}"))

    # -- answers -----------------------------------------------------------------

    def _answer(self, owner: str | None, forwards: int, level: str) -> list:
        return [self.members.data_ip[owner].encode() if owner else None, forwards, level.encode()]

    async def _ping(self, args: list[bytes]) -> Reply:
        return b"PONG"

    def _position(self, raw: bytes) -> int:
        pos = int(raw)
        if not 0 <= pos < self.members.space.size:
            raise CommandError(f"position {pos} outside the space")
        return pos

    async def _who(self, args: list[bytes]) -> Reply:
        return self._answer(self.chord.successor(self._position(args[0]))[1], 0, "table")

    async def _chord(self, args: list[bytes]) -> Reply:
        key = self._position(args[0])
        if len(args) > 1:
            node = int(args[1])
            if self.chord.names.get(node) != self.name:
                raise CommandError(f"node {node} is not one of {self.name}'s")
        else:
            node = self.chord.entry(self.name, key)
        while True:
            server = self.chord.names[node]
            if server != self.name:
                ip, forwards, level = await self.peers.lookup(self.members.lookup[server], "CHORD", key, node)
                return [ip, forwards + 1, level]
            owner, node = self.chord.step(node, key)
            if owner is not None:
                return self._answer(owner, 0, "chord")

    async def _ghba(self, args: list[bytes]) -> Reply:
        if not args:
            raise CommandError("GHBA needs a key")
        key, bad = args[0], frozenset(a.decode() for a in args[1:])
        steps = resolve(self.ghba, key, bad)
        try:
            probe = next(steps)
            while True:
                probe = steps.send(await self._multicast(probe, key))
        except StopIteration as done:
            found = done.value
        self.stats["level_" + found.level] += 1
        return self._answer(found.owner, found.rpcs, found.level)

    async def _multicast(self, probe: Probe, key: bytes) -> list:
        command = "GPROBE" if probe.kind == "group" else "GHAS"
        addresses = [self.members.lookup[t] for t in probe.targets]
        replies = await asyncio.gather(*(self.peers.call(a, command, key) for a in addresses))
        if probe.kind == "group":
            return [[expect(a, name, bytes).decode() for name in expect(a, hits, list)]
                    for a, hits in zip(addresses, replies, strict=True)]
        return [bool(r) for r in replies]

    async def _gprobe(self, args: list[bytes]) -> Reply:
        return [name.encode() for name in self.ghba.segment_hits(args[0])]

    async def _ghas(self, args: list[bytes]) -> Reply:
        return int(self.ghba.has(args[0]))

    async def _gadd(self, args: list[bytes]) -> Reply:
        added = [key for arg in args for key in arg.split(b"\0") if key]
        for key in added:
            self.ghba.add_own(key)
        return len(added)

    async def _gfilter(self, args: list[bytes]) -> Reply:
        return self.ghba.own_filter().to_bytes()

    async def _gsync(self, args: list[bytes]) -> Reply:
        """Fetch a fresh copy of every filter we replicate: G-HBA's periodic
        replica update, run by the benchmark between phases."""
        others = self.ghba.held[1:]   # the first is our own, answered from our exact key set
        for server in others:
            address = self.members.lookup[server]
            data = expect(address, await self.peers.call(address, "GFILTER"), bytes)
            self.ghba.set_replica(server, BloomFilter.from_bytes(data))
        return len(others)

    async def _stats(self, args: list[bytes]) -> Reply:
        return json.dumps(dict(self.stats, rpcs_sent=self.peers.calls)).encode()


async def serve(args: argparse.Namespace) -> int:
    membership = Membership.load(json.loads(Path(args.membership).read_text()))
    service = LookupService(args.name, membership)
    host, port = args.listen.rsplit(":", 1)
    bound = await service.start(host, int(port))
    log.info("%s: lookups on %s:%d for %d servers", args.name, host, bound, len(membership.data_ip))
    print(f"ready {bound}", flush=True)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    await service.stop()
    return 0


def parser() -> argparse.ArgumentParser:
    """Every flag of `metaflow-lookupd`, declared once: `main` reads a
    command line with it and docs/reference/flags.md is generated from it."""
    p = argparse.ArgumentParser(prog="metaflow-lookupd", description=__doc__.splitlines()[0])
    add_version_flag(p)
    p.add_argument("--name", required=True, help="this server's name in the membership")
    p.add_argument("--membership", required=True, help="JSON: space, servers (data_ip, lookup, blocks), "
                                                       "coordinator, group_size")
    p.add_argument("--listen", default=f"0.0.0.0:{LOOKUP_PORT}", help="HOST:PORT")
    p.add_argument("--log-level", default="WARNING")
    return p


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    logging.basicConfig(level=args.log_level, format="%(asctime)s lookupd %(levelname)s %(message)s")
    import uvloop
    return uvloop.run(serve(args))


if __name__ == "__main__":
    sys.exit(main())
