"""Shared by the namespace tests: the POSIX model a `Namespace` must match,
and the service's record operations in memory, for pure tests of the
namespace logic (crashes injected between any two requests)."""

from __future__ import annotations

import errno
from collections.abc import Callable
from dataclasses import dataclass, field

from client_lib import NamespaceError
from client_lib.fs.namespace import Attributes, Namespace
from client_lib.mdid import entry_key, normalize_key

Tree = dict[int, dict[str, tuple[str, int]]]
"""Directories by inode: {name: (kind, ino)}."""

CREATES = {"mkdir": "dir", "create": "file", "symlink": "symlink"}


class Model:
    """The namespace as POSIX defines it, in memory."""

    def __init__(self, root: int) -> None:
        self.root = root
        self.dirs: Tree = {root: {}}

    def copy(self) -> Tree:
        return {ino: dict(entries) for ino, entries in self.dirs.items()}

    def below(self, ino: int, other: int) -> bool:
        """Whether directory `other` is `ino` or inside it."""
        return other == ino or any(kind == "dir" and self.below(child, other)
                                   for kind, child in self.dirs.get(ino, {}).values())

    def below_itself(self, parent: int, name: str, new_parent: int) -> bool:
        """Whether renaming (parent, name) into `new_parent` moves a directory
        strictly below itself: the kernel refuses it, `Namespace` does not
        check it across clients (its docstring), so tests do not ask."""
        kind, ino = self.dirs.get(parent, {}).get(name, ("", 0))
        return kind == "dir" and new_parent != ino and self.below(ino, new_parent)

    def apply(self, op: str, parent: int, name: str, made: int | None = None,
              new_parent: int = 0, new_name: str = "") -> int:
        """The errno the operation must fail with, or 0; `made` is a new inode."""
        entries = self.dirs.get(parent)
        if entries is None:
            return errno.ENOENT
        found = entries.get(name)
        if op in CREATES:
            if found is not None:
                return errno.EEXIST
            assert made is not None
            entries[name] = (CREATES[op], made)
            if op == "mkdir":
                self.dirs[made] = {}
            return 0
        if found is None:
            return errno.ENOENT
        kind, ino = found
        if op == "link":
            return self._link(found, new_parent, new_name)
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
        elif op == "rename":
            return self._rename(entries, name, found, new_parent, new_name)
        return 0

    def _link(self, found: tuple[str, int], new_parent: int, new_name: str) -> int:
        targets = self.dirs.get(new_parent)
        if found[0] == "dir":
            return errno.EPERM
        if targets is None:
            return errno.ENOENT
        if new_name in targets:
            return errno.EEXIST
        targets[new_name] = found
        return 0

    def links(self) -> dict[int, int]:
        """Names per inode of everything but directories."""
        counts: dict[int, int] = {}
        for entries in self.dirs.values():
            for kind, ino in entries.values():
                if kind != "dir":
                    counts[ino] = counts.get(ino, 0) + 1
        return counts

    def _rename(self, entries: dict[str, tuple[str, int]], name: str, found: tuple[str, int],
                new_parent: int, new_name: str) -> int:
        kind, ino = found
        targets = self.dirs.get(new_parent)
        if targets is None:
            return errno.ENOENT
        if targets is entries and new_name == name:
            return 0
        if kind == "dir" and new_parent == ino:
            return errno.EINVAL
        replaced = targets.get(new_name)
        if replaced is not None and replaced[1] == ino:
            return 0   # two names of one inode: POSIX does nothing
        if replaced is not None:
            if kind == "dir" and replaced[0] != "dir":
                return errno.ENOTDIR
            if kind != "dir" and replaced[0] == "dir":
                return errno.EISDIR
            if replaced[0] == "dir":
                if self.dirs[replaced[1]]:
                    return errno.ENOTEMPTY
                del self.dirs[replaced[1]]
        del entries[name]
        targets[new_name] = found
        return 0


def run_op(ns: Namespace, op: str, parent: int, name: str, new_parent: int = 0,
           new_name: str = "") -> tuple[int, Attributes | None]:
    """One operation on a namespace: (errno or 0, the attributes it returned)."""
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
        if op == "rename":
            return 0, ns.rename(parent, name, new_parent, new_name)
        if op == "link":
            source = ns.lookup(parent, name)
            return 0, ns.link(new_parent, new_name, (parent, name.encode()), source.ino)
        return 0, ns.lookup(parent, name)
    except NamespaceError as exc:
        return exc.errno, None


