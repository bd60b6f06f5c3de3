"""What polling flow counters costs (issue 14, part 1): the switch and the controller.

One Open vSwitch bridge (userspace datapath, named ``mflp<pid>``) holds N
MetaFlow prefixes as the controller writes them (two entries each, tcp and
udp, our cookie). This client speaks OpenFlow 1.0 to the bridge's management
socket, as the controller does over TCP: a flow-stats request, the
multi-part reply read back, parsed by os-ken's parser, turned into counts
(`controller.ofmsgs.entry_counts`) and fed to the `LoadMeter`. Per poll it
reports ovs-vswitchd's CPU (from /proc, less its idle rate measured just
before) and ours, split into os-ken's parse and our own work.

    python -m benchmarks.load_poll [--prefixes 205,960] [--polls 200]
"""

from __future__ import annotations

import argparse
import ipaddress
import json
import os
import socket
import struct
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from os_ken.ofproto import ofproto_parser, ofproto_v1_0, ofproto_v1_0_parser

from benchmarks.cpu import cpu_seconds
from client_lib.cidr import Block
from client_lib.constants import COOKIE_METAFLOW, METAFLOW_BASE_PRIORITY, METAFLOW_PORT
from controller import ofmsgs
from controller.load import LoadMeter

HEADER = struct.Struct("!BBHI")


class _Datapath:
    """What os-ken's parser needs of a datapath."""

    ofproto = ofproto_v1_0
    ofproto_parser = ofproto_v1_0_parser
    id = 1


def _prefixes(count: int) -> list[Block]:
    space = Block.parse("100.64.0.0/10")
    plen = space.plen + max(1, (count - 1).bit_length())
    return [Block(space.first + i * (1 << (32 - plen)), plen) for i in range(count)]


def _flows(prefixes: list[Block]) -> str:
    lines = []
    for i, block in enumerate(prefixes):
        for proto in ("tcp", "udp"):
            lines.append(f"cookie={COOKIE_METAFLOW:#x},priority={METAFLOW_BASE_PRIORITY + block.plen},"
                         f"{proto},nw_dst={ipaddress.IPv4Address(block.first)}/{block.plen},"
                         f"tp_dst={METAFLOW_PORT},actions=output:{1 + i % 16}")
    return "\n".join(lines) + "\n"


class OpenFlowClient:
    """OpenFlow 1.0 over a bridge's management socket: hello, then flow stats."""

    def __init__(self, path: str) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.connect(path)
        self.xid = 0
        self._send(ofproto_v1_0.OFPT_HELLO, b"")
        self._read()   # the switch's hello

    def _send(self, msg_type: int, body: bytes) -> None:
        self.xid += 1
        self.sock.sendall(HEADER.pack(ofproto_v1_0.OFP_VERSION, msg_type, HEADER.size + len(body), self.xid)
                          + body)

    def _read(self) -> tuple[int, int, bytes]:
        header = self._exactly(HEADER.size)
        version, msg_type, length, xid = HEADER.unpack(header)
        return msg_type, xid, header + self._exactly(length - HEADER.size)

    def _exactly(self, n: int) -> bytes:
        out = b""
        while len(out) < n:
            chunk = self.sock.recv(n - len(out))
            if not chunk:
                raise ConnectionError("the switch closed the connection")
            out += chunk
        return out

    def flow_stats(self) -> list[bytes]:
        """One request; the raw reply messages."""
        parser = ofproto_v1_0_parser
        request = parser.OFPFlowStatsRequest(_Datapath(), 0, parser.OFPMatch(), 0xFF, ofproto_v1_0.OFPP_NONE)
        request.xid = self.xid + 1
        request.serialize()
        self.xid += 1
        self.sock.sendall(request.buf)
        replies = []
        while True:
            msg_type, xid, buf = self._read()
            if msg_type != ofproto_v1_0.OFPT_STATS_REPLY or xid != self.xid:
                continue   # an echo or a stray: not ours
            replies.append(buf)
            flags = struct.unpack_from("!H", buf, HEADER.size + 2)[0]
            if not flags & ofproto_v1_0.OFPSF_REPLY_MORE:
                return replies

    def close(self) -> None:
        self.sock.close()


def _parse(raw: list[bytes]) -> list[Any]:
    stats = []
    for buf in raw:
        version, msg_type, length, xid = HEADER.unpack_from(buf)
        msg = ofproto_parser.msg(_Datapath(), version, msg_type, length, xid, buf)
        stats.extend(msg.body)
    return stats


def _vswitchd() -> int:
    return int(Path("/var/run/openvswitch/ovs-vswitchd.pid").read_text())


def measure(prefixes: int, polls: int) -> dict[str, Any]:
    bridge = f"mflp{os.getpid() % 100000}"
    subprocess.run(["ovs-vsctl", "--may-exist", "add-br", bridge, "--", "set", "bridge", bridge,
                    "datapath_type=netdev"], check=True)
    try:
        with tempfile.NamedTemporaryFile("w", suffix=".flows") as flows:
            flows.write(_flows(_prefixes(prefixes)))
            flows.flush()
            subprocess.run(["ovs-ofctl", "-O", "OpenFlow10", "add-flows", bridge, flows.name], check=True)
        client = OpenFlowClient(f"/var/run/openvswitch/{bridge}.mgmt")
        try:
            vswitchd = _vswitchd()
            idle_start, idle_wall = cpu_seconds(vswitchd), time.perf_counter()
            time.sleep(2.0)
            idle_rate = (cpu_seconds(vswitchd) - idle_start) / (time.perf_counter() - idle_wall)
            meter = LoadMeter()
            parse_s = ours_s = 0.0
            switch_start, wall = cpu_seconds(vswitchd), time.perf_counter()
            entries = 0
            for i in range(polls):
                raw = client.flow_stats()
                t0 = time.perf_counter()
                stats = _parse(raw)
                t1 = time.perf_counter()
                meter.observe(1, float(i), ofmsgs.entry_counts(stats))
                t2 = time.perf_counter()
                parse_s += t1 - t0
                ours_s += t2 - t1
                entries = len(stats)
            elapsed = time.perf_counter() - wall
            switch_s = cpu_seconds(vswitchd) - switch_start - idle_rate * elapsed
        finally:
            client.close()
    finally:
        subprocess.run(["ovs-vsctl", "--if-exists", "del-br", bridge], check=True)
    return {"prefixes": prefixes, "entries": entries, "polls": polls,
            "switch_us_per_poll": round(1e6 * switch_s / polls, 1),
            "controller_parse_us_per_poll": round(1e6 * parse_s / polls, 1),
            "controller_ours_us_per_poll": round(1e6 * ours_s / polls, 1),
            "reply_bytes": sum(len(b) for b in raw)}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--prefixes", default="16,205,960",
                   help="MetaFlow prefixes on the switch, comma-separated")
    p.add_argument("--polls", type=int, default=200)
    p.add_argument("--json", action="store_true")
    args = p.parse_args(argv)
    rows = [measure(int(n), args.polls) for n in args.prefixes.split(",")]
    if args.json:
        print(json.dumps(rows))
        return 0
    print("prefixes  entries  reply KiB  switch µs/poll  controller µs/poll (os-ken parse + ours)")
    for r in rows:
        total = r["controller_parse_us_per_poll"] + r["controller_ours_us_per_poll"]
        print(f"{r['prefixes']:>8} {r['entries']:>8} {r['reply_bytes'] / 1024:>10.1f} "
              f"{r['switch_us_per_poll']:>15.1f} {total:>10.1f} "
              f"({r['controller_parse_us_per_poll']} + {r['controller_ours_us_per_poll']})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
