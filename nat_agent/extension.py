"""The agent's compiled request path, if this install has it: the one import of `nat_agent._fastpath`.

Why optional: the extension is Rust (`nat_agent/fastpath`), built into the
platform wheels and by the editable install (pyproject.toml,
[tool.setuptools-rust]). An install without it (an sdist on a machine
without cargo, a work tree not set up by `make`, a wheel of another
platform unpacked by hand) still has everything the compiled path does in
Python, since the Python path is its oracle: `resp_commands.CommandParser`
for the compiled `CommandParser`, `MetadataService`'s handlers for
`FastLane`. The agent then serves every request through Python, slower, as
redis-py does without hiredis; `daemon` logs `UNAVAILABLE` once at start.

`tests/unit/test_extension.py` keeps every other module from importing the
extension itself, so this is the only place the decision is made.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, cast

from client_lib.resp import DEFAULT_MAX_ARGS
from nat_agent import resp_commands
from nat_agent.mdid_index import SortedMdids
from nat_agent.resp_commands import ArgLimit

if TYPE_CHECKING:
    from nat_agent._fastpath import (
        CommandParser,
        FastLane,
        Histogram,
        Keyspace,
        LaneView,
        LevelDB,
        MdidIndex,
        ServiceLoop,
        SyncGroup,
    )

FAST_LANE: type[FastLane] | None
"""The compiled lane's class, or None: no lane, every request on the Python path."""
SERVICE_LOOP: type[ServiceLoop] | None
"""The compiled worker threads' class (only ever started with a lane)."""
KEYSPACE: type[Keyspace] | None
"""The compiled key step (normalize, hash, record key) a lane is built with."""
LANE_VIEW: type[LaneView] | None
"""The lane's view of ownership and of the writes under way, kept current by Python."""
HISTOGRAM: type[Histogram] | None
"""The lane's lock-free histogram of a command's seconds (one per command it takes on)."""
SYNC_GROUP: type[SyncGroup] | None
"""The group commit's ledger that the worker threads wait on (``--fsync batch``)."""
LEVELDB: type[LevelDB] | None
"""LevelDB opened by the extension, which the lane then reads and writes
without Python; None: `nat_agent.leveldb_store` opens it with plyvel."""
MDID_INDEX: type[MdidIndex] | None
"""The LevelDB store's record index in Rust, which the lane updates without
Python; None: `nat_agent.mdid_index.SortedMdids`."""
UNAVAILABLE: str | None
"""None when the extension is imported; else why it could not be."""
PYTHON_PATH_NOTICE = "serving every request through the Python path"
"""What the agent logs once at start, after `UNAVAILABLE`, when it has no
extension (the tests and `make check-install` look for it)."""

try:
    import nat_agent._fastpath as _fastpath
except ImportError as error:
    FAST_LANE = SERVICE_LOOP = KEYSPACE = LANE_VIEW = HISTOGRAM = SYNC_GROUP = LEVELDB = MDID_INDEX = None
    UNAVAILABLE = f"nat_agent._fastpath cannot be imported: {error}"
else:
    FAST_LANE, SERVICE_LOOP = _fastpath.FastLane, _fastpath.ServiceLoop
    KEYSPACE, LANE_VIEW, HISTOGRAM = _fastpath.Keyspace, _fastpath.LaneView, _fastpath.Histogram
    SYNC_GROUP, LEVELDB, MDID_INDEX = _fastpath.SyncGroup, _fastpath.LevelDB, _fastpath.MdidIndex
    UNAVAILABLE = None


def command_parser(max_bulk: int, limit: ArgLimit | None, max_args: int = DEFAULT_MAX_ARGS) -> CommandParser:
    """A command parser for one connection: the compiled one, which a lane
    reads commands from directly, or without the extension its oracle,
    `resp_commands.CommandParser`, which has the same methods, limits,
    errors and messages (tests/unit/test_fastpath.py). Typed as the compiled one because only
    that one ever reaches a lane: there is no lane without the extension."""
    if UNAVAILABLE is None:
        return _fastpath.CommandParser(max_bulk=max_bulk, max_args=max_args, limit=limit)
    parser = resp_commands.CommandParser(max_bulk=max_bulk, max_args=max_args, limit=limit)
    return cast("CommandParser", parser)


def mdid_index(id_bytes: int, keys: Iterable[bytes]) -> MdidIndex:
    """The index of a store's records, of its record keys `keys` (whose
    mdids are `id_bytes` long): the compiled one, which the lane updates
    directly, or without the extension `SortedMdids`, its oracle with the
    same methods (tests/unit/test_mdid_index.py)."""
    if MDID_INDEX is not None:
        return MDID_INDEX(id_bytes, keys)
    return cast("MdidIndex", SortedMdids(id_bytes, keys))


def arg_limits(key: int, value: int, values_from: list[tuple[bytes, int]]) -> ArgLimit:
    """Per-argument limits: `value` bytes for the arguments of `values_from`'s
    commands from the index it gives on, `key` bytes for every other. The
    compiled `ArgLimits`, which the compiled parser reads without calling
    into Python, or the same rule in Python (tied by tests/unit/test_extension.py)."""
    if UNAVAILABLE is None:
        return _fastpath.ArgLimits(key, value, values_from)
    return python_arg_limits(key, value, values_from)


def python_arg_limits(key: int, value: int, values_from: list[tuple[bytes, int]]) -> ArgLimit:
    """`arg_limits` without the extension. Command names compare as
    `bytes.upper()` makes them equal (ASCII only), as the compiled one compares them."""
    first_value = {name.upper(): first for name, first in values_from}

    def limit(name: bytes, index: int) -> int:
        first = first_value.get(name.upper())
        return value if first is not None and index >= first else key
    return limit
