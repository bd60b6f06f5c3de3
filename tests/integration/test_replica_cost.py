"""`benchmarks.replica_cost` against a real backup listener and LevelDB store:
what it times is really applied, and each of its figures is printed."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from benchmarks import replica_cost
from nat_agent.leveldb_store import LevelDBStore

pytestmark = pytest.mark.timeout(120)


@pytest.mark.parametrize("fsync", replica_cost.MODES)
def test_every_rmset_timed_is_applied(fsync, tmp_path: Path) -> None:
    found = asyncio.run(replica_cost.apply_cost(tmp_path / "b", fsync, turns=6, records=4))
    assert found["cpu_us_per_rmset"] > 0 and found["cpu_us_per_record"] == pytest.approx(
        found["cpu_us_per_rmset"] / 4, abs=0.1)
    expected = {(command[at + 1].decode(), command[at + 2])
                for command in replica_cost._rmsets(6, 4) for at in range(3, len(command), 3)}

    async def stored() -> set[tuple[str, bytes]]:
        store = LevelDBStore(tmp_path / "b", replica_cost.SPACE.width, "off")
        try:
            space = replica_cost.SPACE
            return {(path, value) async for chunk in store.scan(space.first, space.last)
                    for _, path, value in chunk}
        finally:
            await store.close()

    assert asyncio.run(stored()) == expected


def test_the_command_prints_each_figure(capsys: pytest.CaptureFixture[str]) -> None:
    assert replica_cost.main(["--turns", "3", "--records", "1,2"]) == 0
    out = capsys.readouterr().out
    for line in ("RMSET of 1 records, --fsync off", "RMSET of 2 records, --fsync batch",
                 "write and sync of one record", "run_in_executor of a call that does nothing"):
        assert line in out, out
