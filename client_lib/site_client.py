"""A client of a deployment of several sites (issue 29): each call placed by
the strategy (`client_lib.sites.place`) and made with one `MetaFlowClient`
per site, each over its site's prefix, so that each computes the ID the
site's agents compute (they run with that prefix as their ``--space``).

All of them reach every site through the same route: on the fabric the
network's (the switches route a site's own prefix to its servers and its
border carries the other prefixes over the WAN), without one a table
(``--route``, `client_lib.routes`). No lookup service is asked anything.

Under ``replicated`` a write is stamped (`client_lib.stamps`), queued with
the writer's site's propagation agent (`nat_agent.site_sync`, at the
layout's ``sync`` address) and then written into the writer's site; it
returns once both are done, and the agent carries it to every other site.
Queued first, so a writer that dies between the two loses nothing: the
agent writes the local copy too. A read takes the local copy, its stamp
removed.
"""

from __future__ import annotations

import os
import socket
import threading
import tomllib
from collections.abc import Callable, Mapping
from pathlib import Path
from types import TracebackType
from typing import Any, Protocol, TypeVar

from client_lib.client import Destination, MetaFlowClient
from client_lib.errors import BadReply, InvalidArgument, ServerError, Unavailable
from client_lib.mdid import normalize_path
from client_lib.metadata import FileMetadata
from client_lib.resp import OK, ErrorReply, ProtocolError, Reply, RespParser, encode_command
from client_lib.sites import Placement, SiteLayout, Strategies, Strategy, layout_from_table, place
from client_lib.stamps import Clock, is_tombstone, stamped, unstamped

T = TypeVar("T")

__all__ = ["Outbox", "RespLine", "SiteClient", "SiteStore", "read_layout"]


def read_layout(path: Path | str) -> SiteLayout:
    """The layout in a TOML file (`client_lib.sites.layout_from_table`);
    `InvalidArgument` naming the file for anything wrong."""
    try:
        with open(path, "rb") as f:
            return layout_from_table(tomllib.load(f))
    except (OSError, tomllib.TOMLDecodeError, InvalidArgument) as exc:
        raise InvalidArgument(f"{path}: {exc}") from None


class RespLine:
    """One kept connection to one RESP server at a fixed address (a
    propagation agent; the baselines' registries). Thread-safe (one
    request at a time)."""

    what = "server"

    def __init__(self, where: Destination, timeout: float = 5.0) -> None:
        self.where, self.timeout = where, timeout
        self._sock: socket.socket | None = None
        self._lock = threading.Lock()

    def call(self, *args: bytes | str) -> Reply:
        """One command and its reply; `Unavailable` if the server cannot be
        reached or answered nothing in time (the command may or may not have
        been applied then), `ServerError` if it refused."""
        frame = encode_command(*args)
        with self._lock:
            try:
                if self._sock is None:
                    self._sock = socket.create_connection(self.where, timeout=self.timeout)
                self._sock.settimeout(self.timeout)
                self._sock.sendall(frame)
                parser = RespParser()
                while not (answer := parser.next_reply())[0]:
                    data = self._sock.recv(65536)
                    if not data:
                        raise ConnectionResetError(f"the {self.what} closed the connection")
                    parser.feed(data)
            except (OSError, ProtocolError) as exc:
                self._drop()
                raise Unavailable(f"{self.what} {self.where[0]}:{self.where[1]}", 1, str(exc)) from None
        reply = answer[1]
        if isinstance(reply, ErrorReply):
            raise ServerError(reply.message)
        return reply

    def _drop(self) -> None:
        if self._sock is not None:
            self._sock.close()
            self._sock = None

    def close(self) -> None:
        with self._lock:
            self._drop()


class Outbox(RespLine):
    """The connection to one propagation agent: `queue` returns once the
    agent has the update on disk (an `Unavailable` leaves it unknown whether
    it was queued: queueing again is harmless)."""

    what = "propagation agent"

    def queue(self, key: bytes, value: bytes) -> None:
        reply = self.call("QUEUE", key, value)
        if reply != OK:
            raise BadReply(f"QUEUE answered {reply!r}")


class SiteStore(Protocol):
    """What `SiteClient` reads and writes one site's copies through: a
    `MetaFlowClient` over the site's prefix, or (the baselines) a registry."""

    def get(self, path: str | bytes) -> bytes | None: ...
    def put(self, path: str | bytes, value: bytes | FileMetadata) -> None: ...
    def delete(self, path: str | bytes) -> bool: ...
    def close(self) -> None: ...


