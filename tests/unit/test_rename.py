"""Rename's two-phase commit (`client_lib.fs.namespace`), in memory: random
sequences of namespace operations against the POSIX model, the same with
the renaming client killed before or after any one of its writes, and
readers looking between every two writes of a rename."""

from __future__ import annotations

import contextlib
import errno
import itertools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from client_lib import NamespaceError
from client_lib.fs.inode import Attributes, decode_entry
from client_lib.fs.namespace import LEASE_NS, Namespace
from tests.fs_model import Crash, MemoryRecords, Model, Tree, run_op, visible_links, visible_tree

NAMES = ["a", "b", "c"]
OPS = ["mkdir", "create", "symlink", "unlink", "rmdir", "setattr", "rename", "rename", "lookup", "link"]
ROOT = 1


class Clock:
    """Nanoseconds that tests move on; sleeping moves them too."""

    def __init__(self) -> None:
        self.now = 10**18

    def __call__(self) -> int:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += int(seconds * 1e9)


_INODES = itertools.count(100)
"""One allocator for every client of every test: inode numbers never repeat.
(Each client once took a range from its records' memory address modulo 997,
and two clients of one test now and then drew the same range.)"""


def _namespace(records: MemoryRecords, clock: Clock) -> Namespace:
    return Namespace(records, root=ROOT, clock=clock, sleep=clock.sleep, new_ino=lambda: next(_INODES))


def _whole_tree(ns: Namespace) -> Tree:
    """Every directory reachable from the root, as a reader lists it."""
    tree: Tree = {}
    todo = [ROOT]
    while todo:
        ino = todo.pop()
        tree[ino] = {name.decode(): (a.kind, a.ino) for name, a in ns.walk(ino)}
        todo += [child for kind, child in tree[ino].values() if kind == "dir"]
    return tree


def _fresh() -> tuple[MemoryRecords, Clock, Namespace, Model]:
    records, clock = MemoryRecords(), Clock()
    ns = _namespace(records, clock)
    ns.format()
    return records, clock, ns, Model(ROOT)


op_lists = st.lists(st.tuples(st.sampled_from(OPS), st.integers(0, 7), st.sampled_from(NAMES),
                              st.integers(0, 7), st.sampled_from(NAMES),
                              st.tuples(st.integers(0, 8), st.booleans())),
                    min_size=1, max_size=30)


def _pick(model: Model, removed: list[int], index: int) -> int:
    known = sorted(model.dirs) + removed
    return known[index % len(known)]


def _step(ns: Namespace, model: Model, removed: list[int], op: str, parent: int, name: str,
          new_parent: int, new_name: str) -> None:
    """One operation on both, with the same outcome required."""
    if op == "rename" and model.below_itself(parent, name, new_parent):
        return
    code, attributes = run_op(ns, op, parent, name, new_parent, new_name)
    expected = model.apply(op, parent, name, attributes.ino if attributes and op != "rename" else None,
                           new_parent, new_name)
    assert code == expected, (op, parent, name, new_parent, new_name)
    if op == "rmdir" and code == 0 and attributes is not None:
        removed.append(attributes.ino)


@given(ops=op_lists)
@settings(max_examples=200)
def test_random_sequences_with_renames_match_the_model(ops: list) -> None:
    _, _, ns, model = _fresh()
    removed: list[int] = []
    for op, pick, name, new_pick, new_name, _ in ops:
        _step(ns, model, removed, op, _pick(model, removed, pick), name,
              _pick(model, removed, new_pick), new_name)
        assert visible_tree(ns, model) == model.dirs
        assert visible_links(ns, model) == model.links()
    assert not [k for k, v in ns.client.records.items() if b'"intent"' in v]   # type: ignore[attr-defined]


