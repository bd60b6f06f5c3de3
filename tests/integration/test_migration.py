"""Loss-free migration between two real agents under concurrent writers.

The test plays the controller: a routing table (block -> agent) stands in
for the switches' flow entries and is swapped at the moment the controller
would swap flows, sometimes before the cut-over (the target answers MOVED
until it owns the block) and sometimes after it (the old owner answers
MOVED to stragglers). Four writers put and delete their own paths and record
only what was acknowledged; at the end every acknowledged write must be
readable at its owner, and nothing else may exist anywhere.
"""

from __future__ import annotations

import random
import threading

import pytest

from client_lib.cidr import Block
from client_lib.client import MetaFlowClient, RetryPolicy
from client_lib.mdid import mdid
from mininet_scenarios.daemons import AgentProcess

SPACE = Block.parse("100.64.0.0/10")
ROOT = Block(SPACE.first, SPACE.plen)
MIGRATIONS = 50
WRITERS = 4


class Routes:
    """The test's stand-in for the flow tables: disjoint blocks -> (host, port)."""

    def __init__(self, owner: tuple[str, int]) -> None:
        self._lock = threading.Lock()
        self._table: dict[Block, tuple[str, int]] = {ROOT: owner}

    def __call__(self, address: str) -> tuple[str, int]:
        ident = int.from_bytes(bytes(map(int, address.split("."))), "big")
        with self._lock:
            return next(dest for block, dest in self._table.items() if block.contains(ident))

    def move(self, block: Block, dest: tuple[str, int]) -> None:
        """Route `block` to `dest`, splitting whichever entry holds it."""
        with self._lock:
            holder = next(b for b in self._table if b.covers(block))
            old = self._table.pop(holder)
            rest = [holder]
            while block not in rest:
                parent = next(b for b in rest if b.covers(block))
                rest.remove(parent)
                rest.extend(parent.halves())
            for b in rest:
                self._table[b] = dest if b == block else old


def _writer(n: int, routes: Routes, stop: threading.Event, acked: dict[str, bytes | None],
            errors: list[BaseException], stats: list) -> None:
    rng = random.Random(n)
    client = MetaFlowClient(space=SPACE, route=routes, timeout=5.0,
                            retry=RetryPolicy(attempts=200, base=0.002, cap=0.05))
    try:
        seq = 0
        while not stop.is_set():
            seq += 1
            path = f"/writer{n}/dir{rng.randrange(40)}/file{rng.randrange(60)}"
            if rng.random() < 0.15:
                client.delete(path)
                acked[path] = None
            else:
                value = f"{n}:{seq}".encode()
                client.put(path, value)
                acked[path] = value
    except BaseException as exc:  # reported by the test, not lost in a thread
        errors.append(exc)
    finally:
        stats.append(client.stats)
        client.close()


def _pick_block(rng: random.Random, owned: list[str]) -> Block:
    block = Block.parse(rng.choice(owned))
    for _ in range(rng.randrange(0, 4)):
        if block.plen >= 28:
            break
        block = rng.choice(block.halves())
    return block


