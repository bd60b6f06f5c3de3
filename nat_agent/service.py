"""The metadata service on port 9000: a Redis-compatible subset over the server's store.

Why RESP: every Redis client and `redis-cli -h <mdid> -p 9000` work against
it, so a person can poke at any MetaDataID from a shell. Why re-check
ownership on the server: the switches route by flow entries that change a
little later (or earlier) than the data moves, so the last word on whether a
key may be served here is the agent's own view (`ownership.Ownership`).

What a Redis client sees:

* ``GET``, ``SET key value [NX|XX|IFEQ old] [GET]`` (Redis semantics, and
  Valkey's IFEQ: write only if the value is exactly ``old``, a
  compare-and-set; atomic in both stores; expiry options are refused:
  metadata does not expire), ``DEL``, ``DELIFEQ key value`` (Valkey's:
  delete only if the value is exactly ``value``; 1 if it did), ``EXISTS``, ``PING``, ``ECHO``,
  ``INFO``, ``QUIT``, and ``STAT key`` (where a key lives and why, never
  redirected).
* A key is a path or an entry key, ``directory NUL name``
  (`client_lib.mdid.entry_key`), which lives with its directory; ``ELIST
  directory [after [count]]`` lists a directory's entries as a flat array of
  name, value, ... in name order, after ``after`` (a name; empty for the
  first page), at most ``count`` (default 100, at most 1000) of them: a file
  system's paged readdir, one range scan on one server.
* A directory exists while its *header* (the record at its own key) does:
  ``ECREATE directory name value`` writes the entry only if the name is free
  and the header present (``+OK``; nil when the name is taken; ``-ENOENT``
  without a header), and ``ERMDIR directory`` deletes the header only if the
  directory has no entries (1; 0 without a header; ``-ENOTEMPTY``). Each is
  one atomic step on one server, since a header and its entries share a
  MetaDataID: no create can land in a directory that rmdir found empty.
* ``HELLO [2|3]`` switches the connection to RESP3 (redis-py 8's default) and
  answers the map Redis answers; ``CLIENT SETNAME/SETINFO`` are accepted.
* A key this server is not the primary of (not held, or held as a backup)
  gets ``-MOVED <mdid> <ip>:<port>``, the shape Redis Cluster uses
  (`client_lib.resp.moved_message`), naming the new owner when a hand-off
  told us (``moved_to``), else the MetaDataID's own address on port 9000,
  which the switches route to whoever owns it now. ``-TRYAGAIN`` (which
  passes) answers a write to a block being migrated, any request while the
  store cannot be reached (a restarting redis-server), a block this primary
  may not serve now (`ownership`: not yet serving, fenced, degraded,
  suspended), and a write its replica set did not acknowledge.
* A write to a block with other members is answered once every synced
  member has applied it, and a read of a key waits while a write to it is
  under way (`replication`), so no reply shows a value a single failure
  could take back.
* Commands that make no sense here (transactions, pub/sub, ``SELECT`` other
  than 0, ...) get an ``-ERR`` saying so; the connection stays usable.

The compiled path (`nat_agent._fastpath.FastLane`, ``--request-path``): GET,
SET, EXISTS and PING are answered in Rust where the answer is a plain success
that needs no waiting on the event loop (the table of `Ownership.fast_ranges`,
a store with `record_access`; its worker threads also take conditional writes
and, in turns, SETs to replicated blocks: `Replicator.begin_turn`); this
class answers everything else, words every error, and
is the oracle the lane is tested against. An install without the extension
(`nat_agent.extension`) has no lane: this class answers everything.

Limits, so that this port, which faces every client of the file system,
cannot be starved by one of them (the mechanics are in `connection.py`):

* a key (and any argument but SET's value) may have `MAX_KEY` bytes and a
  value ``--max-value``; both are checked at the bulk header, before the
  bytes are read, and an argument over its limit gets an error while the rest
  of its command is discarded unbuffered (the connection stays usable);
  a bulk header over `PROTO_MAX_BULK` is a protocol error and closes it;
* a request must arrive in full within ``--read-timeout`` of its first byte,
  an idle connection is closed after ``--idle-timeout``, and a client that
  reads none of its replies stops being read once `connection.UNSENT_HIGH`
  bytes are waiting for it;
* at ``--max-clients`` a new connection reclaims the slot of the connection
  that made useful progress least recently (idle the longest, stuck in the
  oldest incomplete request, or not reading), so slow or idle clients can
  never lock out a working one: what a candidate has sent is read and
  answered before it is judged, so a connection that has sent a complete
  command is never reclaimed while an idle or trickling one is open, on any
  of the worker threads (`nat_agent/fastpath/src/server.rs`, "Reclaiming
  across workers"). Only when every connection is waiting on the store is a
  newcomer refused (``-TRYAGAIN``).
"""

from __future__ import annotations

import asyncio
import functools
import logging
import socket
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar

from client_lib.api.metrics import REQUEST_BUCKETS
from client_lib.cidr import Block
from client_lib.constants import ELIST_DEFAULT, ELIST_MAX, MAX_KEY, MAX_VALUE, METAFLOW_PORT
from client_lib.errors import Conflict, InvalidArgument
from client_lib.mdid import NAME_MAX, PATH_MAX, digest_size, entry_key, mdid_of_key, normalize_key
from client_lib.resp import (
    DEFAULT_MAX_ARGS,
    DEFAULT_MAX_LINE,
    OK,
    PONG,
    ErrorReply,
    Reply,
    moved_message,
    parse_moved,
)
from client_lib.version import version
from nat_agent.agent import Agent
from nat_agent.anyip import transparent_listener
from nat_agent.connection import (
    FLUSH_BYTES,
    READ_AHEAD,
    RECLAIMED,
    UNSENT_HIGH,
    UNSENT_LOW,
    Client,
    Connection,
    dropped,
    overdue,
    resume,
    settled,
    sweep,
    sweep_interval,
    timed_out,
)
from nat_agent.extension import FAST_LANE, HISTOGRAM, KEYSPACE, LANE_VIEW, SERVICE_LOOP, arg_limits
from nat_agent.latency import Latency
from nat_agent.ops_meter import SAMPLE_S, Buckets, OpsMeter
from nat_agent.ownership import Decision, Held, Verdict
from nat_agent.port_sharing import refuse_shared
from nat_agent.replication import NotReplicated, Replicator
from nat_agent.resp_commands import ArgLimit, encode_reply, internal_error
from nat_agent.store import (
    Condition,
    IfEqual,
    InDirectory,
    Record,
    RecordAccess,
    check_width,
    encode_path,
)

