"""The MetaDataID function: the wire contract between clients, agents and the planner.

A client never asks anyone where a file's metadata lives. It hashes the path
into an address inside a configured CIDR block, the *MetaDataID space*, and
sends the request to that address; the switches route it to the owning server.
Every party (client library, server agent, controller planner, benchmarks) must
therefore compute exactly the same ID for the same path. This module is that
single definition; changing any rule below changes where every key lives and
is a breaking change. Test vectors in ``tests/unit/test_mdid.py`` pin it.

The rule
--------
1. The key of a path is ``normalize_path(path)``, a ``bytes`` value:

   * ``str`` is encoded as UTF-8 with ``errors="surrogateescape"``, so a name
     obtained from ``os.fsdecode`` hashes to the raw bytes it has on disk;
     ``bytes`` are used as given.
   * No Unicode normalization (NFC/NFD) is applied: file systems compare names
     byte for byte, so ``"caf\\u00e9"`` and ``"cafe\\u0301"`` are different files
     and get different IDs.
   * The path must be absolute (start with ``/``), non-empty, and must not
     contain NUL; otherwise `InvalidPath` (a ``ValueError``).
   * Lexical clean-up, without consulting any file system: runs of ``/``
     collapse to one (a leading ``//`` too), ``.`` components vanish, ``..``
     removes the previous component and never climbs above ``/``, and a
     trailing ``/`` is dropped except for ``/`` itself.
   * The normalized key may be at most ``max_length`` bytes (default 4096,
     Linux ``PATH_MAX``); longer keys raise `InvalidPath`.

   * An *entry key* names one entry of a directory: ``path NUL name``
     (`entry_key`), where ``path`` is normalized as above and ``name`` is a
     file name: 1 to `NAME_MAX` bytes, no ``/`` or NUL, not ``.`` or ``..``.
     It hashes as ``path`` alone (rule 3 hashes the part before the NUL), so
     every entry of a directory lives on the server of the directory's own
     key, next to each other in the stores' ``(mdid, path)`` order: listing
     a directory is one range scan on one server, and NUL, which no path
     contains, keeps entry keys apart from path keys.

2. The space is a CIDR block (`client_lib.cidr.Block`): ``first`` (its network
   address as an integer), ``size = 2 ** (width - plen)`` where ``width`` is 32 (IPv4) or 128 (IPv6).

3. ``mdid = first + int.from_bytes(H, "big") % size`` where
   ``H = hashlib.blake2b(route, digest_size=D).digest()`` (no key, salt or
   personalization), ``route`` is the key up to its first NUL (the whole key
   for a path), and

   * ``D = 8`` for 32-bit (IPv4) spaces: the rule fixed by ARCHITECTURE.md;
   * ``D = 16`` for 128-bit (IPv6) spaces: this project's extension of the
     rule. A 64-bit digest could only reach 2**64 distinct IDs, leaving most of
     a large IPv6 space (e.g. a /32 or ``::/0``) unused and the modulo biased;
     a 128-bit digest covers every IPv6 space evenly.

The default space is ``100.64.0.0/10`` (RFC 6598 shared address space), so a
client host needs a single route for all MetaDataIDs; the paper's whole
``0.0.0.0/0`` works as well.
"""

from __future__ import annotations

import hashlib

from client_lib.cidr import Block
from client_lib.constants import DEFAULT_SPACE_CIDR, MAX_KEY
from client_lib.errors import InvalidPath

__all__ = [
    "DEFAULT_SPACE",
    "PATH_MAX",
    "digest_size",
    "NAME_MAX",
    "entry_key",
    "mdid",
    "mdid_address",
    "mdid_of_key",
    "normalize_key",
    "normalize_path",
]

PATH_MAX = MAX_KEY
"""Default upper bound, in bytes, on a normalized key (Linux ``PATH_MAX``)."""

NAME_MAX = 255
"""Upper bound, in bytes, on one file name (Linux ``NAME_MAX``)."""


