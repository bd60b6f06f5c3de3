"""The file locks of a mounted file system (`client_lib.fs.locks`), without I/O.

What is checked, and why:

- `conflict` and `apply` against a byte-by-byte model of POSIX record locks
  (random requests of three owners, both kinds, read, write and unlock, over
  ranges of a small file, some of them "to the end"): a request is refused
  exactly when another owner holds a clashing lock on one of its bytes, and
  what `apply` leaves is, byte by byte, what POSIX says, kept in a canonical
  form (an owner's locks of one kind do not overlap, those of one type do
  not even touch). Splitting, merging and punching holes are where range
  code goes wrong, and a model over every byte catches what examples miss.
- The rules that need no model: POSIX and flock locks do not see each other,
  read locks share, an owner never blocks itself (an upgrade in place works).
- Leases: a lock whose expiry has come (``expires <= now``) blocks nothing
  and is dropped at the next write, or a dead mount would block for ever.
- The record format: `encode` / `decode` round trip, and a record that is
  not one is a `MetadataFormatError`, not a crash elsewhere.
- `LockTable`, two mounts over the in-memory records of the pure tests
  (`tests.fs_model.MemoryRecords`) with a clock the test moves: conflicts
  change nothing, releases and leases free the lock for the other mount,
  the record goes when its last lock does, and a compare-and-set that loses
  to another writer is retried on the new record (and gives up, with an
  error, after `_CAS_TRIES` losses).
"""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from client_lib.errors import MetadataFormatError, MetaFlowError
from client_lib.fs import locks
from client_lib.fs.locks import (
    F_RDLCK,
    F_UNLCK,
    F_WRLCK,
    FLOCK,
    OFFSET_MAX,
    POSIX,
    Lock,
    LockTable,
    apply,
    conflict,
    decode,
    encode,
    lock_key,
)
from tests.fs_model import MemoryRecords

SESSION = "s"
NOW = 1_000.0
LATER = NOW + 1_000.0
"""Expiry of the locks of the pure tests that are not about leases."""
SIZE = 32
"""The model's file: offsets 0..31, and ranges that end there or at OFFSET_MAX."""
CELLS = [*range(SIZE + 1), OFFSET_MAX]
"""The offsets the model looks at: every one of the small file, and two
beyond it (32, the first a "to the end" range covers alone, and the last
one). A correct `apply` only makes ranges that end at a request's end or
just before a request's start, so these stand for every byte (checked)."""
OWNERS = (1, 2, 3)
KINDS = (POSIX, FLOCK)
NAMES = {F_RDLCK: "read", F_WRLCK: "write", F_UNLCK: "unlock"}


def _lock(owner: int, lock_type: int, start: int, end: int, *, kind: str = POSIX, session: str = SESSION,
          expires: float = LATER, pid: int = 0) -> Lock:
    return Lock(session, owner, kind, lock_type, start, end, pid or 100 + owner, expires)


# -- the model -------------------------------------------------------------------------------------

Model = dict[tuple[int, str], list[int | None]]
"""Per (owner, kind): the type of lock it holds at each of CELLS, or None."""


def _covers(start: int, end: int) -> list[int]:
    return [i for i, offset in enumerate(CELLS) if start <= offset <= end]


def _model_conflicts(model: Model, owner: int, kind: str, lock_type: int, start: int, end: int) -> bool:
    """Whether another owner of the same kind holds, on a byte of the range,
    a lock that clashes (one of the two is a write lock). An unlock never does."""
    if lock_type == F_UNLCK:
        return False
    for (other, other_kind), cells in model.items():
        if other == owner or other_kind != kind:
            continue
        for i in _covers(start, end):
            held = cells[i]
            if held is not None and F_WRLCK in (held, lock_type):
                return True
    return False


def _model_apply(model: Model, owner: int, kind: str, lock_type: int, start: int, end: int) -> None:
    cells = model.setdefault((owner, kind), [None] * len(CELLS))
    for i in _covers(start, end):
        cells[i] = None if lock_type == F_UNLCK else lock_type


def _view(held: list[Lock]) -> Model:
    """What a list of locks holds, as the model keeps it (empty owners left out)."""
    view: Model = {}
    for lock in held:
        cells = view.setdefault((lock.owner, lock.kind), [None] * len(CELLS))
        for i in _covers(lock.start, lock.end):
            assert cells[i] is None, f"two locks of one owner on offset {CELLS[i]}: {held}"
            cells[i] = lock.type
    return view


