"""How many real Open vSwitch bridges this machine holds (issue 26: "Open
vSwitch bridges for as many as fit, measured").

For each fat-tree arity k, the topology's switches and their links (no
hosts) become Open vSwitch bridges in the userspace datapath, OpenFlow 1.0,
fail mode secure, wired by veth pairs on the topology's port numbers
(Mininet, as every scenario here builds them), all connected to one real
`metaflow-controller`, which discovers the links by LLDP. Measured: the
time to build the bridges, until the controller sees every switch and
every link, then over an idle window ovs-vswitchd's CPU and resident
memory (less what it used before the bridges existed: the daemon is the
machine's) and the controller's CPU. A size whose switches or links are
not all seen within `--timeout` is reported with what was reached, and
the sizes after it are not tried.

    python -m benchmarks.ovs_fit [--k 4 8 16] [--idle 20] [--out benchmarks/results]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

from mininet.link import OVSLink
from mininet.net import Mininet
from mininet.node import Host, OVSSwitch, RemoteController

from benchmarks.cpu import cpu_seconds
from benchmarks.scale import Controller
from client_lib.api.clients import ApiClient
from client_lib.api.rest import REST
from client_lib.errors import ApiError
from mininet_scenarios.leaks import sweep, unique_prefix
from mininet_scenarios.scenario import stop_mininet
from mininet_scenarios.topos import GraphTopo
from topology import builders

OVS_PID_FILE = Path("/var/run/openvswitch/ovs-vswitchd.pid")


def ovs_pid() -> int:
    return int(OVS_PID_FILE.read_text().strip())


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError(f"process {pid} has no VmRSS")


def cpu_pct(pids: list[int], seconds: float) -> list[float]:
    """Each process's CPU over the next `seconds`, in % of one core."""
    before = [cpu_seconds(p) for p in pids]
    time.sleep(seconds)
    return [round(100 * (cpu_seconds(p) - b) / seconds, 1) for p, b in zip(pids, before, strict=True)]


def wait_for(what: str, check: Callable[[], bool], timeout: float) -> float:
    """Seconds until `check` holds; TimeoutError naming `what`."""
    start = time.monotonic()
    while True:
        try:
            if check():
                return round(time.monotonic() - start, 2)
        except ApiError:
            pass
        if time.monotonic() - start > timeout:
            raise TimeoutError(f"{what}: not within {timeout:g} s")
        time.sleep(0.5)


def switch_fabric(k: int) -> Any:
    """The k=`k` fat-tree's switches and links, its hosts left out."""
    graph = builders.fat_tree(k)
    graph.remove_nodes_from(list(builders.hosts(graph)))
    return graph


def measure(k: int, idle_s: float, timeout: float, workdir: Path) -> dict[str, Any]:
    graph = switch_fabric(k)
    n_switches, n_links = graph.number_of_nodes(), graph.number_of_edges()
    out: dict[str, Any] = {"k": k, "switches": n_switches, "links": n_links, "ovs_ports": 2 * n_links,
                           "load_before": os.getloadavg()}
    ovs = ovs_pid()
    out["ovs_idle_cpu_pct_before"], = cpu_pct([ovs], idle_s)
    out["ovs_rss_mb_before"] = round(rss_mb(ovs), 1)
    controller = Controller(workdir, ["--settle", "1", "--log-level", "WARNING"], name=f"controller-k{k}")
    controller.start()
    api = ApiClient(controller.url, controller.secret, timeout=30.0)
    # `unique_prefix` less its "mf", led by "o": 5 characters, so that k=16's
    # names ("<prefix>s320-eth16") fit Linux's 15, still this process's own.
    prefix = "o" + unique_prefix()[2:]
    switch = partial(OVSSwitch, datapath="user", protocols="OpenFlow10", failMode="secure")
    net = Mininet(topo=GraphTopo(graph, prefix=prefix), switch=switch, host=Host, link=OVSLink,
                  controller=None, build=False, autoSetMacs=False, autoStaticArp=False, cleanup=False)
    net.addController(f"{prefix}c", controller=RemoteController, ip="127.0.0.1", port=controller.of_port)
    try:
        wait_for("the controller's REST", lambda: bool(api.call(REST.leadership)), 30)
        started = time.monotonic()
        net.build()
        net.start()
        out["bridges_built_s"] = round(time.monotonic() - started, 2)
        out["switches_connected_s"] = wait_for(
            "every switch connected", lambda: len(api.call(REST.topology).switches) == n_switches, timeout)
        out["links_found_s"] = wait_for(
            "every link found by LLDP", lambda: len(api.call(REST.topology).links) == n_links, timeout)
        out["ovs_idle_cpu_pct"], out["controller_idle_cpu_pct"] = cpu_pct([ovs, controller.pid], idle_s)
        out["ovs_rss_mb"] = round(rss_mb(ovs), 1)
    except (TimeoutError, ApiError) as exc:
        out["error"] = str(exc)
        try:
            topo = api.call(REST.topology)
            out["reached"] = {"switches": len(topo.switches), "links": len(topo.links)}
        except ApiError:
            pass
    finally:
        stop_mininet(net)
        controller.stop()
        out["left_behind"] = sweep(prefix)   # what the teardown missed (nothing, normally)
    out["load_after"] = os.getloadavg()
    return out


def plot(results: list[dict[str, Any]], path: Path) -> None:
    """ovs-vswitchd's and the controller's idle CPU against the bridges' ports."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    done = [r for r in results if "error" not in r]
    ports = [r["ovs_ports"] for r in done]
    fig, ax = plt.subplots(figsize=(6, 4))
    ax.plot(ports, [r["ovs_idle_cpu_pct"] for r in done], "o-", label="ovs-vswitchd")
    ax.plot(ports, [r["controller_idle_cpu_pct"] for r in done], "s-", label="controller")
    for r in done:
        ax.annotate(f"k={r['k']}: {r['switches']} bridges", (r["ovs_ports"], r["ovs_idle_cpu_pct"]),
                    textcoords="offset points", xytext=(-60, 8), fontsize=8)
    ax.set(title="idle CPU of real OVS fat-trees (userspace datapath)", xlabel="bridge ports",
           ylabel="% of one core")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--k", type=int, nargs="+", default=[4, 8, 16], help="fat-tree arities, in order")
    p.add_argument("--idle", type=float, default=20.0, help="seconds of each idle CPU window")
    p.add_argument("--timeout", type=float, default=300.0,
                   help="seconds a size may take to be seen whole by the controller")
    p.add_argument("--out", type=Path, default=Path("benchmarks/results"))
    args = p.parse_args(argv)
    if os.geteuid() != 0:
        print("ovs_fit needs root (Mininet, Open vSwitch)", file=sys.stderr)
        return 2
    results = []
    with tempfile.TemporaryDirectory(prefix="mf-ovsfit-") as tmp:
        for k in args.k:
            print(f"k={k} ...", flush=True)
            result = measure(k, args.idle, args.timeout, Path(tmp))
            print(json.dumps(result), flush=True)
            results.append(result)
            if "error" in result:
                break
    args.out.mkdir(parents=True, exist_ok=True)
    record = {"command": " ".join(["python -m benchmarks.ovs_fit", *(argv or sys.argv[1:])]),
              "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "results": results}
    (args.out / "ovs_fit.json").write_text(json.dumps(record, indent=1) + "\n")
    plot(results, args.out / "ovs_fit.png")
    return 0


if __name__ == "__main__":
    sys.exit(main())