@given(ops=op_lists, clients=st.lists(st.integers(0, 2), min_size=30, max_size=30))
@settings(max_examples=200)
def test_three_clients_taking_turns_match_the_model(ops: list, clients: list[int]) -> None:
    """The same sequences, each operation by one of three clients of the same
    records: each remembers records the others have since changed, and its
    guesses must never show (they are only compared, never believed)."""
    records, clock, ns, model = _fresh()
    others = [ns] + [_namespace(records.attach(), clock) for _ in range(2)]
    removed: list[int] = []
    for (op, pick, name, new_pick, new_name, _), who in zip(ops, clients, strict=False):
        _step(others[who], model, removed, op, _pick(model, removed, pick), name,
              _pick(model, removed, new_pick), new_name)
        assert visible_tree(ns, model) == model.dirs


def test_a_remembered_link_another_client_removed_is_not_changed() -> None:
    """A client remembers the name it linked; another client unlinks it; the
    first one's setattr of that name is ENOENT, and the inode (still named
    by its other link) is untouched. (A remembered stub was once believed
    and the change went to the inode through a name that no longer existed.)"""
    records, clock, ns, _ = _fresh()
    other = _namespace(records.attach(), clock)
    made = ns.create(ROOT, "c")
    ns.link(ROOT, "b", (ROOT, b"c"), made.ino)
    other.unlink(ROOT, "b")
    with pytest.raises(NamespaceError) as caught:
        ns.setattr(ROOT, "b", mode=0o600)
    assert caught.value.errno == errno.ENOENT
    assert ns.lookup(ROOT, "c").mode == made.mode


def _shows(seen: Tree, tree: Tree) -> bool:
    """Whether a reader's view of the directories the model knew before an
    operation (`seen`) is `tree`: the same listings, and a directory that
    `tree` no longer has (the empty one a rename replaced) lists nothing."""
    return all(seen.get(ino) == entries for ino, entries in tree.items()) and \
        all(not entries for ino, entries in seen.items() if ino not in tree)


@given(ops=op_lists)
@settings(max_examples=300)
def test_a_rename_killed_at_any_write_is_all_or_nothing(ops: list) -> None:
    """Each rename runs on a client killed at one of its writes (before or
    after the server applied it). Another client then sees the tree from
    before or after the rename, never a mix; it keeps seeing that same tree
    after its writes have pushed the rename to its end; and later
    operations match the model."""
    records, clock, ns, model = _fresh()
    removed: list[int] = []
    for op, pick, name, new_pick, new_name, (crash_at, applied) in ops:
        parent, new_parent = _pick(model, removed, pick), _pick(model, removed, new_pick)
        if op != "rename":
            _step(ns, model, removed, op, parent, name, new_parent, new_name)
            continue
        before = model.copy()
        after = Model(ROOT)
        after.dirs = model.copy()
        if model.below_itself(parent, name, new_parent):
            continue
        expected = after.apply("rename", parent, name, None, new_parent, new_name)
        dying = _namespace(records.attach(crash_at, applied), clock)
        try:
            code, _ = run_op(dying, "rename", parent, name, new_parent, new_name)
        except Crash:
            code = None
        clock.now += LEASE_NS   # the dead client's lease runs out
        seen = visible_tree(ns, model)
        if code is not None:
            assert code == expected and _shows(seen, after.dirs if code == 0 else before)
        else:
            assert _shows(seen, before) or _shows(seen, after.dirs), (parent, name, new_parent, new_name)
        seen = before if _shows(seen, before) else after.dirs
        for directory, entries in seen.items():   # writes to every entry settle the rename
            for entry in entries:
                ns._settled(ns.entry_key(directory, entry))
        assert _shows(visible_tree(ns, model), seen)
        model.dirs = {ino: dict(entries) for ino, entries in seen.items()}
    assert visible_tree(ns, model) == model.dirs


