"""The file-system namespace (`client_lib.fs.namespace`) on real agents, against
the POSIX model of `tests.fs_model`: random sequences of mkdir, create,
symlink, unlink, rmdir, setattr, rename and lookup give the same results and
errno values, and leave the same tree, with the space split between two
agents so that renames cross servers. Each example gets a root of its own,
so the agents serve them all. Concurrent creators and renamers lose and
duplicate nothing, and neither does a renaming process killed at random."""

from __future__ import annotations

import errno
import os
import secrets
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from client_lib import MetaFlowClient, NamespaceError
from client_lib.fs.central import CentralRecords
from client_lib.fs.namespace import Namespace, directory_key
from client_lib.fs.records import Records
from mininet_scenarios.daemons import AgentProcess
from tests.fs_model import Model, run_op, visible_links, visible_tree

NAMES = ["a", "b", "c"]
OPS = ["mkdir", "create", "symlink", "unlink", "rmdir", "setattr", "rename", "lookup", "link"]


@pytest.fixture(scope="module", params=["metaflow", "central-redis"])
def client(request: pytest.FixtureRequest, redis_server: str) -> Iterator[Records]:
    """The same namespace logic on MetaFlow (two agents splitting the space)
    and on one central redis-server (`client_lib.fs.central`, the baseline)."""
    if request.param == "metaflow":
        yield request.getfixturevalue("two_server_client")
        return
    host, port = redis_server.removeprefix("redis://").split(":")
    records = CentralRecords(host, int(port))
    yield records
    records.close()


def _fresh(client: Records) -> Namespace:
    """A namespace with a root of its own: every run, replays included (the
    agents keep what earlier runs made), starts from an empty tree."""
    ns = Namespace(client, root=secrets.randbits(62) | 2)
    ns.format()
    return ns


@given(ops=st.lists(st.tuples(st.sampled_from(OPS), st.integers(0, 7), st.sampled_from(NAMES),
                              st.integers(0, 7), st.sampled_from(NAMES)), min_size=1, max_size=40))
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
def test_random_sequences_match_the_model(client: Records,
                                          ops: list[tuple[str, int, str, int, str]]) -> None:
    ns = _fresh(client)
    model = Model(ns.root)
    removed: list[int] = []      # directories that existed once: operations in them fail
    for op, pick, name, new_pick, new_name in ops:
        known = sorted(model.dirs) + removed
        parent, new_parent = known[pick % len(known)], known[new_pick % len(known)]
        if op == "rename" and model.below_itself(parent, name, new_parent):
            continue
        code, attributes = run_op(ns, op, parent, name, new_parent, new_name)
        made = attributes.ino if attributes is not None and op != "rename" else None
        expected = model.apply(op, parent, name, made, new_parent, new_name)
        assert code == expected, (op, parent, name, new_parent, new_name)
        if op == "rmdir" and code == 0 and attributes is not None:
            removed.append(attributes.ino)
        if op == "setattr" and code == 0:
            assert attributes is not None and attributes.mode == 0o600 and attributes.mtime_ns == 7
            assert ns.lookup(parent, name).version == attributes.version
    assert visible_tree(ns, model) == model.dirs
    assert visible_links(ns, model) == model.links()
    for ino in removed:
        assert client.get(directory_key(ino)) is None and list(ns.walk(ino)) == []


def test_concurrent_creators_in_one_directory_lose_and_duplicate_nothing(client: Records) -> None:
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


