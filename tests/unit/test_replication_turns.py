"""The replicator's table of keys under way, as the workers' turns share it
(`Replicator.begin_turn`, `TurnWrites`) with the event loop's writes: two
writes of one key are never under way at once, and a turn lets its keys go
and tells its worker when it ends. Pure logic: no member is ever reached."""

from __future__ import annotations

import asyncio

from client_lib.api.admin import Member, Role
from client_lib.cidr import Block
from nat_agent.ownership import Ownership
from nat_agent.replication import Replicator

SPACE = Block.parse("10.0.0.0/8")


class Told:
    """What a worker's `Acknowledgement` was told."""

    def __init__(self) -> None:
        self.outcomes: list[str | None] = []

    def done(self, failure: str | None) -> None:
        self.outcomes.append(failure)


def _replicator(loop: asyncio.AbstractEventLoop, held: bool) -> Replicator:
    ownership = Ownership(32, "me")
    if held:
        ownership.assign([Role(SPACE, 1, True, [Member("me", "127.0.0.1:1")])])
    replicator = Replicator(ownership, "me", b"s" * 32)
    replicator.loop = loop
    return replicator


def test_a_key_under_way_is_taken_by_no_other_write_or_turn() -> None:
    async def main() -> None:
        replicator = _replicator(asyncio.get_running_loop(), held=True)
        write = replicator.begin(SPACE.first, "/a")
        assert write is not None and replicator.begin(SPACE.first, "/a") is None
        told = Told()
        assert replicator.begin_turn([(SPACE.first, b"/b", b"1"), (SPACE.first, b"/a", b"2")], told) is None
        assert set(replicator.writing) == {"/a"}   # the refused turn registered nothing
        turn = replicator.begin_turn([(SPACE.first, b"/b", b"1")], told)
        assert turn is not None and replicator.writing["/b"] is turn
        assert replicator.begin(SPACE.first, "/b") is None
        replicator.finish(write, None)
        assert set(replicator.writing) == {"/b"}

    asyncio.run(main())


def test_a_turn_of_a_set_of_one_ends_acknowledged_and_lets_its_keys_go() -> None:
    async def main() -> None:
        replicator = _replicator(asyncio.get_running_loop(), held=True)
        told = Told()
        turn = replicator.begin_turn([(SPACE.first, b"/a", b"1"), (SPACE.first + 5, b"/b", b"2")], told)
        assert turn is not None
        turn.landed(None)   # as the worker calls it, from its thread
        await turn.done
        assert told.outcomes == [None] and replicator.writing == {}
        assert replicator.stats["worker_records"] == 2

    asyncio.run(main())


def test_a_turn_whose_block_is_gone_or_whose_batch_failed_ends_unacknowledged() -> None:
    async def main() -> None:
        loop = asyncio.get_running_loop()
        for held, error in ((False, None), (True, "disk full")):
            replicator = _replicator(loop, held)
            told = Told()
            turn = replicator.begin_turn([(SPACE.first, b"/a", b"1")], told)
            assert turn is not None
            turn.landed(error)
            await turn.done
            assert len(told.outcomes) == 1 and told.outcomes[0] is not None
            assert (error or "changed during the write") in told.outcomes[0]
            assert replicator.writing == {}

    asyncio.run(main())


def test_a_turn_ends_once_when_the_agent_shuts_down() -> None:
    async def main() -> None:
        replicator = _replicator(asyncio.get_running_loop(), held=True)
        told = Told()
        turn = replicator.begin_turn([(SPACE.first, b"/a", b"1")], told)
        assert turn is not None
        await replicator.close()
        turn.landed(None)
        await asyncio.sleep(0)
        assert told.outcomes == ["the agent is shutting down"] and replicator.writing == {}

    asyncio.run(main())
