"""The multi-site paper's registry layout, the baseline of `make bench-sites`
(issue 29): one in-memory cache per site (the paper's Azure Managed Cache,
here one redis-server in each site's border namespace, no persistence) that
a node reaches at its known address, over the WAN for another site, on one
kept connection. The strategies place copies exactly as for MetaFlow
(`client_lib.sites.place`); only the way to a copy differs: an address
looked up in the registry's table against a request routed by its ID.

    stores = registry_stores({"east": ("10.100.0.1", 6379), ...})
    SiteClient(layout, Strategy.DECENTRALIZED, "east", stores=stores)
"""

from __future__ import annotations

from collections.abc import Mapping

from client_lib.client import Destination
from client_lib.errors import BadReply
from client_lib.mdid import normalize_path
from client_lib.metadata import FileMetadata
from client_lib.resp import OK
from client_lib.site_client import RespLine, SiteStore


class RegistryStore(RespLine):
    """One site's registry: a redis-server keyed by the entry's normalized path."""

    what = "registry"

    def get(self, path: str | bytes) -> bytes | None:
        reply = self.call("GET", normalize_path(path))
        if reply is not None and not isinstance(reply, bytes):
            raise BadReply(f"GET answered {reply!r}")
        return reply

    def put(self, path: str | bytes, value: bytes | FileMetadata) -> None:
        data = value.to_bytes() if isinstance(value, FileMetadata) else value
        reply = self.call("SET", normalize_path(path), data)
        if reply != OK:
            raise BadReply(f"SET answered {reply!r}")

    def delete(self, path: str | bytes) -> bool:
        reply = self.call("DEL", normalize_path(path))
        if not isinstance(reply, int):
            raise BadReply(f"DEL answered {reply!r}")
        return reply > 0


def registry_stores(addresses: Mapping[str, Destination], timeout: float = 10.0) -> dict[str, SiteStore]:
    """Every site's registry, by site name."""
    return {site: RegistryStore(where, timeout) for site, where in addresses.items()}