if TYPE_CHECKING:
    from nat_agent.extension import FastLane, Histogram, Keyspace, ServiceLoop

log = logging.getLogger("metaflow.agent.service")
T = TypeVar("T")


class _Unchanged:
    """A write that changed nothing (SET NX of a present key): nothing to replicate."""


UNCHANGED = _Unchanged()
Change = bytes | None | _Unchanged
"""What a write did: a new value, None (deleted), or `UNCHANGED`."""

PROTO_MAX_BULK = 512 << 20
"""A bulk header announcing more than this closes the connection (Redis's
proto-max-bulk-len); below it, an argument over its own limit is refused and
skipped."""

_VERSION = version().encode()

_VALUES_FROM = {b"SET": 2, b"ECREATE": 3, b"DELIFEQ": 2}
"""Commands with values, and the index of their first argument that may be one."""

FAST_COMMANDS = (b"GET", b"SET", b"EXISTS", b"PING", b"DEL", b"DELIFEQ", b"ECREATE")
"""What `FastLane` may answer itself (the cases it takes on are in its docstring)."""

_UNSUPPORTED = {
    **dict.fromkeys([b"MULTI", b"EXEC", b"DISCARD", b"WATCH", b"UNWATCH"],
                    "transactions (each command is atomic, and keys live on different servers)"),
    **dict.fromkeys([b"SUBSCRIBE", b"UNSUBSCRIBE", b"PSUBSCRIBE", b"PUNSUBSCRIBE", b"SSUBSCRIBE",
                     b"SUNSUBSCRIBE", b"PUBLISH", b"SPUBLISH"], "publish/subscribe"),
    **dict.fromkeys([b"MONITOR", b"SYNC", b"PSYNC", b"REPLICAOF", b"SLAVEOF"],
                    "replication or monitoring"),
    b"AUTH": "authentication (port 9000 is open to every client by design)",
}
"""Redis commands a client might send that MetaFlow refuses, and why."""


SHUTTING_DOWN = "the server is shutting down"
"""Why a busy connection is reclaimed when the service stops."""


def keyspace(space: Block) -> Keyspace:
    """The compiled path's key step (normalize, hash, record key) for
    `space`, given every number it needs from its one Python declaration
    (only asked for with the extension: there is no lane without it)."""
    assert KEYSPACE is not None
    return KEYSPACE(space=space, digest_size=digest_size(space), id_bytes=check_width(space.width),
                    max_length=PATH_MAX, name_max=NAME_MAX)


DEFAULT_WORKERS = 1
"""Threads serving the port: one measured best on this project's 2-core
machines, where the clients share the cores (docs/benchmarks/agent.md, `make bench-agent`)."""


@dataclass(frozen=True)
class ServiceLimits:
    max_value: int = MAX_VALUE    # bytes in one value
    read_timeout: float = 5.0     # seconds from a request's first byte to its last
    idle_timeout: float = 300.0   # seconds a connection may sit without a request
    max_clients: int = 4096       # open connections; beyond, the least useful one is reclaimed
    workers: int = 0              # threads serving the port (`ServiceLoop`) given a lane; 0: the loop does


class CommandError(Exception):
    """A request that gets an error reply; the connection stays usable."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.reply = ErrorReply(message)


Handler = Callable[[Client, list[bytes]], Awaitable[Reply]]


class WorkerClient:
    """A connection of a `ServiceLoop` worker, as a handler sees it. Made
    anew for each command handed over: the worker keeps the state (its
    `resp3` comes back with the reply)."""

    __slots__ = ("ident", "peer", "resp3")

    def __init__(self, ident: int, peer: object, resp3: bool) -> None:
        self.ident = ident
        self.peer = peer
        self.resp3 = resp3


_OUTCOMES = {"MOVED": "moved", "TRYAGAIN": "tryagain"}
"""The outcome a command's error reply counts under, by its code; any other code is an error."""


