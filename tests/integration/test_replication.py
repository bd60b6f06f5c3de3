"""Replicated blocks between real agents on loopback: the test plays the
controller (it assigns roles over the signed admin API, as the controller
would) and checks what issue 11 asks of the agent:

* a write is acknowledged only once the backup has it: kill -9 the primary
  while writers run, promote the backup, and every acknowledged write is there;
* a primary deposed by a newer epoch is fenced by its backup's answer and
  stops serving;
* a read never shows a write the set has not acknowledged (a backup that
  never answers: the write fails, the read does not see it);
* a sync under concurrent writes leaves both stores with the same records,
  at about the rate asked for;
* the replication listener takes commands only from an authenticated
  primary of the block at the epoch held.
"""

from __future__ import annotations

import itertools
import random
import socket
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from client_lib.api.admin import ADMIN, AssignRequest, Member, Role, SyncReport, SyncRequest
from client_lib.api.auth import Signer, Verifier, load_secret, write_secret
from client_lib.cidr import Block
from client_lib.client import MetaFlowClient, RetryPolicy
from client_lib.errors import ApiError, MetaFlowError, NamespaceError, Unavailable
from client_lib.mdid import entry_key, mdid
from client_lib.resp import ErrorReply, RespParser, SimpleString, encode_command
from mininet_scenarios.daemons import AgentProcess
from nat_agent.replication import check_hello, hello
from nat_agent.resp_commands import CommandParser, encode_reply
from nat_agent.store import Record
from tests.integration.agent_probe import stored_records
from tests.integration.resp_peer import Peer

SPACE = Block.parse("100.64.0.0/10")


def _client(agent: AgentProcess, attempts: int = 1, deadline: float = 10.0) -> MetaFlowClient:
    return MetaFlowClient(space=SPACE, route=lambda _address: (agent.host, agent.port), deadline=deadline,
                          retry=RetryPolicy(attempts, base=0.002, cap=0.02))


def _assign(agent: AgentProcess, epoch: int, members: list[Member], block: Block = SPACE) -> None:
    """Give `agent` its role in the set `members` (primary first)."""
    primary = members[0].name == agent.name
    agent.call(ADMIN.assign, AssignRequest([Role(block, epoch, primary, members)]))


def _pair(a: AgentProcess, b: AgentProcess, epoch: int = 1, synced: bool = True) -> list[Member]:
    """`a` the primary of SPACE and `b` its backup, at `epoch`: backups are
    assigned first, as the controller does."""
    members = [a.member(), b.member(synced)]
    _assign(b, epoch, members)
    _assign(a, epoch, members)
    return members


@contextmanager
def _agents(tmp_path: Path, secret: Path, *names: str, own: str | None = "a",
            extra: tuple[str, ...] = (), redis: str | None = None) -> Iterator[list[AgentProcess]]:
    """Agents named `names` (LevelDB stores, or prefixes of the redis-server
    at `redis`), the one named `own` the primary of the space at epoch 0."""
    def store(name: str) -> str:
        return f"leveldb:{tmp_path / name}" if redis is None else f"{redis}{name}:"

    procs = [AgentProcess(store(n), *extra, own=[str(SPACE)] if n == own else None,
                          log_path=tmp_path / f"{n}.log", secret_file=secret) for n in names]
    for proc in procs:
        proc.launch()
    try:
        for proc in procs:
            proc.wait_ready()
        yield procs
    except BaseException:
        for proc in procs:
            proc.kill()
        raise
    for proc in procs:
        proc.terminate()
    for proc in procs:
        assert proc.stop() == 0, f"{proc.name} did not exit cleanly: {proc.log()[-2000:]}"


def _scan(path: Path) -> list[Record]:
    return stored_records(path, SPACE)


