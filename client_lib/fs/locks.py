"""File locks held through the service: POSIX record locks (``fcntl``,
``F_OFD_*``) and BSD ``flock``, seen by every mount of the file system.

Why the service and not the kernel: a kernel keeps the locks of its own
mount, so two machines would lock one file at once. Here every lock on an
inode lives in one record (`lock_key`), next to its other records, and a
mount takes or drops one by a compare-and-set of that record: the service
orders the contenders.

A mount that dies cannot drop its locks, so each is leased: it carries an
expiry (the wall clock's, `LEASE` seconds ahead), which its mount renews
every `LEASE` / 4 seconds while it holds it (`LockTable.renew`). Another
mount treats an expired lock as gone, and drops it from the record when it
next writes it. So a dead mount's locks free themselves within the lease,
and the mounts' clocks must agree to well within it (NTP does).

What a lock is, as Linux keeps them: an owner (the kernel's lock owner:
for POSIX locks the process's file table, for flock and OFD locks the open
file description; with the mount's session, so owners of two mounts
differ), a kind (POSIX and flock locks do not see each other), a type (read
or write) and a byte range, ends included. A POSIX lock taken over part of
an owner's own lock splits or merges with it; an unlock may punch a hole.
Deadlocks between mounts are not detected (no EDEADLK).

`Held` is pure and tested without I/O; `LockTable` adds the records.
"""

from __future__ import annotations

import json
import secrets
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, replace

from client_lib.errors import MetadataFormatError, MetaFlowError
from client_lib.fs.records import Records

__all__ = ["F_RDLCK", "F_UNLCK", "F_WRLCK", "FLOCK", "LEASE", "POSIX", "Lock", "LockTable", "apply",
           "conflict", "decode", "encode", "lock_key"]

F_RDLCK, F_WRLCK, F_UNLCK = 0, 1, 2
"""Lock types as Linux numbers them (``fcntl.h``), which FUSE passes on."""
POSIX, FLOCK = "posix", "flock"
OFFSET_MAX = (1 << 63) - 1
"""A range's end that means "to the end of the file, however it grows"."""
LEASE = 20.0
"""Seconds a lock outlives its mount's last renewal (module docstring)."""
_CAS_TRIES = 100


@dataclass(frozen=True)
class Lock:
    """One lock, as its record keeps it (module docstring)."""

    session: str
    owner: int
    kind: str
    type: int
    start: int
    end: int
    pid: int
    expires: float

    def same_owner(self, other: Lock) -> bool:
        return self.session == other.session and self.owner == other.owner and self.kind == other.kind

    def overlaps(self, start: int, end: int) -> bool:
        return self.start <= end and start <= self.end


def lock_key(ino: int) -> str:
    """The record of inode `ino`'s locks."""
    return f"/.mf/l/{ino:016x}"


def encode(held: Iterable[Lock]) -> bytes:
    return json.dumps([asdict(lock) for lock in held], separators=(",", ":")).encode()


def decode(raw: bytes | None) -> list[Lock]:
    """Inverse of `encode`; None (no record) is no locks."""
    if raw is None:
        return []
    try:
        return [Lock(**fields) for fields in json.loads(raw)]
    except (ValueError, TypeError) as exc:
        raise MetadataFormatError(f"not a lock record: {raw[:80]!r}: {exc}") from None


def live(held: Iterable[Lock], now: float) -> list[Lock]:
    return [lock for lock in held if lock.expires > now]


def conflict(held: Iterable[Lock], wanted: Lock, now: float) -> Lock | None:
    """The first live lock of another owner, of the same kind, that overlaps
    `wanted` where one of the two is a write lock; None if it may be taken
    (an unlock always may)."""
    if wanted.type == F_UNLCK:
        return None
    for lock in held:
        if (lock.expires > now and lock.kind == wanted.kind and not lock.same_owner(wanted)
                and lock.overlaps(wanted.start, wanted.end) and F_WRLCK in (lock.type, wanted.type)):
            return lock
    return None