def _nonempty(model: Model) -> Model:
    return {key: cells for key, cells in model.items() if any(t is not None for t in cells)}


def _check_canonical(held: list[Lock]) -> None:
    """Every range well formed, ending where the model can see it; no two
    locks of one owner overlap, and two of one type do not even touch."""
    for lock in held:
        assert lock.start <= lock.end, lock
        assert lock.type in (F_RDLCK, F_WRLCK), lock
        assert lock.start <= SIZE and (lock.end < SIZE or lock.end == OFFSET_MAX), lock
    for i, a in enumerate(held):
        for b in held[i + 1:]:
            if not a.same_owner(b):
                continue
            assert not a.overlaps(b.start, b.end), (a, b)
            if a.type == b.type:
                assert a.end + 1 < b.start or b.end + 1 < a.start, f"not merged: {a}, {b}"


@st.composite
def requests(draw: st.DrawFn) -> tuple[int, str, int, int, int]:
    """(owner, kind, type, start, end) of one request."""
    start = draw(st.integers(0, SIZE - 1))
    end = draw(st.one_of(st.integers(start, SIZE - 1), st.just(OFFSET_MAX)))
    return (draw(st.sampled_from(OWNERS)), draw(st.sampled_from(KINDS)),
            draw(st.sampled_from([F_RDLCK, F_WRLCK, F_UNLCK])), start, end)


@given(ops=st.lists(requests(), max_size=40))
@settings(max_examples=400)
def test_conflict_and_apply_follow_posix_byte_by_byte(ops: list[tuple[int, str, int, int, int]]) -> None:
    """Each request, as `LockTable.set` makes it: refused (a lock returned)
    exactly when the model says another owner's lock clashes on one of its
    bytes, with the lock returned one that does; else taken, after which the
    locks hold, byte by byte, what the model holds, in canonical form. The
    held list goes through its record (`encode`, `decode`) at every step.
    An unlock is never refused, whatever others hold over its range."""
    model: Model = {}
    held: list[Lock] = []
    for owner, kind, lock_type, start, end in ops:
        wanted = _lock(owner, lock_type, start, end, kind=kind)
        step = f"{owner} {kind} {NAMES[lock_type]} [{start}, {end}] over {held}"
        refused = conflict(held, wanted, NOW)
        if _model_conflicts(model, owner, kind, lock_type, start, end):
            assert refused is not None, f"not refused: {step}"
            assert refused in held and not refused.same_owner(wanted) and refused.kind == kind
            assert refused.overlaps(start, end) and F_WRLCK in (refused.type, lock_type), step
            continue
        assert refused is None, f"refused by {refused}: {step}"
        _model_apply(model, owner, kind, lock_type, start, end)
        held = decode(encode(apply(held, wanted, NOW)))
        _check_canonical(held)
        assert _view(held) == _nonempty(model), step


# -- rules without a model -------------------------------------------------------------------------

ranges = st.tuples(st.integers(0, 100), st.integers(0, 100)).map(sorted)
types = st.sampled_from([F_RDLCK, F_WRLCK])


@given(a=ranges, b=ranges, a_type=types, b_type=types)
def test_posix_and_flock_locks_never_conflict(a: list[int], b: list[int], a_type: int, b_type: int) -> None:
    held = [_lock(1, a_type, *a, kind=POSIX)]
    assert conflict(held, _lock(2, b_type, *b, kind=FLOCK), NOW) is None
    held = [_lock(1, a_type, *a, kind=FLOCK)]
    assert conflict(held, _lock(2, b_type, *b, kind=POSIX), NOW) is None
    # while the same two locks of one kind clash, unless both read
    assert (conflict(held, _lock(2, b_type, *a, kind=FLOCK), NOW) is None) == (a_type == b_type == F_RDLCK)


@given(a=ranges, b=ranges, kind=st.sampled_from(KINDS))
def test_read_locks_of_two_owners_share(a: list[int], b: list[int], kind: str) -> None:
    held = [_lock(1, F_RDLCK, *a, kind=kind)]
    assert conflict(held, _lock(2, F_RDLCK, *b, kind=kind), NOW) is None
    assert conflict(held, _lock(2, F_RDLCK, *b, kind=kind, session="other mount"), NOW) is None


@given(mine=st.lists(st.tuples(ranges, types), max_size=6), b=ranges, b_type=types,
       kind=st.sampled_from(KINDS))
