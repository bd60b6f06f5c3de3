"""The control plane, attacked from a client host of a running MetaFlow network.

Reproduced before: from a Mininet client host, an unauthenticated `/fail`,
fake heartbeats and a re-registration with a hijacked admin URL were all
accepted, and one forged ARP moved a server's location. Now every change
needs the cluster's signature (401 otherwise, and nothing changes), a name
stays bound to its server even for a caller holding the secret (409), and
ARP cannot move a located server.
"""

from __future__ import annotations

import json
import sys
import warnings

import pytest

from client_lib.api.rest import REST, Registration
from client_lib.errors import Conflict
from mininet_scenarios.daemons import ROOT
from mininet_scenarios.metaflow_net import MetaFlowNet
from topology import builders

warnings.filterwarnings("ignore", category=DeprecationWarning)

# Run inside a client host: unsigned HTTP calls, as an attacker without the secret would make them.
_UNSIGNED = """
import json, sys, urllib.request, urllib.error
base, calls = sys.argv[1], json.loads(sys.argv[2])
out = []
for method, path, body in calls:
    request = urllib.request.Request(base + path, data=json.dumps(body).encode(), method=method,
                                     headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            out.append(response.status)
    except urllib.error.HTTPError as err:
        out.append(err.code)
print(json.dumps(out))
"""

# Run inside a client host: a gratuitous ARP reply claiming a storage server's address and MAC.
_FORGED_ARP = """
import sys
from scapy.all import ARP, Ether, sendp
ip, mac, iface = sys.argv[1:4]
frame = (Ether(src=mac, dst="ff:ff:ff:ff:ff:ff")
         / ARP(op=2, psrc=ip, hwsrc=mac, pdst=ip, hwdst="ff:ff:ff:ff:ff:ff"))
sendp(frame, iface=iface, count=3, inter=0.2, verbose=False)
"""


@pytest.mark.timeout(300)
def test_a_client_host_cannot_change_the_control_plane(tmp_path):
    graph = builders.fat_tree(4, servers=8)
    with MetaFlowNet(graph, capacity=1_000_000, workdir=tmp_path) as mf:
        scenario = mf.scenario
        client = mf.hosts("client")[0]
        servers = mf.view(REST.servers).servers
        victim = next(n for n, s in servers.items() if s.state == "busy")
        base = f"http://{scenario.mgmt.root_ip}:{mf.rest_port}"
        reg = {"name": victim, "data_ip": servers[victim].data_ip, "data_mac": "02:00:00:00:00:66",
               "data_port": 9000, "admin_url": f"http://{scenario.mgmt_ips[client]}:9001",
               "store": "leveldb", "capacity": 1, "space": scenario.space, "owned": []}
        calls = [("POST", f"/metaflow/servers/{victim}/fail", {"reason": "attacker"}),
                 ("POST", f"/metaflow/agents/{victim}/heartbeat", {"keys": 0, "owned": [], "frozen": []}),
                 ("POST", "/metaflow/agents", reg),
                 ("POST", f"/metaflow/servers/{victim}/split", {}),
                 ("GET", "/metaflow/servers", None)]
        out = scenario.ns(client).run(sys.executable, "-c", _UNSIGNED, base, json.dumps(calls), cwd=ROOT)
        assert json.loads(out.stdout) == [401] * len(calls)

        after = mf.view(REST.servers).servers[victim]
        assert after.failed is None and after.admin_url == servers[victim].admin_url
        assert not [e for e in mf.events("takeover") if e["server"] == victim]

        # Even with the secret, a name cannot be taken over.
        hijack = Registration(victim, servers[victim].data_ip, "02:00:00:00:00:66", 9000,
                              f"http://{scenario.mgmt_ips[client]}:9001", "leveldb", 1,
                              mf.view(REST.tree).leaves[victim].blocks[0], [])
        with pytest.raises(Conflict):
            mf.api.call(REST.register, hijack)

        # One forged ARP (three, in fact) from the client's port claims the server's address and MAC.
        before = {h.ip: h for h in mf.view(REST.topology).hosts}
        data_ip = servers[victim].data_ip
        victim_mac = before[data_ip].mac
        iface = scenario.host(client).defaultIntf().name
        scenario.ns(client).run(sys.executable, "-c", _FORGED_ARP, data_ip, victim_mac, iface, cwd=ROOT)
        mf.announce()
        located = {h.ip: h for h in mf.view(REST.topology).hosts}[data_ip]
        assert (located.dpid, located.port) == (before[data_ip].dpid, before[data_ip].port)
        assert any(e["ip"] == data_ip for e in mf.events("arp-refused"))
        results = mf.run_clients(100, tmp_path)
        assert all(r["errors"] == 0 and r["read_back"] == 100 for r in results), results