def test_errors_a_file_system_expects(client: Records) -> None:
    ns = _fresh(client)
    f = ns.create(ns.root, "f")
    sub = ns.mkdir(ns.root, "sub")
    for call, code in [(lambda: ns.create(ns.root, "f"), errno.EEXIST),
                       (lambda: ns.mkdir(f.ino, "x"), errno.ENOENT),          # a file takes no entries
                       (lambda: ns.rmdir(ns.root, "f"), errno.ENOTDIR),
                       (lambda: ns.link(ns.root, "g", (ns.root, b"sub"), sub.ino), errno.EPERM),
                       (lambda: ns.link(ns.root, "g", (ns.root, b"sub"), f.ino), errno.ESTALE),
                       (lambda: ns.link(ns.root, "sub", (ns.root, b"f"), f.ino), errno.EEXIST),
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


def test_concurrent_creators_and_renamers_into_one_directory(client: Records) -> None:
    """Four threads create names in one directory while four others create
    files in directories of their own and rename them into it, some onto
    names the creators also want: every name ends up there exactly once,
    each shared one won once, and the renamers' directories are empty."""
    ns = _fresh(client)
    home = ns.mkdir(ns.root, "home")
    outcomes: dict[str, list[str]] = {}
    lock = threading.Lock()

    def won(name: str, by: str) -> None:
        with lock:
            outcomes.setdefault(name, []).append(by)

    def creator(n: int) -> None:
        for i in range(40):
            name = f"shared-{i}" if i % 2 else f"c{n}-{i}"
            try:
                ns.create(home.ino, name)
                won(name, f"create {n}")
            except NamespaceError as exc:
                assert exc.errno == errno.EEXIST

    def renamer(n: int) -> None:
        own = ns.mkdir(ns.root, f"own{n}")
        for i in range(40):
            ns.create(own.ino, "tmp")
            name = f"shared-{i}" if i % 4 == 1 else f"r{n}-{i}"
            try:
                ns.rename(own.ino, "tmp", home.ino, name, replace_target=False)
                won(name, f"rename {n}")
            except NamespaceError as exc:
                assert exc.errno == errno.EEXIST
                ns.unlink(own.ino, "tmp")

    threads = [threading.Thread(target=creator, args=(n,)) for n in range(4)] + \
        [threading.Thread(target=renamer, args=(n,)) for n in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    names = [name.decode() for name, _ in ns.walk(home.ino)]
    assert names == sorted(set(names)) == sorted(outcomes)
    assert all(len(by) == 1 for by in outcomes.values()), {k: v for k, v in outcomes.items() if len(v) > 1}
    assert len(names) == 4 * 20 + 4 * 30 + 20
    for n in range(4):
        assert list(ns.walk(ns.lookup(ns.root, f"own{n}").ino)) == []


RENAMER = """
import sys
from client_lib import MetaFlowClient, NamespaceError
from client_lib.fs.namespace import Namespace
from tests.two_servers import route_by_halves
low, high = (tuple(x.split(":")) for x in sys.argv[1:3])
root, a, b = (int(x) for x in sys.argv[3:6])
route = route_by_halves((low[0], int(low[1])), (high[0], int(high[1])))
with MetaFlowClient(route=route) as client:
    ns = Namespace(client, root=root)
    print("ready", flush=True)
    n = 0
    while True:   # each file to the other directory, wherever it is now
        name = f"f{n % 50}"
        try:
            ns.rename(a, name, b, name)
        except NamespaceError:
            ns.rename(b, name, a, name)
        n += 1
"""


def test_a_renaming_process_killed_at_random_leaves_every_file_once(
        two_server_client: MetaFlowClient, two_servers: tuple[AgentProcess, AgentProcess]) -> None:
    """A process renames 50 files back and forth between two directories (on
    two servers, as it happens) and is killed with SIGKILL at a random
    moment, ten times over; after each kill, every file is found exactly
    once, in one directory or the other, and a rename it left half done is
    finished or undone by the next one (whose lease waits are short here)."""
    addresses = [f"{agent.host}:{agent.port}" for agent in two_servers]
    client = two_server_client
    ns = _fresh(client)
    a, b = ns.mkdir(ns.root, "a"), ns.mkdir(ns.root, "b")
    inodes = {ns.create(a.ino, f"f{i}").ino for i in range(50)}
    env = {**os.environ, "PYTHONPATH": os.getcwd()}
    half_done = 0
    for _ in range(10):
        proc = subprocess.Popen([sys.executable, "-c", RENAMER, *addresses, str(ns.root),
                                 str(a.ino), str(b.ino)], stdout=subprocess.PIPE, env=env)
        assert proc.stdout is not None and proc.stdout.readline() == b"ready\n"
        time.sleep(0.05 + secrets.randbelow(300) / 1000)
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        proc.stdout.close()
        half_done += any(b'"intent"' in raw for d in (a, b) for _, raw in client.entries(directory_key(d.ino),
                                                                                        count=1000))
        listed = [(n, attrs.ino) for d in (a, b) for n, attrs in ns.walk(d.ino)]
        assert sorted(ino for _, ino in listed) == sorted(inodes)
        assert sorted(n for n, _ in listed) == sorted(f"f{i}".encode() for i in range(50))
    assert half_done > 0   # the kills did land inside renames (almost all of the loop's time is)
