"""A client of a deployment of several sites (issue 29): each call placed by
the strategy (`client_lib.sites.place`) and made with one `MetaFlowClient`
per site, each over its site's prefix, so that each computes the ID the
site's agents compute (they run with that prefix as their ``--space``).

All of them reach every site through the same route: on the fabric the
network's (the switches route a site's own prefix to its servers and its
border carries the other prefixes over the WAN), without one a table
(``--route``, `client_lib.routes`). No lookup service is asked anything.

The ``replicated`` strategy needs the sites' propagation agent, which is not
built yet: this client refuses it rather than write copies nobody would
propagate.
"""

from __future__ import annotations

from types import TracebackType
from typing import Any

from client_lib.client import MetaFlowClient
from client_lib.errors import InvalidArgument
from client_lib.mdid import normalize_path
from client_lib.metadata import FileMetadata
from client_lib.sites import Placement, SiteLayout, Strategy, place

__all__ = ["SiteClient"]


class SiteClient:
    """Reads and writes of a client in site `local` under `strategy`
    (``centralized`` names its site in `central`); `options` are every
    per-site `MetaFlowClient`'s (its route, timeouts, retries)."""

    def __init__(self, layout: SiteLayout, strategy: Strategy, local: str, *, central: str | None = None,
                 **options: Any) -> None:
        if strategy is Strategy.REPLICATED:
            raise InvalidArgument("the replicated strategy needs the sites' propagation agent, "
                                  "which is not built yet")
        self.layout, self.strategy, self.local, self.central = layout, strategy, local, central
        self.placed(b"/")   # a bad site name, or centralized without its site, fails now
        self.sites = {site.name: MetaFlowClient(site.prefix, **options) for site in layout.sites}

    def placed(self, key: bytes) -> Placement:
        """Where this client puts and looks for a normalized key."""
        return place(self.layout, self.strategy, key, self.local, self.central)

    def put(self, path: str | bytes, value: bytes | FileMetadata) -> None:
        """Write every copy the strategy makes, in its order (local first)."""
        for site, _ in self.placed(normalize_path(path)).writes:
            self.sites[site].put(path, value)

    def get(self, path: str | bytes) -> bytes | None:
        """The first copy found, in the strategy's order (local first); None
        if no copy it looks at holds the entry."""
        for site, _ in self.placed(normalize_path(path)).reads:
            value = self.sites[site].get(path)
            if value is not None:
                return value
        return None

    def close(self) -> None:
        for client in self.sites.values():
            client.close()

    def __enter__(self) -> SiteClient:
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None,
                 trace: TracebackType | None) -> None:
        self.close()
