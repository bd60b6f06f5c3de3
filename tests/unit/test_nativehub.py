"""os-ken's app event loop under the native hub: a handler's exception ends
the app's event thread (and with it, once its queue is full, every switch
connection that has an event for it); `HandlerFailuresLogged` logs it and
goes on (`controller.nativehub`)."""

from __future__ import annotations

import logging
import threading

import pytest
from os_ken.base import app_manager
from os_ken.controller import event

from controller.nativehub import HandlerFailuresLogged


class Ping(event.EventBase):
    def __init__(self, n: int) -> None:
        super().__init__()
        self.n = n


class Plain(app_manager.OSKenApp):
    """os-ken's own loop."""


class Kept(HandlerFailuresLogged, app_manager.OSKenApp):
    """Ours."""


def run(cls: type[app_manager.OSKenApp]) -> tuple[list[int], bool]:
    """Three events to an app whose handler fails on the first: those
    handled, and whether its event thread was still running after them."""
    app = cls()
    handled: list[int] = []
    done = threading.Event()

    def handler(ev: Ping) -> None:
        if ev.n == 0:
            raise KeyError("a race in a handler")
        handled.append(ev.n)
        if ev.n == 2:
            done.set()

    app.register_handler(Ping, handler)
    app.start()
    thread = app.threads[0]
    for n in range(3):
        app._send_event(Ping(n), None)
    thread.join(0.2)
    if thread.is_alive():
        done.wait(5)
    alive = thread.is_alive()
    if alive:
        app.stop()   # (its stop event ends the loop)
    return handled, alive


def test_os_kens_own_loop_ends_at_a_handlers_exception_under_the_native_hub() -> None:
    handled, alive = run(Plain)
    assert handled == [] and not alive


def test_a_handlers_exception_is_logged_and_the_next_events_handled(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.ERROR, logger="metaflow.controller.nativehub"):
        handled, alive = run(Kept)
    assert handled == [1, 2] and alive
    assert "handler failed on Ping" in caplog.text and "a race in a handler" in caplog.text