@pytest.mark.parametrize("across", [False, True], ids=["one-directory", "two-directories"])
@pytest.mark.parametrize("replacing", [None, "file", "dir"])
def test_readers_between_any_two_writes_see_before_then_after(across: bool, replacing: str | None) -> None:
    """A reader looks at the whole tree before each write of a rename: it sees
    the tree before the rename, then (from the commit on) the tree after it,
    and nothing else."""
    records, clock, ns, model = _fresh()
    src = ns.mkdir(ROOT, "src") if across else ns.root_attributes()
    dst = ns.mkdir(ROOT, "dst") if across else src
    moving = ns.mkdir(src.ino, "m") if replacing == "dir" else ns.create(src.ino, "m")
    ns.create(moving.ino, "inside") if moving.kind == "dir" else None
    if replacing == "dir":
        ns.mkdir(dst.ino, "t")
    elif replacing == "file":
        ns.create(dst.ino, "t")
    model_before = _whole_tree(ns)
    after = Model(ROOT)
    after.dirs = {ino: dict(e) for ino, e in model_before.items()}
    assert after.apply("rename", src.ino, "m", None, dst.ino, "t") == 0
    seen: list[Tree] = []

    def look(number: int) -> None:
        view = _whole_tree(_namespace(records.attach(), clock))
        assert view in (model_before, after.dirs), number
        seen.append(view)

    renamer = _namespace(records.attach(before_write=look), clock)
    renamer.rename(src.ino, "m", dst.ino, "t")
    assert seen[0] == model_before and seen[-1] != model_before
    firsts = [i for i, view in enumerate(seen) if view != model_before]
    assert firsts == list(range(firsts[0], len(seen)))   # once after, always after
    assert not [k for k, v in records.records.items() if b'"intent"' in v]


def test_a_stalled_rename_is_aborted_by_another_client_and_retries() -> None:
    """The renamer stalls after locking its source, past its lease; another
    client's setattr aborts the rename and applies. The renamer's late
    writes fail their compare-and-set, it cleans up after itself and tries
    again: the file ends up moved once, with the setattr."""
    records, clock, ns, _ = _fresh()
    ns.create(ROOT, "f")
    d = ns.mkdir(ROOT, "d")

    def stall(number: int) -> None:
        if number == 1:   # the renamer's prepare of its target, before it lands
            clock.now += LEASE_NS
            assert ns.setattr(ROOT, "f", mode=0o600).mode == 0o600

    _namespace(records.attach(before_write=stall), clock).rename(ROOT, "f", d.ino, "g")
    assert [n for n, _ in ns.walk(ROOT)] == [b"d"]
    assert [(n, a.mode) for n, a in ns.walk(d.ino)] == [(b"g", 0o600)]
    assert not [k for k, v in records.records.items() if b'"intent"' in v]


def test_a_young_rename_is_waited_for_not_aborted() -> None:
    """A writer that meets a rename in flight within its lease waits (here:
    the clock moves only by its pauses), and aborts it only once the lease
    has run out."""
    records, clock, ns, _ = _fresh()
    ns.create(ROOT, "f")
    dying = _namespace(records.attach(crash_at=1), clock)
    with pytest.raises(Crash):
        dying.rename(ROOT, "f", ROOT, "g")
    start = clock.now
    assert ns.unlink(ROOT, "f").kind == "file"
    assert LEASE_NS <= clock.now - start < 2 * LEASE_NS
    assert list(ns.walk(ROOT)) == []


def test_rename_errors() -> None:
    _, _, ns, _ = _fresh()
    d, e = ns.mkdir(ROOT, "d"), ns.mkdir(ROOT, "e")
    ns.create(e.ino, "x")
    ns.create(ROOT, "f")
    for args, replace_target, code in [((ROOT, "missing", ROOT, "z"), True, errno.ENOENT),
                                       ((ROOT, "d", d.ino, "z"), True, errno.EINVAL),
                                       ((ROOT, "d", ROOT, "f"), True, errno.ENOTDIR),
                                       ((ROOT, "f", ROOT, "d"), True, errno.EISDIR),
                                       ((ROOT, "d", ROOT, "e"), True, errno.ENOTEMPTY),
                                       ((ROOT, "f", 424242, "z"), True, errno.ENOENT),
                                       ((ROOT, "f", ROOT, "a/b"), True, errno.EINVAL),
                                       ((ROOT, "f", e.ino, "x"), False, errno.EEXIST)]:
        with pytest.raises(NamespaceError) as failed:
            ns.rename(*args, replace_target=replace_target)
        assert failed.value.errno == code, args
    assert sorted(n for n, _ in ns.walk(ROOT)) == [b"d", b"e", b"f"]   # nothing moved
    assert [n for n, _ in ns.walk(e.ino)] == [b"x"]
    assert ns.rename(ROOT, "f", ROOT, "f") is None and ns.lookup(ROOT, "f").kind == "file"
    replaced = ns.rename(ROOT, "f", e.ino, "x")
    assert replaced is not None and replaced.kind == "file"
    assert ns.rename(ROOT, "d", e.ino, "d") is None and ns.rmdir(e.ino, "d").kind == "dir"