@pytest.mark.timeout(300)
@pytest.mark.parametrize("kind", ["leveldb", "redis"])
def test_fifty_migrations_under_four_writers_lose_nothing(kind, tmp_path, request):
    def spec(name: str) -> str:
        if kind == "leveldb":
            return f"leveldb:{tmp_path / name}"
        return f"{request.getfixturevalue('redis_server')}/0?prefix={request.getfixturevalue('redis_prefix')}{name}:"

    with AgentProcess(spec("a"), own=[str(ROOT)], log_path=tmp_path / "a.log") as a, \
            AgentProcess(spec("b"), log_path=tmp_path / "b.log") as b:
        agents = [a, b]
        routes = Routes((a.host, a.port))
        stop = threading.Event()
        acked: list[dict[str, bytes | None]] = [{} for _ in range(WRITERS)]
        errors: list[BaseException] = []
        stats: list = []
        threads = [threading.Thread(target=_writer, args=(n, routes, stop, acked[n], errors, stats))
                   for n in range(WRITERS)]
        for t in threads:
            t.start()
        rng = random.Random(7)
        outcomes = {"committed": 0, "aborted": 0}
        try:
            for i in range(MIGRATIONS):
                owned = {p: p.call("GET", "/health")[1]["owned"] for p in agents}
                source = rng.choice([p for p in agents if owned[p]])
                target = b if source is a else a
                block = _pick_block(rng, owned[source])
                status, mig = source.call("POST", "/migrations",
                                          {"blocks": [str(block)], "target": target.admin_url})
                assert status == 200, mig
                if rng.random() < 0.1:  # a controller that changes its mind
                    status, body = source.call("POST", f"/migrations/{mig['id']}/abort")
                    assert status == 200 and body["state"] == "aborted"
                    outcomes["aborted"] += 1
                    continue
                swap_first = i % 2 == 0
                if swap_first:  # flows first: the target answers MOVED until it owns
                    routes.move(block, (target.host, target.port))
                status, body = source.call("POST", f"/migrations/{mig['id']}/commit")
                assert status == 200 and body["state"] == "committed", body
                if not swap_first:  # flows late: the old owner answers MOVED meanwhile
                    threading.Event().wait(0.02)
                    routes.move(block, (target.host, target.port))
                outcomes["committed"] += 1
        finally:
            stop.set()
            for t in threads:
                t.join(60)
        assert not errors, errors
        assert outcomes["committed"] >= 40

        # Every acknowledged write is readable where the routes send it...
        expected = {path: value for log in acked for path, value in log.items()}
        live = {path: value for path, value in expected.items() if value is not None}
        assert len(live) > 500
        with MetaFlowClient(space=SPACE, route=routes, retry=RetryPolicy(3)) as client:
            for path, value in expected.items():
                assert client.get(path) == value, path
        # ...and nothing else exists: each agent holds exactly the keys of its blocks.
        held = 0
        for proc in agents:
            health = proc.call("GET", "/health")[1]
            blocks = proc.call("GET", "/blocks")[1]
            assert health["frozen"] == []
            assert health["keys"] == blocks["total"], f"{proc.name} holds keys outside its blocks"
            held += health["keys"]
            for path in live:
                if any(Block.parse(o).contains(mdid(path, SPACE)) for o in health["owned"]):
                    assert routes(SPACE.address(mdid(path, SPACE))) == (proc.host, proc.port)
        assert held == len(live)
        # The clients really went through both kinds of refusal and retried.
        assert sum(s.moved for s in stats) > 0 and sum(s.tryagain for s in stats) > 0


def test_a_target_that_dies_leaves_the_source_owning_and_serving(tmp_path):
    with AgentProcess(f"leveldb:{tmp_path / 'a'}", own=[str(ROOT)], log_path=tmp_path / "a.log") as a:
        b = AgentProcess(f"leveldb:{tmp_path / 'b'}", log_path=tmp_path / "b.log").start()
        route = lambda _address: (a.host, a.port)  # noqa: E731
        with MetaFlowClient(space=SPACE, route=route) as client:
            paths = [f"/keep/{i}" for i in range(300)]
            for path in paths:
                client.put(path, path.encode())
            half = ROOT.halves()[1]
            status, mig = a.call("POST", "/migrations", {"blocks": [str(half)], "target": b.admin_url})
            assert status == 200 and mig["state"] == "copied" and mig["keys"] > 100
            b.kill()  # the target dies between the copy and the cut-over
            status, body = a.call("POST", f"/migrations/{mig['id']}/commit")
            assert status == 502 and "cut-over failed" in body["error"]
            health = a.call("GET", "/health")[1]
            assert health["owned"] == [str(ROOT)] and health["frozen"] == []
            assert all(client.get(p) == p.encode() for p in paths)
            client.put(paths[0], b"writable again")  # unfrozen
            assert client.get(paths[0]) == b"writable again"
            # and a target that is not there at all: refused before anything is frozen for long
            status, body = a.call("POST", "/migrations", {"blocks": [str(half)], "target": b.admin_url})
            assert status == 502 and "copy failed" in body["error"]
            assert a.call("GET", "/health")[1]["frozen"] == []
            assert a.call("GET", "/blocks")[1]["total"] == len(paths)
        assert "aborted" in a.log()