def test_an_owner_never_conflicts_with_itself(mine: list[tuple[list[int], int]], b: list[int], b_type: int,
                                              kind: str) -> None:
    held: list[Lock] = []
    for (start, end), lock_type in mine:
        held = apply(held, _lock(1, lock_type, start, end, kind=kind), NOW)
    assert conflict(held, _lock(1, b_type, *b, kind=kind), NOW) is None


def test_owners_are_told_apart_by_session_and_number() -> None:
    held = [_lock(1, F_WRLCK, 0, 9)]
    assert conflict(held, _lock(1, F_RDLCK, 5, 5, session="other mount"), NOW) == held[0]
    assert conflict(held, _lock(2, F_RDLCK, 5, 5), NOW) == held[0]
    assert conflict(held, _lock(1, F_RDLCK, 5, 5), NOW) is None


def test_an_upgrade_in_place_replaces_the_read_lock() -> None:
    """Read to write over the owner's own range, while another owner reads
    elsewhere: taken, and the read lock is gone (not left under the write)."""
    other = _lock(2, F_RDLCK, 20, 29)
    held = apply([other], _lock(1, F_RDLCK, 0, 9), NOW)
    upgrade = _lock(1, F_WRLCK, 0, 9)
    assert conflict(held, upgrade, NOW) is None
    assert sorted(apply(held, upgrade, NOW), key=lambda lock: lock.owner) == [upgrade, other]
    # ... but not over another owner's read lock
    assert conflict(held, _lock(1, F_WRLCK, 0, 20), NOW) == other


def test_apply_splits_merges_and_punches_holes() -> None:
    """The worked cases behind the model, for a reader."""

    def _ranges(held: list[Lock]) -> list[tuple[int, int, int]]:
        return sorted((x.type, x.start, x.end) for x in held)

    r = _lock(1, F_RDLCK, 0, 9)
    held = apply([r], _lock(1, F_WRLCK, 3, 5), NOW)   # a write lock inside a read lock splits it
    assert _ranges(held) == [(F_RDLCK, 0, 2), (F_RDLCK, 6, 9), (F_WRLCK, 3, 5)]
    held = apply(held, _lock(1, F_RDLCK, 3, 5), NOW)   # back to read: one lock again
    assert _ranges(held) == [(F_RDLCK, 0, 9)]
    held = apply(held, _lock(1, F_RDLCK, 10, 12), NOW)   # an adjacent lock of the same type merges
    assert _ranges(held) == [(F_RDLCK, 0, 12)]
    held = apply(held, _lock(1, F_UNLCK, 4, 4), NOW)   # an unlock punches a hole
    assert _ranges(held) == [(F_RDLCK, 0, 3), (F_RDLCK, 5, 12)]
    held = apply(held, _lock(1, F_UNLCK, 0, OFFSET_MAX), NOW)
    assert held == []


# -- leases ----------------------------------------------------------------------------------------

@given(held=st.lists(st.tuples(types, ranges, st.sampled_from([-1.0, 0.0, 1.0])), max_size=6),
       wanted=st.tuples(st.integers(0, 6), st.sampled_from([F_RDLCK, F_WRLCK, F_UNLCK]), ranges))
def test_expired_locks_block_nothing_and_are_dropped(
        held: list[tuple[int, list[int], float]], wanted: tuple[int, int, list[int]]) -> None:
    """Locks (of owners 0, 1, ..., one each) that expire a second ago, now,
    or in a second (`expires <= now` is expired), and a request of one of
    them or of another owner: `conflict` answers as if the expired ones were
    not there, and `apply` leaves none of them, whoever's they were."""
    locks_ = [_lock(owner, t, *r, expires=NOW + delta) for owner, (t, r, delta) in enumerate(held)]
    alive = [lock for lock in locks_ if lock.expires > NOW]
    request = _lock(wanted[0], wanted[1], *wanted[2])
    found = conflict(locks_, request, NOW)
    assert found == conflict(alive, request, NOW)
    assert found is None or found.expires > NOW
    after = apply(locks_, request, NOW)
    assert all(lock.expires > NOW for lock in after), after
    assert after == apply(alive, request, NOW)


