"""A file system's namespace on MetaFlow: directories, files, symlinks, FIFOs,
sockets and device nodes by inode number, each operation a few zero-hop requests.

The layout is IndexFS's, on the service's primitives (`client_lib.client`);
the records are defined in `client_lib.fs.inode`:

* An object is named by (parent inode, name). Its attributes live *in its
  entry* of the parent directory, ``entry_key(directory_key(parent), name)``,
  which is on the parent's server: a lookup is one GET, and a listing with
  every child's attributes (readdir-plus) is one ``ELIST`` page.
* A directory with inode ``d`` has its own routing key, `directory_key` (d),
  whose record is its *header*: the directory exists (takes entries) while
  the header does, so a create in it and its rmdir exclude each other on one
  server (``ECREATE``, ``ERMDIR``). Its children are keyed by ``d``, not by
  its name, so renaming a directory moves one entry, whatever is below.
* Inode numbers are drawn at random (63 bits) by the creating client: no
  allocator to ask, so no extra hop. The root is inode 1, and its attributes
  live in its header (it has no parent entry).
* Hard links: the first `link` of an inode moves its attributes into a
  record of its own (`inode_key`, with the link count) and marks its entry
  `shared`; every name of it is then such an entry, and a lookup through
  one costs a second GET (the inode record may live on another server).
  `link` is three steps (the inode record, the source entry's mark, the new
  entry; or the count, then the new entry), `unlink` two (the entry, then
  the count). A client that dies between them leaves a count one too high,
  never too low: its chunks are then kept, never lost.

Every update of an entry is conditional on the record read (``SET IFEQ``,
``DELIFEQ``), with a version inside the value, so a retried or late update
never overwrites a newer one. Errors are `NamespaceError` with the POSIX
errno a file system returns.

**Rename** changes two entries, which may live on two servers, and is atomic
all the same: no reader ever sees both names or neither, whoever crashes
when. It is a two-phase commit whose commit record is the source entry
itself (as Percolator's primary lock), with *presumed abort*:

1. *lock* the source: add an `Intent` (role source) to its record;
2. *prepare* the target: write the moved attributes there with an intent
   (role target) that keeps what the target held (``ECREATE`` or CAS); an
   empty directory being replaced loses its header now (``ERMDIR``, so
   nothing can be created in it any more);
3. *commit*: mark the source's intent committed (one CAS: the only step
   that decides);
4. *finish*: strip the intent from the target, then delete the source.

Readers resolve an intent without writing: a source shows its attributes
until committed and nothing after; a target shows the moved attributes if
its source carries the same rename committed, and what it replaced (or
nothing) otherwise, since the finish clears the target before it deletes
the source, a source without the rename means it was aborted. Writers that
meet an intent push the rename to its end first: they finish a committed
one, and abort (one CAS on the source, then clean the target) one whose
lease (`lease_ns`) has run out; a late step of an aborted rename then fails
its CAS, and its client cleans up and tries again.

Not checked across clients: moving a directory below itself, which the
kernel refuses within one mount.
"""

from __future__ import annotations

import contextlib
import errno
import secrets
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterator
from dataclasses import asdict, replace
from typing import Any

from client_lib.errors import NamespaceError
from client_lib.fs.inode import (
    ROOT,
    SPECIAL,
    Attributes,
    Intent,
    Kind,
    decode_entry,
    directory_key,
    encode_entry,
    inode_key,
)
from client_lib.fs.records import Records
from client_lib.fs.xattrs import XattrMap, xattr_key
from client_lib.fs.xattrs import decode as decode_xattrs
from client_lib.fs.xattrs import encode as encode_xattrs
from client_lib.mdid import NAME_MAX, entry_key

__all__ = ["ROOT", "Attributes", "Kind", "Namespace", "Records", "directory_key"]

_SETTABLE = ("mode", "uid", "gid", "size", "atime_ns", "mtime_ns", "ctime_ns", "xattrs")
_CAS_TRIES = 16
LEASE_NS = 2_000_000_000
"""How long a rename may hold its source entry before another client may
abort it: a rename takes a few round trips, so this is for clients that
died (or stalled) in the middle."""
KNOWN = 65536
"""Entries whose last record a `Namespace` remembers (a few hundred bytes each)."""
_SETTLE_TRIES = 400
"""Reads of an entry that another rename holds before giving up (EAGAIN):
enough to outwait a lease at the pauses `_pause` takes."""


