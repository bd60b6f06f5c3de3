"""What SIGHUP does, the same in every daemon: re-read, apply what is safe, say the rest.

Each daemon has a ``reload(new)`` that compares the settings it runs with
against `new` (`compare`), applies those of its `live` settings that changed
and returns the `Outcome`: what it applied, and what changed but takes a
restart to apply. `Reloader` is the SIGHUP handler around it: it re-reads the
settings (`reread`: the daemon's configuration file over its command line),
tells systemd a reload is under way (`client_lib.sdnotify`), and logs the
outcome. A re-read that fails (a file that no longer parses, a value out of
range) changes nothing: the running settings stay, and the log says why.
A daemon started without a file has nothing to re-read (its command line
cannot change), which the log says too.

Standard library only, like the rest of the client library: all three
daemons import it.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass, field
from typing import Generic, TypeVar

from client_lib import sdnotify
from client_lib.errors import InvalidArgument

T = TypeVar("T")

LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR")
"""The log levels a daemon's ``--log-level`` takes."""


@dataclass(frozen=True)
class Outcome:
    """What one reload did."""

    applied: dict[str, tuple[object, object]] = field(default_factory=dict)
    """Settings now in force: name -> (old value, new value)."""
    restart: list[str] = field(default_factory=list)
    """Settings that changed but keep their old value until a restart."""

    def report(self, log: logging.Logger) -> None:
        """Say, at the level an operator sees, what the reload did. Values are
        shown only for what was applied: a setting that needs a restart may be
        a secret, and its name is what the operator needs."""
        if not self.applied and not self.restart:
            log.info("reload: the settings are unchanged; nothing to apply")
            return
        if self.applied:
            log.info("reload: applied %s", ", ".join(f"{name} {old!r} -> {new!r}"
                                                       for name, (old, new) in self.applied.items()))
        if self.restart:
            log.warning("reload: changed but only applied by a restart (the running values stay): %s",
                        ", ".join(self.restart))


def compare(old: Mapping[str, object], new: Mapping[str, object], live: Collection[str]) -> Outcome:
    """Which settings changed between `old` and `new`, split into those of
    `live` (the daemon can apply them as it runs) and the others. A name in
    only one of the two counts as changed."""
    applied: dict[str, tuple[object, object]] = {}
    restart: list[str] = []
    missing = object()
    for name in sorted(old.keys() | new.keys()):
        before, after = old.get(name, missing), new.get(name, missing)
        if before == after:
            continue
        if name in live and before is not missing and after is not missing:
            applied[name] = (before, after)
        else:
            restart.append(name)
    return Outcome(applied, restart)


def set_log_level(level: str, *quieter: str) -> None:
    """The root logger's level; the loggers named in `quieter` (chatty
    libraries) at it too, but never below WARNING."""
    logging.getLogger().setLevel(level)
    for name in quieter:
        logging.getLogger(name).setLevel(max(logging.WARNING, logging.getLevelName(level)))


class Reloader(Generic[T]):
    """A daemon's SIGHUP handler: `reread` gives the settings anew (None: the
    daemon has no file to re-read), `apply` is the daemon's ``reload``.
    Called from the daemon's own loop, never from inside a signal handler:
    it logs and may wait for the daemon's threads."""

    def __init__(self, log: logging.Logger, reread: Callable[[], T] | None,
                 apply: Callable[[T], Outcome]) -> None:
        self.log = log
        self.reread = reread
        self.apply = apply

    def __call__(self) -> Outcome | None:
        """Reload; the outcome, or None when nothing was re-read or the
        re-read settings were refused (the running ones stay)."""
        if self.reread is None:
            self.log.info("SIGHUP: started without a configuration file, so there is nothing to re-read "
                          "(the command line cannot change); the running settings stay")
            return None
        sdnotify.reloading("reloading the configuration")
        try:
            outcome = self.apply(self.reread())
        except (InvalidArgument, OSError, ValueError) as exc:
            self.log.error("SIGHUP: reload refused, the running settings stay: %s", exc)
            return None
        finally:
            sdnotify.ready("serving")
        outcome.report(self.log)
        return outcome
