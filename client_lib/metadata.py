"""The metadata object a file system stores per path.

The paper measures with HDFS-sized objects: about 250 bytes for a file and
290 for a directory. `FileMetadata` carries what an HDFS INode holds (owner,
group, permissions, times, and for files the replication, block size and
block list; for directories the quotas and child count), serialized as
compact JSON with short keys. JSON, not a binary layout, because
`redis-cli -h <mdid> -p 9000 GET /a/b` is the debugging tool and should show
something a person can read; sizes land where the paper's are (see
`tests/unit/test_metadata.py`).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, Literal

from client_lib.errors import InvalidArgument, MetadataFormatError, MetaFlowError
from client_lib.mdid import normalize_path

__all__ = ["FileMetadata", "Kind", "MetadataFormatError"]

Kind = Literal["file", "dir"]

# Wire keys: short, stable, and versioned by "v" so a later layout can be
# told apart from this one.
_FORMAT_VERSION = 1
_FIELDS = {
    "path": "p", "kind": "k", "size": "s", "mode": "m", "owner": "o",
    "group": "g", "mtime": "mt", "atime": "at", "ctime": "ct",
    "replication": "r", "block_size": "bs", "blocks": "b",
    "children": "c", "ns_quota": "nq", "ds_quota": "dq", "storage_policy": "sp",
    "acl": "a", "snapshottable": "ss",
}
_FILE_ONLY = ("replication", "block_size", "blocks")
_DIR_ONLY = ("children", "ns_quota", "ds_quota", "snapshottable")
_KEYS = {short: name for name, short in _FIELDS.items()}

# Each integer field and the least value HDFS allows for it (-1 is "no
# quota"; times may precede the epoch). A dataclass does not check types, and
# a record decoded from the wire must not carry a string where a size belongs.
_INTS: dict[str, int | None] = {
    "size": 0, "mode": 0, "mtime": None, "atime": None, "ctime": None, "replication": 0,
    "block_size": 0, "children": 0, "ns_quota": -1, "ds_quota": -1,
}
_STRS = ("owner", "group", "storage_policy")
_MAX_MODE = 0o7777


def _require_int(name: str, value: object, least: int | None) -> None:
    """`value` is an int (not a bool) no smaller than `least`, or InvalidArgument."""
    if not isinstance(value, int) or isinstance(value, bool):
        raise InvalidArgument(f"{name} must be an integer, not {value!r}")
    if least is not None and value < least:
        raise InvalidArgument(f"{name} must be at least {least}, not {value}")


def _require_list(name: str, value: object, item: type) -> None:
    if not isinstance(value, list) or not all(
            isinstance(x, item) and not isinstance(x, bool) for x in value):
        raise InvalidArgument(f"{name} must be a list of {item.__name__}, not {value!r}")


@dataclass
class FileMetadata:
    """Attributes of one file or directory (an HDFS INode's worth)."""

    path: str
    kind: Kind = "file"
    size: int = 0
    mode: int = 0o644
    owner: str = "hdfs"
    group: str = "supergroup"
    mtime: int = 0          # milliseconds since the epoch, as HDFS keeps them
    atime: int = 0
    ctime: int = 0
    replication: int = 3
    block_size: int = 128 << 20
    blocks: list[int] = field(default_factory=list)  # block ids, files only
    children: int = 0       # directories only
    ns_quota: int = -1      # -1 = no quota, as in HDFS
    ds_quota: int = -1
    storage_policy: str = "HOT"
    acl: list[str] = field(default_factory=list)  # extended ACL entries, HDFS syntax
    snapshottable: bool = False  # directories only

    def __post_init__(self) -> None:
        """Check every field, so that a bad record is refused where it is made
        (or decoded), with `InvalidArgument`, and never reaches a store."""
        try:
            self.path = normalize_path(self.path).decode("utf-8", "surrogateescape")
        except TypeError:
            raise InvalidArgument(f"path must be str or bytes, not {self.path!r}") from None
        if self.kind not in ("file", "dir"):
            raise InvalidArgument(f"kind must be 'file' or 'dir', not {self.kind!r}")
        for name, least in _INTS.items():
            _require_int(name, getattr(self, name), least)
        if self.mode > _MAX_MODE:
            raise InvalidArgument(f"mode {self.mode:#o} has bits above {_MAX_MODE:#o}")
        for name in _STRS:
            if not isinstance(getattr(self, name), str):
                raise InvalidArgument(f"{name} must be a string, not {getattr(self, name)!r}")
        _require_list("blocks", self.blocks, int)
        _require_list("acl", self.acl, str)
        if not isinstance(self.snapshottable, bool):
            raise InvalidArgument(f"snapshottable must be true or false, not {self.snapshottable!r}")
        if self.is_dir:  # directories have no data blocks, as in HDFS
            self.replication, self.block_size, self.blocks = 0, 0, []

    @property
    def is_dir(self) -> bool:
        return self.kind == "dir"

    @classmethod
    def new_file(cls, path: str, size: int, now_ms: int, block_ids: list[int] | None = None,
                 **attrs: Any) -> FileMetadata:
        """A file whose block list covers `size` bytes (ids given or numbered from 1);
        `attrs` are further fields (owner, mode, block_size, ...)."""
        block_size = attrs.pop("block_size", 128 << 20)
        _require_int("size", size, 0)
        _require_int("block_size", block_size, 1)  # a file's blocks have a size
        count = max(1, -(-size // block_size))
        blocks = block_ids if block_ids is not None else list(range(1, count + 1))
        return cls(path, "file", size=size, mtime=now_ms, atime=now_ms, ctime=now_ms,
                   block_size=block_size, blocks=blocks, **attrs)

    @classmethod
    def new_dir(cls, path: str, now_ms: int, children: int = 0, **attrs: Any) -> FileMetadata:
        attrs.setdefault("mode", 0o755)
        attrs.setdefault("acl", ["user::rwx", "group::r-x", "other::r-x", "default:group::r-x"])
        return cls(path, "dir", mtime=now_ms, atime=now_ms, ctime=now_ms,
                   children=children, **attrs)

    def to_bytes(self) -> bytes:
        doc: dict[str, object] = {"v": _FORMAT_VERSION}
        for name, short in _FIELDS.items():
            value = getattr(self, name)
            if name in (_FILE_ONLY if self.is_dir else _DIR_ONLY):
                continue
            if name == "acl" and not value:
                continue
            doc[short] = value
        return json.dumps(doc, separators=(",", ":")).encode("ascii")

    @classmethod
    def from_bytes(cls, data: bytes) -> FileMetadata:
        try:
            doc = json.loads(data)
        except (UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise MetadataFormatError(f"not a metadata object: {exc}") from None
        if not isinstance(doc, dict):
            raise MetadataFormatError(f"not a metadata object: a JSON {type(doc).__name__}")
        version = doc.get("v")
        if type(version) is not int or version != _FORMAT_VERSION:
            raise MetadataFormatError(f"unknown metadata format version {version!r}")
        unknown = set(doc) - set(_KEYS) - {"v"}
        if unknown:
            raise MetadataFormatError(f"unknown metadata fields {sorted(unknown)}")
        try:
            return cls(**{_KEYS[k]: v for k, v in doc.items() if k != "v"})
        except (TypeError, MetaFlowError) as exc:  # a field missing (path) or bad
            raise MetadataFormatError(f"bad metadata object: {exc}") from None
