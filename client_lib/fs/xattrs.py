"""Extended attributes of an inode: one record per inode, apart from its
attributes, so that lookups and listings never carry them.

The record (`xattr_key`) holds every name and value of the inode as JSON
(hex, since both are bytes). An inode whose attributes say it has none
(`Attributes.xattrs` false, the usual case) is answered without a request:
the kernel asks for ``security.capability`` before every write, and those
asks cost nothing. The flag is set before the record is first written, so a
client that dies between the two leaves a flag over no record (answered
ENODATA), never a record nobody will delete.

Limits, Linux's where it has one: a name of 1 to 255 bytes (ERANGE past
it), a value of at most 64 KiB (E2BIG), and at most 64 KiB of names and
values in all per inode (ENOSPC), which keeps the record well under the
service's ``--max-value``. ``XATTR_CREATE`` and ``XATTR_REPLACE`` are
honoured, checked against the record under its compare-and-set.
"""

from __future__ import annotations

import errno
import json

from client_lib.errors import MetadataFormatError, NamespaceError

__all__ = ["NAME_MAX", "TOTAL_MAX", "VALUE_MAX", "XATTR_CREATE", "XATTR_REPLACE", "XattrMap", "decode",
           "encode", "removed", "set_in", "xattr_key"]

NAME_MAX = 255
"""Bytes of one name (Linux's ``XATTR_NAME_MAX``)."""
VALUE_MAX = 65536
"""Bytes of one value (Linux's ``XATTR_SIZE_MAX``)."""
TOTAL_MAX = 65536
"""Bytes of every name and value of one inode together."""

XattrMap = dict[bytes, bytes]


def xattr_key(ino: int) -> str:
    """The key of inode `ino`'s extended attributes."""
    return f"/.mf/x/{ino:016x}"


def encode(xattrs: XattrMap) -> bytes:
    return json.dumps({name.hex(): value.hex() for name, value in sorted(xattrs.items())},
                      separators=(",", ":")).encode()


def decode(raw: bytes | None) -> XattrMap:
    """Inverse of `encode`; None (no record) is no attributes."""
    if raw is None:
        return {}
    try:
        fields = json.loads(raw)
        return {bytes.fromhex(name): bytes.fromhex(value) for name, value in fields.items()}
    except (ValueError, AttributeError, TypeError) as exc:
        raise MetadataFormatError(f"not extended attributes: {raw[:80]!r}: {exc}") from None


XATTR_CREATE, XATTR_REPLACE = 1, 2
"""setxattr(2)'s flags: fail if the name exists (EEXIST), or if it does not (ENODATA)."""


def set_in(xattrs: XattrMap, name: bytes, value: bytes, flags: int = 0) -> XattrMap:
    """`xattrs` with `name` set to `value`, within the limits (module
    docstring) and as `flags` allow."""
    if flags & XATTR_CREATE and name in xattrs:
        raise NamespaceError(errno.EEXIST, f"extended attribute {name!r} exists (XATTR_CREATE)")
    if flags & XATTR_REPLACE and name not in xattrs:
        raise NamespaceError(errno.ENODATA, f"no extended attribute {name!r} (XATTR_REPLACE)")
    if not name or len(name) > NAME_MAX:
        raise NamespaceError(errno.ERANGE, f"an extended attribute's name has 1 to {NAME_MAX} bytes")
    if len(value) > VALUE_MAX:
        raise NamespaceError(errno.E2BIG, f"an extended attribute's value has at most {VALUE_MAX} bytes")
    changed = {**xattrs, name: value}
    if sum(len(n) + len(v) for n, v in changed.items()) > TOTAL_MAX:
        raise NamespaceError(errno.ENOSPC, f"an inode's extended attributes hold at most {TOTAL_MAX} bytes")
    return changed


def removed(xattrs: XattrMap, name: bytes) -> XattrMap:
    """`xattrs` without `name` (ENODATA if it has none)."""
    if name not in xattrs:
        raise NamespaceError(errno.ENODATA, f"no extended attribute {name!r}")
    return {n: v for n, v in xattrs.items() if n != name}