def _names_and_links(ns: Namespace, ino: int) -> tuple[set[str], int]:
    """The root's names of inode `ino` as a reader lists them, and the
    largest link count any of them shows (0 if none)."""
    shown = [(name.decode(), a.nlink) for name, a in ns.walk(ROOT) if a.ino == ino]
    return {name for name, _ in shown}, max((n for _, n in shown), default=0)


@pytest.mark.parametrize("step", ["first link", "second link", "unlink of a linked name"])
@pytest.mark.parametrize("applied", [False, True])
@pytest.mark.parametrize("crash_at", range(4))
def test_a_link_or_unlink_killed_at_any_write_loses_no_name_and_never_undercounts(
        step: str, applied: bool, crash_at: int) -> None:
    """A hard link or unlink runs on a client killed at one of its writes
    (before or after the server applied it). Another client then sees the
    names from before or after it, each of them readable (no name left
    pointing at a missing inode record), and a link count never below the
    names it has: a count too high keeps the data, one too low would lose it."""
    records, clock, ns, _ = _fresh()
    made = ns.create(ROOT, "a")
    names = {"a"}
    if step != "first link":
        ns.link(ROOT, "b", (ROOT, b"a"), made.ino)
        names.add("b")
    dying = _namespace(records.attach(crash_at, applied), clock)
    if step == "unlink of a linked name":
        call, after = (lambda: dying.unlink(ROOT, "b")), names - {"b"}
    else:
        new = "b" if step == "first link" else "c"
        call, after = (lambda: dying.link(ROOT, new, (ROOT, b"a"), made.ino)), names | {new}
    with contextlib.suppress(Crash):
        call()
    shown, count = _names_and_links(ns, made.ino)
    assert shown in (names, after), shown
    assert count >= len(shown)
    for name in shown:
        assert ns.lookup(ROOT, name).ino == made.ino


@given(ops=op_lists)
@settings(max_examples=200)
def test_a_lookup_from_one_record_says_what_lookup_says(ops: list) -> None:
    """The mount answers most lookups on its event loop from the entry's
    record alone (`Namespace.plain_entry`), and leaves the rest to `lookup`.
    Whatever state the records are in (every operation by a client killed at
    one of its writes: renames left in flight, links half made, hard-linked
    inodes), where it answers it answers what `lookup` does, and it answers
    every entry that no rename holds and that is not a hard link."""
    records, clock, ns, _ = _fresh()
    directories = [ROOT]
    for op, pick, name, new_pick, new_name, (crash_at, applied) in ops:
        parent, new_parent = directories[pick % len(directories)], directories[new_pick % len(directories)]
        dying = _namespace(records.attach(crash_at, applied), clock)
        with contextlib.suppress(Crash):
            code, made = run_op(dying, op, parent, name, new_parent, new_name)
            if op == "mkdir" and code == 0 and made is not None:
                directories.append(made.ino)
        clock.now += LEASE_NS
        reader = _namespace(records.attach(), clock)
        for directory in directories:
            for entry in NAMES:
                key = reader.entry_key(directory, entry)
                raw = records.get(key)
                fast = reader.plain_entry(key, raw)
                try:
                    slow: Attributes | int = reader.lookup(directory, entry)
                except NamespaceError as exc:
                    slow = exc.errno
                if fast is not None:
                    assert fast == slow, (directory, entry)
                if raw is not None:
                    attributes, intent = decode_entry(raw)
                    plain = intent is None and not attributes.shared
                    assert (fast is not None) == plain, (directory, entry)
