"""`metaflowctl snapshot` and `restore` against real agents and a stand-in controller.

The agents are real (LevelDB, the admin API's ``POST /dump`` and ``POST
/load``, the replication stream); the controller is a `FakeApi` that answers
``GET /metaflow/servers`` from what the agents hold, as the real one's view
follows their roles. A snapshot of a cluster with a replicated block and a
directory is restored into a cluster of another shape and read back key by
key, backups included; a block that moves during its read is read again
from where it went; a corrupt snapshot, a non-empty cluster and an
unreachable controller are refused before anything is written.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any, TypeVar

import pytest

from client_lib.api.admin import (
    ADMIN,
    AssignRequest,
    DumpRequest,
    LoadRequest,
    MigrateRequest,
    Role,
    encode_records,
)
from client_lib.api.clients import ApiClient
from client_lib.api.rest import REST, ServerInfo, ServersView
from client_lib.api.route import Route
from client_lib.cidr import Block
from client_lib.client import MetaFlowClient, RetryPolicy
from client_lib.errors import ApiError, AuthError, Conflict
from client_lib.metadata import FileMetadata
from client_lib.server.api import Call
from controller.backup import restore, snapshot
from controller.ctl import main
from controller.snapshot_format import BLOCKS, MANIFEST, read_manifest
from mininet_scenarios.daemons import AgentProcess
from tests.integration.fake_api import FakeApi

pytestmark = pytest.mark.timeout(180)

Req = TypeVar("Req")
Resp = TypeVar("Resp")
SPACE = Block.parse("100.64.0.0/10")
LOW, HIGH = SPACE.halves()
FILES = 600
DIRECTORY_ENTRIES = 150


class Cluster:
    """Agents, a stand-in controller serving their view, and routes to their blocks."""

    def __init__(self, agents: list[AgentProcess], secret: bytes) -> None:
        self.agents = agents
        self.api = FakeApi(REST.ALL, secret, self._answer)

    def _answer(self, call: Call) -> object:
        assert call.route is REST.servers, call.route
        servers = {}
        for agent in self.agents:
            health = agent.call(ADMIN.health)
            servers[agent.name] = ServerInfo(
                "127.0.0.1", agent.admin_url, health.keys, 10**6, None, "busy" if health.owned else "idle",
                health.owned, None, [r.block for r in health.roles if not r.primary])
        return ServersView(servers)

    def route(self, address: str) -> tuple[str, int]:
        ident = int.from_bytes(bytes(map(int, address.split("."))), "big")
        for agent in self.agents:
            if any(b.contains(ident) for b in agent.call(ADMIN.health).owned):
                return agent.host, agent.port
        raise AssertionError(f"nobody owns {address}")

    def client(self) -> MetaFlowClient:
        return MetaFlowClient(space=SPACE, route=self.route, retry=RetryPolicy(attempts=50, base=0.01))


def _assign(agent: AgentProcess, block: Block, epoch: int, *backups: AgentProcess,
            migration: str | None = None) -> None:
    members = [agent.member(), *(b.member() for b in backups)]
    for i, member in enumerate([agent, *backups]):
        member.call(ADMIN.assign, AssignRequest([Role(block, epoch, i == 0, members)], migration))


class Mover:
    """Agent clients (`client`) that move `block` from `source` to `target`
    (a migration, the target's new role, the commit: a split as the
    controller runs it) just before the third call of `route`."""

    def __init__(self, route: Route[Any, Any], source: AgentProcess, target: AgentProcess,
                 block: Block) -> None:
        self.route, self.source, self.target, self.block = route, source, target, block
        self.calls = 0
        self.moved = False

    def client(self, url: str) -> ApiClient:
        mover = self

        class Moving(ApiClient):
            def call(self, route: Route[Req, Resp], body: Req | None = None, **params: str) -> Resp:
                mover.before(route)
                return super().call(route, body, **params)

        return Moving(url, self.source.secret)

    def before(self, route: Route[Any, Any]) -> None:
        if route is not self.route or self.moved:
            return
        self.calls += 1
        if self.calls == 3:
            mig = self.source.call(ADMIN.migrate, MigrateRequest([self.block], [self.target.admin_url]))
            epoch = 1 + max(r.epoch for r in self.source.call(ADMIN.health).roles)
            _assign(self.target, self.block, epoch, migration=mig.id)
            self.source.call(ADMIN.commit, id=mig.id)
            self.moved = True


def _agents(tmp_path: Path, secret: Path, *names: str) -> list[AgentProcess]:
    return [AgentProcess(f"leveldb:{tmp_path / name}", name=name, log_path=tmp_path / f"{name}.log",
                         secret_file=secret) for name in names]


@pytest.fixture
def source(tmp_path: Path, cluster_secret: Path) -> Iterator[tuple[Cluster, dict[str, bytes]]]:
    """Two agents: a is LOW's primary with b as its synced backup, b is HIGH's
    primary alone; files and a directory's entries written through the
    client. Yields the cluster and every key's value."""
    a, b = _agents(tmp_path, cluster_secret, "a", "b")
    with a, b:
        _assign(a, LOW, 1, b)
        _assign(b, HIGH, 1)
        cluster = Cluster([a, b], a.secret)
        written: dict[str, bytes] = {}
        with cluster.api, cluster.client() as client:
            for i in range(FILES):
                path, value = f"/data/f{i}", FileMetadata.new_file(f"/data/f{i}", i, 1000 + i).to_bytes()
                client.put(path, value)
                written[path] = value
            client.put("/dir", FileMetadata.new_dir("/dir", 1))
            written["/dir"] = FileMetadata.new_dir("/dir", 1).to_bytes()
            for i in range(DIRECTORY_ENTRIES):
                assert client.create_entry("/dir", f"e{i}", f"entry {i}".encode())
                written[f"/dir\0e{i}"] = f"entry {i}".encode()
            yield cluster, written


