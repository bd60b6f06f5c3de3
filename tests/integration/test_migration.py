"""Migrations between real agents: loss-free under concurrent writers, to
every member of a new replica set, and safe whatever a target or the
controller does (dies, falls silent, does not hold the secret, never
commits).

The test plays the controller: it assigns the targets their roles (with the
migration's id, which keeps the imported records) before it commits, as the
controller does, and a routing table (block -> agent) stands in for the
switches' flow entries, swapped at the moment the controller would swap
flows, sometimes before the source's commit and sometimes after it (the old
owner answers MOVED to stragglers). Four writers put and delete their own
paths and record only what was acknowledged; at the end every acknowledged
write must be readable at its owner, and nothing else may exist anywhere.
"""

from __future__ import annotations

import random
import socket
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from client_lib.api.admin import (
    ADMIN,
    AssignRequest,
    Discarded,
    DisownReply,
    Health,
    Importing,
    ImportProgress,
    MigrateRequest,
    MigrationReport,
    Role,
)
from client_lib.api.auth import load_secret
from client_lib.cidr import Block
from client_lib.client import MetaFlowClient, RetryPolicy, Unavailable
from client_lib.constants import MAX_VALUE
from client_lib.errors import ApiError, Conflict, NotFound
from client_lib.mdid import mdid
from client_lib.resp import encode_command
from client_lib.server.api import Call
from mininet_scenarios.daemons import AgentProcess
from tests.integration.fake_api import FakeApi, Listener

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
    client = MetaFlowClient(space=SPACE, route=routes, timeout=5.0, deadline=30.0,
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


def _take(targets: list[AgentProcess], block: Block, epoch: int, migration: str | None = None) -> None:
    """What the controller does before it commits: every target gets its role
    in the block's new set (the first is the primary), keeping the import."""
    members = [t.member() for t in targets]
    for i, target in enumerate(targets):
        target.call(ADMIN.assign, AssignRequest([Role(block, epoch, i == 0, members)], migration))


def _pick_block(rng: random.Random, owned: list[Block]) -> Block:
    block = rng.choice(owned)
    for _ in range(rng.randrange(0, 4)):
        if block.plen >= 28:
            break
        block = rng.choice(block.halves())
    return block


@pytest.mark.timeout(300)
@pytest.mark.parametrize("kind", ["leveldb", "redis", "leveldb-threads"])
def test_fifty_migrations_under_four_writers_lose_nothing(kind: str, tmp_path: Path,
                                                          request: pytest.FixtureRequest,
                                                          cluster_secret: Path) -> None:
    """``leveldb-threads``: the port served by worker threads whose lane
    writes without waiting for a sync (``--fsync off``), so writes race the
    freeze from other threads, and only the gate (`ServiceLoop.barrier`)
    keeps a copy from missing one."""
    def spec(name: str) -> str:
        if kind.startswith("leveldb"):
            return f"leveldb:{tmp_path / name}"
        prefix = request.getfixturevalue("redis_prefix")
        return f"{request.getfixturevalue('redis_server')}/0?prefix={prefix}{name}:"

    extra = ("--workers", "2", "--fsync", "off") if kind == "leveldb-threads" else ()
    with AgentProcess(spec("a"), *extra, own=[str(ROOT)], log_path=tmp_path / "a.log",
                      secret_file=cluster_secret) as a, \
            AgentProcess(spec("b"), *extra, log_path=tmp_path / "b.log", secret_file=cluster_secret) as b:
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
                owned = {p: p.call(ADMIN.health).owned for p in agents}
                source = rng.choice([p for p in agents if owned[p]])
                target = b if source is a else a
                block = _pick_block(rng, owned[source])
                mig = source.call(ADMIN.migrate, MigrateRequest([block], [target.admin_url]))
                assert mig.state == "copied" and mig.lease_left_s is not None
                if rng.random() < 0.1:  # a controller that changes its mind
                    assert source.call(ADMIN.abort, id=mig.id).state == "aborted"
                    outcomes["aborted"] += 1
                    continue
                _take([target], block, i + 1, mig.id)
                swap_first = i % 2 == 0
                if swap_first:  # flows first: the source still answers, frozen, until it commits
                    routes.move(block, (target.host, target.port))
                assert source.call(ADMIN.commit, id=mig.id).state == "committed"
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
            health = proc.call(ADMIN.health)
            assert health.frozen == [] and health.imports == []
            assert health.keys == proc.call(ADMIN.blocks).total, f"{proc.name} holds keys outside its blocks"
            held += health.keys
            for path in live:
                if any(o.contains(mdid(path, SPACE)) for o in health.owned):
                    assert routes(SPACE.address(mdid(path, SPACE))) == (proc.host, proc.port)
        assert held == len(live)
        if kind == "leveldb-threads":   # the threads' lane answered writes, not only the event loop
            assert sum(p.call(ADMIN.stats).service.get("compiled_requests", 0) for p in agents) > 1000
        # The clients really went through both kinds of refusal and retried.
        assert sum(s.moved for s in stats) > 0 and sum(s.tryagain for s in stats) > 0


def test_a_target_that_dies_leaves_the_source_owning_and_serving(tmp_path, cluster_secret):
    """The target dies between the copy and its assignment: the controller's
    /assign fails, it aborts, and the source serves on (nothing was deleted)."""
    with AgentProcess(f"leveldb:{tmp_path / 'a'}", own=[str(ROOT)], log_path=tmp_path / "a.log",
                      secret_file=cluster_secret) as a:
        b = AgentProcess(f"leveldb:{tmp_path / 'b'}", log_path=tmp_path / "b.log",
                         secret_file=cluster_secret).start()
        route = lambda _address: (a.host, a.port)  # noqa: E731
        with MetaFlowClient(space=SPACE, route=route) as client:
            paths = [f"/keep/{i}" for i in range(300)]
            for path in paths:
                client.put(path, path.encode())
            half = ROOT.halves()[1]
            mig = a.call(ADMIN.migrate, MigrateRequest([half], [b.admin_url]))
            assert mig.state == "copied" and mig.keys > 100
            b.kill()  # the target dies between the copy and the cut-over
            with pytest.raises(ApiError):
                _take([b], half, 1, mig.id)
            assert a.call(ADMIN.abort, id=mig.id).state == "aborted"
            health = a.call(ADMIN.health)
            assert health.owned == [ROOT] and health.frozen == []
            assert all(client.get(p) == p.encode() for p in paths)
            client.put(paths[0], b"writable again")  # unfrozen
            assert client.get(paths[0]) == b"writable again"
            # and a target that is not there at all: refused before anything is frozen
            with pytest.raises(ApiError, match="before anything was frozen") as failed:
                a.call(ADMIN.migrate, MigrateRequest([half], [b.admin_url]))
            assert failed.value.status == 502
            assert a.call(ADMIN.health).frozen == []
            assert a.call(ADMIN.blocks).total == len(paths)
            reports = {m.id: m for m in a.call(ADMIN.migrations).migrations}
            assert reports[mig.id].state == "aborted" and reports[mig.id].error == "aborted by request"
        assert "did not confirm the discard" in a.log()


def _wait_state(agent: AgentProcess, ident: str, state: str, timeout: float) -> MigrationReport:
    deadline = time.monotonic() + timeout
    while (report := agent.call(ADMIN.migration, id=ident)).state != state:
        assert time.monotonic() < deadline, f"migration {ident} still {report.state} after {timeout} s"
        time.sleep(0.05)
    return report


def _client(agent: AgentProcess, attempts: int = 10) -> MetaFlowClient:
    return MetaFlowClient(space=SPACE, route=lambda _address: (agent.host, agent.port),
                          retry=RetryPolicy(attempts))


def test_a_migration_nobody_commits_aborts_when_its_lease_runs_out(tmp_path, cluster_secret):
    """A controller killed between the copy and the commit: the blocks are
    writable again after the lease, and the target keeps nothing."""
    half = ROOT.halves()[1]
    with AgentProcess(f"leveldb:{tmp_path / 'a'}", own=[str(ROOT)], log_path=tmp_path / "a.log",
                      secret_file=cluster_secret) as a, \
            AgentProcess(f"leveldb:{tmp_path / 'b'}", log_path=tmp_path / "b.log",
                         secret_file=cluster_secret) as b, _client(a, attempts=1) as client:
        paths = [f"/lease/{i}" for i in range(200)]
        for path in paths:
            client.put(path, b"before")
        moving = [p for p in paths if half.contains(mdid(p, SPACE))]
        mig = a.call(ADMIN.migrate, MigrateRequest([half], [b.admin_url], lease_s=1.0))
        answered = time.monotonic()
        assert mig.state == "copied" and mig.keys == len(moving)
        assert mig.lease_left_s is not None and 0 < mig.lease_left_s <= 1.0
        assert b.call(ADMIN.health).imports == [mig.id]
        listed = a.call(ADMIN.migrations).migrations
        assert [m.id for m in listed] == [mig.id] and listed[0].lease_left_s is not None
        assert listed[0].lease_left_s <= mig.lease_left_s
        with pytest.raises(Unavailable):  # frozen, and nobody will commit
            client.put(moving[0], b"during")
        report = _wait_state(a, mig.id, "aborted", timeout=10)
        assert time.monotonic() - answered > 0.5
        assert "lease of 1 s expired" in (report.error or "") and report.lease_left_s is None
        client.put(moving[0], b"after")  # writable again, at the first attempt
        assert client.get(moving[0]) == b"after" and client.get(moving[1]) == b"before"
        assert a.call(ADMIN.health).frozen == []
        target = b.call(ADMIN.health)
        assert target.keys == 0 and target.imports == [] and target.owned == []
        with pytest.raises(Conflict, match="lease"):  # a controller that comes back too late
            a.call(ADMIN.commit, id=mig.id)
        assert a.call(ADMIN.abort, id=mig.id).state == "aborted"  # aborting again is harmless


def test_a_target_without_the_secret_receives_no_record(tmp_path, cluster_secret):
    """One target of the new set does not hold the secret: no target gets a record."""
    with Listener() as fake, AgentProcess(f"leveldb:{tmp_path / 'a'}", own=[str(ROOT)],
                                          secret_file=cluster_secret) as a, \
            AgentProcess(f"leveldb:{tmp_path / 'b'}", secret_file=cluster_secret) as b, \
            _client(a, 1) as client:
        for i in range(100):
            client.put(f"/secret/{i}", b"x")
        with pytest.raises(ApiError, match="not signed with the cluster's secret") as failed:
            a.call(ADMIN.migrate, MigrateRequest([ROOT], [b.admin_url, fake.url]))
        assert failed.value.status == 502
        assert [(method, path) for method, path, _ in fake.received] == [("GET", "/health")]
        assert b.call(ADMIN.health).imports == [] and b.call(ADMIN.health).keys == 0
        assert a.call(ADMIN.health).frozen == [] and a.call(ADMIN.migrations).migrations == []
        client.put("/secret/0", b"still writable")
        assert a.call(ADMIN.blocks).total == 100


def test_an_agent_refuses_itself_and_impossible_migrations_as_a_target(tmp_path):
    with AgentProcess(f"leveldb:{tmp_path / 'a'}", own=[str(ROOT.halves()[0])]) as a:
        with pytest.raises(ApiError, match="own admin API") as failed:
            a.call(ADMIN.migrate, MigrateRequest([ROOT.halves()[0]], ["http://127.0.0.1:1", a.admin_url]))
        assert failed.value.status == 400
        # Another name for itself: signed requests are bound to the address they
        # are sent to, so the alias does not even pass the target check.
        with pytest.raises(ApiError, match="refused before anything was frozen") as failed:
            a.call(ADMIN.migrate, MigrateRequest([ROOT.halves()[0]], [f"http://localhost:{a.admin_port}"]))
        assert failed.value.status == 502
        other = "http://127.0.0.1:1"
        for request, status in ((MigrateRequest([], [other]), 400),
                                (MigrateRequest([ROOT.halves()[0]], []), 400),
                                (MigrateRequest([ROOT.halves()[0]], [other, other + "/"]), 400),
                                (MigrateRequest([ROOT.halves()[0]], [other], lease_s=0), 400),
                                (MigrateRequest([ROOT.halves()[0]], ["http://127.0.0.1:port"]), 400),
                                (MigrateRequest([ROOT.halves()[0]], ["ftp://127.0.0.1:1"]), 400),
                                (MigrateRequest([ROOT.halves()[1]], [other]), 409)):
            with pytest.raises(ApiError) as failed:
                a.call(ADMIN.migrate, request)
            assert failed.value.status == status, failed.value
        with pytest.raises(NotFound):
            a.call(ADMIN.migration, id="nope")
        assert a.call(ADMIN.health).frozen == []


def _target(secret: bytes, **answers: Callable[[Call], object]) -> FakeApi:
    """A stand-in target agent holding the cluster's secret: healthy, takes
    imports, and answers the routes in `answers` as the test says."""
    def handle(call: Call) -> object:
        name = next(n for n, r in vars(ADMIN).items() if r is call.route)
        if name in answers:
            return answers[name](call)
        if call.route is ADMIN.health:
            return Health("ok", "stand-in", "leveldb", SPACE, None, None, 9000, "http://x", 1, 0,
                          [], [], [], 0.0)
        if call.route is ADMIN.import_begin:
            return Importing(call.body.blocks)
        if call.route is ADMIN.import_records:
            return ImportProgress(len(call.body.records))
        if call.route is ADMIN.import_discard:
            return Discarded(call.params["id"])
        if call.route is ADMIN.disown:
            return DisownReply([], call.body.blocks)
        raise NotFound(f"the stand-in does not serve {call.route}")
    return FakeApi(ADMIN.ALL, secret, handle)


def _falls_silent(secret: bytes) -> FakeApi:
    """A stand-in target that takes the import and then never answers a batch."""
    def hang(call: Call) -> object:
        silent.release.wait(60)
        return ImportProgress(0)

    silent = _target(secret, import_records=hang)
    return silent


def test_a_target_that_falls_silent_mid_copy_cannot_keep_the_blocks_frozen(tmp_path, cluster_secret):
    with _falls_silent(load_secret(cluster_secret)) as silent, \
            AgentProcess(f"leveldb:{tmp_path / 'a'}", "--peer-timeout", "1", own=[str(ROOT)],
                         secret_file=cluster_secret) as a, _client(a, 1) as client:
        for i in range(50):
            client.put(f"/silent/{i}", b"x")
        started = time.monotonic()
        with pytest.raises(ApiError, match="timed out") as failed:
            a.call(ADMIN.migrate, MigrateRequest([ROOT], [silent.url]))
        assert failed.value.status == 502 and time.monotonic() - started < 8
        assert silent.routes_called() == [ADMIN.health, ADMIN.import_begin, ADMIN.import_records,
                                          ADMIN.import_discard]
        assert a.call(ADMIN.health).frozen == []
        client.put("/silent/0", b"writable")


def test_an_abort_during_the_copy_stops_it(tmp_path: Path, cluster_secret: Path) -> None:
    with _falls_silent(load_secret(cluster_secret)) as silent, \
            AgentProcess(f"leveldb:{tmp_path / 'a'}", "--peer-timeout", "30", own=[str(ROOT)],
                         secret_file=cluster_secret) as a, _client(a, 1) as client:
        client.put("/copying/0", b"x")
        outcome: list[BaseException] = []
        migrating = threading.Thread(target=lambda: outcome.extend(
            _raised(lambda: a.call(ADMIN.migrate, MigrateRequest([ROOT], [silent.url])))))
        migrating.start()
        deadline = time.monotonic() + 10
        while not (copying := [m for m in a.call(ADMIN.migrations).migrations if m.state == "copying"]):
            assert time.monotonic() < deadline
            time.sleep(0.05)
        started = time.monotonic()
        assert a.call(ADMIN.abort, id=copying[0].id).state == "aborted"
        migrating.join(10)
        assert time.monotonic() - started < 5  # not the 30 s peer timeout
        assert len(outcome) == 1 and "aborted by request during the copy" in str(outcome[0])
        assert a.call(ADMIN.health).frozen == []
        assert silent.routes_called()[-1] is ADMIN.import_discard
        client.put("/copying/0", b"writable")


def _raw(agent: AgentProcess, request: bytes) -> bytes:
    """One request on port 9000, and the reply's first line."""
    with socket.create_connection((agent.host, agent.port), timeout=5) as sock:
        sock.sendall(request)
        return sock.makefile("rb").readline()


def _raised(work: Callable[[], object]) -> list[BaseException]:
    try:
        work()
    except BaseException as exc:
        return [exc]
    return []


def test_a_migration_copies_to_every_member_of_the_new_set(tmp_path: Path, cluster_secret: Path) -> None:
    """A split target that is a replica set of two: both members get every
    record, the controller assigns them (primary and backup, keeping the
    import), the source commits, and the new set serves and replicates."""
    half = ROOT.halves()[1]
    a, b, c = (AgentProcess(f"leveldb:{tmp_path / n}", own=[str(ROOT)] if n == "a" else None,
                            log_path=tmp_path / f"{n}.log", secret_file=cluster_secret) for n in "abc")
    with a, b, c, _client(a) as client:
        paths = [f"/pair/{i}" for i in range(400)]
        for path in paths:
            client.put(path, path.encode())
        moving = [p for p in paths if half.contains(mdid(p, SPACE))]
        mig = a.call(ADMIN.migrate, MigrateRequest([half], [b.admin_url, c.admin_url]))
        assert mig.state == "copied" and mig.keys == len(moving) and mig.targets == [b.admin_url, c.admin_url]
        assert b.call(ADMIN.health).imports == [mig.id] == c.call(ADMIN.health).imports
        _take([b, c], half, 1, mig.id)
        _take([b, c], half, 1, mig.id)   # the controller heard no answer and asks again: a no-op
        with pytest.raises(NotFound):    # but not for a role it does not hold at that epoch
            _take([b, c], half, 2, mig.id)
        assert a.call(ADMIN.commit, id=mig.id).state == "committed"
        assert a.call(ADMIN.health).owned == [ROOT.halves()[0]]
        assert a.call(ADMIN.blocks).total == len(paths) - len(moving)
        for target, primary in ((b, True), (c, False)):
            health = target.call(ADMIN.health)
            assert health.imports == [] and health.keys == len(moving)
            assert [(r.block, r.epoch, r.primary) for r in health.roles] == [(half, 1, primary)]
        # a straggler is sent on to the new primary
        assert _raw(a, encode_command("GET", moving[0])) == f"-MOVED {mdid(moving[0], SPACE)} " \
            f"127.0.0.1:{b.port}\r\n".encode()
        with _client(b) as new:
            assert all(new.get(p) == p.encode() for p in moving)
            new.put(moving[0], b"after the move")   # acknowledged once c has it too
        assert c.call(ADMIN.stats).service["replica_applied"] == 1


def test_a_failed_target_aborts_the_copy_at_every_target(tmp_path: Path, cluster_secret: Path) -> None:
    with _falls_silent(load_secret(cluster_secret)) as silent, \
            AgentProcess(f"leveldb:{tmp_path / 'a'}", "--peer-timeout", "1", own=[str(ROOT)],
                         secret_file=cluster_secret) as a, \
            AgentProcess(f"leveldb:{tmp_path / 'b'}", secret_file=cluster_secret) as b, \
            _client(a, 1) as client:
        for i in range(50):
            client.put(f"/half/{i}", b"x")
        with pytest.raises(ApiError, match="timed out"):
            a.call(ADMIN.migrate, MigrateRequest([ROOT], [b.admin_url, silent.url]))
        assert silent.routes_called()[-1] is ADMIN.import_discard
        target = b.call(ADMIN.health)
        assert target.imports == [] and target.keys == 0
        assert a.call(ADMIN.health).frozen == []
        client.put("/half/0", b"writable")


def test_values_of_the_largest_size_migrate_in_bounded_batches(tmp_path, cluster_secret):
    """70 values of MAX_VALUE bytes are ~93 MiB as base64: more than one
    admin request may carry, so the copy must cut its batches by size."""
    value = bytes(range(256)) * (MAX_VALUE // 256)
    with AgentProcess(f"leveldb:{tmp_path / 'a'}", own=[str(ROOT)], secret_file=cluster_secret) as a, \
            AgentProcess(f"leveldb:{tmp_path / 'b'}", secret_file=cluster_secret) as b:
        paths = [f"/large/{i}" for i in range(70)]
        with _client(a) as client:
            for path in paths:
                client.put(path, value)
        mig = a.call(ADMIN.migrate, MigrateRequest([ROOT], [b.admin_url]))
        _take([b], ROOT, 1, mig.id)
        assert a.call(ADMIN.commit, id=mig.id).state == "committed" and mig.keys == len(paths)
        assert a.call(ADMIN.commit, id=mig.id).state == "committed"  # a retried commit
        with pytest.raises(Conflict, match="already committed"):
            a.call(ADMIN.abort, id=mig.id)
        assert a.call(ADMIN.health).keys == 0 and b.call(ADMIN.health).owned == [ROOT]
        with _client(b) as client:
            assert all(client.get(path) == value for path in paths)


def test_an_agent_stopped_with_a_copied_migration_leaves_no_copy_at_the_target(tmp_path, cluster_secret):
    with AgentProcess(f"leveldb:{tmp_path / 'b'}", secret_file=cluster_secret) as b:
        with AgentProcess(f"leveldb:{tmp_path / 'a'}", own=[str(ROOT)], secret_file=cluster_secret) as a:
            with _client(a) as client:
                for i in range(100):
                    client.put(f"/stopped/{i}", b"x")
            mig = a.call(ADMIN.migrate, MigrateRequest([ROOT], [b.admin_url]))
            assert b.call(ADMIN.health).imports == [mig.id]
        # SIGTERM (and exit 0, checked by AgentProcess) aborted it
        target = b.call(ADMIN.health)
        assert target.imports == [] and target.keys == 0
