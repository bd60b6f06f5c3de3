"""os-ken's OpenFlow connection, with its end noticed at once under the native hub.

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
from typing import Any

from os_ken.controller import controller as os_ken_controller

log = logging.getLogger("metaflow.controller.ofconn")


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
