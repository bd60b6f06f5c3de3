"""File contents on MetaFlow: fixed-size chunks keyed by (inode, index).

Why this placement: a chunk's key, `chunk_key` (ino, index), is hashed into
the MetaDataID space like any other key, so the switches route a chunk to its
server with no lookup and no block map to keep, the chunks of one file spread
over the servers, and they are replicated, migrated and split with the blocks
that hold them (r copies when ``--replicas`` is r). The cost is one request
per chunk touched.

Each record is ``MAGIC + CRC-32 (big-endian) + data``; a read checks the sum
and raises `ChecksumMismatch` rather than return bytes that changed on disk.
A chunk that does not exist inside the file's size reads as zeros (a sparse
file). A write to part of a chunk is a read-modify-write by compare-and-set
(``SET NX`` for a new chunk, ``SET IFEQ`` otherwise), retried when another
writer came first, so concurrent writers to one chunk lose nothing; a write
of a whole chunk replaces it in one plain ``SET``.

The file's size lives in its attributes (`client_lib.fs.namespace`); the caller
passes it to `read`, `truncate` and `remove`.
"""

from __future__ import annotations

import random
import time
import zlib
from collections.abc import Callable

from client_lib.errors import InvalidArgument, MetaFlowError
from client_lib.fs.records import Records

__all__ = ["CHUNK_SIZE", "ChecksumMismatch", "FileData", "chunk_key"]

CHUNK_SIZE = 256 * 1024
"""Bytes per chunk: a quarter of the agent's default --max-value; a 1 GiB file is 4,096 chunks."""

MAGIC = b"MFC1"
_HEAD = len(MAGIC) + 4
_CAS_TRIES = 32


class ChecksumMismatch(MetaFlowError):
    """A chunk's bytes do not match its checksum (or are not a chunk at all)."""


def chunk_key(ino: int, index: int) -> str:
    return f"/.mf/c/{ino:016x}/{index:08x}"


def _seal(data: bytes) -> bytes:
    return MAGIC + zlib.crc32(data).to_bytes(4, "big") + data


def _open(key: str, raw: bytes) -> bytes:
    data = raw[_HEAD:]
    if raw[:len(MAGIC)] != MAGIC or int.from_bytes(raw[len(MAGIC):_HEAD], "big") != zlib.crc32(data):
        raise ChecksumMismatch(f"chunk {key} fails its checksum ({len(raw)} bytes)")
    return data


