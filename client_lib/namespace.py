"""A file system's namespace on MetaFlow: directories, files and symlinks by
inode number, each operation a few zero-hop requests.

The layout is IndexFS's, on the service's primitives (`client_lib.client`):

* An object is named by (parent inode, name). Its attributes live *in its
  entry* of the parent directory, ``entry_key(directory_key(parent), name)``,
  which is on the parent's server: a lookup is one GET, and a listing with
  every child's attributes (readdir-plus) is one ``ELIST`` page.
* A directory with inode ``d`` has its own routing key, `directory_key` (d),
  whose record is its *header*: the directory exists (takes entries) while
  the header does, so a create in it and its rmdir exclude each other on one
  server (``ECREATE``, ``ERMDIR``). Its children are keyed by ``d``, not by
  its name, so renaming a directory will move one record, whatever is below.
* Inode numbers are drawn at random (63 bits) by the creating client: no
  allocator to ask, so no extra hop. The root is inode 1, and its attributes
  live in its header (it has no parent entry).
* Hard links are refused (`errno.EPERM`): an inode's attributes live in its
  one entry.

Every update of attributes is a compare-and-set on the entry (``SET IFEQ``)
with a version inside the value, so a retried update never overwrites a newer
one. Errors are `NamespaceError` with the POSIX errno a file system returns.

Not here yet (issue 12): rename, which needs an atomic step across two
records (and across servers); file data.
"""

from __future__ import annotations

import errno
import json
import secrets
import stat
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, replace
from typing import Any, Literal

from client_lib.client import MetaFlowClient
from client_lib.errors import MetadataFormatError, NamespaceError
from client_lib.mdid import entry_key

__all__ = ["ROOT", "Attributes", "Kind", "Namespace", "directory_key"]

ROOT = 1
"""The root directory's inode number."""

Kind = Literal["dir", "file", "symlink"]

_TYPE_BITS: dict[Kind, int] = {"dir": stat.S_IFDIR, "file": stat.S_IFREG, "symlink": stat.S_IFLNK}
_SETTABLE = ("mode", "uid", "gid", "size", "atime_ns", "mtime_ns")
_CAS_TRIES = 16


def directory_key(ino: int) -> str:
    """The routing key of directory `ino`: its header's key, and the key its
    entries are named under (so they all live on one server)."""
    return f"/.mf/d/{ino:016x}"


@dataclass(frozen=True)
class Attributes:
    """One object's inode, as a file system's stat sees it."""

    ino: int
    kind: Kind
    mode: int          # permission bits only; `st_mode` adds the type
    uid: int
    gid: int
    size: int
    atime_ns: int
    mtime_ns: int
    ctime_ns: int
    target: str | None = None   # a symlink's
    version: int = 1            # bumped by every change: what compare-and-set compares

    @property
    def st_mode(self) -> int:
        return _TYPE_BITS[self.kind] | self.mode

    def to_bytes(self) -> bytes:
        return json.dumps(asdict(self), separators=(",", ":"), sort_keys=True).encode()

    @classmethod
    def from_bytes(cls, raw: bytes) -> Attributes:
        try:
            fields = json.loads(raw)
            attributes = cls(**fields)
        except (ValueError, TypeError) as exc:
            raise MetadataFormatError(f"not the attributes of an inode: {raw[:80]!r}: {exc}") from None
        if attributes.kind not in _TYPE_BITS:
            raise MetadataFormatError(f"unknown kind {attributes.kind!r}")
        return attributes


