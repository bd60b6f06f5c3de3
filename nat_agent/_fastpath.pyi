"""Types of the compiled request path (`nat_agent/fastpath`, built by `make`)."""

from collections import Counter
from collections.abc import Callable, Sequence

from client_lib.cidr import Block
from nat_agent.ops_meter import Buckets
from nat_agent.resp_commands import ArgLimit
from nat_agent.store import RecordAccess

class CommandParser:
    """`nat_agent.resp_commands.CommandParser`, compiled: same limits,
    same refusals, same exceptions and messages."""

    def __init__(self, max_bulk: int = ..., max_args: int = ..., max_line: int = ...,
                 limit: ArgLimit | None = ...) -> None: ...
    def feed(self, data: bytes) -> None: ...
    @property
    def pending(self) -> int: ...
    @property
    def busy(self) -> bool: ...
    def next_command(self) -> list[bytes] | None: ...

class ArgLimits:
    """Per-argument limits as data (`key` bytes, or `value` bytes from the
    index `values_from` gives for a command on); a `nat_agent.resp_commands.ArgLimit`."""

    def __init__(self, key: int, value: int, values_from: list[tuple[bytes, int]]) -> None: ...
    def __call__(self, name: bytes, index: int) -> int: ...

class Keyspace:
    """The MetaDataID space, its hash and a key's limits, each from its Python
    declaration (`nat_agent.service.keyspace`): the lane's key step."""

    def __init__(self, *, space: Block, digest_size: int, id_bytes: int, max_length: int,
                 name_max: int) -> None: ...
    def route(self, raw: bytes) -> tuple[bytes, int] | None:
        """A raw key's normalized form and MetaDataID, or None where the service answers an error."""

class LaneView:
    """What the lane knows of the agent's state, kept current by Python: the
    ranges it may answer for at one `Ownership.version`, the version the
    ownership is at (`Ownership.on_version`), and how many replicated writes
    are under way (`Replicator.writing`)."""

    def __init__(self) -> None: ...
    @property
    def version(self) -> int: ...
    def set_table(self, version: int, reads: list[tuple[int, int]],
                  writes: list[tuple[int, int]]) -> None: ...
    def set_version(self, version: int) -> None: ...
    @property
    def stale(self) -> bool: ...
    @property
    def writing(self) -> int: ...
    def set_writing(self, count: int) -> None: ...

class Histogram:
    """The seconds one command took on the lane (`seconds.rs`): lock-free
    buckets with `nat_agent.latency.Latency`'s bounds and placement."""

    def __init__(self, bounds: Sequence[float]) -> None: ...
    def observe(self, seconds: float) -> None: ...
    def snapshot(self) -> tuple[list[int], float]:
        """Counts per bucket (not cumulative; +Inf last) and the sum of the seconds."""

class SyncGroup:
    """The group commit's ledger (`durable.rs`), shared by the worker threads
    and the event loop; `nat_agent.group_commit.Ledger` is its oracle (both
    are a `nat_agent.group_commit.SyncLedger`). It syncs a directory's logs
    (`directory`, `suffix`) or calls `sync`."""

    def __init__(self, *, seconds: Histogram, directory: str | None = ..., suffix: str | None = ...,
                 sync: Callable[[], object] | None = ...) -> None: ...
    @property
    def issued(self) -> int: ...
    @property
    def syncs(self) -> int: ...
    def begin(self, keys: list[bytes]) -> int: ...
    def end(self, ticket: int) -> None: ...
    def covered(self, ticket: int) -> bool: ...
    def ticket_of(self, key: bytes) -> int | None: ...
    def sync_through(self, ticket: int) -> None: ...

class FastLane:
    """The common commands answered end to end in compiled code (`lane.rs`)."""

    def __init__(self, *, keyspace: Keyspace, view: LaneView, access: RecordAccess,
                 stats: Counter[str], counters: list[tuple[bytes, str, Histogram]], total: str,
                 buckets: Buckets) -> None: ...
    @property
    def view(self) -> LaneView: ...
    def ops_counts(self) -> bytes:
        """Requests answered here per bucket since the start (`nat_agent.ops_meter.Counts`)."""
    def answer(self, parser: CommandParser, resp3: bool, budget: int) -> bytes | None: ...

class ServiceLoop:
    """The service's port served by threads of its own (`server.rs`): one
    per listener (file descriptors it takes over), the lane on each, what
    the lane declines handed to `handoff` (which schedules the service)."""

    def __init__(self, *, listeners: list[int], lane: FastLane, refresh: Callable[[], object],
                 handoff: Callable[[int, int, tuple[str, int], int, bool, list[bytes] | Exception], object],
                 sync_failed: Callable[[str, int], bytes], write_failed: Callable[[str, int], bytes],
                 connected: Callable[[], int], refused: Callable[[], None],
                 reclaimed: Callable[[tuple[str, int], float], None],
                 overdue: Callable[[tuple[str, int], float, int], None],
                 dropped: Callable[[tuple[str, int], int], None], arg_limit: ArgLimit, max_bulk: int,
                 max_args: int, max_line: int, unsent: tuple[int, int],
                 flush_bytes: int, read_ahead: int, read_timeout: float, idle_timeout: float,
                 sweep_interval: float, max_clients: int, refusal: bytes, timeout_reply: bytes,
                 reclaimed_prefix: bytes, at_limit: str, shutting_down: str) -> None: ...
    def reply(self, worker: int, conn: int, data: bytes, close: bool, resp3: bool) -> None: ...
    def barrier(self) -> None: ...
    @property
    def connections(self) -> int: ...
    def stop(self) -> None: ...
