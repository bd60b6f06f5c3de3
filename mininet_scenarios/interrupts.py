"""Signals around a scenario: stop cleanly on SIGTERM, finish a teardown once begun.

A scenario holds OVS bridges, veths and processes that outlive this Python
process if it dies without tearing down. Ctrl-C already raises
KeyboardInterrupt, which ``finally`` blocks handle; SIGTERM (``kill``, a CI
timeout) would end the process on the spot, so while a scenario is up it
raises KeyboardInterrupt too. During the teardown itself both signals are
held back and reported once it is done, so a second Ctrl-C cannot leave
half a network behind.

Python only delivers signals to the main thread, so elsewhere both helpers
do nothing (and a SIGTERM kills the process as usual).
"""

from __future__ import annotations

import signal
import threading
from types import FrameType

_HELD = (signal.SIGINT, signal.SIGTERM)


def _in_main_thread() -> bool:
    return threading.current_thread() is threading.main_thread()


class SigtermAsInterrupt:
    """While entered, SIGTERM raises KeyboardInterrupt like Ctrl-C."""

    def __enter__(self) -> SigtermAsInterrupt:
        self._previous = signal.signal(signal.SIGTERM, _raise_interrupt) if _in_main_thread() else None
        return self

    def __exit__(self, *exc: object) -> None:
        if self._previous is not None:
            signal.signal(signal.SIGTERM, self._previous)


class SignalsHeld:
    """While entered, SIGINT and SIGTERM are only recorded in `received`; on
    exit the previous handlers come back. The caller decides what to raise
    once its cleanup is complete."""

    def __enter__(self) -> SignalsHeld:
        self.received: list[int] = []
        self._previous = {sig: signal.signal(sig, self._record) for sig in _HELD} if _in_main_thread() else {}
        return self

    def __exit__(self, *exc: object) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)

    def _record(self, signum: int, frame: FrameType | None) -> None:
        self.received.append(signum)


def _raise_interrupt(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt(f"signal {signum}")