def visible_tree(ns: Namespace, model: Model) -> Tree:
    """What `ns` shows of every directory the model knows."""
    return {ino: {name.decode(): (a.kind, a.ino) for name, a in ns.walk(ino)} for ino in model.dirs}


def visible_links(ns: Namespace, model: Model) -> dict[int, int]:
    """The link count `ns` shows for every inode but directories, by any name of it."""
    return {a.ino: a.nlink for ino in model.dirs for _, a in ns.walk(ino) if a.kind != "dir"}


class Crash(BaseException):
    """The client process died: nothing after it runs (BaseException, so no
    `except Exception` of the code under test can swallow it)."""


@dataclass
class MemoryRecords:
    """The service's record commands (`client_lib.MetaFlowClient`'s surface)
    over a dict, one atomic step each as on a server. With `crash_at` set,
    the write numbered `crash_at` (from 0) kills the client: it is applied
    first when `applied` (the reply was lost), and every later call raises
    `Crash` too. `before_write`, if set, runs before each write is applied,
    with its number: where a test lets other clients act mid-operation."""

    records: dict[bytes, bytes] = field(default_factory=dict)
    crash_at: int | None = None
    applied: bool = False
    before_write: Callable[[int], None] | None = None
    writes: int = 0
    dead: bool = False

    def attach(self, crash_at: int | None = None, applied: bool = False,
               before_write: Callable[[int], None] | None = None) -> MemoryRecords:
        """Another client of the same records."""
        return MemoryRecords(self.records, crash_at, applied, before_write)

    def _write(self) -> None:
        if self.dead:
            raise Crash
        number, self.writes = self.writes, self.writes + 1
        if self.before_write is not None:
            self.before_write(number)
        if number == self.crash_at:
            self.dead = True
            if not self.applied:
                raise Crash

    def _done(self) -> None:
        if self.dead:
            raise Crash

    def get(self, path: str | bytes) -> bytes | None:
        if self.dead:
            raise Crash
        return self.records.get(normalize_key(path))

    def put(self, path: str | bytes, value: bytes) -> None:
        self._write()
        self.records[normalize_key(path)] = value
        self._done()

    def create(self, path: str | bytes, value: bytes) -> bool:
        self._write()
        done = self.records.setdefault(normalize_key(path), value) is value
        self._done()
        return done

    def compare_and_set(self, path: str | bytes, old: bytes, new: bytes) -> bool:
        self._write()
        key = normalize_key(path)
        done = self.records.get(key) == old
        if done:
            self.records[key] = new
        self._done()
        return done

    def delete(self, path: str | bytes) -> bool:
        self._write()
        done = self.records.pop(normalize_key(path), None) is not None
        self._done()
        return done

    def delete_if_equal(self, path: str | bytes, value: bytes) -> bool:
        self._write()
        key = normalize_key(path)
        done = self.records.get(key) == value
        if done:
            del self.records[key]
        self._done()
        return done

    def entries(self, directory: str | bytes, after: str | bytes = b"",
                count: int = 100) -> list[tuple[bytes, bytes]]:
        if self.dead:
            raise Crash
        prefix = normalize_key(directory) + b"\0"
        start = entry_key(directory, after) if after else prefix
        found = sorted((k, v) for k, v in self.records.items() if k.startswith(prefix) and k > start
                       or (not after and k == start))
        return [(k[len(prefix):], v) for k, v in found[:count]]

    def create_entry(self, directory: str | bytes, name: str | bytes, value: bytes) -> bool:
        self._write()
        if normalize_key(directory) not in self.records:
            self._done()
            raise NamespaceError(errno.ENOENT, "no such directory")
        done = self.records.setdefault(entry_key(directory, name), value) is value
        self._done()
        return done

    def remove_directory(self, directory: str | bytes) -> bool:
        self._write()
        key = normalize_key(directory)
        if any(k.startswith(key + b"\0") for k in self.records):
            self._done()
            raise NamespaceError(errno.ENOTEMPTY, "directory not empty")
        done = self.records.pop(key, None) is not None
        self._done()
        return done
