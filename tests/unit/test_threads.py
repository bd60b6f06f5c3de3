"""The controller's SIGUSR1 account of its threads: grouped by where they wait."""

from __future__ import annotations

import sys
import threading
import time

from controller import threads


def test_threads_waiting_at_the_same_place_are_one_group_and_the_largest_comes_first() -> None:
    gate = threading.Event()
    started = threading.Barrier(4)

    def waiter() -> None:
        started.wait()
        gate.wait()

    pool = [threading.Thread(target=waiter, name=f"waiter-{i}") for i in range(3)]
    for t in pool:
        t.start()
    started.wait()
    try:
        names = {t.ident: t.name for t in pool if t.ident is not None}
        deadline = time.monotonic() + 10
        while True:   # until all three are inside gate.wait (past the barrier, they may not be yet)
            frames = {ident: frame for ident, frame in sys._current_frames().items() if ident in names}
            text = threads.summary(frames, names)
            if " 1 groups" in text.splitlines()[0] or time.monotonic() > deadline:
                break
            time.sleep(0.01)
    finally:
        gate.set()
        for t in pool:
            t.join()
    lines = text.splitlines()
    assert lines[0] == "3 threads in 1 groups"
    assert lines[1].startswith("3 x like 'waiter-")
    assert any("waiter" in line and "test_threads.py" in line for line in lines[2:])
    assert len(lines) == 2 + threads.DEPTH


def test_the_whole_process_is_summed_up() -> None:
    text = threads.now()
    count = int(text.split()[0])
    assert count == len(sys._current_frames()) >= 1
    assert "test_threads.py" in text
