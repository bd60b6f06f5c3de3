"""The whole agent on a real data path: 5,000 round trips to MetaDataIDs.

A client namespace routes the MetaDataID space to a server namespace (as the
switches would deliver it); the server runs the real daemon with the kernel
or the NFQUEUE rewrite. Every reply must come back from the MetaDataID the
client addressed (checked on the wire by a packet capture in the client
namespace), and after SIGTERM no rule with the agent's tag may remain (in
``local`` mode, no policy rule or route of its table either).
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from client_lib.api.admin import ADMIN
from client_lib.cidr import Block
from mininet_scenarios.daemons import ROOT, AgentProcess
from mininet_scenarios.netns_pair import NetnsPair
from nat_agent.anyip_plan import anyip_plan

ROUND_TRIPS = 5_000


def _ours(net: NetnsPair, tag: str) -> list[str]:
    """Our iptables rules, policy rules and routes (``local`` mode's) in the server."""
    saved = net.server.run("iptables-save").stdout
    found = [line for line in saved.splitlines() if f'"{tag}"' in line or f" {tag} " in line]
    plan = anyip_plan(Block.parse(net.space), net.server_if, 9000, tag)
    found += [line for line in net.server.run("ip", "rule", "show").stdout.splitlines()
              if line.split(":")[0] in (str(plan.pref), str(plan.pref + 1))]
    routes = net.server.run("ip", "route", "show", "table", str(plan.table), check=False)
    return found + routes.stdout.splitlines()


@pytest.mark.timeout(600)
@pytest.mark.parametrize("mode", ["local", "kernel", "nfqueue"])
def test_five_thousand_round_trips_through_the_rewrite(mode, tmp_path):
    with NetnsPair(prefix="mfag") as net:
        agent = AgentProcess(f"leveldb:{tmp_path / 'db'}", own=[net.space], rewrite=mode,
                             host="0.0.0.0", port=9000, netns=net.server,
                             log_path=tmp_path / "agent.log")
        agent.argv += ["--data-ip", net.server_ip]
        with agent:
            tag = f"metaflow-agent:{agent.name}"
            assert _ours(net, tag), "the agent installed no rules"
            out = net.client.run(sys.executable, "-m", "benchmarks.agent_load", "--ops", str(ROUND_TRIPS),
                                 "--workload", "cycle", "--audit", net.client_if, "--space", net.space,
                                 cwd=ROOT, timeout=500, check=False)
            assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
            report = json.loads(out.stdout)
            stats = agent.call(ADMIN.stats)  # from inside the namespace
        assert report["ops"] >= ROUND_TRIPS and report["wrong_count"] == 0, report
        assert report["client"]["retries"] == 0, report
        audit = report["audit"]
        # Every reply leaves from the mdid asked, also when the client opened
        # a connection from a port it still held to another mdid (the flow
        # table gives that one another port on the server's side).
        assert audit["replies_from_elsewhere"] == 0, audit
        assert audit["replies_from_mdid"] >= ROUND_TRIPS  # at least one packet per reply
        # Different IDs really were used: one connection per MetaDataID.
        assert report["client"]["connects"] > ROUND_TRIPS // 3 * 0.9
        if mode == "nfqueue":
            assert stats.rewrite["rewritten"] >= 2 * ROUND_TRIPS
        assert stats.service["cmd_set"] == ROUND_TRIPS // 3 + (ROUND_TRIPS % 3 > 0)
        # SIGTERM (in AgentProcess.__exit__) removed exactly our rules.
        assert _ours(net, tag) == []
        names = net.names()
    listed = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    assert not any(name in listed for name in names)


@pytest.mark.parametrize("mode", ["local", "kernel"])
def test_stale_rules_of_a_crashed_agent_are_replaced(mode, tmp_path):
    with NetnsPair(prefix="mfag") as net:
        def agent() -> AgentProcess:
            proc = AgentProcess(f"leveldb:{tmp_path / 'db'}", own=[net.space], rewrite=mode,
                                host="0.0.0.0", port=9000, netns=net.server, name="crashy",
                                log_path=tmp_path / "agent.log")
            proc.argv += ["--data-ip", net.server_ip]
            return proc
        first = agent().start()
        installed = _ours(net, "metaflow-agent:crashy")
        assert len(installed) == {"local": 5, "kernel": 2}[mode]  # local: 2 NOTRACK, 2 rules, 1 route
        first.kill()  # SIGKILL: no chance to clean up
        assert _ours(net, "metaflow-agent:crashy") == installed
        with agent():
            assert _ours(net, "metaflow-agent:crashy") == installed  # replaced, not doubled
            out = net.client.run(sys.executable, "-m", "benchmarks.agent_load", "--ops", "30",
                                 "--space", net.space, cwd=ROOT, check=False)
            assert out.returncode == 0, out.stdout + out.stderr
        assert _ours(net, "metaflow-agent:crashy") == []
