"""Stamped values: how the ``replicated`` strategy of several sites (issue 29)
orders the copies of one entry. Pure: no I/O.

Under ``replicated`` every site holds a copy of every entry, written in the
writer's site and later, by the sites' propagation agent
(`nat_agent.site_sync`), in every other. Copies may arrive in any order and
more than once (an agent resends what it cannot prove applied), so each
value carries a **stamp**: the writer's wall clock in nanoseconds and the
writer's name. A site's copy is replaced only by a value with a greater
stamp (`step`, applied with the agent's compare-and-set), so every site
ends with the copy of the greatest stamp whatever the order of delivery:
last writer wins, by stamp. One writer's stamps increase strictly (`Clock`),
so its writes of one key are seen in the order it made them.

A stamp is a header in front of the value: `MAGIC`, the nanoseconds (8
bytes, big-endian), the writer's name (one length byte, then the name). A
value without the header (written at that key by some other strategy or
tool) counts as older than any stamped one.
"""

from __future__ import annotations

import enum
import struct
import threading
import time
from dataclasses import dataclass

from client_lib.constants import MAX_VALUE
from client_lib.errors import InvalidArgument

MAGIC = b"\x00MFs1"
"""What a stamped value starts with (a NUL first: no text value does)."""
DELETED = b"\x00MFd1"
"""...and a deletion (a tombstone: a stamp and nothing else), which orders
against writes as any stamped value does, so a later write brings the entry
back and a later deletion removes it, in every site alike."""
_CLOCK = struct.Struct(">Q")
MAX_WRITER = 64
"""The longest writer name, in bytes."""


@dataclass(frozen=True, order=True)
class Stamp:
    """When, and by whom, a value was written; stamps order by time, then writer."""

    ns: int
    writer: bytes

    def __post_init__(self) -> None:
        if not 0 <= self.ns < 1 << 64:
            raise InvalidArgument(f"a stamp's time must fit 64 bits, not {self.ns}")
        if not 0 < len(self.writer) <= MAX_WRITER:
            raise InvalidArgument(f"a writer's name is 1 to {MAX_WRITER} bytes, not {len(self.writer)}")

    @property
    def header(self) -> bytes:
        return MAGIC + self._body

    @property
    def tombstone(self) -> bytes:
        """The deletion made at this stamp."""
        return DELETED + self._body

    @property
    def _body(self) -> bytes:
        return _CLOCK.pack(self.ns) + bytes([len(self.writer)]) + self.writer


def stamped(value: bytes, stamp: Stamp) -> bytes:
    """`value` with `stamp` in front; `InvalidArgument` if the two exceed `MAX_VALUE`."""
    out = stamp.header + value
    if len(out) > MAX_VALUE:
        raise InvalidArgument(f"a stamped value of {len(out)} bytes exceeds the limit of {MAX_VALUE} "
                              f"(the value may have {MAX_VALUE - len(stamp.header)})")
    return out


def unstamped(data: bytes) -> tuple[Stamp | None, bytes]:
    """The stamp and the value of stored `data`; (None, data) if it has no
    stamp; a tombstone's value is empty (`is_tombstone` tells it apart)."""
    head = len(MAGIC) + _CLOCK.size
    if not data.startswith((MAGIC, DELETED)) or len(data) <= head:
        return None, data
    if data.startswith(DELETED) and len(data) != head + 1 + data[head]:
        return None, data
    size = data[head]
    if not 0 < size <= MAX_WRITER or len(data) < head + 1 + size:
        return None, data
    end = head + 1 + size
    return Stamp(_CLOCK.unpack_from(data, len(MAGIC))[0], data[head + 1:end]), data[end:]


def stamp_of(data: bytes) -> Stamp | None:
    return unstamped(data)[0]


def is_tombstone(data: bytes) -> bool:
    """Whether stored `data` is a deletion."""
    return data.startswith(DELETED) and stamp_of(data) is not None


class Step(enum.Enum):
    """What a site must do to bring its copy up to an update (`step`)."""

    KEEP = "keep"        # its copy is as new or newer
    CREATE = "create"    # it has none: write if still none (SET NX)
    REPLACE = "replace"  # it has an older one: write if it is still that one (SET IFEQ)


def step(current: bytes | None, update: bytes) -> Step:
    """How a site holding `current` takes stamped `update` (refused if
    `update` has no stamp, InvalidArgument): the rule that makes every delivery order converge."""
    new = stamp_of(update)
    if new is None:
        raise InvalidArgument("an update to propagate must be stamped")
    if current is None:
        return Step.CREATE
    old = stamp_of(current)
    return Step.KEEP if old is not None and old >= new else Step.REPLACE


class Clock:
    """One writer's stamps: its wall clock, strictly increasing even when the
    clock stands still or steps back. Thread-safe."""

    def __init__(self, writer: bytes) -> None:
        Stamp(0, writer)   # the name is checked now
        self.writer = writer
        self._last = 0
        self._lock = threading.Lock()

    def next(self) -> Stamp:
        with self._lock:
            self._last = max(time.time_ns(), self._last + 1)
            return Stamp(self._last, self.writer)
