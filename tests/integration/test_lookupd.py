"""`metaflow-lookupd` for real: five daemons on loopback answering each other.

Every lookup is checked against the partition (the truth) and against the
pure logic the daemons run (`placement.Chord`, `ghba.resolve`), so a daemon
that forwarded wrongly, counted hops wrongly or lost a multicast answer fails.
"""

from __future__ import annotations

import asyncio
import json
import random
import signal
import subprocess
import sys
from collections.abc import Iterator

import pytest

from benchmarks.baselines.lookupd import Membership
from benchmarks.baselines.rpc import RpcError, RpcPool
from client_lib.cidr import Block
from client_lib.mdid import mdid_of_key
from mininet_scenarios.daemons import ROOT
from nat_agent.ports import listen_port

SPACE = Block.parse("100.64.0.0/10")
SERVERS = [f"s{i}" for i in range(5)]
Cluster = tuple[Membership, dict[str, subprocess.Popen[str]]]
"""The membership the lookupds were started with, and their processes by name."""


@pytest.fixture(scope="module")
def cluster(
        tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[Cluster]:
    """Five lookupds over a partition of 16 blocks dealt at random."""
    tmp = tmp_path_factory.mktemp("lookupd")
    rng = random.Random(7)
    owners = [SERVERS[i % len(SERVERS)] for i in range(16)]
    rng.shuffle(owners)
    blocks: dict[str, list[str]] = {s: [] for s in SERVERS}
    for i, owner in enumerate(owners):
        blocks[owner].append(str(Block(SPACE.first + i * (SPACE.size // 16), SPACE.plen + 4)))
    ports = {s: listen_port() for s in SERVERS}
    data = {"space": str(SPACE), "coordinator": "s0", "group_size": 2,
            "servers": {s: {"data_ip": f"10.9.0.{i + 1}", "lookup": f"127.0.0.1:{ports[s]}",
                            "blocks": blocks[s]}
                        for i, s in enumerate(SERVERS)}}
    path = tmp / "membership.json"
    path.write_text(json.dumps(data))
    procs = {s: subprocess.Popen([sys.executable, "-m", "benchmarks.baselines.lookupd", "--name", s,
                                  "--membership", str(path), "--listen", f"127.0.0.1:{ports[s]}"],
                                 cwd=ROOT, stdout=subprocess.PIPE, text=True) for s in SERVERS}
    for proc in procs.values():
        assert proc.stdout is not None
        assert proc.stdout.readline().startswith("ready")
    yield Membership.load(data), procs
    for proc in procs.values():
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
    assert all(proc.wait(10) == 0 for proc in procs.values())


def run(coro):
    return asyncio.run(coro)


def keys(n: int, tag: str) -> list[bytes]:
    return [f"/lookupd/{tag}/d{i // 10}/f{i}".encode() for i in range(n)]


def truth(members: Membership, key: bytes) -> str:
    mdid = mdid_of_key(key, SPACE)
    owner = next(name for name, bs in members.blocks.items() if any(b.contains(mdid) for b in bs))
    return members.data_ip[owner]


def test_who_and_chord_find_every_owner_with_the_hops_chord_predicts(cluster: Cluster) -> None:
    members, _ = cluster
    chord = members.chord()
    rng = random.Random(3)

    async def go():
        pool = RpcPool()
        try:
            for key in keys(200, "chord"):
                pos = mdid_of_key(key, SPACE) - SPACE.first
                start = rng.choice(SERVERS)
                ip, forwards, level = await pool.call(members.lookup[start], "WHO", pos)
                assert (ip.decode(), forwards, level) == (truth(members, key), 0, b"table")
                ip, forwards, level = await pool.call(members.lookup[start], "CHORD", pos)
                assert ip.decode() == truth(members, key)
                assert forwards == chord.route(start, pos).rpcs - 1   # the client's RPC is not a forward
        finally:
            pool.close()
    run(go())


def test_ghba_resolves_loaded_keys_and_misses_unknown_ones_by_global_multicast(cluster: Cluster) -> None:
    members, _ = cluster
    stored = keys(300, "ghba")
    by_owner: dict[str, list[bytes]] = {}
    ring = members.chord()
    for key in stored:
        by_owner.setdefault(ring.owner(key), []).append(key)

    async def go():
        pool = RpcPool()
        try:
            for name, owned in by_owner.items():
                assert await pool.call(members.lookup[name], "GADD", b"\0".join(owned)) == len(owned)
            for name in SERVERS:
                await pool.call(members.lookup[name], "GSYNC")
            levels = []
            for key in stored:
                ip, forwards, level = await pool.call(members.lookup["s1"], "GHBA", key)
                if ip.decode() != truth(members, key):   # a false positive: ask again without it
                    wrong = next(n for n, a in members.data_ip.items() if a == ip.decode())
                    ip, forwards, level = await pool.call(members.lookup["s1"], "GHBA", key, wrong)
                assert ip.decode() == truth(members, key)
                levels.append(level)
            again = await pool.call(members.lookup["s1"], "GHBA", stored[0])
            assert again[2] == b"lru" and again[1] == 0
            ip, forwards, level = await pool.call(members.lookup["s1"], "GHBA", b"/lookupd/never/written")
            assert (ip, level) == (None, b"miss")
            assert forwards >= len(SERVERS) - 1     # every other server was asked
            stats = json.loads(await pool.call(members.lookup["s1"], "STATS"))
            assert stats["level_miss"] >= 1 and stats["cmd_ghba"] >= len(stored)
            return levels
        finally:
            pool.close()
    levels = run(go())
    assert b"segment" in levels or b"group" in levels


def test_bad_requests_get_errors_and_the_daemon_keeps_serving(cluster: Cluster) -> None:
    members, _ = cluster
    address = members.lookup["s2"]

    async def go():
        pool = RpcPool()
        try:
            for args, message in ((("NOPE",), "unknown command"), (("WHO", SPACE.size), "outside the space"),
                                  (("WHO", "x"), "invalid literal"), (("CHORD", 5, 12345), "is not one of"),
                                  (("GHBA",), "needs a key"), (("WHO",), "ERR")):
                with pytest.raises(RpcError, match=message):
                    await pool.call(address, *args)
            assert await pool.call(address, "PING") == b"PONG"
        finally:
            pool.close()
    run(go())


def test_a_dead_peer_fails_the_lookup_not_the_daemon(cluster: Cluster) -> None:
    members, procs = cluster
    chord = members.chord()
    victim = "s4"
    # a key whose Chord route from s0 passes through the victim before the end
    key, pos = next((k, p) for k in keys(2000, "dead")
                    for p in [mdid_of_key(k, SPACE) - SPACE.first]
                    if victim in chord.route("s0", p).visited[1:])
    procs[victim].send_signal(signal.SIGTERM)
    assert procs[victim].wait(10) == 0

    async def go():
        pool = RpcPool(timeout=3)
        try:
            with pytest.raises(RpcError, match="peer failed"):
                await pool.call(members.lookup["s0"], "CHORD", pos)
            assert await pool.call(members.lookup["s0"], "PING") == b"PONG"
        finally:
            pool.close()
    run(go())