def test_a_lock_expires_at_its_expiry() -> None:
    held = [_lock(1, F_WRLCK, 0, 9, expires=NOW)]
    wanted = _lock(2, F_WRLCK, 0, 9)
    assert conflict(held, wanted, NOW - 0.5) == held[0]
    assert conflict(held, wanted, NOW) is None
    assert apply(held, wanted, NOW) == [wanted]
    assert apply(held, _lock(1, F_UNLCK, 20, 29), NOW) == []   # the owner's own expired lock goes too


# -- the record ------------------------------------------------------------------------------------

any_locks = st.builds(Lock, session=st.text(max_size=20), owner=st.integers(0, 2**64 - 1),
                      kind=st.sampled_from(KINDS), type=st.sampled_from([F_RDLCK, F_WRLCK, F_UNLCK]),
                      start=st.integers(0, OFFSET_MAX), end=st.integers(0, OFFSET_MAX),
                      pid=st.integers(0, 2**32 - 1), expires=st.floats(allow_nan=False, allow_infinity=False))


@given(held=st.lists(any_locks, max_size=5))
def test_encode_decode_round_trip(held: list[Lock]) -> None:
    assert decode(encode(held)) == held


@pytest.mark.parametrize("raw", [b"not json", b"[1,2]", b'[{"x":1}]', b"\xff\xfe", b"null",
                                 b'[{"session":"s","owner":1}]'])
def test_a_record_that_is_not_one_is_a_format_error(raw: bytes) -> None:
    with pytest.raises(MetadataFormatError):
        decode(raw)


def test_no_record_is_no_locks() -> None:
    assert decode(None) == []
    assert decode(encode([])) == []


# -- LockTable: two mounts on one set of records ---------------------------------------------------

INO = 7


class Clock:
    """The wall clock of the tests' mounts, moved by hand."""

    def __init__(self, now: float = NOW) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def _mounts(lease: float = 10.0) -> tuple[MemoryRecords, Clock, LockTable, LockTable]:
    """The records, the clock, and mounts A and B (each its own client)."""
    records, clock = MemoryRecords(), Clock()
    a = LockTable(records.attach(), lease=lease, clock=clock)
    b = LockTable(records.attach(), lease=lease, clock=clock)
    assert a.session != b.session
    return records, clock, a, b


def _held(records: MemoryRecords, ino: int = INO) -> list[Lock]:
    return decode(records.get(lock_key(ino)))


def test_a_conflict_between_mounts_changes_nothing_until_the_holder_releases() -> None:
    records, _clock, a, b = _mounts()
    taken = a.lock(1, POSIX, F_WRLCK, 0, 99, pid=111)
    assert a.set(INO, taken) is None
    assert a.holds(INO) and not b.holds(INO)
    assert _held(records) == [taken]

    before, b_client = dict(records.records), b.records
    assert isinstance(b_client, MemoryRecords)
    wanted = b.lock(1, POSIX, F_RDLCK, 50, 60, pid=222)
    assert b.set(INO, wanted) == taken
    assert records.records == before and b_client.writes == 0 and not b.holds(INO)
    assert b.test(INO, wanted) == taken
    assert b.test(INO, b.lock(1, POSIX, F_RDLCK, 100, 200, pid=222)) is None
    assert b.test(INO, b.lock(1, FLOCK, F_WRLCK, 0, OFFSET_MAX, pid=222)) is None
    assert a.test(INO, a.lock(1, POSIX, F_WRLCK, 0, 99, pid=111)) is None   # its own
    assert a.test(INO, a.lock(2, POSIX, F_RDLCK, 0, 0, pid=112)) == taken   # another owner of A's

    assert a.pid_of(taken) == 111 and b.pid_of(taken) == 0
    assert b.pid_of(wanted) == 222 and a.pid_of(wanted) == 0

    a.release_owner(INO, 1, POSIX)
    assert not a.holds(INO)
    assert records.get(lock_key(INO)) is None   # the last lock gone, the record with it
    assert b.set(INO, wanted) is None
    assert b.holds(INO) and _held(records) == [wanted]
    b.set(INO, b.lock(1, POSIX, F_UNLCK, 0, OFFSET_MAX, pid=222))
    assert not b.holds(INO) and records.get(lock_key(INO)) is None