def _until(condition: Callable[[], bool], timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out waiting"
        time.sleep(0.05)


# -- acknowledged means on the backup -------------------------------------------------


@pytest.mark.parametrize("kind", ["leveldb", "redis"])
def test_every_acknowledged_write_survives_a_kill_of_the_primary(kind: str, tmp_path: Path,
                                                                 cluster_secret: Path,
                                                                 request: pytest.FixtureRequest) -> None:
    redis = None
    if kind == "redis":
        server, prefix = request.getfixturevalue("redis_server"), request.getfixturevalue("redis_prefix")
        redis = f"{server}/0?prefix={prefix}"
    with _agents(tmp_path, cluster_secret, "a", "b", redis=redis) as (a, b):
        _pair(a, b)
        acked: dict[str, bytes | None] = {}
        doubtful: dict[str, bytes | None] = {}   # the write under way when the primary died
        stop = threading.Event()
        lock = threading.Lock()

        def writer(n: int) -> None:
            rng = random.Random(n)
            with _client(a, attempts=1, deadline=5) as client:
                seq = 0
                while not stop.is_set():
                    seq += 1
                    path = f"/w{n}/{rng.randrange(200)}"
                    value = None if rng.random() < 0.1 else f"{n}:{seq}".encode()
                    try:
                        client.put(path, value) if value is not None else client.delete(path)
                    except MetaFlowError:
                        with lock:
                            doubtful[path] = value
                        return
                    with lock:
                        acked[path] = value

        threads = [threading.Thread(target=writer, args=(n,)) for n in range(4)]
        for t in threads:
            t.start()
        _until(lambda: len(acked) > 300)
        time.sleep(0.5)
        a.kill()   # kill -9, writers in full flight
        stop.set()
        for t in threads:
            t.join(30)
        assert len(acked) > 300
        _assign(b, 2, [b.member()])   # the controller promotes the backup (a set of one for now)
        with _client(b, attempts=3) as client:
            for path, value in acked.items():
                got = client.get(path)
                assert got == value or (path in doubtful and got == doubtful[path]), path
        a.launch().wait_ready()   # so that the harness stops it cleanly


# -- fencing ------------------------------------------------------------------------


def test_a_primary_deposed_by_a_newer_epoch_is_fenced_by_its_backup(tmp_path: Path,
                                                                   cluster_secret: Path) -> None:
    with _agents(tmp_path, cluster_secret, "a", "b") as (a, b):
        _pair(a, b)
        with _client(a) as client:
            client.put("/fence/x", b"before")
        _assign(b, 2, [b.member(), a.member()])   # b is the primary at epoch 2; nobody tells a
        with _client(a) as client:
            with pytest.raises(Unavailable, match="TRYAGAIN.*not acknowledged.*STALE 2"):
                client.put("/fence/x", b"from the deposed primary")
            with pytest.raises(Unavailable, match="TRYAGAIN.*fenced"):
                client.get("/fence/x")         # and it no longer serves reads either
            with pytest.raises(Unavailable, match="TRYAGAIN.*fenced"):
                client.put("/fence/y", b"another key")
        assert a.call(ADMIN.stats).service["replication_fenced"] == 1
        with pytest.raises(ApiError, match="fenced") as refused:   # a deposed primary copies nothing
            a.call(ADMIN.sync, SyncRequest(SPACE, 1, b.name, 100))
        assert refused.value.status == 409
        with _client(b) as client:
            assert client.get("/fence/x") == b"before"
        # the controller reassigns a (a backup now): it answers MOVED and applies b's stream
        _assign(a, 2, [b.member(), a.member()])
        with _client(b) as client:
            client.put("/fence/x", b"after")
        assert a.call(ADMIN.blocks).total == 1 and a.call(ADMIN.stats).service["replica_applied"] == 1


# -- reads never see an unacknowledged write ----------------------------------------------


def silent_replica(secret: bytes, commands: list[list[bytes]]) -> Peer:
    """A replication listener holding the cluster's secret that answers the
    handshake and then never answers a command (a hung backup); what it is
    sent goes to `commands`."""
    def behaviour(conn: socket.socket) -> None:
        parser = CommandParser(max_bulk=1 << 21)
        while data := conn.recv(65536):
            parser.feed(data)
            while (command := parser.next_command()) is not None:
                if command[0] == b"AUTH":
                    conn.sendall(encode_reply(check_hello(verifier, command[1:])[1]))
                else:
                    commands.append(command)

    peer = Peer(behaviour)
    verifier = Verifier(secret, peer.via)
    return peer


def test_a_read_never_sees_a_write_the_set_did_not_acknowledge(tmp_path: Path, cluster_secret: Path) -> None:
    sent: list[list[bytes]] = []
    with silent_replica(load_secret(cluster_secret), sent) as silent, \
            _agents(tmp_path, cluster_secret, "a", extra=("--replication-timeout", "1")) as (a,):
        with _client(a) as client:
            client.put("/read/x", b"old")
        members = [a.member(), Member("hung", silent.via)]
        _assign(a, 1, members)
        outcome: dict[str, object] = {}

        def write() -> None:
            started = time.monotonic()
            try:
                with _client(a) as client:
                    client.put("/read/x", b"new")
                outcome["write"] = "acknowledged"
            except Unavailable as exc:
                outcome["write"] = str(exc)
            outcome["write_s"] = time.monotonic() - started

        writing = threading.Thread(target=write)
        writing.start()
        _until(lambda: any(c[0] in (b"RSET", b"RMSET") for c in sent))   # the write is under way
        started = time.monotonic()
        with _client(a) as client, pytest.raises(Unavailable, match="TRYAGAIN.*degraded"):
            client.get("/read/x")     # waits for the write's end: failed, so the block is held back
        waited = time.monotonic() - started
        writing.join(10)
        assert "not acknowledged" in str(outcome["write"]) and "within 1 s" in str(outcome["write"])
        assert 0.9 < float(outcome["write_s"]) < 5  # type: ignore[arg-type]
        assert waited > 0.5   # the read was held until the write ended, and never saw "new"
        # The controller re-syncs under a newer epoch (here: the hung member is dropped).
        _assign(a, 2, [a.member()])
        with _client(a) as client:
            value = client.get("/read/x")
        # An unacknowledged write may take effect or not; here it did, on the one copy left.
        assert value == b"new"


# -- re-replication --------------------------------------------------------------------


def test_a_sync_under_concurrent_writes_leaves_identical_stores(tmp_path: Path, cluster_secret: Path) -> None:
    rate = 2000
    with _agents(tmp_path, cluster_secret, "a", "b") as (a, b):
        with _client(a) as client:
            for i in range(4000):
                client.put(f"/sync/{i}", b"v0")
        _assign(b, 0, [b.member()])   # b held the block once, and kept records the set no longer has
        with _client(b) as client:
            for i in range(300):
                client.put(f"/stale/{i}", b"old life")
        _pair(a, b, synced=False)   # b joins unsynced (keeping what it held): streamed to, not waited for
        stop = threading.Event()
        written = [0]

        def writer(n: int) -> None:
            rng = random.Random(n)
            with _client(a, attempts=20) as client:
                while not stop.is_set():
                    path = f"/sync/{rng.randrange(5000)}"   # existing keys and new ones
                    if rng.random() < 0.2:
                        client.delete(path)
                    else:
                        client.put(path, f"{n}:{rng.random()}".encode())
                    written[0] += 1

        threads = [threading.Thread(target=writer, args=(n,)) for n in range(3)]
        for t in threads:
            t.start()
        time.sleep(0.3)
        report = a.call(ADMIN.sync, SyncRequest(SPACE, 1, b.name, rate))
        assert report.state == "copying"
        done: list[SyncReport] = []

        def finished() -> bool:
            done[:] = [s for s in a.call(ADMIN.syncs).syncs if s.member == b.name and s.state != "copying"]
            return bool(done)

        _until(finished, timeout=60)
        time.sleep(0.5)   # writes go on, now waiting for b too
        stop.set()
        for t in threads:
            t.join(30)
        sync = done[0]
        assert sync.state == "synced" and sync.error is None, sync
        assert sync.records >= 3000
        assert sync.seconds > 0.8 * sync.records / rate, sync        # the rate was respected...
        assert sync.seconds < 3 * sync.records / rate + 5, sync      # ...and not far undershot
        assert written[0] > 200
        primary = a.call(ADMIN.health).roles[0]
        assert primary.members[1].synced   # synced at the primary, in its role too
        # the same request again answers the finished sync
        assert a.call(ADMIN.sync, SyncRequest(SPACE, 1, b.name, rate)).state == "synced"
    records = _scan(tmp_path / "a")
    assert len(records) > 3000 and records == _scan(tmp_path / "b")


def test_a_sync_to_a_member_that_goes_away_fails_and_drops_it(tmp_path: Path, cluster_secret: Path) -> None:
    with _agents(tmp_path, cluster_secret, "a", "b") as (a, b):
        with _client(a) as client:
            for i in range(2000):
                client.put(f"/gone/{i}", b"x")
        _pair(a, b, synced=False)
        a.call(ADMIN.sync, SyncRequest(SPACE, 1, b.name, 500))
        time.sleep(0.5)
        b.kill()
        _until(lambda: a.call(ADMIN.syncs).syncs[0].state != "copying")
        sync = a.call(ADMIN.syncs).syncs[0]
        assert sync.state == "failed" and sync.error and 0 < sync.records < 2000
        with _client(a) as client:   # the unsynced member is not waited for: writes go on
            client.put("/gone/0", b"still writable")
        with pytest.raises(ApiError) as refused:   # not the primary at that epoch
            a.call(ADMIN.sync, SyncRequest(SPACE, 7, b.name, 500))
        assert refused.value.status == 409
        with pytest.raises(ApiError) as refused:   # not a member
            a.call(ADMIN.sync, SyncRequest(SPACE, 1, "nobody", 500))
        assert refused.value.status == 400
        b.launch().wait_ready()


# -- the listener -----------------------------------------------------------------------


def _raw(address: str, payload: bytes, replies: int) -> list[object]:
    host, port = address.rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=5) as sock:
        sock.sendall(payload)
        parser = RespParser()
        out: list[object] = []
        while len(out) < replies:
            data = sock.recv(65536)
            if not data:
                break
            parser.feed(data)
            while len(out) < replies and (reply := parser.next_reply())[0]:
                out.append(reply[1])
        return out


