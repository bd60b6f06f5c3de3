"""The primary's side of replication in one process, against a real backup
listener on loopback with a real LevelDB store: the paths a daemon test
cannot time precisely (this store slower than the members, this store
failing after the stream, the role moving on mid-write)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest

from client_lib.api.admin import AssignRequest, Member, Role, SyncRequest
from client_lib.api.auth import Verifier
from client_lib.cidr import Block
from client_lib.constants import MAX_VALUE
from client_lib.mdid import mdid
from nat_agent.agent import Agent, Identity
from nat_agent.leveldb_store import LevelDBStore
from nat_agent.replica import ReplicaServer
from nat_agent.replication import NotReplicated, Replicator
from nat_agent.syncs import Syncs

SPACE = Block.parse("100.64.0.0/10")
SECRET = b"0123456789abcdef0123456789abcdef"
PATH = "/paths/key"
IDENT = mdid(PATH, SPACE)


@dataclass
class Pair:
    primary: Agent
    backup: Agent
    replicator: Replicator
    members: list[Member]

    async def assign(self, epoch: int, backup_epoch: int | None = None) -> None:
        """Both at `epoch` (the backup at `backup_epoch` if given), backup first."""
        await self.backup.assign(AssignRequest([Role(SPACE, backup_epoch or epoch, False, self.members)]))
        await self.primary.assign(AssignRequest([Role(SPACE, epoch, True, self.members)]))


def _agent(name: str, path: Path, replication: str = "") -> Agent:
    identity = Identity(name, None, None, 0, f"http://{name}", 1, replication)
    return Agent(identity, LevelDBStore(path, SPACE.width, "off"), SPACE)


@asynccontextmanager
async def _pair(tmp_path: Path, timeout: float = 0.3) -> AsyncIterator[Pair]:
    backup = _agent("b", tmp_path / "b")
    server = ReplicaServer(backup, Verifier(SECRET), MAX_VALUE)
    port = await server.start("127.0.0.1", 0)
    members = [Member("p", "127.0.0.1:1"), Member("b", f"127.0.0.1:{port}")]
    primary = _agent("p", tmp_path / "p")
    replicator = Replicator(primary.ownership, "p", SECRET, timeout)
    pair = Pair(primary, backup, replicator, members)
    await pair.assign(1)
    try:
        yield pair
    finally:
        await replicator.close()
        await server.stop()
        await primary.store.close()
        await backup.store.close()


async def _write(pair: Pair, value: bytes, local: Callable[[], Awaitable[None]]) -> None:
    """What the service does for a plain SET: stream first, then this store's part."""
    replicator = pair.replicator
    write = replicator.begin(IDENT, PATH)
    assert write is not None   # no other write of the key is under way
    replicator.stream(write, value)
    try:
        await local()
        await pair.primary.store.put(IDENT, PATH, value)
    except BaseException as exc:
        replicator.failed_here(write, exc)
        raise
    finally:
        replicator.sent(write)
    await replicator.acknowledged(write)


def test_a_store_slower_than_the_members_does_not_fail_the_write(tmp_path: Path) -> None:
    """The members acknowledge at once and this store takes longer than the
    replication timeout: the write waited for both and succeeds (it failed
    as a timeout before the timer stopped at the last member's answer)."""
    async def main() -> None:
        async with _pair(tmp_path, timeout=0.3) as pair:
            await _write(pair, b"slow here", lambda: asyncio.sleep(0.6))
            assert pair.primary.ownership.degraded == []
            assert await pair.backup.store.get(IDENT, PATH) == b"slow here"

    asyncio.run(main())


def test_this_store_failing_after_the_stream_degrades_the_block(tmp_path: Path) -> None:
    async def main() -> None:
        async def broken() -> None:
            raise ConnectionError("the store went away")

        async with _pair(tmp_path) as pair:
            with pytest.raises(ConnectionError):
                await _write(pair, b"only on the backup", broken)
            assert pair.primary.ownership.degraded == [SPACE]   # the backup holds what this store lacks
            await pair.assign(2)
            assert pair.primary.ownership.degraded == []

    asyncio.run(main())


