"""Types of the compiled request path (`nat_agent/fastpath`, built by `make`)."""

import logging
from collections import Counter
from collections.abc import Callable
from typing import Any

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

class FastLane:
    """The common commands answered end to end in compiled code (`lane.rs`)."""

    def __init__(self, *, space: Block, max_length: int, access: RecordAccess, writing: dict[str, Any],
                 stats: Counter[str], counters: list[tuple[bytes, str]], total: str,
                 buckets: Buckets) -> None: ...
    @property
    def version(self) -> int: ...
    def ops_counts(self) -> bytes:
        """Requests answered here per bucket since the start (`nat_agent.ops_meter.Counts`)."""
    def set_table(self, version: int, reads: list[tuple[int, int]],
                  writes: list[tuple[int, int]]) -> None: ...
    def answer(self, parser: CommandParser, resp3: bool, budget: int) -> bytes | None: ...

def route(raw: bytes, space: Block, max_length: int) -> tuple[bytes, int] | None:
    """A raw key's normalized form and MetaDataID, or None where the service answers an error."""

class ServiceLoop:
    """The service's port served by threads of its own (`server.rs`): one
    per listener (file descriptors it takes over), the lane on each, what
    the lane declines handed to `handoff` (which schedules the service)."""

    def __init__(self, *, listeners: list[int], lane: FastLane, ownership: Any,
                 handoff: Callable[[int, int, tuple[str, int], int, bool, list[bytes] | Exception], object],
                 stats: Counter[str], log: logging.Logger, arg_limit: ArgLimit, max_bulk: int,
                 unsent: tuple[int, int],
                 flush_bytes: int, read_ahead: int, read_timeout: float, idle_timeout: float,
                 max_clients: int, refusal: bytes, reclaimed_prefix: bytes, at_limit: str) -> None: ...
    def reply(self, worker: int, conn: int, data: bytes, close: bool, resp3: bool) -> None: ...
    def barrier(self) -> None: ...
    @property
    def connections(self) -> int: ...
    def stop(self) -> None: ...