def test_the_listener_applies_only_what_the_primary_of_the_epoch_sends(tmp_path: Path,
                                                                       cluster_secret: Path) -> None:
    secret = load_secret(cluster_secret)
    with _agents(tmp_path, cluster_secret, "a", "b") as (a, b):
        _pair(a, b, epoch=3)
        ident = mdid("/listener", SPACE)
        rset = encode_command("RSET", str(SPACE), 3, ident, "/listener", "forged")
        # no handshake: refused and closed
        answer = _raw(b.replication, rset, 2)
        assert len(answer) == 1 and isinstance(answer[0], ErrorReply) and "must be AUTH" in answer[0].message
        # another secret
        stranger, _ = hello(Signer(load_secret(write_secret(tmp_path / "other"))), a.name, b.replication)
        answer = _raw(b.replication, stranger + rset, 2)
        assert len(answer) == 1 and isinstance(answer[0], ErrorReply) and "bad signature" in answer[0].message
        # the cluster's secret, as a's name: applied at epoch 3, STALE at another
        auth, _ = hello(Signer(secret), a.name, b.replication)
        stale = encode_command("RSET", str(SPACE), 2, ident, "/listener", "old epoch")
        answer = _raw(b.replication, auth + rset + stale, 3)
        assert isinstance(answer[0], SimpleString)
        assert answer[1:] == [SimpleString("OK"), ErrorReply("STALE 3")]
        # the same handshake again: a replay
        answer = _raw(b.replication, auth + rset, 2)
        assert len(answer) == 1 and "replay" in str(answer[0])
        # an authenticated agent that is not the primary of the block
        other, _ = hello(Signer(secret), "someone-else", b.replication)
        answer = _raw(b.replication, other + rset, 2)
        assert isinstance(answer[1], ErrorReply) and "not the primary" in answer[1].message
        assert b.call(ADMIN.blocks).total == 1
        with _client(a) as client:   # b holds it as a backup: clients are sent to the primary
            assert client.get("/listener") is None   # a never wrote it: only b has the forged-by-a copy
        assert b.call(ADMIN.stats).service["replica_refused"] == 2


