"""The least an OpenFlow controller does: os-ken's handshake handler and nothing else.

Switches in fail_mode "secure" connect to it and then forward nothing, since
it installs no flows. test_mininet_scenario.py uses it to check the
scenario's secure-mode path (remote controller, connection wait, the
start_controller hook) without depending on MetaFlow's own controller.

    python openflow_endpoint.py PORT     # listens on 127.0.0.1:PORT until SIGTERM
"""

from __future__ import annotations

import os
import signal
import sys

from os_ken import cfg
from os_ken.base import app_manager


def main() -> None:
    # Nothing to save: leave at once (os-ken's own shutdown path raises on this version).
    signal.signal(signal.SIGTERM, lambda *_: os._exit(0))
    cfg.CONF(args=["--ofp-tcp-listen-port", sys.argv[1], "--ofp-listen-host", "127.0.0.1"], project="os_ken")
    app_manager.AppManager.run_apps(["os_ken.controller.ofp_handler"])


if __name__ == "__main__":
    main()