def apply(held: Iterable[Lock], wanted: Lock, now: float) -> list[Lock]:
    """The locks after `wanted` (an F_UNLCK drops its range) is taken by its
    owner, expired ones dropped; the caller checked `conflict` first. The
    owner's own locks of its kind over the range are cut away, then the new
    one merged with its own neighbours of the same type."""
    kept: list[Lock] = []
    mine: list[Lock] = []
    for lock in live(held, now):
        if not lock.same_owner(wanted):
            kept.append(lock)
        elif not lock.overlaps(wanted.start, wanted.end):
            mine.append(lock)
        else:   # what lies outside the new range stays
            if lock.start < wanted.start:
                mine.append(replace(lock, end=wanted.start - 1))
            if lock.end > wanted.end:
                mine.append(replace(lock, start=wanted.end + 1))
    if wanted.type != F_UNLCK:
        merged = wanted
        for lock in list(mine):
            adjacent = lock.end + 1 >= merged.start and merged.end + 1 >= lock.start
            if lock.type == merged.type and adjacent:
                mine.remove(lock)
                merged = replace(merged, start=min(merged.start, lock.start), end=max(merged.end, lock.end))
        mine.append(merged)
    return kept + sorted(mine, key=lambda lock: lock.start)


class LockTable:
    """This mount's side of the lock records (module docstring). Thread-safe."""

    def __init__(self, records: Records, *, lease: float = LEASE,
                 clock: Callable[[], float] = time.time) -> None:
        self.records, self.lease, self.clock = records, lease, clock
        self.session = secrets.token_hex(8)
        """This mount's name in the records: its owners are no other mount's."""
        self._lock = threading.Lock()
        self._holding: set[int] = set()   # the inodes this mount holds a lock on

    def lock(self, owner: int, kind: str, lock_type: int, start: int, end: int, pid: int) -> Lock:
        """A lock of this mount's `owner`, leased from now."""
        return Lock(self.session, owner, kind, lock_type, start, min(end, OFFSET_MAX), pid,
                    self.clock() + self.lease)

    def pid_of(self, lock: Lock) -> int:
        """F_GETLK's pid: the holder's, if it is on this machine's mount; 0 for another mount's."""
        return lock.pid if lock.session == self.session else 0

    def holds(self, ino: int) -> bool:
        """Whether this mount holds a lock on `ino` (no request)."""
        return ino in self._holding

    def test(self, ino: int, wanted: Lock) -> Lock | None:
        """F_GETLK: what is in the way of `wanted`."""
        return conflict(decode(self.records.get(lock_key(ino))), wanted, self.clock())

    def set(self, ino: int, wanted: Lock) -> Lock | None:
        """Take (or drop, F_UNLCK) `wanted`; the lock in the way instead, with nothing changed."""
        return self._change(ino, lambda held, now: (conflict(held, wanted, now), apply(held, wanted, now)))

    def release_owner(self, ino: int, owner: int, kind: str) -> None:
        """Drop every lock of `kind` that `owner` holds on `ino` (close, and the last close for flock)."""
        self.set(ino, self.lock(owner, kind, F_UNLCK, 0, OFFSET_MAX, 0))

    def renew(self) -> None:
        """Push the lease of every lock this mount holds `lease` ahead (its pusher's turn)."""
        for ino in list(self._holding):
            self._change(ino, lambda held, now: (None, [
                replace(lock, expires=now + self.lease) if lock.session == self.session else lock
                for lock in live(held, now)]))

    def release_all(self) -> None:
        """Drop every lock of this mount (a clean unmount)."""
        for ino in list(self._holding):
            self._change(ino, lambda held, now: (None, [lock for lock in live(held, now)
                                                        if lock.session != self.session]))

    def _change(self, ino: int,
                decide: Callable[[list[Lock], float], tuple[Lock | None, list[Lock]]]) -> Lock | None:
        """Rewrite `ino`'s record as `decide` says, by compare-and-set; `decide`
        returns (the lock in the way, or None; the new locks)."""
        key = lock_key(ino)
        for _ in range(_CAS_TRIES):
            raw = self.records.get(key)
            now = self.clock()
            in_the_way, after = decide(decode(raw), now)
            if in_the_way is not None:
                return in_the_way
            if raw is None:
                done = not after or self.records.create(key, encode(after))
            elif not after:
                done = self.records.delete_if_equal(key, raw)
            else:
                done = self.records.compare_and_set(key, raw, encode(after))
            if done:
                self._note_held(ino, after)
                return None
        raise MetaFlowError(f"lock record {key} changed {_CAS_TRIES} times under this request")

    def _note_held(self, ino: int, after: list[Lock]) -> None:
        mine = any(lock.session == self.session for lock in after)
        with self._lock:
            if mine:
                self._holding.add(ino)
            else:
                self._holding.discard(ino)
