"""What every thread of the controller is doing, grouped: its answer to SIGUSR1.

Under os-ken's native hub each switch connection has its own threads, so a
controller at k=32 runs thousands (two or three per switch). A stall there
(connections that stop being read, an app's event queue full) is found by
where those threads wait, and neither py-spy (it failed on a controller
with 5,000 threads) nor `faulthandler` (at most 100 threads) shows that.
`kill -USR1 <pid>` logs the threads grouped by their innermost frames,
the largest groups first.
"""

from __future__ import annotations

import sys
import threading
import traceback
from collections import Counter
from types import FrameType

DEPTH = 6
"""Innermost frames that make a thread's group: enough to tell an os-ken
receiving loop blocked on an app's queue from one reading its socket."""


def summary(frames: dict[int, FrameType], names: dict[int, str], depth: int = DEPTH) -> str:
    """`frames` (`sys._current_frames()`) grouped by their `depth` innermost
    frames, each group with its size and one of its threads' names."""
    groups: Counter[tuple[str, ...]] = Counter()
    example: dict[tuple[str, ...], str] = {}
    for ident, frame in frames.items():
        stack = traceback.extract_stack(frame)[-depth:]
        key = tuple(f"{'/'.join(f.filename.split('/')[-2:])}:{f.lineno} {f.name}" for f in reversed(stack))
        groups[key] += 1
        example.setdefault(key, names.get(ident, str(ident)))
    lines = [f"{len(frames)} threads in {len(groups)} groups"]
    for key, count in groups.most_common():
        lines.append(f"{count} x like {example[key]!r}:")
        lines.extend(f"    {frame}" for frame in key)
    return "\n".join(lines)


def now() -> str:
    """This process's threads, grouped (`summary`)."""
    names = {t.ident: t.name for t in threading.enumerate() if t.ident is not None}
    return summary(sys._current_frames(), names)