class Namespace:
    """The namespace operations a file system calls, over one `MetaFlowClient`.

    Thread-safe as the client is. `root` names a namespace's root inode, so
    several namespaces (tests, tenants) can share a cluster.
    """

    def __init__(self, client: MetaFlowClient, *, root: int = ROOT,
                 clock: Callable[[], int] = time.time_ns,
                 new_ino: Callable[[], int] = lambda: secrets.randbits(63) | 2) -> None:
        self.client, self.root, self.clock, self.new_ino = client, root, clock, new_ino

    # -- reading -----------------------------------------------------------------------

    def root_attributes(self) -> Attributes:
        raw = self.client.get(directory_key(self.root))
        if raw is None:
            raise NamespaceError(errno.ENOENT, "no file system here: format() it first")
        return Attributes.from_bytes(raw)

    def lookup(self, parent: int, name: str | bytes) -> Attributes:
        """The attributes of `name` in directory `parent` (ENOENT if absent)."""
        raw = self.client.get(self._entry(parent, name))
        if raw is None:
            raise NamespaceError(errno.ENOENT, f"no entry {name!r} in directory {parent}")
        return Attributes.from_bytes(raw)

    def readdir(self, directory: int, after: str | bytes = b"",
                count: int = 100) -> list[tuple[bytes, Attributes]]:
        """A page of (name, attributes) in name order, after `after`."""
        return [(name, Attributes.from_bytes(raw))
                for name, raw in self.client.entries(directory_key(directory), after, count)]

    def walk(self, directory: int) -> Iterator[tuple[bytes, Attributes]]:
        """Every entry of `directory`, page by page."""
        after = b""
        while page := self.readdir(directory, after, 1000):
            yield from page
            after = page[-1][0]

    # -- creating ----------------------------------------------------------------------

    def format(self, mode: int = 0o755, uid: int = 0, gid: int = 0) -> Attributes:
        """Create the root directory if there is none; its attributes either way."""
        attributes = self._new("dir", mode, uid, gid, ino=self.root)
        self.client.create(directory_key(self.root), attributes.to_bytes())
        return self.root_attributes()

    def mkdir(self, parent: int, name: str | bytes, mode: int = 0o755, uid: int = 0,
              gid: int = 0) -> Attributes:
        """A new, empty directory: its header first (invisible until named),
        then its entry in `parent`. A crash in between leaves an unnamed header,
        which nothing can reach."""
        attributes = self._new("dir", mode, uid, gid)
        self.client.create(directory_key(attributes.ino), attributes.to_bytes())
        try:
            self._link(parent, name, attributes)
        except BaseException:
            self.client.delete(directory_key(attributes.ino))
            raise
        return attributes

    def create(self, parent: int, name: str | bytes, mode: int = 0o644, uid: int = 0,
               gid: int = 0) -> Attributes:
        """A new, empty regular file (EEXIST if the name is taken)."""
        attributes = self._new("file", mode, uid, gid)
        self._link(parent, name, attributes)
        return attributes

    def symlink(self, parent: int, name: str | bytes, target: str, uid: int = 0, gid: int = 0) -> Attributes:
        attributes = replace(self._new("symlink", 0o777, uid, gid), target=target,
                             size=len(target.encode("utf-8", "surrogateescape")))
        self._link(parent, name, attributes)
        return attributes

    def link(self, parent: int, name: str | bytes, target: int) -> Attributes:
        """Hard links: refused. An inode's attributes live in its one entry."""
        raise NamespaceError(errno.EPERM, "hard links are not supported")

    # -- removing ----------------------------------------------------------------------

    def unlink(self, parent: int, name: str | bytes) -> Attributes:
        """Remove a file or symlink (EISDIR for a directory); what it was."""
        attributes = self.lookup(parent, name)
        if attributes.kind == "dir":
            raise NamespaceError(errno.EISDIR, f"{name!r} is a directory: rmdir it")
        self.client.delete(self._entry(parent, name))   # a change since the lookup loses to it
        return attributes

    def rmdir(self, parent: int, name: str | bytes) -> Attributes:
        """Remove an empty directory (ENOTEMPTY otherwise, ENOTDIR for a file).

        Its header goes first, atomically with the check that it is empty, so
        nothing can be created in it afterwards; then its entry. A crash in
        between leaves the name of a directory that takes no entries, and
        rmdir of it again finishes the job."""
        attributes = self.lookup(parent, name)
        if attributes.kind != "dir":
            raise NamespaceError(errno.ENOTDIR, f"{name!r} is not a directory")
        self.client.remove_directory(directory_key(attributes.ino))
        self.client.delete(self._entry(parent, name))
        return attributes

    # -- changing ----------------------------------------------------------------------

    def setattr(self, parent: int, name: str | bytes, **changes: int) -> Attributes:
        """Change any of mode, uid, gid, size, atime_ns and mtime_ns; ctime and
        the version move with every change. A compare-and-set on the entry,
        retried when another change came first."""
        unknown = set(changes) - set(_SETTABLE)
        if unknown:
            raise NamespaceError(errno.EINVAL, f"cannot set {sorted(unknown)}: only {list(_SETTABLE)}")
        key = self._entry(parent, name)
        for _ in range(_CAS_TRIES):
            raw = self.client.get(key)
            if raw is None:
                raise NamespaceError(errno.ENOENT, f"no entry {name!r} in directory {parent}")
            old = Attributes.from_bytes(raw)
            if old.kind == "dir" and "size" in changes:
                raise NamespaceError(errno.EISDIR, f"{name!r} is a directory: it has no size to set")
            fields: dict[str, Any] = {**asdict(old), **changes, "ctime_ns": self.clock(),
                                      "version": old.version + 1}
            if "mode" in changes:
                fields["mode"] = changes["mode"] & 0o7777
            new = Attributes(**fields)
            if self.client.compare_and_set(key, raw, new.to_bytes()):
                return new
        raise NamespaceError(errno.EAGAIN, f"{name!r} changed {_CAS_TRIES} times under this update")

    # -- helpers -----------------------------------------------------------------------

    def _entry(self, parent: int, name: str | bytes) -> bytes:
        try:
            return entry_key(directory_key(parent), name)
        except ValueError as exc:
            raise NamespaceError(errno.EINVAL, str(exc)) from None

    def _new(self, kind: Kind, mode: int, uid: int, gid: int, ino: int | None = None) -> Attributes:
        now = self.clock()
        return Attributes(self.new_ino() if ino is None else ino, kind, mode & 0o7777, uid, gid,
                          0, now, now, now)

    def _link(self, parent: int, name: str | bytes, attributes: Attributes) -> None:
        self._entry(parent, name)   # a bad name is EINVAL before anything is written
        if not self.client.create_entry(directory_key(parent), name, attributes.to_bytes()):
            raise NamespaceError(errno.EEXIST, f"{name!r} exists in directory {parent}")