class FileData:
    """Reads and writes the chunks of files, over one `Records` client."""

    def __init__(self, client: Records, chunk_size: int = CHUNK_SIZE) -> None:
        if chunk_size < 1:
            raise InvalidArgument(f"chunk_size must be positive, not {chunk_size}")
        self.client, self.chunk_size = client, chunk_size

    def write(self, ino: int, offset: int, data: bytes, known_size: int | None = None) -> int:
        """Write `data` at `offset`; returns its length. The caller grows the
        file's size in its attributes if the write went past it. With
        `known_size`, chunks wholly past it are first created without being
        read (SET NX; one request instead of two for a growing file), and
        read-modify-written as usual if they turn out to exist."""
        _check_range(offset, len(data))
        position, view = offset, memoryview(data)
        while view:
            index, within = divmod(position, self.chunk_size)
            piece = view[:self.chunk_size - within]
            if len(piece) == self.chunk_size:   # a whole chunk: nothing of the old one to keep
                self.client.put(chunk_key(ino, index), _seal(bytes(piece)))
            else:
                fresh = known_size is not None and index * self.chunk_size >= known_size
                self._splice(ino, index, within, bytes(piece), fresh)
            position += len(piece)
            view = view[len(piece):]
        return len(data)

    def read(self, ino: int, offset: int, size: int, file_size: int) -> bytes:
        """Up to `size` bytes at `offset` of a file of `file_size` bytes."""
        _check_range(offset, size)
        end = min(offset + size, file_size)
        out = bytearray()
        position = offset
        while position < end:
            index, within = divmod(position, self.chunk_size)
            take = min(self.chunk_size - within, end - position)
            chunk = self._chunk(ino, index)
            piece = chunk[within:within + take]
            out += piece + bytes(take - len(piece))   # past a chunk's end, or no chunk: zeros
            position += take
        return bytes(out)

    def truncate(self, ino: int, old_size: int, new_size: int) -> None:
        """Drop what lies beyond `new_size`: whole chunks deleted, the last one cut."""
        _check_range(new_size, 0)
        if new_size >= old_size:
            return
        keep, within = divmod(new_size, self.chunk_size)
        if within:
            self._cut(ino, keep, within)
            keep += 1
        self._delete(ino, keep, old_size)

    def zero(self, ino: int, offset: int, length: int) -> None:
        """Zeros over `length` bytes at `offset` (``fallocate``'s punched hole
        or zeroed range): chunks wholly inside deleted, the ends blanked."""
        _check_range(offset, length)
        position, end = offset, offset + length
        while position < end:
            index, within = divmod(position, self.chunk_size)
            take = min(self.chunk_size - within, end - position)
            if take == self.chunk_size:
                self.client.delete(chunk_key(ino, index))
            else:
                self._blank(ino, index, within, take)
            position += take

    def remove(self, ino: int, size: int) -> None:
        """Reclaim every chunk of an unlinked file of `size` bytes."""
        self._delete(ino, 0, size)

    # -- chunks ------------------------------------------------------------------------

    def _chunk(self, ino: int, index: int) -> bytes:
        key = chunk_key(ino, index)
        raw = self.client.get(key)
        return b"" if raw is None else _open(key, raw)

    def _splice(self, ino: int, index: int, within: int, piece: bytes, fresh: bool = False) -> None:
        """Put `piece` at `within` in a chunk; a `fresh` chunk is first assumed absent."""
        def spliced(old: bytes | None) -> bytes:
            old = old or b""
            return old[:within] + bytes(max(0, within - len(old))) + piece + old[within + len(piece):]
        self._rewrite(ino, index, spliced, "write", fresh)

    def _cut(self, ino: int, index: int, length: int) -> None:
        self._rewrite(ino, index, lambda old: None if old is None or len(old) <= length else old[:length],
                      "truncate")

    def _blank(self, ino: int, index: int, within: int, length: int) -> None:
        """Zeros over `length` bytes at `within` of a chunk (a missing chunk,
        or bytes past its end, read as zeros already)."""
        def blanked(old: bytes | None) -> bytes | None:
            if old is None or within >= len(old):
                return None
            return old[:within] + bytes(min(length, len(old) - within)) + old[within + length:]
        self._rewrite(ino, index, blanked, "punch")

    def _rewrite(self, ino: int, index: int, change: Callable[[bytes | None], bytes | None], what: str,
                 fresh: bool = False) -> None:
        """A chunk changed by compare-and-set: `change` maps its bytes (None:
        no chunk) to the new ones, or None for nothing to write."""
        key = chunk_key(ino, index)
        for attempt in range(_CAS_TRIES):
            _back_off(attempt)
            raw = None if fresh and not attempt else self.client.get(key)
            new = change(None if raw is None else _open(key, raw))
            if new is None:
                return
            done = (self.client.create(key, _seal(new)) if raw is None
                    else self.client.compare_and_set(key, raw, _seal(new)))
            if done:
                return
        raise MetaFlowError(f"chunk {key} changed {_CAS_TRIES} times under this {what}")

    def _delete(self, ino: int, first: int, size: int) -> None:
        for index in range(first, -(-size // self.chunk_size)):
            self.client.delete(chunk_key(ino, index))


def _back_off(attempt: int) -> None:
    """Before a retry of a compare-and-set that lost to another writer: a
    random pause that grows with the attempts, so that writers contending for
    one chunk spread out instead of colliding again in lockstep."""
    if attempt:
        time.sleep(random.uniform(0, 0.001 * (1 << min(attempt, 6))))


def _check_range(offset: int, size: int) -> None:
    if offset < 0 or size < 0:
        raise InvalidArgument(f"offset and size must not be negative: {offset}, {size}")