class Namespace:
    """The namespace operations a file system calls, over one `Records` client.

    Thread-safe as the client is. `root` names a namespace's root inode, so
    several namespaces (tests, tenants) can share a cluster.

    It remembers the last record it read or wrote of up to `KNOWN` entries,
    so that an update (setattr, unlink) can try its compare-and-set on it
    without reading first: one request instead of two when nobody else
    changed the entry, and a failed comparison (then a read) when someone
    did. A guess is never trusted, only compared.
    """

    def __init__(self, client: Records, *, root: int = ROOT,
                 clock: Callable[[], int] = time.time_ns,
                 new_ino: Callable[[], int] = lambda: secrets.randbits(63) | 2,
                 sleep: Callable[[float], None] = time.sleep, lease_ns: int = LEASE_NS) -> None:
        self.client, self.root, self.clock, self.new_ino = client, root, clock, new_ino
        self.sleep, self.lease_ns = sleep, lease_ns
        self._known: OrderedDict[bytes | str, bytes] = OrderedDict()
        self._known_lock = threading.Lock()

    # -- reading -----------------------------------------------------------------------

    def root_attributes(self) -> Attributes:
        return self._root_record()[1]

    def _root_record(self) -> tuple[bytes, Attributes]:
        """The root's header: its record and attributes (it has no entry)."""
        raw = self.client.get(directory_key(self.root))
        if raw is None:
            raise NamespaceError(errno.ENOENT, "no file system here: format() it first")
        return raw, Attributes.from_bytes(raw)

    def lookup(self, parent: int, name: str | bytes) -> Attributes:
        """The attributes of `name` in directory `parent` (ENOENT if absent)."""
        key = self.entry_key(parent, name)
        raw = self.client.get(key)
        attributes = self.plain_entry(key, raw)
        if attributes is None:
            attributes = self._resolved(self._visible(key, raw))
            if attributes is None:
                raise NamespaceError(errno.ENOENT, f"no entry {name!r} in directory {parent}")
            self._remember(key, raw)
        return attributes

    def plain_entry(self, key: bytes, raw: bytes | None) -> Attributes | None:
        """What entry `key`, whose record was `raw`, shows a reader when that
        needs no further read: an entry no rename holds and whose inode is
        not shared. None otherwise (no entry, or one that `lookup` resolves
        with more reads). The mount answers most lookups with this alone, on
        its event loop (`client_lib.fs.mount_reads`)."""
        if raw is None:
            return None
        attributes, intent = decode_entry(raw)
        if intent is not None or attributes.shared:
            return None
        self._remember(key, raw)
        return attributes

    def readdir(self, directory: int, after: str | bytes = b"",
                count: int = 100) -> list[tuple[bytes, Attributes]]:
        """A page of (name, attributes) in name order, after `after`. A page
        may come back shorter than `count` where renames are under way; only
        an empty page ends the listing."""
        page = self.client.entries(directory_key(directory), after, count)
        listed = []
        for name, raw in page:
            key = self.entry_key(directory, name)
            attributes = self._resolved(self._visible(key, raw))
            if attributes is not None:
                listed.append((name, attributes))
                self._remember(key, raw)
        if page and not listed:   # a page of renames in flight: go on past them
            return self.readdir(directory, page[-1][0], count)
        return listed

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

    def mknod(self, parent: int, name: str | bytes, kind: Kind, mode: int = 0o644, rdev: int = 0,
              uid: int = 0, gid: int = 0) -> Attributes:
        """A new FIFO, socket or device node (`SPECIAL`): an entry like a
        file's, holding the device number `rdev`; the kernel does its I/O."""
        if kind not in SPECIAL:
            raise NamespaceError(errno.EINVAL, f"mknod makes {sorted(SPECIAL)}, not {kind!r}")
        attributes = replace(self._new(kind, mode, uid, gid), rdev=rdev if kind in ("chr", "blk") else 0)
        self._link(parent, name, attributes)
        return attributes

    def link(self, parent: int, name: str | bytes, source: tuple[int, bytes], ino: int) -> Attributes:
        """A new name (parent, name) for inode `ino`, found at `source` (its
        parent and name): its attributes, with the new link count. EPERM for
        a directory, ESTALE if `source` no longer names `ino`, EEXIST if the
        name is taken (the count is put back)."""
        new_key = self.entry_key(parent, name)   # a bad name fails before anything is written
        source_key = self.entry_key(*source)
        for _ in range(_CAS_TRIES):
            raw, attributes = self._present(source_key, *source)
            if attributes.ino != ino:
                raise NamespaceError(errno.ESTALE, f"inode {ino} is no longer at {source[1]!r}")
            if attributes.kind == "dir":
                raise NamespaceError(errno.EPERM, "a directory takes no hard links")
            if new_key == source_key:   # before any write: _create_entry would take its record for ours
                raise NamespaceError(errno.EEXIST, f"{name!r} exists in directory {parent}")
            linked = self._count_links(ino, +1) if attributes.shared else \
                self._share(source_key, raw, attributes)
            if linked is None:
                continue   # the entry changed meanwhile: read it again
            # A stub's version is its own and random: only its inode and kind are believed,
            # and `_create_entry` must never take another entry's record for this one.
            stub = replace(linked, shared=True, nlink=1, version=secrets.randbits(62)).to_bytes()
            try:
                self._link_record(parent, name, new_key, stub)
            except BaseException:
                with contextlib.suppress(Exception):   # a count one too high keeps, never loses
                    self._count_links(ino, -1)
                raise
            return linked
        raise self._contended(name)

    def _share(self, key: bytes, raw: bytes, attributes: Attributes) -> Attributes | None:
        """The first hard link of the inode whose only entry `key` holds
        `raw`: its attributes into a record of their own (counting two
        links), then the entry marked shared; None if the entry changed first."""
        record = replace(attributes, nlink=2, ctime_ns=self.clock(), version=attributes.version + 1)
        encoded, inode = record.to_bytes(), inode_key(attributes.ino)
        if not self.client.create(inode, encoded):
            # Left by a client that died between the two steps, or by one
            # sharing this inode right now: whoever marks the entry first wins.
            held = self.client.get(inode)
            if held is None or not self._cas(inode, held, encoded):
                return None
        stub = replace(attributes, shared=True, version=attributes.version + 1).to_bytes()
        if not self._cas(key, raw, stub):
            return None
        self._remember(key, stub)
        return record

    def _count_links(self, ino: int, change: int) -> Attributes:
        """Add `change` to a shared inode's link count (and move its ctime);
        its record is deleted when the count reaches 0. The attributes after."""
        key = inode_key(ino)
        for _ in range(_CAS_TRIES):
            raw, old = self._inode_record(ino)
            new = replace(old, nlink=max(0, old.nlink + change), ctime_ns=self.clock(),
                          version=old.version + 1)
            if new.nlink == 0:
                if self.client.delete_if_equal(key, raw):
                    return new
            elif self._cas(key, raw, new.to_bytes()):
                return new
        raise self._contended(key)

    def _inode_record(self, ino: int) -> tuple[bytes, Attributes]:
        """A shared inode's record and attributes (ENOENT if it has none)."""
        raw = self.client.get(inode_key(ino))
        if raw is None:
            raise NamespaceError(errno.ENOENT, f"inode {ino} has no record")
        return raw, Attributes.from_bytes(raw)

    def shared_inode(self, ino: int) -> Attributes | None:
        """A hard-linked inode's attributes, from its own record; None if it has none."""
        raw = self.client.get(inode_key(ino))
        return None if raw is None else Attributes.from_bytes(raw)

    def _resolved(self, attributes: Attributes | None) -> Attributes | None:
        """What an entry's attributes are: its own, or a shared inode's record."""
        if attributes is None or not attributes.shared:
            return attributes
        return self.shared_inode(attributes.ino)

    # -- removing ----------------------------------------------------------------------

    def unlink(self, parent: int, name: str | bytes) -> Attributes:
        """Remove a name of a file, symlink or special file (EISDIR for a
        directory); the inode's attributes after it, whose `nlink` says how
        many names it has left (0: its data may go)."""
        key = self.entry_key(parent, name)
        for raw, attributes, guessed in self._candidates(key, lambda: self._present(key, parent, name)):
            if attributes.kind == "dir":
                if guessed:
                    continue   # a guess is only compared, never believed: read it
                raise NamespaceError(errno.EISDIR, f"{name!r} is a directory: rmdir it")
            if self.client.delete_if_equal(key, raw):
                self._forget(key)
                return self.unlinked(attributes)
        raise self._contended(name)

    def unlinked(self, attributes: Attributes) -> Attributes:
        """The inode whose entry `attributes` just lost its name (by unlink
        or a rename over it): a shared one counted down, any other with no
        names left."""
        left = self._count_links(attributes.ino, -1) if attributes.shared else replace(attributes, nlink=0)
        if left.nlink == 0:
            self._drop_xattrs(left)
        return left

    # -- extended attributes (client_lib.fs.xattrs) --------------------------------------

    def xattrs(self, ino: int) -> XattrMap:
        """Inode `ino`'s extended attributes (one GET)."""
        return decode_xattrs(self.client.get(xattr_key(ino)))

    def change_xattrs(self, ino: int, change: Callable[[XattrMap], XattrMap]) -> None:
        """Replace inode `ino`'s extended attributes by `change` of them, a
        compare-and-set retried when another change came first."""
        key = xattr_key(ino)
        for _ in range(_CAS_TRIES):
            raw = self.client.get(key)
            new = encode_xattrs(change(decode_xattrs(raw)))
            if self.client.create(key, new) if raw is None else self._cas(key, raw, new):
                return
        raise self._contended(key)

    def _drop_xattrs(self, gone: Attributes) -> None:
        """An inode that has no names left takes its extended attributes along."""
        if gone.xattrs:
            self.client.delete(xattr_key(gone.ino))

    def rmdir(self, parent: int, name: str | bytes) -> Attributes:
        """Remove an empty directory (ENOTEMPTY otherwise, ENOTDIR for a file).

        Its header goes first, atomically with the check that it is empty, so
        nothing can be created in it afterwards; then its entry. A crash in
        between leaves the name of a directory that takes no entries, and
        rmdir of it again finishes the job."""
        key = self.entry_key(parent, name)
        raw, attributes = self._present(key, parent, name)
        if attributes.kind != "dir":
            raise NamespaceError(errno.ENOTDIR, f"{name!r} is not a directory")
        self.client.remove_directory(directory_key(attributes.ino))
        self._forget(key)
        held: bytes | None = raw
        for _ in range(_CAS_TRIES):
            if held is None or self.client.delete_if_equal(key, held):
                break
            held, now = self._settled(key)
            if now is None or now.ino != attributes.ino:
                break   # renamed away or removed meanwhile: its header is gone either way
        self._drop_xattrs(attributes)
        return attributes

    # -- changing ----------------------------------------------------------------------

    def setattr(self, parent: int, name: str | bytes, **changes: int) -> Attributes:
        """Change any of mode, uid, gid, size, atime_ns and mtime_ns; ctime
        (to now, or to ctime_ns if given: a change made earlier and written
        now) and the version move with every change. A compare-and-set on the entry,
        retried when another change came first."""
        key = self.entry_key(parent, name)
        return self._update(key, name, changes, lambda: self._present(key, parent, name))

    def setattr_inode(self, ino: int, **changes: int) -> Attributes:
        """`setattr` of a hard-linked inode, on its own record."""
        return self._update(inode_key(ino), str(ino), changes, lambda: self._inode_record(ino))

    def setattr_root(self, **changes: int) -> Attributes:
        """`setattr` of the root directory, whose attributes are its header's."""
        return self._update(directory_key(self.root), "/", changes, self._root_record)

    def _update(self, key: bytes | str, name: str | bytes, changes: dict[str, int],
                read: Callable[[], tuple[bytes, Attributes]]) -> Attributes:
        unknown = set(changes) - set(_SETTABLE)
        if unknown:
            raise NamespaceError(errno.EINVAL, f"cannot set {sorted(unknown)}: only {list(_SETTABLE)}")
        for raw, old, guessed in self._candidates(key, read):
            if old.shared:
                if guessed:
                    continue   # a stub is never rewritten, so no CAS would compare this guess: read it
                return self.setattr_inode(old.ino, **changes)
            if old.kind == "dir" and "size" in changes:
                if guessed:
                    continue   # a guess is only compared, never believed: read it
                raise NamespaceError(errno.EISDIR, f"{name!r} is a directory: it has no size to set")
            fields: dict[str, Any] = {**asdict(old), "ctime_ns": self.clock(), **changes,
                                      "version": old.version + 1}
            if "mode" in changes:
                fields["mode"] = changes["mode"] & 0o7777
            fields["xattrs"] = bool(fields["xattrs"])
            new = Attributes(**fields)
            record = new.to_bytes()
            if self._cas(key, raw, record):
                self._remember(key, record)
                return new
        raise self._contended(name)

    def rename(self, parent: int, name: str | bytes, new_parent: int, new_name: str | bytes, *,
               replace_target: bool = True) -> Attributes | None:
        """Move entry (parent, name) to (new_parent, new_name), atomically (see
        the module docstring), replacing what is there as POSIX rename does:
        a file or symlink by a non-directory, an empty directory by a
        directory (ENOTDIR, EISDIR, ENOTEMPTY otherwise; EEXIST without
        `replace_target`, which is RENAME_NOREPLACE). Returns the inode it
        replaced as `unlinked` leaves it (its data the caller reclaims if it
        has no names left), or None. Two names of one inode: nothing happens,
        as POSIX says."""
        source_key, target_key = self.entry_key(parent, name), self.entry_key(new_parent, new_name)
        if source_key == target_key:
            self.lookup(parent, name)
            return None
        self._forget(source_key)
        self._forget(target_key)
        for _ in range(_CAS_TRIES):
            source_raw, moving = self._present(source_key, parent, name)
            if moving.kind == "dir" and new_parent == moving.ino:
                raise NamespaceError(errno.EINVAL, f"cannot move directory {name!r} into itself")
            target_raw, replaced = self._settled(target_key)
            if replaced is not None and replaced.ino == moving.ino:
                return None
            if replaced is not None:
                _check_replace(moving, replaced, new_name, replace_target)
            intent = Intent(secrets.token_hex(8), "source", (parent, _name_bytes(name)),
                            (new_parent, _name_bytes(new_name)), self.clock())
            locked = encode_entry(moving, intent)
            if not self._cas(source_key, source_raw, locked):
                continue
            try:
                if self._prepare_and_commit(intent, moving, locked, target_raw, replaced):
                    return None if replaced is None else self.unlinked(replaced)
            except BaseException:
                self._end_own(intent)
                raise
        raise self._contended(name)

    def _prepare_and_commit(self, intent: Intent, moving: Attributes, locked: bytes,
                            target_raw: bytes | None, replaced: Attributes | None) -> bool:
        """Steps 2 to 4 of a rename whose source this client has locked;
        False (after undoing its steps) when another client came first."""
        moved = replace(moving, ctime_ns=self.clock(), version=moving.version + 1)
        prepared = encode_entry(moved, intent.as_role("target", replaced=replaced))
        directory, name = intent.target
        if target_raw is None:
            written = self._create_entry(directory, name, prepared)
        else:
            written = self._cas(self.entry_key(directory, name), target_raw, prepared)
        if not written:
            self._abort(intent, locked, moving)
            return False
        if replaced is not None and replaced.kind == "dir":
            self.client.remove_directory(directory_key(replaced.ino))   # ENOTEMPTY: undone by the caller
        committed = encode_entry(moving, intent.as_role("source", committed=True))
        if not self._cas(self.entry_key(*intent.source), locked, committed):
            self._clean_target(intent)   # aborted by another client
            return False
        self._finish(intent, committed)
        return True

    # -- renames in flight -------------------------------------------------------------

    def _visible(self, key: bytes, raw: bytes | None) -> Attributes | None:
        """What entry `key`, whose record was `raw`, shows a reader: a rename
        in flight resolved without writing anything (module docstring)."""
        while raw is not None:
            attributes, intent = decode_entry(raw)
            if intent is None:
                return attributes
            if intent.role == "source":
                return None if intent.committed else attributes
            source = self._intent_at(intent.source)
            if source is not None and source.tx == intent.tx:
                return attributes if source.committed else intent.replaced
            again = self.client.get(key)
            if again == raw:   # still prepared with its source unlocked: aborted
                return intent.replaced
            raw = again
        return None

    def _settled(self, key: bytes) -> tuple[bytes | None, Attributes | None]:
        """Entry `key`'s record and attributes once no rename holds it: a
        writer's view, which pushes renames in flight to their end."""
        for attempt in range(_SETTLE_TRIES):
            raw = self.client.get(key)
            if raw is None:
                return None, None
            attributes, intent = decode_entry(raw)
            if intent is None:
                return raw, attributes
            if not self._push(intent):
                self._pause(attempt)
        raise NamespaceError(errno.EAGAIN, f"entry {key!r} stayed held by a rename")

    def _push(self, intent: Intent, own: bool = False) -> bool:
        """Take the rename `intent` a step towards its end: finish it if
        committed, abort it if its lease ran out (or it is this client's own,
        `own`), clean a target its aborted source left. False when it is
        young and running: the caller waits."""
        source_key = self.entry_key(*intent.source)
        source_raw = self.client.get(source_key)
        if source_raw is not None:
            attributes, source = decode_entry(source_raw)
            if source is not None and source.tx == intent.tx:
                if source.committed:
                    self._finish(source, source_raw)
                elif own or self.clock() - source.at_ns >= self.lease_ns:
                    self._abort(source, source_raw, attributes)
                else:
                    return False
                return True
        self._clean_target(intent)
        return True

    def _end_own(self, intent: Intent) -> None:
        """After an error in this client's own rename: finish it if the commit
        went through, else abort it, so that nobody waits for its lease. The
        error is what the caller raises; a second one here adds nothing."""
        with contextlib.suppress(Exception):   # the lease ends the rename all the same
            self._push(intent, own=True)

    def _finish(self, intent: Intent, committed: bytes) -> None:
        """Step 4, by anyone: the target keeps the moved attributes, then the
        committed source goes."""
        target_key = self.entry_key(*intent.target)
        target_raw = self.client.get(target_key)
        if target_raw is not None:
            attributes, held = decode_entry(target_raw)
            if held is not None and held.tx == intent.tx:
                self.client.compare_and_set(target_key, target_raw, encode_entry(attributes))
        self.client.delete_if_equal(self.entry_key(*intent.source), committed)

    def _abort(self, intent: Intent, locked: bytes, attributes: Attributes) -> None:
        """Decide that rename `intent` did not happen (one CAS on its source:
        it fails if the rename committed first), then clean its target."""
        if self._cas(self.entry_key(*intent.source), locked, encode_entry(attributes)):
            self._clean_target(intent)

    def _clean_target(self, intent: Intent) -> None:
        """Put back what an aborted rename's target held: the entry it
        replaced (with its header, if it was a directory's) or nothing."""
        target_key = self.entry_key(*intent.target)
        target_raw = self.client.get(target_key)
        if target_raw is None:
            return
        _, held = decode_entry(target_raw)
        if held is None or held.tx != intent.tx:
            return
        replaced = held.replaced
        if replaced is None:
            self.client.delete_if_equal(target_key, target_raw)
            return
        if replaced.kind == "dir":
            self.client.create(directory_key(replaced.ino), replaced.to_bytes())
        self.client.compare_and_set(target_key, target_raw, encode_entry(replaced))

    def _intent_at(self, where: tuple[int, bytes]) -> Intent | None:
        raw = self.client.get(self.entry_key(*where))
        return None if raw is None else decode_entry(raw)[1]

    # -- helpers -----------------------------------------------------------------------

    def entry_key(self, parent: int, name: str | bytes) -> bytes:
        """The key of `name` in `parent`: ENAMETOOLONG past `NAME_MAX` bytes
        (POSIX's answer for a long component), EINVAL for any other bad name."""
        if len(name.encode("utf-8", "surrogateescape") if isinstance(name, str) else name) > NAME_MAX:
            raise NamespaceError(errno.ENAMETOOLONG, f"a name has at most {NAME_MAX} bytes: {name[:32]!r}...")
        try:
            return entry_key(directory_key(parent), name)
        except ValueError as exc:
            raise NamespaceError(errno.EINVAL, str(exc)) from None

    def _present(self, key: bytes, parent: int, name: str | bytes) -> tuple[bytes, Attributes]:
        raw, attributes = self._settled(key)
        if raw is None or attributes is None:
            raise NamespaceError(errno.ENOENT, f"no entry {name!r} in directory {parent}")
        return raw, attributes

    def _cas(self, key: bytes | str, old: bytes, new: bytes) -> bool:
        """A compare-and-set that also counts as done when the record holds
        `new` already: the client retries a request whose reply was lost, and
        the retry of an applied CAS fails. (Every `new` here is unique: a
        fresh version, ctime or rename id.)"""
        return self.client.compare_and_set(key, old, new) or self.client.get(key) == new

    def _create_entry(self, parent: int, name: str | bytes, value: bytes) -> bool:
        """ECREATE, counted as done on a lost reply as `_cas` is."""
        return self.client.create_entry(directory_key(parent), name, value) or \
            self.client.get(self.entry_key(parent, name)) == value

    def _remember(self, key: bytes | str, raw: bytes | None) -> None:
        """Keep `raw` as entry `key`'s last known record, if it is a plain one."""
        if raw is None or decode_entry(raw)[1] is not None:
            return
        with self._known_lock:
            self._known[key] = raw
            self._known.move_to_end(key)
            while len(self._known) > KNOWN:
                self._known.popitem(last=False)

    def _candidates(self, key: bytes | str, read: Callable[[], tuple[bytes, Attributes]]
                    ) -> Iterator[tuple[bytes, Attributes, bool]]:
        """What an update of entry `key` compares with, `_CAS_TRIES` times in
        all: the remembered record first, if there is one (guessed: True),
        then what `read` finds each time."""
        with self._known_lock:
            raw = self._known.get(key)
        for _ in range(_CAS_TRIES):
            if raw is not None:
                yield raw, Attributes.from_bytes(raw), True
                raw = None
            else:
                yield *read(), False

    def _forget(self, key: bytes | str) -> None:
        with self._known_lock:
            self._known.pop(key, None)

    def _pause(self, attempt: int) -> None:
        self.sleep(min(0.001 * (attempt + 1), 0.02))

    @staticmethod
    def _contended(name: str | bytes) -> NamespaceError:
        return NamespaceError(errno.EAGAIN, f"{name!r} changed {_CAS_TRIES} times under this update")

    def _new(self, kind: Kind, mode: int, uid: int, gid: int, ino: int | None = None) -> Attributes:
        now = self.clock()
        return Attributes(self.new_ino() if ino is None else ino, kind, mode & 0o7777, uid, gid,
                          0, now, now, now)

    def _link(self, parent: int, name: str | bytes, attributes: Attributes) -> None:
        """A new entry for `attributes`."""
        key = self.entry_key(parent, name)   # a bad name is EINVAL before anything is written
        self._link_record(parent, name, key, attributes.to_bytes())

    def _link_record(self, parent: int, name: str | bytes, key: bytes, record: bytes) -> None:
        """A new entry `key` holding `record`; a name held only by a rename's
        leftovers (a committed source, an aborted target) is settled first
        and then free."""
        for _ in range(_CAS_TRIES):
            if self._create_entry(parent, name, record):
                self._remember(key, record)
                return
            raw, _ = self._settled(key)
            if raw is not None:
                raise NamespaceError(errno.EEXIST, f"{name!r} exists in directory {parent}")
        raise self._contended(name)


def _check_replace(moving: Attributes, replaced: Attributes, name: str | bytes, allowed: bool) -> None:
    if not allowed:
        raise NamespaceError(errno.EEXIST, f"{name!r} exists and the rename may not replace it")
    if moving.kind == "dir" and replaced.kind != "dir":
        raise NamespaceError(errno.ENOTDIR, f"cannot replace non-directory {name!r} by a directory")
    if moving.kind != "dir" and replaced.kind == "dir":
        raise NamespaceError(errno.EISDIR, f"cannot replace directory {name!r} by a non-directory")


def _name_bytes(name: str | bytes) -> bytes:
    return name if isinstance(name, bytes) else name.encode("utf-8", "surrogateescape")