def test_holds_while_any_lock_of_the_mount_is_left() -> None:
    records, _clock, a, b = _mounts()
    assert not a.holds(INO)
    assert a.set(INO, a.lock(1, POSIX, F_RDLCK, 0, 9, pid=1)) is None
    assert a.set(INO, a.lock(2, FLOCK, F_WRLCK, 0, OFFSET_MAX, pid=2)) is None
    assert b.set(INO, b.lock(1, POSIX, F_RDLCK, 0, 9, pid=3)) is None
    assert a.set(INO, a.lock(1, POSIX, F_UNLCK, 0, 4, pid=1)) is None   # a hole: [5, 9] left
    assert a.holds(INO) and not a.holds(INO + 1)
    a.release_owner(INO, 1, POSIX)
    assert a.holds(INO)   # the flock
    a.release_owner(INO, 2, POSIX)   # owner 2 holds no POSIX lock: its flock stays
    assert a.holds(INO) and len(_held(records)) == 2
    a.release_owner(INO, 2, FLOCK)
    assert not a.holds(INO) and b.holds(INO)
    assert [lock.session for lock in _held(records)] == [b.session]


def test_an_unlock_is_never_refused() -> None:
    """POSIX: unlocking cannot fail because of another owner's lock. Owner 1
    of mount A reads [0, 9] while mount B writes [20, 29] of the same file;
    owner 1 closes the file (`release_owner`, whose range covers B's lock):
    its lock must go, or it stays for as long as A runs (A's renewals keep it
    alive). Also an unlock over B's lock that A's owner holds nothing under."""
    records, _clock, a, b = _mounts()
    assert a.set(INO, a.lock(1, POSIX, F_RDLCK, 0, 9, pid=1)) is None
    assert b.set(INO, b.lock(1, POSIX, F_WRLCK, 20, 29, pid=2)) is None
    assert a.set(INO, a.lock(1, POSIX, F_UNLCK, 0, 9, pid=1)) is None
    assert a.set(INO, a.lock(1, POSIX, F_RDLCK, 0, 9, pid=1)) is None
    assert a.set(INO, a.lock(2, POSIX, F_UNLCK, 15, 25, pid=1)) is None
    a.release_owner(INO, 1, POSIX)
    assert not a.holds(INO)
    assert [lock.session for lock in _held(records)] == [b.session]


def test_a_lease_not_renewed_frees_the_lock() -> None:
    records, clock, a, b = _mounts(lease=10.0)
    assert a.set(INO, a.lock(1, POSIX, F_WRLCK, 0, 9, pid=1)) is None
    clock.now += 9.5
    wanted = b.lock(1, POSIX, F_WRLCK, 5, 5, pid=2)
    assert b.set(INO, wanted) is not None
    clock.now += 1.5   # 11 s: A's mount is gone as far as B can tell
    wanted = b.lock(1, POSIX, F_WRLCK, 5, 5, pid=2)
    assert b.test(INO, wanted) is None
    assert b.set(INO, wanted) is None
    assert _held(records) == [wanted]   # A's expired lock dropped as B wrote


def test_a_renewed_lease_keeps_the_lock() -> None:
    records, clock, a, b = _mounts(lease=10.0)
    taken = a.lock(1, POSIX, F_WRLCK, 0, 9, pid=1)
    assert a.set(INO, taken) is None
    clock.now += 6
    a.renew()
    assert _held(records)[0].expires == NOW + 16
    clock.now += 5   # 11 s after the lock was taken, 5 after its renewal
    wanted = b.lock(1, POSIX, F_RDLCK, 0, 0, pid=2)
    held = b.set(INO, wanted)
    assert held is not None and (held.owner, held.start, held.end) == (1, 0, 9)
    assert b.test(INO, wanted) == held
    clock.now += 5   # 16 s: the renewed lease is over
    assert b.set(INO, b.lock(1, POSIX, F_RDLCK, 0, 0, pid=2)) is None


def test_renew_does_not_touch_the_other_mounts_locks() -> None:
    records, clock, a, b = _mounts(lease=10.0)
    assert a.set(INO, a.lock(1, POSIX, F_RDLCK, 0, 9, pid=1)) is None
    theirs = b.lock(1, POSIX, F_RDLCK, 0, 9, pid=2)
    assert b.set(INO, theirs) is None
    clock.now += 6
    a.renew()
    expiries = {lock.session: lock.expires for lock in _held(records)}
    assert expiries == {a.session: NOW + 16, b.session: NOW + 10}