class MetadataService:
    """One server's RESP endpoint. `stats` counts what happened, for the admin API."""

    max_bulk = PROTO_MAX_BULK

    def __init__(self, agent: Agent, replicator: Replicator, limits: ServiceLimits = ServiceLimits(),
                 compiled: bool = True) -> None:
        """`compiled`: answer the common commands on the compiled path
        (`FastLane`) where the store allows it; False keeps every request on
        the Python path (the oracle, and the A/B of the benchmarks)."""
        self.agent = agent
        self.store = agent.store
        self.ownership = agent.ownership
        self.replicator = replicator
        self.writing = replicator.writing
        self.space = agent.space
        self.limits = limits
        self.stats: Counter[str] = Counter()
        self.failures: Counter[tuple[str, str]] = Counter()
        """Commands that did not serve, by (stats counter, outcome: moved, tryagain,
        refused, error); the served ones are their counter's count less these."""
        # Only values may be long (SET's, IFEQ's and ECREATE's); every other
        # argument is a key, a name or a word.
        self.arg_limit: ArgLimit = arg_limits(MAX_KEY, limits.max_value, list(_VALUES_FROM.items()))
        self._connections: set[Connection] = set()
        self._started = time.monotonic()
        self._server: asyncio.AbstractServer | None = None
        self._workers: ServiceLoop | None = None
        self._handed: set[asyncio.Task[None]] = set()  # handed-over commands that wait in the store
        self._sweeper: asyncio.Task[None] | None = None
        self._sampler: asyncio.Task[None] | None = None
        # name: (handler, min args, max args, stats counter); args after the name
        self._commands: dict[bytes, tuple[Handler, int, int, str]] = {
            name: (handler, least, most, "cmd_" + name.decode().lower())
            for name, handler, least, most in (
                (b"PING", self._ping, 0, 1),
                (b"ECHO", self._echo, 1, 1),
                (b"GET", self._get, 1, 1),
                (b"SET", self._set, 2, 6),
                (b"DEL", self._del, 1, 64),
                (b"DELIFEQ", self._delifeq, 2, 2),
                (b"EXISTS", self._exists, 1, 64),
                (b"STAT", self._stat, 1, 1),
                (b"ELIST", self._elist, 1, 3),
                (b"ECREATE", self._ecreate, 3, 3),
                (b"ERMDIR", self._ermdir, 1, 1),
                (b"INFO", self._info, 0, 1),
                (b"COMMAND", self._command, 0, 8),
                (b"HELLO", self._hello, 0, 6),
                (b"CLIENT", self._client, 1, 8),
                (b"SELECT", self._select, 1, 1),
            )
        }
        self.latency = {spec[3]: Latency(REQUEST_BUCKETS) for spec in self._commands.values()}
        """Seconds each command took on the Python path, by stats counter (`nat_agent.metrics`)."""
        self._lane_seconds: dict[str, Histogram] = {}
        """Seconds each command took on the compiled lane, by stats counter (none without a lane)."""

        access = self.store.record_access()
        self._sync_failure = None if access is None else access.sync_failure
        self._lane = self._fast_lane(access) if compiled else None
        self.ops = OpsMeter(self.space, None if self._lane is None else self._lane.ops_counts)
        """Requests served per part of the ID space (``POST /ops``). Each key
        of a command counts once when this server serves it (GET, SET, DEL,
        DELIFEQ, EXISTS, ECREATE, ERMDIR, ELIST), on the path that answers it:
        the lane for what it takes on, else the handler, once the key passed
        the ownership check. A key answered MOVED or TRYAGAIN does not count:
        its load is another server's, or comes back with the retry. Nor does
        STAT, a debugging aid answered for any ID."""

    def _fast_lane(self, access: RecordAccess | None) -> FastLane | None:
        """The compiled path over the store's records, if it allows one and the
        extension is there (`nat_agent.extension`); the ownership and the
        replicator then keep its view current."""
        if access is None or FAST_LANE is None or LANE_VIEW is None or HISTOGRAM is None:
            return None
        view = LANE_VIEW()
        view.set_version(self.ownership.version)
        self.ownership.on_version = view.set_version
        view.watch(self.writing)
        fast = [(name, spec[3]) for name, spec in self._commands.items() if name in FAST_COMMANDS]
        self._lane_seconds = {counter: HISTOGRAM(REQUEST_BUCKETS) for _, counter in fast}
        return FAST_LANE(keyspace=keyspace(self.space), view=view, access=access, stats=self.stats,
                         replicate=self.replicator.begin_turn,
                         counters=[(name, counter, self._lane_seconds[counter]) for name, counter in fast],
                         total="compiled_requests", buckets=Buckets.of(self.space))

    def lane(self) -> FastLane | None:
        """The compiled path, its view's table in step with the ownership
        view. The worker threads call it too, when the view is stale."""
        lane = self._lane
        if lane is not None:
            view, ownership = lane.view, self.ownership
            if view.version != ownership.version:
                view.set_table(ownership.version, *ownership.fast_ranges())
        return lane

    # -- lifecycle ---------------------------------------------------------

    async def start(self, host: str, port: int, transparent: bool = False) -> int:
        """Listen on host:port; returns the bound port (port 0 picks one).
        `transparent`: accept connections to any address the routes deliver
        here, and answer from it (the ``local`` rewrite's mdids)."""
        self.replicator.loop = asyncio.get_running_loop()
        if self.limits.workers > 0 and self._lane is not None:
            port = self._start_workers(host, port, transparent, self._lane)
        else:
            port = await self._listen(host, port, transparent)
        self._sampler = asyncio.get_running_loop().create_task(self._sample_ops(), name="ops-sampler")
        return port

    async def _listen(self, host: str, port: int, transparent: bool) -> int:
        """Serve the port on the event loop."""
        loop = asyncio.get_running_loop()
        if transparent:
            self._server = await loop.create_server(lambda: Connection(self),
                                                    sock=transparent_listener(host, port))
        else:
            self._server = await loop.create_server(lambda: Connection(self), host, port,
                                                    backlog=1024, reuse_address=True)
        self._sweeper = loop.create_task(sweep(self._connections, self.limits.read_timeout,
                                               self.limits.idle_timeout), name="connection-sweeper")
        return int(self._server.sockets[0].getsockname()[1])

    def _start_workers(self, host: str, port: int, transparent: bool, lane: FastLane) -> int:
        """`limits.workers` threads, each on its own `SO_REUSEPORT` listener.
        Only with a lane: without one (the Redis store, ``--request-path
        python``) every command would be handed over, and the event loop
        serves the port better itself."""
        listeners: list[socket.socket] = []
        try:
            for _ in range(self.limits.workers):
                listeners.append(transparent_listener(host, port, reuse_port=True, transparent=transparent))
                port = listeners[0].getsockname()[1]
            refuse_shared(listeners[0].getsockname()[0], port, listeners)
        except BaseException:
            for sock in listeners:
                sock.close()
            raise
        loop = asyncio.get_running_loop()
        limits = self.limits

        def handoff(*handed: Any) -> None:  # on a worker thread
            loop.call_soon_threadsafe(self._serve_handed, *handed)

        assert SERVICE_LOOP is not None  # there is a lane
        self._workers = SERVICE_LOOP(
            listeners=[sock.detach() for sock in listeners], lane=lane, refresh=self.lane, handoff=handoff,
            sync_failed=self._sync_failed, write_failed=self._write_failed,
            turn_refused=self._turn_refused, unacknowledged=self._unacknowledged,
            connected=self._connected, refused=self._refused, reclaimed=self._reclaimed,
            overdue=functools.partial(overdue, self.stats), dropped=functools.partial(dropped, self.stats),
            arg_limit=self.arg_limit, max_bulk=self.max_bulk,
            max_args=DEFAULT_MAX_ARGS, max_line=DEFAULT_MAX_LINE,
            unsent=(UNSENT_HIGH, UNSENT_LOW), flush_bytes=FLUSH_BYTES, read_ahead=READ_AHEAD,
            read_timeout=limits.read_timeout, idle_timeout=limits.idle_timeout,
            sweep_interval=sweep_interval(limits.read_timeout, limits.idle_timeout),
            max_clients=limits.max_clients, refusal=encode_reply(self._refusal()),
            timeout_reply=encode_reply(timed_out(limits.read_timeout)),
            reclaimed_prefix=encode_reply(ErrorReply(RECLAIMED))[:-2],
            at_limit=self._at_limit(), shutting_down=SHUTTING_DOWN)
        self.agent.inflight.barrier = self._workers.barrier
        return port

    def _sync_failed(self, reason: str, replies: int) -> bytes:
        """A worker's replies held for a sync that failed (on a worker
        thread): each is the error the Python path would answer, counted as
        its internal errors are."""
        assert self._sync_failure is not None  # only a store whose writes wait has a sync to fail
        error = self._sync_failure(reason)
        self.stats["internal_errors"] += replies
        log.error("%d replies held for a sync failed: %s", replies, error)
        return encode_reply(internal_error(error))

    def _write_failed(self, reason: str, replies: int) -> bytes:
        """A worker's replies that wait for its turn's writes, which the
        store failed to apply (on a worker thread): counted and worded as
        the Python path's internal errors."""
        self.stats["internal_errors"] += replies
        log.error("%d replies wait for writes the store failed to apply: %s", replies, reason)
        return encode_reply(internal_error(reason))

    def _turn_refused(self, reason: str, replies: int) -> bytes:
        """A worker's replies that wait for its turn's writes, which were not
        made (a block's role changed before the batch, or a replicated write
        of one of its keys was under way; on a worker thread): TRYAGAIN,
        counted as the Python path's are."""
        self.stats["tryagain"] += replies
        self.stats["errors"] += replies
        return encode_reply(ErrorReply(f"TRYAGAIN {reason}"))

    def _unacknowledged(self, reason: str, ident: int) -> bytes:
        """A worker's reply that shows a replicated SET of its turn, which the
        replica set did not acknowledge (on a worker thread): worded and
        counted as the Python path's reply to that SET."""
        self.stats["tryagain"] += 1
        self.stats["errors"] += 1
        return encode_reply(ErrorReply(self._not_acknowledged(ident, reason)))

    async def _sample_ops(self) -> None:
        """The snapshots `ops` slides its window over."""
        while True:
            await asyncio.sleep(SAMPLE_S)
            self.ops.sample()

    async def stop(self) -> None:
        """Stop accepting, then close every client connection."""
        if self._sampler is not None:
            self._sampler.cancel()
            self._sampler = None
        if self._workers is not None:
            workers, self._workers = self._workers, None
            self.agent.inflight.barrier = None
            workers.stop()
            for task in list(self._handed):
                task.cancel()
            return
        if self._server is None:
            return
        self._server.close()
        for conn in list(self._connections):
            conn.reclaim(SHUTTING_DOWN)
        if self._sweeper is not None:
            self._sweeper.cancel()
        await self._server.wait_closed()
        self._server = None

    # -- commands handed over by the worker threads ------------------------

    def _serve_handed(self, worker: int, conn: int, peer: tuple[str, int], ident: int, resp3: bool,
                      parsed: list[bytes] | Exception) -> None:
        """Answer what a worker's lane declined, on the event loop, as a
        `Connection` would; the reply goes back to the worker."""
        workers = self._workers
        if workers is None:
            return  # stopped meanwhile: the connection is gone
        client = WorkerClient(ident, peer, resp3)
        done = settled(self.stats, peer, parsed)
        if done is not None:
            workers.reply(worker, conn, done[0], done[1], resp3)
            return
        assert not isinstance(parsed, Exception)
        coro = self.execute(parsed, client)
        try:
            waiting = coro.send(None)
        except StopIteration as finished:
            workers.reply(worker, conn, finished.value, False, client.resp3)
            return

        async def finish() -> None:
            reply = await resume(coro, waiting)
            if self._workers is workers:
                workers.reply(worker, conn, reply, False, client.resp3)

        task = asyncio.get_running_loop().create_task(finish())
        self._handed.add(task)
        task.add_done_callback(self._handed.discard)

    # -- connections (called by `Connection`) ----------------------------------

    def attach(self, conn: Connection) -> ErrorReply | None:
        if len(self._connections) >= self.limits.max_clients and not self._reclaim_one():
            self._refused()
            return self._refusal()
        self._connections.add(conn)
        conn.ident = self._connected()
        return None

    def _connected(self) -> int:
        """Count a new connection (on either path); its number."""
        self.stats["connections"] += 1
        return self.stats["connections"]

    def _refused(self) -> None:
        """Count a newcomer refused at `max_clients` (on either path)."""
        self.stats["refused_connections"] += 1

    def counters(self) -> dict[str, str]:
        """Each command, in lower case, and the `stats` counter it counts under."""
        return {name.decode().lower(): spec[3] for name, spec in self._commands.items()}

    def latencies(self) -> dict[str, Latency]:
        """Seconds each command took, by stats counter, on both paths: the
        Python path's `latency` with the compiled lane's added. A copy, read
        at a scrape; the lane's counts are read without stopping it."""
        both = dict(self.latency)
        for counter, seconds in self._lane_seconds.items():
            both[counter] = both[counter].plus(*seconds.snapshot())
        return both

    def open_connections(self) -> int:
        """Client connections open now, on the event loop and on the worker threads."""
        workers = self._workers
        return len(self._connections) + (workers.connections if workers is not None else 0)

    def detach(self, conn: Connection) -> None:
        self._connections.discard(conn)

    def _reclaim_one(self) -> bool:
        """At the limit: free the slot of the least recently useful connection
        (a scan, but only at the limit; nothing is kept up to date per request).
        What a candidate has sent is read first (`Connection.catch_up`): one
        whose command sat unread is answered, so becomes the most recently
        useful, and the next candidate is looked at; so a connection that has
        sent a complete command is never reclaimed while an idle or trickling
        one is open."""
        caught: set[Connection] = set()
        while self._connections:
            victim = min(self._connections, key=Connection.staleness)
            if victim.waiting:
                return False  # everyone is waiting on the store: nobody is idle
            if victim not in caught:
                caught.add(victim)
                if victim.catch_up():
                    continue
            self._reclaimed(victim.peer, time.monotonic() - victim.useful)
            victim.reclaim(self._at_limit())
            return True
        return False

    def _reclaimed(self, peer: object, idle: float) -> None:
        """Count a connection reclaimed at `max_clients` after `idle` seconds
        without useful progress (on either path); logged every 100th."""
        self.stats["reclaimed_connections"] += 1
        if self.stats["reclaimed_connections"] % 100 == 1:
            log.warning("at the limit of %d clients: reclaiming %s, idle or stalled for %.1f s "
                        "(%d reclaimed so far)", self.limits.max_clients, peer, idle,
                        self.stats["reclaimed_connections"])

    def _refusal(self) -> ErrorReply:
        # TRYAGAIN, not ERR: overload is transient and clients back off and retry.
        return ErrorReply(f"TRYAGAIN max number of clients reached ({self.limits.max_clients}), "
                          "all of them busy")

    def _at_limit(self) -> str:
        return (f"the server is at its limit of {self.limits.max_clients} clients "
                "and this connection was the least recently active")

    # -- commands ----------------------------------------------------------

    async def execute(self, command: list[bytes], conn: Client) -> bytes:
        name = command[0].upper()
        spec = self._commands.get(name)
        if spec is None:
            return encode_reply(self._unknown(command[0], name))
        handler, least, most, counter = spec
        if not least <= len(command) - 1 <= most:
            self.failures[counter, "refused"] += 1
            return encode_reply(ErrorReply(
                f"ERR wrong number of arguments for '{name.decode().lower()}' command"))
        self.stats[counter] += 1
        started = time.perf_counter()
        try:
            return encode_reply(await handler(conn, command[1:]), conn.resp3)
        except CommandError as exc:
            self.stats["errors"] += 1
            self.failures[counter, _OUTCOMES.get(exc.reply.code, "error")] += 1
            return encode_reply(exc.reply)
        except ConnectionError as exc:
            # The store is out of reach (a redis-server restarting): transient, so
            # TRYAGAIN, which clients retry; the store reconnects by itself.
            self.stats["store_unavailable"] += 1
            self.failures[counter, "tryagain"] += 1
            return encode_reply(ErrorReply(f"TRYAGAIN store unavailable: {exc}"))
        except Exception as exc:
            self.stats["internal_errors"] += 1
            self.failures[counter, "error"] += 1
            log.exception("command %s from %s failed", name.decode(errors="replace"), conn.peer)
            return encode_reply(internal_error(exc))
        finally:
            self.latency[counter].observe(time.perf_counter() - started)

    def _unknown(self, raw: bytes, name: bytes) -> ErrorReply:
        shown = raw[:64].decode("utf-8", "replace")
        why = _UNSUPPORTED.get(name)
        if why is not None:
            self.stats["unsupported_commands"] += 1
            return ErrorReply(f"ERR MetaFlow does not support '{shown.lower()}': no {why}")
        self.stats["unknown_commands"] += 1
        return ErrorReply(f"ERR unknown command '{shown}'")

    def _key(self, raw: bytes, write: bool) -> tuple[int, str, Decision]:
        """Normalize a key, compute its MetaDataID, and decide who answers."""
        try:
            key = normalize_key(raw)
            path = key.decode("utf-8")
        except UnicodeDecodeError:
            raise CommandError("ERR invalid path: not valid UTF-8") from None
        except ValueError as exc:
            raise CommandError(f"ERR invalid path: {exc}") from None
        ident = mdid_of_key(key, self.space)
        return ident, path, self.ownership.decide(ident, write)

    def _served(self, raw: bytes, write: bool) -> tuple[int, str, Held]:
        """The key's ID, path and held block, if this server answers for it now;
        else the CommandError to answer (MOVED or TRYAGAIN)."""
        ident, path, decision = self._key(raw, write)
        if decision.verdict is Verdict.SERVE:
            assert decision.held is not None
            return ident, path, decision.held
        if decision.verdict is Verdict.TRYAGAIN:
            self.stats["tryagain"] += 1
            raise CommandError(f"TRYAGAIN {self.space.address(ident)} block {decision.block} "
                               f"{decision.reason}")
        self.stats["moved"] += 1
        raise CommandError(self._redirect(ident, decision.hint))

    async def _settled(self, raw: bytes, write: bool) -> tuple[int, str, Held]:
        """`_served`, once no write to the key is under way: a read must not
        see a value its replica set may not hold, and writes to one key
        reach the set in the order they reached this store. (Each write
        ends within the replication timeout, acknowledged or not.)"""
        while True:
            ident, path, held = self._served(raw, write)
            pending = self.writing.get(path)
            if pending is None:
                return ident, path, held
            self.stats["waited_for_replication"] += 1
            # Shielded: a waiter whose client hangs up is cancelled, and must not
            # cancel the write's `done`, which is another client's (and the key's).
            await asyncio.shield(pending.done)

    def _redirect(self, ident: int, hint: str | None) -> str:
        """MOVED to the new owner's data address if a hand-off named it, else to
        the MetaDataID itself, which the switches route to the current owner."""
        if hint:
            try:
                return moved_message(*parse_moved(f"MOVED {ident} {hint}"))
            except ValueError:
                log.warning("ignoring a moved_to hint that is not HOST:PORT: %r", hint)
        return moved_message(ident, self.space.address(ident), METAFLOW_PORT)

    async def _admitted(self, work: Awaitable[T]) -> T:
        """Run store work that passed the ownership check, visible to
        `InFlight.drain` until it has finished."""
        token = self.agent.inflight.begin()
        try:
            return await work
        finally:
            self.agent.inflight.end(token)

    async def _replicated(self, ident: int, path: str, work: Awaitable[tuple[T, Change]],
                          known: Change = UNCHANGED) -> T:
        """A write to a block with other members: applied here and streamed to
        the set, answered once every synced member acknowledged it
        (`replication`); an unacknowledged write is TRYAGAIN. `work` applies
        it here and returns the reply and what changed (`UNCHANGED`, a value,
        or None for a delete). When the change does not depend on what the
        store holds (`known`: a plain SET, a DEL), it is streamed first, so
        the members apply it, and sync it to disk, while this store does;
        else it is streamed once `work` says what it changed."""
        replicator = self.replicator
        while (write := replicator.begin(ident, path)) is None:
            # A worker's turn took the key since the caller looked: wait for it,
            # and write only if the block is still served here (`path` is a
            # normalized key, which normalizes to itself).
            await self._settled(path.encode("utf-8"), write=True)
        token = self.agent.inflight.begin()
        try:
            if not isinstance(known, _Unchanged):
                replicator.stream(write, known)
            try:
                reply, change = await work
            except BaseException as exc:
                replicator.failed_here(write, exc)
                raise
            if isinstance(known, _Unchanged) and not isinstance(change, _Unchanged):
                replicator.stream(write, change)
        finally:
            self.agent.inflight.end(token)
            replicator.sent(write)
        try:
            await replicator.acknowledged(write)
        except NotReplicated as exc:
            self.stats["tryagain"] += 1
            raise CommandError(self._not_acknowledged(ident, str(exc))) from None
        return reply

    def _not_acknowledged(self, ident: int, why: str) -> str:
        return f"TRYAGAIN {self.space.address(ident)} write not acknowledged by the replica set: {why}"

    async def _conditional(self, ident: int, path: str, held: Held,
                           work: Awaitable[tuple[Reply, Change]]) -> Reply:
        """A write whose change depends on what the store holds (ECREATE,
        ERMDIR, DELIFEQ): through the replica set if the block has one."""
        if held.peers:
            return await self._replicated(ident, path, work)
        return (await self._admitted(work))[0]

    # -- data commands -------------------------------------------------------

    async def _get(self, conn: Client, args: list[bytes]) -> Reply:
        ident, path, _ = self._served(args[0], write=False)
        if self.writing and path in self.writing:
            ident, path, _ = await self._settled(args[0], write=False)
        self.ops.count(ident)
        return await self._admitted(self.store.get(ident, path))

    async def _set(self, conn: Client, args: list[bytes]) -> Reply:
        """``SET key value [NX|XX] [GET]``, as Redis: nil when NX/XX stops the
        write, and with GET the previous value (nil if none) either way."""
        when, get = _set_options(args[2:])
        ident, path, held = self._served(args[0], write=True)
        if self.writing and path in self.writing:
            ident, path, held = await self._settled(args[0], write=True)
        self.ops.count(ident)
        if held.peers:
            known: Change = args[1] if when is None and not get else UNCHANGED
            return await self._replicated(ident, path, self._put(ident, path, args[1], when, get), known)
        if when is None and not get:
            await self._admitted(self.store.put(ident, path, args[1]))
            return OK
        return (await self._admitted(self._put(ident, path, args[1], when, get)))[0]

    async def _put(self, ident: int, path: str, value: bytes, when: Condition | None,
                   get: bool) -> tuple[Reply, Change]:
        if when is None and not get:
            await self.store.put(ident, path, value)
            return OK, value
        written, old = await self.store.put_if(ident, path, value, when)
        change = value if written else UNCHANGED
        if get:
            return old, change
        return (OK if written else None), change

    # -- restores (``POST /load``) ------------------------------------------

    async def load(self, block: Block, epoch: int, records: Sequence[Record]) -> int:
        """Write `records` as plain SETs would, replicated to the block's set:
        a restore's batch (``POST /load``), for a `block` this agent is the
        primary of at `epoch`. Each record must be a key this service takes,
        with the MetaDataID its path has here, inside `block` (400 before
        anything is written: a snapshot of another space, say); a key this
        agent may not write now (MOVED, TRYAGAIN: the block was frozen,
        moved or fenced) is 409, and the caller sends the batch again where
        the block went (SETs are idempotent, so what was written stays right)."""
        checked = []
        for ident, path, value in records:
            raw = encode_path(path)
            try:
                key = normalize_key(raw)
            except ValueError as exc:
                raise InvalidArgument(f"record {path!r} is not a key: {exc}") from None
            if key != raw or mdid_of_key(key, self.space) != ident or not block.contains(ident):
                raise InvalidArgument(f"record {path!r} with ID {ident:#x} does not belong in {block} "
                                      f"of {self.space} (its key's ID here is "
                                      f"{mdid_of_key(key, self.space):#x})")
            if len(value) > self.limits.max_value:
                raise InvalidArgument(f"record {path!r}: a value of {len(value)} bytes exceeds "
                                      f"the limit of {self.limits.max_value}")
            checked.append((raw, value))
        self.agent.primary_epoch(block, epoch)
        results = await asyncio.gather(*(self._load_one(raw, value, epoch) for raw, value in checked),
                                       return_exceptions=True)
        refused = next((r for r in results if isinstance(r, BaseException)), None)
        if isinstance(refused, CommandError):
            raise Conflict(f"{block}@{epoch}: {refused}", 409)
        if refused is not None:
            raise refused
        self.stats["loaded_records"] += len(checked)
        return len(checked)

    async def _load_one(self, raw: bytes, value: bytes, epoch: int) -> None:
        ident, path, held = await self._settled(raw, write=True)
        if held.epoch != epoch:
            raise CommandError(f"TRYAGAIN {path!r} is held at epoch {held.epoch} now")
        if held.peers:
            await self._replicated(ident, path, self._put(ident, path, value, None, False), value)
        else:
            await self._admitted(self.store.put(ident, path, value))

    async def _del(self, conn: Client, args: list[bytes]) -> Reply:
        keys = [self._served(raw, write=True) for raw in args]  # all checked before any is touched
        for ident, _, _ in keys:
            self.ops.count(ident)
        if not self.writing and not any(held.peers for _, _, held in keys):
            return await self._admitted(self._sum(self.store.delete, [(i, p) for i, p, _ in keys]))
        deleted = 0
        for raw in args:
            ident, path, held = await self._settled(raw, write=True)
            if held.peers:
                deleted += await self._replicated(ident, path, self._delete(ident, path), None)
            else:
                deleted += await self._admitted(self.store.delete(ident, path))
        return deleted

    async def _delete(self, ident: int, path: str, if_equal: bytes | None = None) -> tuple[int, Change]:
        existed = await self.store.delete(ident, path, if_equal)
        return int(existed), (None if existed else UNCHANGED)

    async def _delifeq(self, conn: Client, args: list[bytes]) -> Reply:
        """``DELIFEQ key value``: a compare-and-delete, so a retried or late
        delete cannot remove a newer value (a rename's last step)."""
        ident, path, held = await self._settled(args[0], write=True)
        self.ops.count(ident)
        work = self._delete(ident, path, args[1])
        return await self._conditional(ident, path, held, work)

    async def _exists(self, conn: Client, args: list[bytes]) -> Reply:
        keys = [self._served(raw, write=False) for raw in args]
        for ident, _, _ in keys:
            self.ops.count(ident)
        if self.writing:
            keys = [await self._settled(raw, write=False) for raw in args]
        return await self._admitted(self._sum(self.store.exists, [(i, p) for i, p, _ in keys]))

    @staticmethod
    async def _sum(check: Callable[[int, str], Awaitable[bool]], keys: list[tuple[int, str]]) -> int:
        return sum([await check(ident, path) for ident, path in keys])

    @staticmethod
    def _directory(raw: bytes, command: str) -> bytes:
        if b"\0" in raw:
            raise CommandError(f"ERR {command} takes a directory's path, not an entry key")
        return raw

    async def _ecreate(self, conn: Client, args: list[bytes]) -> Reply:
        """``ECREATE directory name value``: a new entry in an existing directory."""
        raw = self._directory(args[0], "ECREATE")
        try:
            key = entry_key(raw, args[1])
        except ValueError as exc:
            raise CommandError(f"ERR invalid entry: {exc}") from None
        ident, path, held = await self._settled(key, write=True)
        self.ops.count(ident)
        header = path.partition("\0")[0]
        work = self._create_entry(ident, path, args[2], header)
        return await self._conditional(ident, path, held, work)

    async def _create_entry(self, ident: int, path: str, value: bytes, header: str) -> tuple[Reply, Change]:
        written, old = await self.store.put_if(ident, path, value, InDirectory(header))
        if written:
            return OK, value
        if old is None:
            raise CommandError(f"ENOENT no such directory: {header}")
        return None, UNCHANGED

    async def _ermdir(self, conn: Client, args: list[bytes]) -> Reply:
        """``ERMDIR directory``: delete the directory's header if it has no entries."""
        ident, path, held = await self._settled(self._directory(args[0], "ERMDIR"), write=True)
        self.ops.count(ident)
        work = self._remove_directory(ident, path)
        return await self._conditional(ident, path, held, work)

    async def _remove_directory(self, ident: int, path: str) -> tuple[Reply, Change]:
        done = await self.store.remove_directory(ident, path)
        if done == "not-empty":
            raise CommandError(f"ENOTEMPTY directory not empty: {path}")
        return (1, None) if done == "removed" else (0, UNCHANGED)

    async def _elist(self, conn: Client, args: list[bytes]) -> Reply:
        """``ELIST directory [after [count]]``: a page of the directory's entries."""
        self._directory(args[0], "ELIST")
        after = args[1] if len(args) > 1 else b""
        count = _count(args[2]) if len(args) > 2 else ELIST_DEFAULT
        ident, path, _ = self._served(args[0], write=False)
        self.ops.count(ident)
        if after:
            try:
                entry_key(path, after)
            except ValueError as exc:
                raise CommandError(f"ERR invalid name after which to list: {exc}") from None
        prefix = path + "\0"
        while pending := next((w for p, w in list(self.writing.items()) if p.startswith(prefix)), None):
            self.stats["waited_for_replication"] += 1
            await asyncio.shield(pending.done)   # as `_settled`: list nothing its set may not hold
            ident, path, _ = self._served(args[0], write=False)
        found = await self._admitted(self.store.entries(ident, path, after.decode("utf-8", "surrogateescape"),
                                                        count))
        return [part for name, value in found for part in (name.encode("utf-8", "surrogateescape"), value)]

    async def _stat(self, conn: Client, args: list[bytes]) -> Reply:
        """Where a key lives and whether it is here: a debugging aid that never
        answers MOVED, so it also explains *why* a key is not served."""
        ident, path, decision = self._key(args[0], write=False)
        value = await self.store.get(ident, path) if decision.verdict is Verdict.SERVE else None
        if decision.verdict is Verdict.SERVE:
            frozen = any(f.contains(ident) for f in self.ownership.frozen)
            state = "migrating" if frozen else "owned"
        elif decision.verdict is Verdict.TRYAGAIN:
            state = "unavailable"
        else:
            state = "not-owned" if decision.held is None else "backup"
        return [b"path", path.encode(), b"mdid", self.space.address(ident).encode(),
                b"block", str(decision.block or "-").encode(),
                b"state", state.encode(), b"why", decision.reason.encode(),
                b"exists", int(value is not None), b"bytes", len(value) if value is not None else 0]

    # -- connection and server commands ----------------------------------------

    async def _ping(self, conn: Client, args: list[bytes]) -> Reply:
        return args[0] if args else PONG

    async def _echo(self, conn: Client, args: list[bytes]) -> Reply:
        return args[0]

    async def _hello(self, conn: Client, args: list[bytes]) -> Reply:
        """``HELLO [protover [AUTH user pass] [SETNAME name]]``: the reply protocol
        for this connection (2 or 3), and the server's description as Redis gives it."""
        protocol = 3 if conn.resp3 else 2
        if args:
            if not args[0].isdigit():
                raise CommandError("ERR Protocol version is not an integer or out of range")
            protocol = int(args[0])
            if protocol not in (2, 3):
                raise CommandError("NOPROTO unsupported protocol version")
            options = args[1:]
            while options:
                option = options[0].upper()
                if option == b"AUTH" and len(options) >= 3:
                    raise CommandError(f"ERR MetaFlow does not support 'auth': no {_UNSUPPORTED[b'AUTH']}")
                if option != b"SETNAME" or len(options) < 2:
                    raise CommandError(f"ERR syntax error in HELLO option "
                                       f"'{options[0][:32].decode('utf-8', 'replace')}'")
                options = options[2:]
        conn.resp3 = protocol == 3
        return {b"server": b"metaflow", b"version": _VERSION, b"proto": protocol, b"id": conn.ident,
                b"mode": b"standalone", b"role": b"master", b"modules": []}

    async def _client(self, conn: Client, args: list[bytes]) -> Reply:
        """What client libraries send on connect: accepted (and forgotten)."""
        sub = args[0].upper()
        if sub in (b"SETNAME", b"SETINFO") and len(args) >= 2:
            return OK
        if sub == b"ID" and len(args) == 1:
            return conn.ident
        raise CommandError("ERR MetaFlow supports only CLIENT SETNAME, SETINFO and ID")

    async def _select(self, conn: Client, args: list[bytes]) -> Reply:
        if args[0] == b"0":
            return OK
        raise CommandError("ERR MetaFlow has one keyspace: only SELECT 0")

    async def _info(self, conn: Client, args: list[bytes]) -> Reply:
        lines = [
            "# metaflow-agent",
            f"store:{self.store.kind}",
            f"space:{self.space}",
            f"owned_blocks:{','.join(map(str, self.ownership.owned)) or '-'}",
            f"backup_blocks:{','.join(str(r.block) for r in self.ownership.roles if not r.primary) or '-'}",
            f"frozen_blocks:{','.join(map(str, self.ownership.frozen)) or '-'}",
            f"degraded_blocks:{','.join(map(str, self.ownership.degraded)) or '-'}",
            f"suspended:{int(self.ownership.suspended)}",
            f"keys:{await self.store.total()}",
            f"connected_clients:{len(self._connections)}",
            f"uptime_s:{time.monotonic() - self._started:.0f}",
        ]
        lines += [f"{k}:{v}" for k, v in sorted(self.stats.items())]
        return "\r\n".join(lines).encode() + b"\r\n"

    async def _command(self, conn: Client, args: list[bytes]) -> Reply:
        """`redis-cli` asks for COMMAND DOCS in interactive mode; we have none."""
        return []


