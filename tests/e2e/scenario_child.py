"""A scenario in its own process, for the SIGTERM test in test_mininet_scenario.py.

Brings up a loop-free standalone fabric with Redis-backed agents, prints one
JSON line (prefix, namespace inodes, the agents' store kinds) and waits to be
signalled. Exit 0 means the teardown ran to the end without a failure.
"""

from __future__ import annotations

import json
import sys
import time

from client_lib.api.admin import ADMIN
from mininet_scenarios.scenario import Scenario
from topology import builders


def main() -> int:
    graph = builders.two_tier(core=1, edges=1, servers_per_edge=2, clients_per_edge=1)
    try:
        with Scenario(graph, controller=None, fail_mode="standalone", store="redis") as sc:
            stores = [agent.call(ADMIN.health).store for agent in sc.agents.values()]
            print(json.dumps({"prefix": sc.prefix, "inodes": sc.netns_inodes, "stores": stores}), flush=True)
            while True:
                time.sleep(1)
    except KeyboardInterrupt:
        return 0


if __name__ == "__main__":
    sys.exit(main())