def test_an_rmset_is_applied_whole_or_not_at_all(tmp_path: Path, cluster_secret: Path) -> None:
    """A worker's turn reaches a backup as one RMSET: every record is checked
    as an RSET is before any is applied."""
    secret = load_secret(cluster_secret)
    paths = [f"/turn/{i}" for i in range(5)]
    with _agents(tmp_path, cluster_secret, "a", "b") as (a, b):
        _pair(a, b, epoch=3)
        auth, _ = hello(Signer(secret), a.name, b.replication)

        def rmset(epoch: int, records: list[tuple[int, str]]) -> bytes:
            return encode_command("RMSET", str(SPACE), epoch,
                                  *(part for ident, path in records for part in (ident, path, path + "=v")))

        held = [(mdid(p, SPACE), p) for p in paths]
        outside = (SPACE.last + 1, "/turn/outside")   # not in the block
        frames = [rmset(3, held[:2] + [outside]), rmset(2, held[2:3]),
                  encode_command("RMSET", str(SPACE), 3, held[3][0], held[3][1]),   # a record cut short
                  rmset(3, held[3:])]
        answer = _raw(b.replication, auth + b"".join(frames), 5)
        assert isinstance(answer[0], SimpleString)
        assert isinstance(answer[1], ErrorReply) and answer[1].code == "NOTHELD"
        assert answer[2] == ErrorReply("STALE 3")
        assert isinstance(answer[3], ErrorReply) and "wrong number of arguments" in answer[3].message
        assert answer[4] == SimpleString("OK")
        assert b.call(ADMIN.stats).service["replica_refused"] == 2
    assert {(path, value) for _, path, value in _scan(tmp_path / "b")} == \
        {(p, (p + "=v").encode()) for p in paths[3:]}