def _ctl(command: str, snap: Path, cluster: Cluster, secret: Path, *extra: str) -> int:
    """`metaflowctl snapshot|restore` of `snap` against `cluster`'s controller."""
    return main([command, str(snap), "--controller", cluster.api.url, "--secret-file", str(secret), *extra])


def test_a_snapshot_restores_into_a_cluster_of_another_shape(
        source: tuple[Cluster, dict[str, bytes]], tmp_path: Path, cluster_secret: Path,
        capsys: pytest.CaptureFixture[str]) -> None:
    cluster, written = source
    snap = tmp_path / "snap"
    assert _ctl("snapshot", snap, cluster, cluster_secret,
                "--page", "97") == 0
    manifest = read_manifest(snap)
    assert manifest.space == SPACE and manifest.records == len(written)
    assert {(e.block, e.server) for e in manifest.blocks} == {(LOW, "a"), (HIGH, "b")}
    assert sorted(p.name for p in (snap / BLOCKS).iterdir()) == ["100.64.0.0_11.jsonl", "100.96.0.0_11.jsonl"]
    assert f"snapshot: {len(written)} records in 2 blocks" in capsys.readouterr().out

    # Another shape: c holds the whole space, replicated to d.
    c, d = _agents(tmp_path, cluster_secret, "c", "d")
    with c, d:
        _assign(c, SPACE, 1, d)
        target = Cluster([c, d], c.secret)
        with target.api:
            assert _ctl("restore", snap, target, cluster_secret, "--batch", "64") == 0
            assert f"restored {len(written)} records" in capsys.readouterr().out
            with target.client() as client:
                for path, value in written.items():
                    if "\0" in path:
                        continue
                    assert client.get(path) == value, path
                assert client.entries("/dir", count=1000) == sorted(
                    (p.split("\0")[1].encode(), v) for p, v in written.items() if "\0" in p)
            # The backup has every record too: the restore went through the replicated write path.
            assert c.call(ADMIN.health).keys == d.call(ADMIN.health).keys == len(written)

            # A second restore into what is now a full cluster is refused, and --force overwrites.
            assert _ctl("restore", snap, target, cluster_secret) == 2
            assert f"holds {2 * len(written)} records already" in capsys.readouterr().err
            assert _ctl("restore", snap, target, cluster_secret, "--force") == 0
            assert c.call(ADMIN.health).keys == len(written)


def test_a_block_that_moves_while_it_is_read_is_read_again_where_it_went(
        source: tuple[Cluster, dict[str, bytes]], tmp_path: Path) -> None:
    cluster, written = source
    a, b = cluster.agents
    mover = Mover(ADMIN.dump, a, b, LOW)
    said: list[str] = []
    manifest = snapshot(tmp_path / "snap", ApiClient(cluster.api.url, a.secret),
                        mover.client, said.append, page=50)
    assert mover.moved
    assert any("moved while it was read from a" in line for line in said), said
    entries = {e.block: e for e in manifest.blocks}
    assert (entries[LOW].server, entries[LOW].epoch) == ("b", 2)
    assert manifest.records == len(written)
    assert not list((tmp_path / "snap" / BLOCKS).glob("*.part"))


