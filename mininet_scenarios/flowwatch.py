"""Whether a takeover removed a MetaFlow flow entry: the bridges' tables
polled in a thread the whole time and compared with what they held at the
start (`FlowWatch`). The takeover test and the nemesis's ``kill-leader``
rounds use it.
"""

from __future__ import annotations

import re
import threading

from client_lib.constants import COOKIE_BASE, COOKIE_METAFLOW, COOKIE_ROUTE
from mininet_scenarios.metaflow_net import MetaFlowNet

_COUNTERS = re.compile(r"(duration|n_packets|n_bytes|idle_age|hard_age)=[^,]*, ?")
_OURS = {f"cookie={hex(c)}," for c in (COOKIE_BASE, COOKIE_METAFLOW, COOKIE_ROUTE)}


def entries(mf: MetaFlowNet) -> set[tuple[str, str]]:
    """Every MetaFlow entry on every bridge, without its counters."""
    out = set()
    for node, data in mf.graph.nodes(data=True):
        if data.get("kind") == "switch":
            out |= {(node, _COUNTERS.sub("", line.strip())) for line in mf.dump_flows(node).splitlines()
                    if any(c in line for c in _OURS)}
    return out


class FlowWatch:
    """Polls the bridges in a thread; `removed` is every entry of the first
    poll that some later poll lacked."""

    def __init__(self, mf: MetaFlowNet) -> None:
        self.mf, self.first = mf, entries(mf)
        self.removed: set[tuple[str, str]] = set()
        self.polls = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            self.removed |= self.first - entries(self.mf)
            self.polls += 1

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(10)

    def __enter__(self) -> FlowWatch:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