def _count(raw: bytes) -> int:
    """ELIST's page size: 1 to `ELIST_MAX`."""
    if not raw.isdigit() or not 1 <= int(raw) <= ELIST_MAX:
        raise CommandError(f"ERR count must be an integer from 1 to {ELIST_MAX}")
    return int(raw)


def _set_options(options: list[bytes]) -> tuple[Condition | None, bool]:
    """SET's ``NX``/``XX``/``IFEQ old`` and ``GET``; expiry options are
    refused, anything else is a syntax error (as Redis says it)."""
    when: Condition | None = None
    get = False
    rest = iter(options)
    for raw in rest:
        option = raw.upper()
        if option in (b"NX", b"XX") and when is None:
            when = "absent" if option == b"NX" else "present"
        elif option == b"IFEQ" and when is None:
            old = next(rest, None)
            if old is None:
                raise CommandError("ERR syntax error: IFEQ needs the value to compare with")
            when = IfEqual(old)
        elif option == b"GET" and not get:
            get = True
        elif option in (b"EX", b"PX", b"EXAT", b"PXAT", b"KEEPTTL"):
            raise CommandError(f"ERR MetaFlow keeps metadata until it is deleted: "
                               f"SET option '{option.decode()}' (expiry) is not supported")
        else:
            raise CommandError("ERR syntax error")
    return when, get
