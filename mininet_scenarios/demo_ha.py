"""`make demo-ha`: hybrid mode with two controllers on etcd, the leader killed mid-run.

1. A loop-free three-tier tree of Open vSwitch bridges (fail-mode secure,
   both controllers as targets of each) forwards on its own (an operator's
   ``priority=0,actions=NORMAL``) before any controller runs; pings work.
2. etcd and two `metaflow-controller --mode hybrid --etcd ...` start: one
   leads, the other is a standby; the leader installs only MetaFlow's own
   entries. Clients write and read files through them.
3. While the clients write, the leader is killed with kill -9 and, right
   after it, a storage server holding primaries. The standby takes over
   (role MASTER on every bridge), reads the tables back and changes nothing
   that is still right, and fails the dead server over (its backups
   promoted).
4. Every acknowledged write is checked, every pair of hosts pings, and the
   bridges held their MetaFlow entries throughout but for the fail-over's.

Prints the timeline of the takeover; leaves nothing behind.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

from client_lib.api.rest import REST
from mininet_scenarios.demo import _say
from mininet_scenarios.metaflow_net import MetaFlowNet
from mininet_scenarios.mgmt import SUBNET_HELP
from topology import builders

GRAPH = builders.three_tier(core=1, agg=2, edges=4, servers_per_edge=2, edge_uplinks=1, clients_per_edge=1)
OPERATOR_NORMAL = "priority=0,actions=NORMAL"
DECIDED = ("promoted-at-rebuild", "server-failed")


def run(args: argparse.Namespace, workdir: Path) -> int:
    started = time.monotonic()
    _say("MetaFlow HA demo: hybrid mode, a three-tier tree of 7 bridges, 8 storage servers, 4 clients, "
         "two controllers on one etcd")
    with MetaFlowNet(GRAPH, workdir=workdir, mgmt_subnet=args.mgmt_subnet, mode="hybrid",
                     operator_flows=[OPERATOR_NORMAL], controller_later=True, controllers=2,
                     build_timeout=120) as mf:
        net = mf.running.net
        assert net is not None
        _say(f"fabric up, forwarding on its own: ping loss {net.pingAll(timeout=2):.0f} %")
        took = mf.start_controller()
        lead = mf.leader()
        view = mf.view(REST.leadership)
        _say(f"controllers up and the network built in {took:.1f} s: controller {lead} leads "
             f"(term {view.term}), controller {1 - lead} is a standby")
        mf.standby(1 - lead)
        phase1 = mf.run_clients(args.files, workdir)
        _say(f"phase 1: {sum(r['written'] for r in phase1)} files written and read back")

        servers = mf.view(REST.servers).servers
        victim = next(n for n, s in sorted(servers.items()) if s.blocks and not s.failed)
        clients = mf.start_clients(args.files, workdir, start=args.files, read_back=False, concurrency=2)
        time.sleep(1.0)
        killed_at = time.monotonic()
        mf.kill_leader()
        mf.kill_agent(victim)
        _say(f"\nphase 2: kill -9 of the leader (controller {lead}) and of storage server {victim} "
             f"(primary of {', '.join(map(str, servers[victim].blocks))}) while clients write")
        new = mf.leader()
        elected = time.monotonic() - killed_at
        events = _wait_events(mf, killed_at, ("network-built",), 60)
        for event in events:
            if event["event"] in ("leader-elected", "network-built", *DECIDED):
                detail = {k: v for k, v in event.items() if k not in ("t", "event")}
                _say(f"  +{event['t'] - killed_at:5.2f} s  {event['event']} {detail}")
        decided = next((e["t"] - killed_at for e in events if e["event"] in DECIDED), None)
        phase2 = mf.collect(clients)
        _say(f"  controller {new} leads after {elected:.2f} s; fail-over decided "
             + (f"{decided:.2f} s after the leader's death" if decided is not None else "(not seen)"))

        _say("\nphase 3: checking every acknowledged write, and the fabric")
        check = mf.verify_acked(workdir, [])
        loss = net.pingAll(timeout=2)
        rows = [("files written (phase 1 + 2)", sum(r["written"] for r in phase1 + phase2)),
                ("acknowledged writes", check["acked"]),
                ("  missing or wrong (must be 0)", check["missing"] + check["wrong"]),
                ("ping loss after the takeover (must be 0)", f"{loss:.0f} %"),
                ("leader killed -> new leader", f"{elected:.2f} s"),
                ("leader killed -> fail-over decided (target 3 s)",
                 f"{decided:.2f} s" if decided is not None else "none")]
        for name, value in rows:
            _say(f"  {name:52s} {value}")
    _say(f"\ndone in {round(time.monotonic() - started, 1)} s; everything torn down")
    return 0 if check["missing"] + check["wrong"] == 0 and loss == 0 and decided is not None else 1


def _wait_events(mf: MetaFlowNet, since: float, until: tuple[str, ...], timeout: float) -> list[dict]:
    """The leader's events since `since`, once one of `until` is among them."""
    deadline = time.monotonic() + timeout
    while True:
        events = [e for e in mf.events() if e["t"] >= since]
        if any(e["event"] in until for e in events) or time.monotonic() > deadline:
            return events
        time.sleep(0.2)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--files", type=int, default=200, help="files each client writes per phase")
    p.add_argument("--mgmt-subnet", default=None, help=SUBNET_HELP)
    args = p.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="mfdemoha") as workdir:
        return run(args, Path(workdir))


if __name__ == "__main__":
    sys.exit(main())
