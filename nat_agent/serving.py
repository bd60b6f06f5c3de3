"""What the agent-side daemons (`metaflow-agent`, `metaflow-site-sync`) do
around their event loop: log to stderr in one format (systemd's journal
adds the rest), run the loop, and turn a failure to start (an address in
use, a store that will not open) into one logged line and exit code 1
rather than a traceback."""

from __future__ import annotations

import asyncio
import logging
import sys
from collections.abc import Callable, Coroutine
from typing import Any

LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"

Runner = Callable[[Coroutine[Any, Any, None]], None]


def serve(main: Coroutine[Any, Any, None], level: str, log: logging.Logger,
          runner: Runner = asyncio.run) -> int:
    """Run `main` to its end with `runner`; the process's exit code."""
    logging.basicConfig(level=level, stream=sys.stderr, format=LOG_FORMAT)
    try:
        runner(main)
    except (OSError, ValueError) as exc:
        log.error("cannot run: %s", exc)
        return 1
    return 0
