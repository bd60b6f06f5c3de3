"""The file-system namespace (`client_lib.namespace`) on a real agent, against
an in-memory model: random sequences of mkdir, create, symlink, unlink, rmdir,
setattr and lookup give the same results and errno values, and leave the same
tree. Each example gets a root of its own, so one agent serves them all."""

from __future__ import annotations

import errno
import secrets
import threading

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from client_lib import MetaFlowClient, NamespaceError
from client_lib.namespace import Attributes, Namespace, directory_key

NAMES = ["a", "b", "c"]
OPS = ["mkdir", "create", "symlink", "unlink", "rmdir", "setattr", "lookup"]


@pytest.fixture(scope="module")
def client(standalone_client: MetaFlowClient) -> MetaFlowClient:
    return standalone_client


def _fresh(client: MetaFlowClient) -> Namespace:
    """A namespace with a root of its own: every run, replays included (the
    agent keeps what earlier runs made), starts from an empty tree."""
    ns = Namespace(client, root=secrets.randbits(62) | 2)
    ns.format()
    return ns


class Model:
    """Directories as {name: (kind, ino)}, keyed by inode."""

    def __init__(self, root: int) -> None:
        self.dirs: dict[int, dict[str, tuple[str, int]]] = {root: {}}

    def apply(self, op: str, parent: int, name: str, made: int | None) -> int:
        """The errno the operation must fail with, or 0; `made` is the new inode."""
        entries = self.dirs.get(parent)
        if entries is None:
            return errno.ENOENT
        found = entries.get(name)
        if op in ("mkdir", "create", "symlink"):
            if found is not None:
                return errno.EEXIST
            assert made is not None
            entries[name] = ("dir" if op == "mkdir" else "file" if op == "create" else "symlink", made)
            if op == "mkdir":
                self.dirs[made] = {}
            return 0
        if found is None:
            return errno.ENOENT
        kind, ino = found
        if op == "unlink":
            if kind == "dir":
                return errno.EISDIR
            del entries[name]
        elif op == "rmdir":
            if kind != "dir":
                return errno.ENOTDIR
            if self.dirs[ino]:
                return errno.ENOTEMPTY
            del entries[name], self.dirs[ino]
        return 0


def _run(ns: Namespace, op: str, parent: int, name: str) -> tuple[int, Attributes | None]:
    try:
        if op == "mkdir":
            return 0, ns.mkdir(parent, name)
        if op == "create":
            return 0, ns.create(parent, name)
        if op == "symlink":
            return 0, ns.symlink(parent, name, "../" + name)
        if op == "unlink":
            return 0, ns.unlink(parent, name)
        if op == "rmdir":
            return 0, ns.rmdir(parent, name)
        if op == "setattr":
            return 0, ns.setattr(parent, name, mode=0o600, mtime_ns=7)
        return 0, ns.lookup(parent, name)
    except NamespaceError as exc:
        return exc.errno, None


@given(ops=st.lists(
    st.tuples(st.sampled_from(OPS), st.integers(0, 7), st.sampled_from(NAMES)), min_size=1, max_size=40))
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
def test_random_sequences_match_the_model(client: MetaFlowClient, ops: list[tuple[str, int, str]]) -> None:
    ns = _fresh(client)
    model = Model(ns.root)
    removed: list[int] = []      # directories that existed once: operations in them fail
    for op, pick, name in ops:
        known = sorted(model.dirs) + removed
        parent = known[pick % len(known)]
        code, attributes = _run(ns, op, parent, name)
        expected = model.apply(op, parent, name, attributes.ino if attributes else None)
        assert code == expected, (op, parent, name)
        if op == "rmdir" and code == 0 and attributes is not None:
            removed.append(attributes.ino)
        if op == "setattr" and code == 0:
            assert attributes is not None and attributes.mode == 0o600 and attributes.mtime_ns == 7
            assert ns.lookup(parent, name).version == attributes.version
    for ino, entries in model.dirs.items():
        listed = {name.decode(): (a.kind, a.ino) for name, a in ns.walk(ino)}
        assert listed == entries
    for ino in removed:
        assert client.get(directory_key(ino)) is None and list(ns.walk(ino)) == []


def test_concurrent_creators_in_one_directory_lose_and_duplicate_nothing(client: MetaFlowClient) -> None:
    """Eight threads create 50 names each, half of them shared: every name
    exists once, each shared name was won by exactly one thread."""
    ns = _fresh(client)
    home = ns.mkdir(ns.root, "home")
    wins: dict[str, list[int]] = {}
    lock = threading.Lock()

    def creator(n: int) -> None:
        for i in range(50):
            name = f"shared-{i}" if i % 2 else f"own-{n}-{i}"
            try:
                ns.create(home.ino, name)
            except NamespaceError as exc:
                assert exc.errno == errno.EEXIST
                continue
            with lock:
                wins.setdefault(name, []).append(n)

    threads = [threading.Thread(target=creator, args=(n,)) for n in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    names = [name.decode() for name, _ in ns.walk(home.ino)]
    assert names == sorted(set(names)) and len(names) == 8 * 25 + 25
    assert all(len(w) == 1 for w in wins.values()) and set(wins) == set(names)


def test_errors_a_file_system_expects(client: MetaFlowClient) -> None:
    ns = _fresh(client)
    f = ns.create(ns.root, "f")
    for call, code in [(lambda: ns.create(ns.root, "f"), errno.EEXIST),
                       (lambda: ns.mkdir(f.ino, "x"), errno.ENOENT),          # a file takes no entries
                       (lambda: ns.rmdir(ns.root, "f"), errno.ENOTDIR),
                       (lambda: ns.link(ns.root, "g", f.ino), errno.EPERM),
                       (lambda: ns.lookup(ns.root, "a/b"), errno.EINVAL),
                       (lambda: ns.create(ns.root, ".."), errno.EINVAL),
                       (lambda: ns.setattr(ns.root, "f", nlink=2), errno.EINVAL),
                       (lambda: ns.lookup(ns.root, "missing"), errno.ENOENT)]:
        with pytest.raises(NamespaceError) as failed:
            call()
        assert failed.value.errno == code
    d = ns.mkdir(ns.root, "d", mode=0o40750)
    assert d.mode == 0o750 and d.st_mode == 0o40750 and ns.root_attributes().kind == "dir"
    link = ns.symlink(d.ino, "l", "../f")
    assert ns.lookup(d.ino, "l").target == "../f" and link.size == 4
    with pytest.raises(NamespaceError) as busy:
        ns.rmdir(ns.root, "d")
    assert busy.value.errno == errno.ENOTEMPTY
    assert ns.setattr(ns.root, "f", size=10).size == 10
