"""The on-disk format of a cluster snapshot (`metaflowctl snapshot` / ``restore``).

A snapshot is a directory::

    DIR/manifest.json              written last: a directory without it is unfinished
    DIR/blocks/<address>_<plen>.jsonl   one file per block, e.g. 100.64.0.0_12.jsonl

A block file holds one record per line, in the stores' order (MetaDataID,
then the path's bytes), each line the JSON array the admin API carries
records in (`client_lib.api.admin.RecordRow`): ``[mdid, "path",
"base64(value)"]``. The manifest (`Manifest`, version `VERSION`) names the
MetaDataID space, and for every block its file, the server and epoch it
was read from, its record count, its size in bytes and the SHA-256 of its
bytes. The blocks are disjoint and together cover the space.

`verify` checks a snapshot before a restore writes anything: every file's
size and checksum, and every line (a record inside its block, in order,
as many as the manifest says). Standard library only: this belongs to the
client role, like the rest of `metaflowctl`.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO

from client_lib.api import codec
from client_lib.api.admin import RecordRow, decode_records
from client_lib.cidr import Block, cover
from client_lib.errors import MetaFlowError

FORMAT = "metaflow-snapshot"
VERSION = 1
"""Bumped whenever a reader of the previous version would misread a snapshot."""
MANIFEST = "manifest.json"
BLOCKS = "blocks"

Record = tuple[int, str, bytes]
"""``(mdid, path, value)``, as the agents' stores hold it."""


class SnapshotError(MetaFlowError):
    """A snapshot that cannot be taken or used: unfinished, corrupt, of
    another version or space, or a cluster that cannot be read or written."""


@dataclass(frozen=True)
class BlockEntry:
    """One block's file, and where and when it was read."""

    block: Block
    file: str
    """Relative to the snapshot's directory."""
    server: str
    epoch: int
    records: int
    bytes: int
    sha256: str


@dataclass(frozen=True)
class Manifest:
    format: str
    version: int
    created: str
    """UTC, ISO 8601."""
    controller: str
    space: Block
    records: int
    blocks: list[BlockEntry]


def block_file(block: Block) -> str:
    """The block's file, relative to the snapshot's directory."""
    return f"{BLOCKS}/{block.address()}_{block.plen}.jsonl".replace(":", "-")


def missing(space: Block, blocks: list[Block]) -> list[Block]:
    """The parts of `space` no block covers, as blocks (raises if two overlap:
    a snapshot's blocks are a partition)."""
    gaps: list[Block] = []
    at = space.first
    for block in sorted(blocks):
        if block.first < at:
            raise SnapshotError(f"blocks overlap at {block}")
        gaps += cover(at, block.first - 1, space.width)
        at = block.last + 1
    return gaps + cover(at, space.last, space.width)


class BlockWriter:
    """Writes one block's file (as ``.part`` until `finish`), counting its
    records and bytes and hashing them as they go."""

    def __init__(self, root: Path, block: Block) -> None:
        self.block = block
        self.file = block_file(block)
        self.path = root / self.file
        self._part = self.path.with_name(self.path.name + ".part")
        self._out: IO[bytes] = open(self._part, "wb")
        self._hash = hashlib.sha256()
        self._last: tuple[int, bytes] | None = None
        self.records = 0
        self.bytes = 0

    def add(self, rows: list[RecordRow]) -> None:
        """Append rows, which must lie in the block and follow the last in order."""
        for ident, path, value in rows:
            order = (ident, path.encode("utf-8", "surrogateescape"))
            if not self.block.contains(ident) or (self._last is not None and order <= self._last):
                raise SnapshotError(f"{self.block}: record {path!r} ({ident:#x}) is out of order "
                                    "or outside the block")
            self._last = order
            line = json.dumps([ident, path, value], separators=(",", ":")).encode() + b"\n"
            self._out.write(line)
            self._hash.update(line)
            self.bytes += len(line)
            self.records += 1

    def finish(self, server: str, epoch: int) -> BlockEntry:
        """Sync and name the file; its manifest entry."""
        self._out.flush()
        os.fsync(self._out.fileno())
        self._out.close()
        self._part.replace(self.path)
        return BlockEntry(self.block, self.file, server, epoch, self.records, self.bytes,
                          self._hash.hexdigest())

    def discard(self) -> None:
        self._out.close()
        self._part.unlink(missing_ok=True)


