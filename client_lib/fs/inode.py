"""What a file system's namespace stores: an inode's attributes, and the
record of a directory entry that may carry a rename in flight.

An inode's attributes live in its one entry, except for an inode with hard
links: its attributes then live in a record of its own (`inode_key`), and
each of its entries holds a copy marked `Attributes.shared`, of which only
the inode number and kind are to be believed.

Kept apart from the operations (`client_lib.fs.namespace`) because it is the
on-disk contract: every client reads what any other wrote, so the encoding
is defined once, here.

An entry record is the entry's `Attributes` as JSON. During a rename the two
entries it touches also carry an `Intent` under the key ``"intent"``: the
source entry (role ``source``, the rename's commit record) and the target
entry (role ``target``, with the attributes it replaces, if any). Plain
entries, the vast majority, carry nothing more.
"""

from __future__ import annotations

import json
import stat
from dataclasses import asdict, dataclass
from typing import Any, Literal

from client_lib.errors import MetadataFormatError

__all__ = ["ROOT", "SPECIAL", "Attributes", "Intent", "Kind", "decode_entry", "directory_key", "encode_entry",
           "inode_key", "kind_of"]

ROOT = 1
"""The root directory's inode number."""

Kind = Literal["dir", "file", "symlink", "fifo", "socket", "chr", "blk"]

_TYPE_BITS: dict[Kind, int] = {"dir": stat.S_IFDIR, "file": stat.S_IFREG, "symlink": stat.S_IFLNK,
                               "fifo": stat.S_IFIFO, "socket": stat.S_IFSOCK, "chr": stat.S_IFCHR,
                               "blk": stat.S_IFBLK}

SPECIAL: frozenset[Kind] = frozenset({"fifo", "socket", "chr", "blk"})
"""Kinds whose I/O the kernel does itself (a FIFO's pipe, a socket's
endpoint, a device's driver): only their inode is kept here."""


def kind_of(st_mode: int) -> Kind:
    """The kind of an object of type bits `st_mode` (ValueError for none)."""
    for kind, bits in _TYPE_BITS.items():
        if stat.S_IFMT(st_mode) == bits:
            return kind
    raise ValueError(f"no file type in mode {st_mode:#o}")


def inode_key(ino: int) -> str:
    """The key of a hard-linked inode's own record (`Attributes.shared`)."""
    return f"/.mf/i/{ino:016x}"


def directory_key(ino: int) -> str:
    """The routing key of directory `ino`: its header's key, and the key its
    entries are named under (so they all live on one server)."""
    return f"/.mf/d/{ino:016x}"


_USUAL = {"rdev": 0, "nlink": 1, "shared": False, "xattrs": False}
"""Fields added after the first records, and the value a record without them means."""


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
    rdev: int = 0               # a device node's number (chr, blk); left out of records at 0
    nlink: int = 1              # names of the inode: 0 once unlinked while open; left out at 1
    shared: bool = False        # an entry of a hard-linked inode: the truth is at `inode_key`
    xattrs: bool = False        # it may have extended attributes (`client_lib.fs.xattrs`)

    @property
    def st_mode(self) -> int:
        return _TYPE_BITS[self.kind] | self.mode

    def to_bytes(self) -> bytes:
        return _dump(self.to_fields())

    def to_fields(self) -> dict[str, Any]:
        """As stored: every field, but those added since the first records
        (`_USUAL`) only where they differ from their usual value, so that the
        records of everything but device nodes are what older clients wrote,
        and read."""
        fields = asdict(self)
        for name, usual in _USUAL.items():
            if fields[name] == usual:
                del fields[name]
        return fields

    @classmethod
    def from_bytes(cls, raw: bytes) -> Attributes:
        return decode_entry(raw)[0]

    @classmethod
    def from_fields(cls, fields: Any) -> Attributes:
        try:
            attributes = cls(**fields)
        except TypeError as exc:
            raise MetadataFormatError(f"not the attributes of an inode: {fields!r:.80}: {exc}") from None
        if attributes.kind not in _TYPE_BITS:
            raise MetadataFormatError(f"unknown kind {attributes.kind!r}")
        return attributes


@dataclass(frozen=True)
class Intent:
    """A rename of entry (source directory, source name) to (target
    directory, target name), written into both entries while it runs.

    `tx` names the rename (random), `at_ns` is when it began (after a lease,
    anyone may abort it), `committed` is set on the source entry only, by
    the rename's commit, and `replaced` on the target entry only: the
    attributes the target had, which an abort puts back."""

    tx: str
    role: Literal["source", "target"]
    source: tuple[int, bytes]
    target: tuple[int, bytes]
    at_ns: int
    committed: bool = False
    replaced: Attributes | None = None

    def as_role(self, role: Literal["source", "target"], *, committed: bool = False,
                replaced: Attributes | None = None) -> Intent:
        return Intent(self.tx, role, self.source, self.target, self.at_ns, committed, replaced)

    def to_fields(self) -> dict[str, Any]:
        return {"tx": self.tx, "role": self.role, "at_ns": self.at_ns, "committed": self.committed,
                "source": [self.source[0], self.source[1].hex()],
                "target": [self.target[0], self.target[1].hex()],
                "replaced": None if self.replaced is None else self.replaced.to_fields()}

    @classmethod
    def from_fields(cls, fields: Any) -> Intent:
        try:
            replaced = fields["replaced"]
            intent = cls(str(fields["tx"]), fields["role"],
                         (int(fields["source"][0]), bytes.fromhex(fields["source"][1])),
                         (int(fields["target"][0]), bytes.fromhex(fields["target"][1])),
                         int(fields["at_ns"]), bool(fields["committed"]),
                         None if replaced is None else Attributes.from_fields(replaced))
        except (KeyError, IndexError, TypeError, ValueError) as exc:
            raise MetadataFormatError(f"not a rename intent: {fields!r:.80}: {exc}") from None
        if intent.role not in ("source", "target"):
            raise MetadataFormatError(f"unknown intent role {intent.role!r}")
        return intent


def encode_entry(attributes: Attributes, intent: Intent | None = None) -> bytes:
    """An entry's record: its attributes, and the rename it is part of if any."""
    if intent is None:
        return attributes.to_bytes()
    return _dump({**attributes.to_fields(), "intent": intent.to_fields()})


def decode_entry(raw: bytes) -> tuple[Attributes, Intent | None]:
    """Inverse of `encode_entry` (`MetadataFormatError` for anything else)."""
    try:
        fields = json.loads(raw)
    except ValueError as exc:
        raise MetadataFormatError(f"not the attributes of an inode: {raw[:80]!r}: {exc}") from None
    if not isinstance(fields, dict):
        raise MetadataFormatError(f"not the attributes of an inode: {raw[:80]!r}")
    intent = fields.pop("intent", None)
    return Attributes.from_fields(fields), None if intent is None else Intent.from_fields(intent)


def _dump(fields: dict[str, Any]) -> bytes:
    return json.dumps(fields, separators=(",", ":"), sort_keys=True).encode()
