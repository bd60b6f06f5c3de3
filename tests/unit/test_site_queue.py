"""The propagation agent's queue (`nat_agent.site_queue`), on a real SQLite
file: each site is handed the updates in order, each key's last only, from
its own cursor; what every site applied is deleted; sequence numbers are
never reused; and everything survives closing and reopening."""

from __future__ import annotations

import tempfile
from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

from nat_agent.site_queue import SiteQueue


def test_each_site_gets_every_keys_last_update_in_order_from_its_own_cursor(tmp_path: Path) -> None:
    queue = SiteQueue(tmp_path / "q.sqlite", ["east", "west"])
    last = queue.append([(b"/a", b"1"), (b"/b", b"1"), (b"/a", b"2")])
    assert last == 3
    seq, updates = queue.due("west", 10)
    assert seq == 3 and updates == [(2, b"/b", b"1"), (3, b"/a", b"2")]
    assert queue.due("west", 2) == (2, [(1, b"/a", b"1"), (2, b"/b", b"1")])   # a limit cuts the batch
    queue.done("east", 3)
    assert queue.backlog() == {"east": 0, "west": 3} and queue.due("east", 10) == (0, [])
    queue.done("west", 2)
    assert queue.due("west", 10) == (3, [(3, b"/a", b"2")])
    queue.done("west", 3)
    assert queue.backlog() == {"east": 0, "west": 0}
    assert queue.append([(b"/c", b"1")]) == 4   # after everything was deleted: never reused
    queue.close()
    again = SiteQueue(tmp_path / "q.sqlite", ["east", "west", "north"])   # a new site starts at the beginning
    assert again.backlog() == {"east": 1, "west": 1, "north": 1}
    again.close()


@settings(max_examples=40, deadline=None)
@given(st.lists(st.tuples(st.sampled_from([b"/a", b"/b", b"/c"]), st.integers(1, 3), st.integers(1, 5)),
                min_size=1, max_size=30))
def test_whatever_the_batches_a_site_ends_with_each_keys_last_update(
        steps: list[tuple[bytes, int, int]]) -> None:
    with tempfile.TemporaryDirectory() as where:
        queue = SiteQueue(Path(where) / "q.sqlite", ["s"])
        applied: dict[bytes, bytes] = {}
        latest: dict[bytes, bytes] = {}
        for n, (key, count, limit) in enumerate(steps):
            for i in range(count):
                value = b"%d.%d" % (n, i)
                queue.append([(key, value)])
                latest[key] = value
            seq, updates = queue.due("s", limit)
            for _, k, v in updates:
                applied[k] = v
            if seq:
                queue.done("s", seq)
        while (due := queue.due("s", 4))[0]:
            for _, k, v in due[1]:
                applied[k] = v
            queue.done("s", due[0])
        assert applied == latest and queue.backlog() == {"s": 0}
        queue.close()