def test_release_all_drops_the_mounts_locks_and_leaves_the_others() -> None:
    records, _clock, a, b = _mounts()
    assert a.set(1, a.lock(1, POSIX, F_WRLCK, 0, 9, pid=1)) is None
    assert a.set(2, a.lock(1, POSIX, F_RDLCK, 0, 9, pid=1)) is None
    assert a.set(2, a.lock(2, FLOCK, F_RDLCK, 0, OFFSET_MAX, pid=1)) is None
    theirs = [b.lock(1, POSIX, F_RDLCK, 5, 20, pid=2), b.lock(1, FLOCK, F_RDLCK, 0, OFFSET_MAX, pid=2)]
    for lock in theirs:
        assert b.set(2, lock) is None
    assert b.set(3, b.lock(1, POSIX, F_WRLCK, 0, 9, pid=2)) is None
    third = records.get(lock_key(3))
    a.release_all()
    assert not any(a.holds(ino) for ino in (1, 2, 3))
    assert records.get(lock_key(1)) is None
    assert sorted(_held(records, 2), key=lambda lock: lock.kind) == sorted(theirs, key=lambda lock: lock.kind)
    assert records.get(lock_key(3)) == third
    assert b.holds(2) and b.holds(3)


# -- compare-and-set contention --------------------------------------------------------------------

class Interference:
    """A `before_write` of mount B's records: before each of B's writes, while
    `times` allows (None: for ever), mount C takes one more read lock, on a
    byte of its own, so that B's write finds the record changed."""

    def __init__(self, c: LockTable, times: int | None) -> None:
        self.c, self.times = c, times
        self.taken: list[Lock] = []

    def __call__(self, number: int) -> None:
        if self.times is None or len(self.taken) < self.times:
            offset = 100 + 2 * len(self.taken)
            self.taken.append(self.c.lock(len(self.taken), POSIX, F_RDLCK, offset, offset, pid=3))
            assert self.c.set(INO, self.taken[-1]) is None


def _contended(times: int | None) -> tuple[MemoryRecords, MemoryRecords, LockTable, Interference]:
    """The records, mount B's client of them, mount B, and what B's writes lose to."""
    records, clock = MemoryRecords(), Clock()
    interference = Interference(LockTable(records.attach(), clock=clock), times)
    b_records = records.attach(before_write=interference)
    return records, b_records, LockTable(b_records, clock=clock), interference


def _by_start(held: list[Lock]) -> list[Lock]:
    return sorted(held, key=lambda lock: lock.start)


@pytest.mark.parametrize("times", [1, 3])
def test_a_lost_compare_and_set_is_retried_on_the_new_record(times: int) -> None:
    """B's create of the record loses, then its compare-and-sets: each time
    it reads again and decides again, and in the end both mounts' locks are
    there. Then B's delete of the record (as its last lock goes) loses the
    same way, and C's locks are left."""
    records, b_records, b, interference = _contended(times)
    mine = b.lock(1, POSIX, F_WRLCK, 0, 9, pid=2)
    assert b.set(INO, mine) is None
    assert b_records.writes == times + 1
    assert _by_start(_held(records)) == [mine, *interference.taken] and len(interference.taken) == times
    assert b.holds(INO) and interference.c.holds(INO)

    interference.times = 2 * times   # as many again
    b.release_owner(INO, 1, POSIX)
    assert b_records.writes == 2 * (times + 1)
    assert not b.holds(INO)
    assert _by_start(_held(records)) == interference.taken and len(interference.taken) == 2 * times


def test_a_retry_sees_a_conflict_that_came_in_between() -> None:
    """C takes a write lock over B's range just before B's write: B's retry
    finds it and is refused, with nothing of B's written."""
    records, clock = MemoryRecords(), Clock()
    c = LockTable(records.attach(), clock=clock)
    theirs = c.lock(1, POSIX, F_WRLCK, 5, 5, pid=3)

    def interfere(number: int) -> None:
        assert number == 0
        assert c.set(INO, theirs) is None

    b = LockTable(records.attach(before_write=interfere), clock=clock)
    assert b.set(INO, b.lock(1, POSIX, F_RDLCK, 0, 9, pid=2)) == theirs
    assert _held(records) == [theirs] and not b.holds(INO)


def test_a_record_that_changes_at_every_try_is_an_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(locks, "_CAS_TRIES", 5)
    records, b_records, b, interference = _contended(None)
    with pytest.raises(MetaFlowError):
        b.set(INO, b.lock(1, POSIX, F_WRLCK, 0, 9, pid=2))
    assert b_records.writes == 5
    assert _by_start(_held(records)) == interference.taken and not b.holds(INO)