def test_a_turn_of_the_workers_loses_nothing_when_its_backup_is_killed(tmp_path: Path,
                                                                         cluster_secret: Path) -> None:
    """Writers on the primary's worker thread (their SETs are its turns'
    RMSETs) and readers, while the backup is killed -9: every write
    acknowledged is on the backup's disk, no read ever returns a value whose
    write was not acknowledged, and after the kill nothing more is."""
    rng = random.Random(7)
    with _agents(tmp_path, cluster_secret, "a", "b", extra=("--replication-timeout", "1")) as (a, b):
        _pair(a, b)
        started: list[str] = []        # paths whose write began (each path written once)
        acked: set[str] = set()
        refused: set[str] = set()
        seen: list[tuple[str, bytes]] = []
        stop = threading.Event()
        killed_at: list[float] = []

        def writer(n: int) -> None:
            with _client(a) as client:
                for i in itertools.count():
                    if stop.is_set():
                        return
                    path = f"/vanish/{n}/{i}"
                    started.append(path)
                    try:
                        client.put(path, path.encode())
                        acked.add(path)
                    except Unavailable:
                        refused.add(path)

        def reader() -> None:
            with _client(a) as client:
                while not stop.is_set():
                    if not started:
                        continue
                    path = started[rng.randrange(len(started))]
                    try:
                        value = client.get(path)
                    except Unavailable:
                        continue
                    if value is not None:
                        seen.append((path, value))

        threads = [threading.Thread(target=writer, args=(n,)) for n in range(6)]
        threads += [threading.Thread(target=reader) for _ in range(2)]
        for t in threads:
            t.start()
        time.sleep(1.0)
        b.kill()
        killed_at.append(len(acked))
        time.sleep(1.5)
        stop.set()
        for t in threads:
            t.join(15)
        turns = a.call(ADMIN.stats).service["replication_worker_records"]
        b.launch().wait_ready()   # so that it stops cleanly with the rest
    assert turns > 0, "the writes did not go through the workers' turns"
    assert killed_at[0] > 50, "too few writes acknowledged before the kill to mean anything"
    assert refused, "no write failed after the backup was killed"
    on_backup = {path for _, path, _ in _scan(tmp_path / "b")}
    assert acked <= on_backup, sorted(acked - on_backup)[:5]
    assert all(path in acked and value == path.encode() for path, value in seen), \
        [(p, v) for p, v in seen if p not in acked][:5]