def test_a_restore_follows_a_block_that_moves_while_it_is_loaded(
        source: tuple[Cluster, dict[str, bytes]], tmp_path: Path, cluster_secret: Path) -> None:
    cluster, written = source
    snap = tmp_path / "snap"
    assert _ctl("snapshot", snap, cluster, cluster_secret) == 0
    c, d = _agents(tmp_path, cluster_secret, "c", "d")
    with c, d:
        _assign(c, SPACE, 1, d)
        target = Cluster([c, d], c.secret)
        mover = Mover(ADMIN.load, c, d, HIGH)
        with target.api:
            restore(snap, ApiClient(target.api.url, c.secret), mover.client, lambda _: None, batch=100)
            assert mover.moved
            assert d.call(ADMIN.health).owned == [HIGH]
            with target.client() as client:
                for path, value in written.items():
                    if "\0" not in path:
                        assert client.get(path) == value, path
        with pytest.raises(ApiError, match="does not belong") as refused:   # an ID that is not its path's
            c.call(ADMIN.load, LoadRequest(LOW, 1, encode_records([(LOW.first, "/x", b"v")])))
        assert refused.value.status == 400


def test_dump_pages_at_one_epoch_and_never_unsigned(source: tuple[Cluster, dict[str, bytes]]) -> None:
    cluster, _ = source
    a, b = cluster.agents
    first = a.call(ADMIN.dump, DumpRequest(LOW, limit=10))
    assert first.epoch == 1 and first.more and len(first.records) == 10
    nxt = a.call(ADMIN.dump, DumpRequest(LOW, 1, (first.records[-1][0], first.records[-1][1]), 10))
    assert nxt.records[0][:2] > first.records[-1][:2]
    with pytest.raises(Conflict, match="not held here as its primary at epoch 7"):
        a.call(ADMIN.dump, DumpRequest(LOW, 7))
    with pytest.raises(Conflict, match=r"\(backup\)"):
        b.call(ADMIN.dump, DumpRequest(LOW))   # b holds LOW only as its backup


def test_dump_stays_signed_where_the_reads_are_open(tmp_path: Path) -> None:
    with AgentProcess(f"leveldb:{tmp_path / 'open'}", "--open-reads", own=[str(SPACE)]) as agent:
        unsigned = ApiClient(agent.admin_url, None)
        assert unsigned.call(ADMIN.health).owned == [SPACE]
        with pytest.raises(AuthError):
            unsigned.call(ADMIN.dump, DumpRequest(SPACE))
        assert agent.call(ADMIN.dump, DumpRequest(SPACE)).records == []


def test_a_corrupt_snapshot_is_refused_before_anything_is_written(
        source: tuple[Cluster, dict[str, bytes]], tmp_path: Path, cluster_secret: Path,
        capsys: pytest.CaptureFixture[str]) -> None:
    cluster, _ = source
    snap = tmp_path / "snap"
    assert _ctl("snapshot", snap, cluster, cluster_secret) == 0
    block = snap / read_manifest(snap).blocks[0].file
    data = bytearray(block.read_bytes())
    data[len(data) // 2] ^= 0x01
    block.write_bytes(bytes(data))
    (c,) = _agents(tmp_path, cluster_secret, "c")
    with c:
        _assign(c, SPACE, 1)
        target = Cluster([c], c.secret)
        with target.api:
            capsys.readouterr()
            assert _ctl("restore", snap, target, cluster_secret) == 2
            assert f"{read_manifest(snap).blocks[0].file} is corrupt" in capsys.readouterr().err
            assert c.call(ADMIN.health).keys == 0
            manifest = json.loads((snap / MANIFEST).read_text())
            manifest["version"] = 99
            (snap / MANIFEST).write_text(json.dumps(manifest))
            assert _ctl("restore", snap, target, cluster_secret) == 2
            assert "version 99" in capsys.readouterr().err


def test_unreachable_controller_and_a_used_directory_are_clear_errors(
        tmp_path: Path, cluster_secret: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["snapshot", str(tmp_path / "s"), "--controller", "http://127.0.0.1:9",
                 "--secret-file", str(cluster_secret)]) == 2
    assert "connection refused" in capsys.readouterr().err
    (tmp_path / "used").mkdir()
    (tmp_path / "used" / "x").write_text("x")
    assert main(["snapshot", str(tmp_path / "used"), "--secret-file", str(cluster_secret)]) == 2
    assert "is not empty" in capsys.readouterr().err
    assert main(["restore", str(tmp_path / "used"), "--secret-file", str(cluster_secret)]) == 2
    assert "no manifest.json" in capsys.readouterr().err
