"""One client host of `metaflowctl bench`: closed-loop load under any scheme.

Runs inside a Mininet client host for the whole benchmark and takes one
JSON command per line on stdin, answering each with one JSON line, so the
harness can start every client's run at the same moment without paying
an interpreter start per run:

    {"phase": "mixed", "scheme": "chord", "concurrency": 4, "seconds": 3}
    {"phase": "load", "share": [0, 8]}          write the namespace entries i = 0 mod 8
    {"phase": "create"|"stat"|"remove", "scheme": "ghba", "concurrency": 4}
    {"phase": "dfs", "scheme": "onehop", "file_size": 65536, "files": 512,
     "share": [0, 8], "concurrency": 2, "background": 2, "tag": "r0"}

The ``dfs`` phase is the paper's DFS experiment (Fig. 20) on one client: it
writes its share of `files` files of `file_size` bytes, `concurrency` at a time, each a
metadata create found through the scheme, the data in chunks of up to
`DFS_CHUNK` bytes straight to the storage servers that hold them (the same
for every scheme: data placement needs no metadata lookup here), and a
metadata update with the size; meanwhile `background` workers keep the 20/80
metadata load of the mixed phase going through the same scheme. Its time is
from the first file's start to the last one's end.

Per operation, a scheme first finds the owner (MetaFlow and hash mapping:
no lookup; the others: lookup RPCs to `metaflow-lookupd` over kept-open
connections) and then sends the request to it: to the MetaDataID address
for MetaFlow (the switches route it), to the owner's data address for the
rest. The request opens a connection per operation, as the paper's client
does, unless --reuse (then MetaFlow can only reuse per MetaDataID, the
others per server). Latency covers lookup plus request.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import sys
import time
from collections import Counter
from pathlib import Path

from benchmarks.baselines.lookupd import Membership
from benchmarks.baselines.rpc import RpcError, RpcPool, connect, exchange
from benchmarks.mix import Entry, MixedOps, entries, mdtest_entries
from client_lib.constants import METAFLOW_PORT
from client_lib.mdid import mdid_of_key
from client_lib.resp import ErrorReply, encode_command

SCHEMES = ("metaflow", "hash", "central", "onehop", "chord", "ghba")
DFS_CHUNK = 256 * 1024
"""Bytes of file data per request in the dfs phase (`client_lib.fs.filedata`'s chunk)."""


class Router:
    """Where a key's request goes under each scheme, and what finding it cost."""

    def __init__(self, members: Membership, home: str, seed: int) -> None:
        self.members = members
        self.ring = members.chord()
        self.servers = sorted(members.data_ip)
        self.home = home
        self.rng = random.Random(seed)
        self.lookups = RpcPool()

    def placed(self, key: bytes) -> str:
        return self.members.data_ip[self.ring.owner(key)]

    async def locate(self, scheme: str, key: bytes, bad: tuple[str, ...]) -> tuple[str, int]:
        """(address to send the request to, lookup RPCs spent)."""
        if scheme == "metaflow":
            return self.members.space.address(mdid_of_key(key, self.members.space)), 0
        if scheme == "hash":
            return self.placed(key), 0
        if scheme == "ghba":
            home = self.members.lookup[self.home]
            ip, forwards, _level = await self.lookups.lookup(home, "GHBA", key, *bad)
            return (ip.decode() if ip else self.placed(key)), 1 + forwards
        server = self.members.coordinator if scheme == "central" else self.rng.choice(self.servers)
        command = "WHO" if scheme in ("central", "onehop") else "CHORD"
        ip, forwards, _level = await self.lookups.lookup(self.members.lookup[server], command,
                                                         self.ring.position(key))
        if ip is None:
            raise RpcError(f"{server} found no owner for {key!r}")
        return ip.decode(), 1 + forwards

    def server_of(self, ip: str) -> str:
        return next(name for name, addr in self.members.data_ip.items() if addr == ip)


class Requests:
    """The metadata request itself: a connection per request, or reused."""

    def __init__(self, reuse: bool, timeout: float = 5.0) -> None:
        self.pool = RpcPool(timeout) if reuse else None
        self.timeout = timeout

    async def send(self, address: str, frame: bytes):
        if self.pool is not None:
            return await self.pool.call_frame(f"{address}:{METAFLOW_PORT}", frame)
        conn = await connect(address, METAFLOW_PORT, self.timeout)
        try:
            return await exchange(conn, frame, self.timeout)
        finally:
            conn[1].close()


class Client:
    def __init__(self, args: argparse.Namespace) -> None:
        self.name = args.client
        self.members = Membership.load(json.loads(Path(args.membership).read_text()))
        servers = sorted(self.members.data_ip)
        self.router = Router(self.members, servers[args.index % len(servers)], args.seed + args.index)
        self.requests = Requests(args.reuse)
        self.namespace = entries(args.entries, args.seed)
        self.mixed = MixedOps(len(self.namespace), args.get_fraction, args.zipf,
                              args.seed * 1000 + args.index)
        self.mdtest = mdtest_entries(self.name, args.mdtest_files)
        self.data = RpcPool(timeout=60)   # file data: kept-open connections, as a stream would be

    async def op(self, scheme: str, verb: str, entry: Entry, stats: Counter) -> None:
        """One operation, lookups and retries included; a false location (a
        G-HBA false positive: the server answers MOVED) is looked up again
        without it."""
        args = (verb, entry.key, entry.value) if verb == "SET" else (verb, entry.key)
        frame = encode_command(*args)
        bad: tuple[str, ...] = ()
        for _ in range(4):
            address, rpcs = await self.router.locate(scheme, entry.key, bad)
            stats["lookup_rpcs"] += rpcs
            reply = await self.requests.send(address, frame)
            if isinstance(reply, ErrorReply) and reply.code in ("MOVED", "TRYAGAIN"):
                stats["moved"] += 1
                if scheme == "ghba":
                    bad += (self.router.server_of(address),)
                continue
            if isinstance(reply, ErrorReply):
                raise RpcError(reply.message)
            if verb == "SET" and scheme == "ghba":
                await self.router.lookups.call(self.members.lookup[self.router.server_of(address)],
                                               "GADD", entry.key)
                stats["lookup_rpcs"] += 1
            return
        raise RpcError(f"{entry.key!r}: still MOVED after 4 lookups")

    async def dfs(self, cmd: dict) -> dict:
        """The dfs phase (module docstring)."""
        scheme, size = cmd["scheme"], int(cmd["file_size"])
        stats: Counter[str] = Counter()
        errors: list[str] = []
        index, clients = cmd.get("share", [0, 1])
        files = iter(range(int(cmd["files"]) // clients + (index < int(cmd["files"]) % clients)))
        payload = bytes(range(256)) * (min(size, DFS_CHUNK) // 256 + 1)
        writing = True

        async def write_file(i: int) -> None:
            key = f"/fig20/{cmd['tag']}/{self.name}/f{i:06}".encode()
            await self.op(scheme, "SET", Entry(key, b'{"size":0}'), stats)
            for offset in range(0, size, DFS_CHUNK):
                chunk = key + b"#%08x" % (offset // DFS_CHUNK)
                frame = encode_command("SET", chunk, payload[:min(DFS_CHUNK, size - offset)])
                reply = await self.data.call_frame(f"{self.router.placed(chunk)}:{METAFLOW_PORT}", frame)
                if isinstance(reply, ErrorReply):
                    raise RpcError(f"data {chunk!r}: {reply.message}")
                stats["data_requests"] += 1
            await self.op(scheme, "SET", Entry(key, b'{"size":%d}' % size), stats)

        async def writer() -> None:
            for i in files:
                try:
                    await write_file(i)
                    stats["files"] += 1
                except (TimeoutError, OSError, RpcError) as exc:
                    errors.append(f"file {i}: {exc!r}")

        async def background() -> None:
            mixed = self._work("mixed", cmd)
            while writing:
                verb, entry = next(mixed)
                try:
                    await self.op(scheme, verb, entry, stats)
                    stats["background_ops"] += 1
                except (TimeoutError, OSError, RpcError) as exc:
                    errors.append(f"background {verb}: {exc!r}")

        loads = [asyncio.ensure_future(background()) for _ in range(int(cmd.get("background", 0)))]
        began = time.perf_counter()
        await asyncio.gather(*(writer() for _ in range(int(cmd.get("concurrency", 1)))))
        seconds = time.perf_counter() - began
        writing = False
        await asyncio.gather(*loads)
        return {"client": self.name, "phase": "dfs", "scheme": scheme, "file_size": size,
                "seconds": round(seconds, 4), "errors": len(errors), "error_sample": errors[:3], **stats}

    async def run(self, cmd: dict) -> dict:
        if cmd["phase"] == "dfs":
            return await self.dfs(cmd)
        phase, scheme = cmd["phase"], cmd.get("scheme", "hash")
        stats: Counter[str] = Counter()
        latencies: list[int] = []
        errors: list[str] = []
        deadline = time.monotonic() + cmd.get("seconds", 3600)
        work = self._work(phase, cmd)

        async def worker() -> None:
            while time.monotonic() < deadline:
                try:
                    verb, entry = next(work)
                except StopIteration:
                    return
                started = time.perf_counter()
                try:
                    await self.op(scheme, verb, entry, stats)
                except (TimeoutError, OSError, RpcError) as exc:
                    errors.append(f"{verb} {entry.key[:80]!r}: {exc!r}")
                    continue
                latencies.append(int((time.perf_counter() - started) * 1e6))
                stats[verb] += 1

        began = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(cmd.get("concurrency", 1))))
        return {"client": self.name, "phase": phase, "scheme": scheme, "ops": len(latencies),
                "seconds": round(time.perf_counter() - began, 4), "latency_us": latencies,
                "errors": len(errors), "error_sample": errors[:3], **stats}

    def _work(self, phase: str, cmd: dict):
        """(verb, entry) pairs for a phase; the mixed phase never ends by itself."""
        if phase == "mixed":
            return (("GET" if get else "SET", self.namespace[i]) for get, i in self.mixed)
        if phase == "load":
            start, step = cmd["share"]
            return (("SET", e) for e in self.namespace[start::step])
        verb = {"create": "SET", "stat": "GET", "remove": "DEL"}[phase]
        return ((verb, e) for e in self.mdtest)


async def main_async(args: argparse.Namespace) -> None:
    client = Client(args)
    loop = asyncio.get_running_loop()
    print(json.dumps({"ready": client.name, "entries": len(client.namespace)}), flush=True)
    while line := await loop.run_in_executor(None, sys.stdin.readline):
        print(json.dumps(await client.run(json.loads(line))), flush=True)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--client", required=True)
    p.add_argument("--index", type=int, required=True, help="this client's number (picks its G-HBA home)")
    p.add_argument("--membership", required=True)
    p.add_argument("--entries", type=int, default=20000, help="namespace size")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--get-fraction", type=float, default=0.2)
    p.add_argument("--zipf", type=float, default=0.9, help="Zipf exponent of key popularity (0: uniform)")
    p.add_argument("--mdtest-files", type=int, default=200)
    p.add_argument("--reuse", action="store_true", help="reuse request connections")
    args = p.parse_args(argv)
    import uvloop
    uvloop.run(main_async(args))
    return 0


if __name__ == "__main__":
    sys.exit(main())