def normalize_path(path: str | bytes, *, max_length: int = PATH_MAX) -> bytes:
    """Return the canonical key of an absolute path as bytes (rule 1 above).

    A value that cannot be a key raises `InvalidPath`, which is both a
    `MetaFlowError` and a ``ValueError`` (the agent answers ``-ERR`` with its
    message); anything but ``str`` or ``bytes`` is a caller's bug and raises
    ``TypeError``, which the client turns into `InvalidPath` at its surface.
    """
    if isinstance(path, str):
        raw = path.encode("utf-8", "surrogateescape")
    elif isinstance(path, bytes):
        raw = path
    else:
        raise TypeError(f"path must be str or bytes, not {type(path).__name__}")
    if not raw:
        raise InvalidPath("path must not be empty")
    if b"\0" in raw:
        raise InvalidPath(f"path must not contain NUL: {path!r}")
    if not raw.startswith(b"/"):
        raise InvalidPath(f"path must be absolute: {path!r}")
    # Fast path: most keys (every path a DFS hands out) are already canonical.
    if (
        b"//" in raw
        or b"/./" in raw
        or b"/../" in raw
        or raw.endswith((b"/", b"/.", b"/.."))
    ):
        parts: list[bytes] = []
        for component in raw.split(b"/"):
            if component == b"..":
                if parts:
                    parts.pop()
            elif component and component != b".":
                parts.append(component)
        raw = b"/" + b"/".join(parts)
    if len(raw) > max_length:
        raise InvalidPath(f"path too long: {len(raw)} bytes > {max_length}")
    return raw


def entry_key(directory: str | bytes, name: str | bytes, *, max_length: int = PATH_MAX) -> bytes:
    """The key of entry `name` of `directory` (rule 1): it lives where the
    directory's own key does. A bad name raises `InvalidPath`."""
    raw = name.encode("utf-8", "surrogateescape") if isinstance(name, str) else name
    if not isinstance(raw, bytes):
        raise TypeError(f"name must be str or bytes, not {type(name).__name__}")
    if not raw or len(raw) > NAME_MAX:
        raise InvalidPath(f"a name has 1 to {NAME_MAX} bytes, not {len(raw)}: {name!r}")
    if b"/" in raw or b"\0" in raw or raw in (b".", b".."):
        raise InvalidPath(f"not a file name (no '/', NUL, '.' or '..'): {name!r}")
    key = normalize_path(directory, max_length=max_length) + b"\0" + raw
    if len(key) > max_length:
        raise InvalidPath(f"key too long: {len(key)} bytes > {max_length}")
    return key


def normalize_key(key: str | bytes, *, max_length: int = PATH_MAX) -> bytes:
    """A path's canonical key, or an entry key (``path NUL name``) checked and
    with its path normalized: what a server accepts as a key."""
    raw = key.encode("utf-8", "surrogateescape") if isinstance(key, str) else key
    if isinstance(raw, bytes) and b"\0" in raw:
        directory, _, name = raw.partition(b"\0")
        return entry_key(directory, name, max_length=max_length)
    return normalize_path(key, max_length=max_length)


def digest_size(space: Block) -> int:
    """BLAKE2b digest size in bytes that ``mdid`` uses for ``space`` (rule 3)."""
    return 8 if space.width == 32 else 16


DEFAULT_SPACE = Block.parse(DEFAULT_SPACE_CIDR)


def mdid(path: str | bytes, space: Block = DEFAULT_SPACE) -> int:
    """The MetaDataID of ``path`` in ``space`` (rule 3 above)."""
    return mdid_of_key(normalize_path(path), space)


def mdid_of_key(key: bytes, space: Block = DEFAULT_SPACE) -> int:
    """The MetaDataID of a key that is already ``normalize_key``'s output.

    For hot paths that normalize once and need both the key and its ID (the
    agent checks every request); anything else should call ``mdid``.
    """
    nul = key.find(b"\0")
    route = key if nul < 0 else key[:nul]
    digest = hashlib.blake2b(route, digest_size=digest_size(space)).digest()
    return space.first + int.from_bytes(digest, "big") % space.size


def mdid_address(path: str | bytes, space: Block = DEFAULT_SPACE) -> str:
    """The MetaDataID of ``path`` as IP address text: where a request for it is sent."""
    return space.address(mdid(path, space))
