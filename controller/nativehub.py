"""What os-ken's native hub (threads, ours: no eventlet) gets wrong, made right.

**An app's event loop that ends at its handler's first exception.** os-ken
runs each app's queued handlers (`set_ev_cls`) on one thread per app, and
its loop re-raises `hub.TaskExit` to end that thread. Under eventlet that is
`GreenletExit`; under the native hub it is `Exception`, so *any* exception a
handler raised ended the app's event thread, without a word. The app's queue
(128 events) then filled, and every connection's receiving thread that had
an event for it blocked for good: no echo was answered, no barrier reply
read, no new switch finished its handshake. At k=32 with two controllers, a
controller held 1,543 receiving threads blocked this way (its SIGUSR1
account, `controller.threads`), the runs' "connections that stopped carrying
anything". `HandlerFailuresLogged` keeps the loop going and logs the
failure with its traceback.

**A switch that hung up, reported only at the next message sent to it.**
os-ken serves each switch connection with a receiving thread and a sending
thread (`Datapath.serve`). When the switch hangs up, the receiving loop ends
and `serve` joins the sending thread before the connection is reported dead
(`DEAD_DISPATCHER`, our `SwitchDown`). Under eventlet `hub.kill` ends that
thread; under the native hub (ours) `hub.kill` does nothing, and the thread
sleeps on its queue until something is sent to that switch. So a switch
that hung up stayed connected to the controller until its next message: an
LLDP frame once a round (about 100 s at k=32), or never for a switch with no
ports (`tests/integration/test_switch_disconnect.py`). At k=32 with two
controllers, hundreds of connections an emulated switch had dropped were
never reported in a run.

`Connection` wakes the sending thread when the receiving loop ends: the
socket is closed by then, so the thread's next send fails or sees the
close request, and it ends; `serve` returns and os-ken reports the end.
"""

from __future__ import annotations

import contextlib
import logging
import socket
from collections.abc import Callable
from typing import Any

from os_ken.controller import controller as os_ken_controller

log = logging.getLogger("metaflow.controller.nativehub")


class HandlerFailuresLogged:
    """Mixin for an os-ken app (before `OSKenApp` in its bases): a handler
    that raises is logged, and the app's next event is handled (module doc).
    The loop ends as os-ken's does: once the app stops and its queue is empty."""

    name: str
    is_active: bool
    events: Any
    _events_sem: Any
    _event_stop: Any
    get_handlers: Callable[..., list[Callable[[Any], None]]]

    def _event_loop(self) -> None:
        while self.is_active or not self.events.empty():
            event, state = self.events.get()
            self._events_sem.release()
            if event is self._event_stop:
                continue
            for handler in self.get_handlers(event, state):
                try:
                    handler(event)
                except Exception:
                    log.exception("%s: %s failed on %s; its next events are handled", self.name,
                                  getattr(handler, "__name__", handler), type(event).__name__)


class Connection(os_ken_controller.Datapath):
    """os-ken's `Datapath`, whose sending thread ends with its receiving loop."""

    def _recv_loop(self) -> None:
        try:
            super()._recv_loop()   # (os-ken's closes the socket as it ends)
        finally:
            # Never blocks for long: a full queue drains as soon as the
            # sending thread's write fails on the closed socket.
            self.send(b"", close_socket=True)


def serve(sock: socket.socket, address: Any) -> None:
    """One switch connection, served as os-ken's own factory serves it, as a `Connection`."""
    with contextlib.closing(Connection(sock, address)) as connection:
        try:
            connection.serve()
        except Exception:   # a malformed message from the switch: its connection ends
            log.exception("switch %s at %s: its connection failed", connection.id, address)
            raise


def install() -> None:
    """Make os-ken serve every switch connection with `serve`: its OpenFlow
    server looks the factory up in its module when it starts listening, so
    this runs before the apps start. (Replacing `Datapath` there instead
    would break os-ken's `super(Datapath, self)`.)"""
    os_ken_controller.datapath_connection_factory = serve