class _Named:
    """A site's store whose `Unavailable` says which site could not be reached."""

    def __init__(self, site: str, store: SiteStore) -> None:
        self.site, self.store = site, store

    def _call(self, method: Callable[..., T], *args: Any) -> T:
        try:
            return method(*args)
        except Unavailable as exc:
            what = f"site {self.site} unreachable ({exc.what})"
            raise Unavailable(what, exc.attempts, exc.reason) from None

    def get(self, path: str | bytes) -> bytes | None:
        return self._call(self.store.get, path)

    def put(self, path: str | bytes, value: bytes | FileMetadata) -> None:
        self._call(self.store.put, path, value)

    def delete(self, path: str | bytes) -> bool:
        return self._call(self.store.delete, path)

    def close(self) -> None:
        self.store.close()


class SiteClient:
    """Reads and writes of a client in site `local` under `strategy`, one
    for every entry or one per namespace prefix (`Strategies`;
    ``centralized`` names its site in `central`); `options` are every
    per-site `MetaFlowClient`'s (its route, timeouts, retries). `stores`
    replaces those clients, one per site (the baselines' registries)."""

    def __init__(self, layout: SiteLayout, strategy: Strategy | Strategies, local: str, *,
                 central: str | None = None, stores: Mapping[str, SiteStore] | None = None,
                 **options: Any) -> None:
        self.layout, self.local, self.central = layout, local, central
        self.strategies = strategy if isinstance(strategy, Strategies) else Strategies.single(strategy)
        for _, each in self.strategies.rules:   # a bad site name, or centralized without its site, fails now
            place(layout, each, b"/", local, central)
        self.outbox: Outbox | None = None
        if self.strategies.uses(Strategy.REPLICATED):
            sync = layout.named(local).sync
            if sync is None:
                raise InvalidArgument(f"the replicated strategy needs site {local}'s propagation agent "
                                      "(its sync address in the layout)")
            self.outbox = Outbox(sync, float(options.get("deadline", 5.0)))
            self.clock = Clock(f"{local}/{os.getpid()}/{os.urandom(4).hex()}".encode())
        self.sites: Mapping[str, SiteStore] = stores or {
            site.name: MetaFlowClient(site.prefix, **options) for site in layout.sites}

    def placed(self, key: bytes) -> Placement:
        """Where this client puts and looks for a normalized key."""
        return place(self.layout, self.strategies.of(key), key, self.local, self.central)

    def _at(self, site: str) -> SiteStore:
        """`site`'s copies, whose `Unavailable` names the site (a site cut off
        from this one, or down, is said as such; the error stays retryable)."""
        return _Named(site, self.sites[site])

    def _replicated(self, key: bytes) -> bool:
        return self.strategies.of(key) is Strategy.REPLICATED

    def put(self, path: str | bytes, value: bytes | FileMetadata) -> None:
        """Write every copy the strategy makes, in its order (local first);
        under ``replicated``, queue it for the other sites first."""
        key = normalize_path(path)
        if self._replicated(key):
            assert self.outbox is not None
            value = stamped(value.to_bytes() if isinstance(value, FileMetadata) else value, self.clock.next())
            self.outbox.queue(key, value)
        for site, _ in self.placed(key).writes:
            self._at(site).put(key, value)

    def delete(self, path: str | bytes) -> None:
        """Remove the copies a write makes, in its order; under ``replicated``
        write a tombstone instead, queued and propagated as a write is (a
        later write, by stamp, brings the entry back). Under local
        replication another site's local copy, written by a writer there,
        stays until it is deleted from there."""
        key = normalize_path(path)
        if self._replicated(key):
            assert self.outbox is not None
            tombstone = self.clock.next().tombstone
            self.outbox.queue(key, tombstone)
            for site, _ in self.placed(key).writes:
                self._at(site).put(key, tombstone)
            return
        for site, _ in self.placed(key).writes:
            self._at(site).delete(key)

    def get(self, path: str | bytes) -> bytes | None:
        """The first copy found, in the strategy's order (local first); None
        if no copy it looks at holds the entry."""
        key = normalize_path(path)
        for site, _ in self.placed(key).reads:
            value = self._at(site).get(key)
            if value is not None and self._replicated(key):
                return None if is_tombstone(value) else unstamped(value)[1]
            if value is not None:
                return value
        return None

    def close(self) -> None:
        for client in self.sites.values():
            client.close()
        if self.outbox is not None:
            self.outbox.close()

    def __enter__(self) -> SiteClient:
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None,
                 trace: TracebackType | None) -> None:
        self.close()