def test_a_write_of_the_previous_epoch_that_a_member_refused_degrades_the_new_one(tmp_path: Path) -> None:
    """The write is streamed at epoch 1; before it reaches the backup, both
    move to epoch 2 (same set), so the backup refuses it as stale: the new
    epoch's block would otherwise serve a value its member lacks."""
    async def main() -> None:
        async with _pair(tmp_path) as pair:
            replicator = pair.replicator
            write = replicator.begin(IDENT, PATH)
            assert write is not None
            await pair.backup.assign(AssignRequest([Role(SPACE, 2, False, pair.members)]))
            replicator.stream(write, b"sent at epoch 1")
            await pair.primary.assign(AssignRequest([Role(SPACE, 2, True, pair.members)]))
            await pair.primary.store.put(IDENT, PATH, b"sent at epoch 1")
            replicator.sent(write)
            with pytest.raises(NotReplicated, match="STALE 2"):
                await replicator.acknowledged(write)
            assert pair.primary.ownership.degraded == [SPACE]
            assert await pair.backup.store.get(IDENT, PATH) is None

    asyncio.run(main())


def test_a_write_acknowledged_by_the_set_it_was_sent_to_holds_in_the_next_epoch(tmp_path: Path) -> None:
    async def main() -> None:
        async with _pair(tmp_path) as pair:
            await _write(pair, b"v1", lambda: asyncio.sleep(0))
            await pair.assign(2)
            await _write(pair, b"v2", lambda: asyncio.sleep(0))
            assert pair.primary.ownership.degraded == []
            assert await pair.backup.store.get(IDENT, PATH) == b"v2"
            assert pair.replicator.writing == {}

    asyncio.run(main())


@pytest.mark.parametrize("behind", ["older epoch", "not held"])
def test_a_member_not_yet_at_the_writes_epoch_is_sent_it_again(tmp_path: Path, behind: str) -> None:
    """The primary takes epoch 2 before its backup hears of it (the controller
    assigns a set's members in parallel): the backup answers STALE 1, or
    NOTHELD, and the write goes again until it is taken (it failed at once,
    and degraded the block, before)."""
    async def main() -> None:
        async with _pair(tmp_path, timeout=2.0) as pair:
            if behind == "not held":
                await pair.backup.disown([SPACE])
            await pair.primary.assign(AssignRequest([Role(SPACE, 2, True, pair.members)]))

            async def late() -> None:
                await asyncio.sleep(0.2)
                await pair.backup.assign(AssignRequest([Role(SPACE, 2, False, pair.members)]))

            assigning = asyncio.create_task(late())
            await _write(pair, b"taken late", lambda: asyncio.sleep(0))
            await assigning
            assert pair.replicator.stats["resent"] > 1
            assert pair.primary.ownership.degraded == []
            assert await pair.backup.store.get(IDENT, PATH) == b"taken late"

    asyncio.run(main())


@pytest.mark.parametrize("behind", ["older epoch", "not held"])
def test_a_new_member_that_has_not_heard_of_the_set_yet_is_synced_all_the_same(tmp_path: Path,
                                                                               behind: str) -> None:
    """The set grows by an unsynced member (a drain's or a repair's new copy);
    the controller assigns the members in parallel and the primary, first,
    streams a write to it while it is still at epoch 1 (STALE 1) or holds
    nothing (NOTHELD). That refusal failed the member's sync that started a
    moment later, and with it a drain (the rolling restart's Mininet test);
    now it fails nothing: the sync begins once the member holds the block and
    copies the record. A member that refuses for another reason is still failed."""
    async def main() -> None:
        async with _pair(tmp_path, timeout=2.0) as pair:
            primary, new = pair.members
            grown = [primary, Member(new.name, new.replication, synced=False)]
            if behind == "not held":
                await pair.backup.disown([SPACE])
            await pair.primary.assign(AssignRequest([Role(SPACE, 2, True, grown)]))
            syncs = Syncs(pair.primary, pair.replicator)
            failed: list[str] = []
            pair.replicator.on_member_failure = lambda block, epoch, member, why: failed.append(why)
            await _write(pair, b"before it heard", lambda: asyncio.sleep(0))   # nothing waits for it
            while not (pair.replicator.stats["behind_unsynced"] or failed):   # its answer came back
                await asyncio.sleep(0.01)
            assert failed == []

            await pair.backup.assign(AssignRequest([Role(SPACE, 2, False, grown)]))
            sync = syncs.start(SyncRequest(SPACE, 2, new.name))
            assert sync.task is not None
            await sync.task
            assert (sync.state, sync.error) == ("synced", None)
            assert await pair.backup.store.get(IDENT, PATH) == b"before it heard"

            another = [Member("x", "127.0.0.1:2"), grown[1]]   # it follows another primary at epoch 3
            await pair.backup.assign(AssignRequest([Role(SPACE, 3, False, another)]))
            await pair.primary.assign(AssignRequest([Role(SPACE, 3, True, grown)]))
            await _write(pair, b"refused", lambda: asyncio.sleep(0))
            while not failed:
                await asyncio.sleep(0.01)
            assert "is not the primary" in failed[0]

    asyncio.run(main())