# -- roles on a real agent ---------------------------------------------------------------


def test_an_exclusive_assignment_drops_and_deletes_every_other_block(tmp_path: Path,
                                                                     cluster_secret: Path) -> None:
    low, high = SPACE.halves()
    with _agents(tmp_path, cluster_secret, "a") as (a,):
        paths = [f"/excl/{i}" for i in range(300)]
        with _client(a) as client:
            for path in paths:
                client.put(path, b"x")
        kept = [p for p in paths if low.contains(mdid(p, SPACE))]
        a.call(ADMIN.assign, AssignRequest([Role(low, 2, True, [a.member()])], exclusive=True))
        health = a.call(ADMIN.health)
        assert health.owned == [low] and [r.block for r in health.roles] == [low]
        assert health.keys == len(kept) == a.call(ADMIN.blocks).total
        with _client(a) as client:
            assert all(client.get(p) == b"x" for p in kept)
            gone = next(p for p in paths if high.contains(mdid(p, SPACE)))
            with pytest.raises(Unavailable, match="MOVED"):
                client.get(gone)
        # taking the high half again later: nothing of the old records comes back
        a.call(ADMIN.assign, AssignRequest([Role(high, 3, True, [a.member()])]))
        with _client(a) as client:
            assert client.get(gone) is None


def test_entries_directories_and_compare_and_set_live_on_the_backup_too(tmp_path: Path,
                                                                        cluster_secret: Path) -> None:
    """A directory's entries, its header, a compare-and-set and a
    compare-and-delete go through the
    replica set like any write: after a kill -9 of the primary the promoted
    backup lists the same entries, knows which directories were removed, and
    holds the value the winning update wrote."""
    with _agents(tmp_path, cluster_secret, "a", "b") as (a, b):
        _pair(a, b)
        with _client(a) as client:
            for i in range(25):
                assert client.create(entry_key("/d", f"f{i:02}"), b"%d" % i)
            assert not client.create(entry_key("/d", "f00"), b"again")
            assert client.compare_and_set("/v", b"", b"x") is False      # absent is not b""
            client.put("/v", b"v1")
            assert client.compare_and_set("/v", b"v1", b"v2")
            assert not client.compare_and_set("/v", b"v1", b"v3")
            listed = client.entries("/d")
            assert client.create("/gone", b"header") and client.create_entry("/gone", "x", b"1")
            assert client.delete(entry_key("/gone", "x")) and client.remove_directory("/gone")
            assert client.create("/kept", b"header") and client.create_entry("/kept", "y", b"2")
            client.put("/once", b"o1")
            client.put("/twice", b"t1")
            assert not client.delete_if_equal("/twice", b"t0") and client.delete_if_equal("/once", b"o1")
        assert listed == [(b"f%02d" % i, b"%d" % i) for i in range(25)]
        a.kill()
        _assign(b, 2, [b.member()])
        with _client(b, attempts=3) as client:
            assert client.entries("/d") == listed
            assert client.get("/v") == b"v2"
            assert client.get("/gone") is None and client.entries("/gone") == []
            with pytest.raises(NamespaceError):
                client.create_entry("/gone", "z", b"")
            assert client.entries("/kept") == [(b"y", b"2")]
            assert client.get("/once") is None and client.get("/twice") == b"t1"
        a.launch().wait_ready()
