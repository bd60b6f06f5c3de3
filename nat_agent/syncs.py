"""Re-replication (``POST /syncs``): a primary brings a new member of a
block's set up to date while writes go on.

The member is in the set already (unsynced) when the controller asks, so
the primary streams every new write to it (`nat_agent.replication`) without
waiting for it. A sync then copies the block's records to it in the
background, throttled to `SyncRequest.rate` records a second so that the
foreground keeps its latency:

1. ``RBEGIN``: the member wipes the block and starts noting the keys the
   stream touches;
2. ``RCOPY`` per record, in batches, each batch acknowledged before the
   next: the member skips a key the stream touched since RBEGIN, so a copy
   never overwrites a newer write (`nat_agent.replica`);
3. the member becomes *required* (new writes wait for its acknowledgement)
   and ``REND`` goes out: once it is acknowledged, every write sent before
   it has been applied (the connection answers in order), so the member
   holds the whole block: it is *synced*, here (`Ownership.update_peer`,
   persisted) and in the report; the controller then re-assigns the set
   with it synced at the same epoch.

A failure (the member unreachable, refusing, or failing a write streamed to
it, or the block's epoch moving on) ends the sync as ``failed``, and the
member is dropped from the stream until the controller reassigns the block.
A write the member refused only because it did not hold the block at that
epoch yet is no failure: it was streamed before RBEGIN, which wipes the
block and is followed by the copy of that record (`nat_agent.replication`).
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass, field

from client_lib.api.admin import SyncReport, SyncRequest
from client_lib.cidr import Block
from client_lib.errors import Conflict, InvalidArgument
from client_lib.resp import encode_command
from nat_agent.agent import Agent
from nat_agent.ownership import Held, Peer
from nat_agent.replication import NotReplicated, Replicator
from nat_agent.store import encode_path

log = logging.getLogger("metaflow.agent.syncs")

BATCH = 500
"""Records per copy batch at most (fewer when the rate is low, so it stays smooth)."""
KEEP_FINISHED = 256
BYTES_PER_SECOND = 16 << 20
"""How fast a member is assumed to take a batch in, on top of the replication
timeout: a batch of large values gets longer to be acknowledged."""

COPYING, SYNCED, FAILED = "copying", "synced", "failed"


@dataclass(eq=False)
class Sync:
    block: Block
    epoch: int
    member: str
    rate: int
    state: str = COPYING
    records: int = 0
    error: str | None = None
    started: float = field(default_factory=time.monotonic)
    finished: float | None = None
    task: asyncio.Task[None] | None = None

    def report(self) -> SyncReport:
        return SyncReport(self.block, self.epoch, self.member, self.state, self.records, self.error,
                          round((self.finished or time.monotonic()) - self.started, 4))


class Syncs:
    """The syncs this agent runs as a primary."""

    def __init__(self, agent: Agent, replicator: Replicator) -> None:
        self.agent = agent
        self.replicator = replicator
        self.syncs: dict[tuple[Block, int, str], Sync] = {}
        replicator.on_member_failure = self._member_failed

    def reports(self) -> list[SyncReport]:
        return [s.report() for s in self.syncs.values()]

    def start(self, request: SyncRequest) -> Sync:
        """Start (or return, if it runs or succeeded already) the sync of
        `request.member` for `request.block` at `request.epoch`."""
        if not 0 < request.rate:
            raise InvalidArgument(f"rate must be a positive number of records a second, not {request.rate}")
        held, peer = self._member(request.block, request.epoch, request.member)
        key = (request.block, request.epoch, request.member)
        running = self.syncs.get(key)
        if running is not None and running.state != FAILED:
            return running
        sync = Sync(request.block, request.epoch, request.member, request.rate)
        self._remember(key, sync)
        if peer.synced:
            sync.state, sync.finished = SYNCED, time.monotonic()
            return sync
        sync.task = asyncio.get_running_loop().create_task(self._run(sync, peer),
                                                           name=f"sync-{request.block}-{request.member}")
        log.info("sync of %s (epoch %d) to %s started, at most %d records/s", sync.block, sync.epoch,
                 sync.member, sync.rate)
        return sync

    def _member(self, block: Block, epoch: int, member: str) -> tuple[Held, Peer]:
        """The held part covering `block` as its primary at `epoch`, and the member's peer there."""
        self.agent.check_block(block)
        ownership = self.agent.ownership
        parts = ownership.overlapping(block)
        if ownership.suspended or any(h.fenced for h in parts):
            why = "suspended" if ownership.suspended else "fenced (a newer primary exists)"
            raise Conflict(f"cannot sync {block}: this agent is {why}", 409)
        if ownership.unheld(block) or any(not h.role.primary or h.epoch != epoch or
                                          not h.block.covers(block) for h in parts):
            holds = ", ".join(f"{h.block}@{h.epoch}{'' if h.role.primary else ' (backup)'}"
                              for h in parts) or "nothing of it"
            raise Conflict(f"cannot sync {block}: this agent is not its primary at epoch {epoch} "
                           f"(it holds {holds})", 409)
        held = parts[0]
        peer = next((p for p in held.peers if p.name == member), None)
        if peer is None:
            raise InvalidArgument(f"{member!r} is not another member of the set of {held.block} "
                                  f"at epoch {epoch}")
        return held, peer

    async def _run(self, sync: Sync, peer: Peer) -> None:
        ownership, replicator = self.agent.ownership, self.replicator
        label = str(sync.block)
        timeout = replicator.timeout
        try:
            ownership.update_peer(sync.block, sync.epoch, sync.member, streamed=True, required=False)
            held, peer = self._member(sync.block, sync.epoch, sync.member)
            await replicator.call(held, peer, [encode_command(b"RBEGIN", label, sync.epoch)], timeout)
            batch = max(1, min(BATCH, sync.rate // 10))
            started = time.monotonic()
            async for records in self.agent.store.scan(sync.block.first, sync.block.last, batch):
                self._check(sync)
                payloads = [encode_command(b"RCOPY", label, sync.epoch, ident, encode_path(path), value)
                            for ident, path, value in records]
                size = sum(len(p) for p in payloads)
                await replicator.call(held, peer, payloads, timeout + size / BYTES_PER_SECOND)
                sync.records += len(records)
                ahead = sync.records / sync.rate - (time.monotonic() - started)
                if ahead > 0:
                    await asyncio.sleep(ahead)
            self._check(sync)
            # From here on, writes wait for the member: REND's answer then covers every write
            # the member was sent without being waited for.
            ownership.update_peer(sync.block, sync.epoch, sync.member, required=True)
            await replicator.call(held, peer, [encode_command(b"REND", label, sync.epoch)], timeout)
            self._check(sync)
        except (NotReplicated, Conflict, InvalidArgument) as exc:
            self._fail(sync, str(exc))
            return
        except asyncio.CancelledError:
            self._fail(sync, sync.error or "cancelled")
            raise
        except Exception as exc:  # whatever it was, the member must not be counted on
            log.error("sync of %s to %s failed", sync.block, sync.member, exc_info=exc)
            self._fail(sync, f"{type(exc).__name__}: {exc}")
            return
        ownership.update_peer(sync.block, sync.epoch, sync.member, synced=True)
        sync.state, sync.finished = SYNCED, time.monotonic()
        await self.agent.persist()
        log.info("sync of %s (epoch %d) to %s done: %d records in %.2f s", sync.block, sync.epoch,
                 sync.member, sync.records, sync.finished - sync.started)

    def _check(self, sync: Sync) -> None:
        """Give up once the stream failed the member, or the block moved on."""
        if sync.error is not None:
            raise NotReplicated(sync.error)
        self._member(sync.block, sync.epoch, sync.member)

    def _fail(self, sync: Sync, why: str) -> None:
        if sync.state != COPYING:
            return
        sync.state, sync.error, sync.finished = FAILED, why, time.monotonic()
        self.agent.ownership.update_peer(sync.block, sync.epoch, sync.member, required=False, streamed=False)
        log.warning("sync of %s (epoch %d) to %s failed after %d records: %s; the member is dropped "
                    "from the stream until the block is reassigned", sync.block, sync.epoch,
                    sync.member, sync.records, why)

    def _member_failed(self, block: Block, epoch: int, member: str, why: str) -> None:
        """A write streamed to an unsynced member failed: its copy cannot be complete."""
        for sync in self.syncs.values():
            if sync.member == member and sync.epoch == epoch and sync.state == COPYING \
                    and (sync.block.covers(block) or block.covers(sync.block)):
                sync.error = sync.error or f"a streamed write failed: {why}"

    def _remember(self, key: tuple[Block, int, str], sync: Sync) -> None:
        self.syncs[key] = sync
        finished = [k for k, s in self.syncs.items() if s.state != COPYING]
        for old in finished[:max(0, len(finished) - KEEP_FINISHED)]:
            del self.syncs[old]

    async def close(self) -> None:
        tasks = [s.task for s in self.syncs.values() if s.task is not None and not s.task.done()]
        for sync in self.syncs.values():
            if sync.state == COPYING:
                sync.error = "the agent is shutting down"
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
