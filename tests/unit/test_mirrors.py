"""What the compiled path (`nat_agent/fastpath`) must hold as a literal of
its own, tied to the Python declaration it mirrors (ARCHITECTURE.md, "The
contracts, each defined once"). Everything else reaches Rust from Python
at construction; these are the few that cannot, and each test here reads
both sides and fails if they drift apart.
"""

from __future__ import annotations

import inspect
import re
from pathlib import Path

import nat_agent
from client_lib.resp import RespParser
from nat_agent._fastpath import CommandParser

SOURCES = Path(nat_agent.__file__).parent


def test_the_compiled_parser_defaults_are_the_python_ones() -> None:
    """`CommandParser()` is what a connection parses with (`Connection`,
    the replica's); its defaults are written out in `parser.rs`, and must be
    `RespParser`'s (`client_lib.resp.DEFAULT_MAX_*`)."""
    ours = inspect.signature(CommandParser).parameters
    theirs = inspect.signature(RespParser).parameters
    assert {name: p.default for name, p in ours.items()} == {name: p.default for name, p in theirs.items()}


def test_the_worker_threads_count_under_the_names_the_python_path_counts() -> None:
    """`server.rs` counts connections, refusals, reclaims, timeouts and
    dropped clients into the service's `stats` under names of its own
    writing; each must be a name the Python path counts the same event
    under, or the admin API's counters would split by path."""
    rust = set(re.findall(r'count\(py, "([a-z_]+)"\)', (SOURCES / "fastpath/src/server.rs").read_text()))
    python = {name for module in ("service.py", "connection.py")
              for name in re.findall(r'stats\["([a-z_]+)"\]', (SOURCES / module).read_text())}
    assert rust == {"connections", "refused_connections", "reclaimed_connections", "timeouts",
                    "dropped_connections"}
    assert rust <= python