def write_manifest(root: Path, manifest: Manifest) -> None:
    """Write the manifest last and atomically: it is what makes the snapshot."""
    part = root / (MANIFEST + ".part")
    with open(part, "w") as out:
        json.dump(codec.to_json(manifest), out, indent=1)
        out.write("\n")
        out.flush()
        os.fsync(out.fileno())
    part.replace(root / MANIFEST)


def read_manifest(root: Path) -> Manifest:
    """The manifest of the snapshot in `root`, checked against this format."""
    try:
        data = json.loads((root / MANIFEST).read_text())
    except FileNotFoundError:
        raise SnapshotError(f"{root} has no {MANIFEST}: not a snapshot, or an unfinished one") from None
    except (OSError, ValueError) as exc:
        raise SnapshotError(f"{root / MANIFEST}: {exc}") from None
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        raise SnapshotError(f"{root / MANIFEST} is not a {FORMAT} manifest")
    if data.get("version") != VERSION:
        raise SnapshotError(f"{root / MANIFEST} is version {data.get('version')!r}; "
                            f"this metaflowctl reads version {VERSION}")
    try:
        manifest = codec.from_json(Manifest, data, where=MANIFEST)
    except codec.CodecError as exc:
        raise SnapshotError(str(exc)) from None
    blocks = [e.block for e in manifest.blocks]
    if any(b.width != manifest.space.width or not manifest.space.covers(b) for b in blocks):
        raise SnapshotError(f"{MANIFEST}: a block lies outside the space {manifest.space}")
    gaps = missing(manifest.space, blocks)
    if gaps:
        raise SnapshotError(f"{MANIFEST}: the blocks leave out {', '.join(map(str, gaps[:4]))}")
    if manifest.records != sum(e.records for e in manifest.blocks):
        raise SnapshotError(f"{MANIFEST}: {manifest.records} records in all, but its blocks add up "
                            f"to {sum(e.records for e in manifest.blocks)}")
    return manifest


def verify(root: Path, manifest: Manifest) -> None:
    """Every block file is whole: its size, checksum, records (in order,
    inside the block) and count as the manifest says; else `SnapshotError`
    naming the file."""
    for entry in manifest.blocks:
        path = root / entry.file
        if entry.file != block_file(entry.block):
            raise SnapshotError(f"{MANIFEST}: {entry.block} is in {entry.file!r}, "
                                f"not {block_file(entry.block)!r}")
        try:
            size = path.stat().st_size
            digest = hashlib.sha256()
            with open(path, "rb") as f:
                while chunk := f.read(1 << 20):
                    digest.update(chunk)
        except OSError as exc:
            raise SnapshotError(f"{entry.file}: {exc}") from None
        if size != entry.bytes or digest.hexdigest() != entry.sha256:
            raise SnapshotError(f"{entry.file} is corrupt: {size} bytes with SHA-256 {digest.hexdigest()}, "
                                f"the manifest says {entry.bytes} with {entry.sha256}")
        count = sum(len(batch) for batch in records(root, entry))
        if count != entry.records:
            raise SnapshotError(f"{entry.file} holds {count} records, the manifest says {entry.records}")


def records(root: Path, entry: BlockEntry, batch: int = 1000) -> Iterator[list[Record]]:
    """The block's records in batches of at most `batch`, each line checked
    (a record of the block, after the one before it)."""
    last: tuple[int, bytes] | None = None
    rows: list[RecordRow] = []
    with open(root / entry.file, "rb") as f:
        for number, line in enumerate(f, 1):
            try:
                ident, path, value = json.loads(line)
                row: RecordRow = (ident, path, value)
                if not (isinstance(ident, int) and isinstance(path, str) and isinstance(value, str)):
                    raise ValueError("not [mdid, path, base64 value]")
            except ValueError as exc:
                raise SnapshotError(f"{entry.file}:{number}: {exc}") from None
            order = (ident, path.encode("utf-8", "surrogateescape"))
            if not entry.block.contains(ident) or (last is not None and order <= last):
                raise SnapshotError(f"{entry.file}:{number}: record {path!r} is out of order "
                                    f"or outside {entry.block}")
            last = order
            rows.append(row)
            if len(rows) == batch:
                yield _decoded(entry, rows)
                rows = []
    if rows:
        yield _decoded(entry, rows)


def _decoded(entry: BlockEntry, rows: list[RecordRow]) -> list[Record]:
    try:
        return decode_records(rows)
    except ValueError as exc:
        raise SnapshotError(f"{entry.file}: {exc}") from None
