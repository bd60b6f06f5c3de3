"""A client host's load on MetaDataIDs: the driver behind the rewrite tests and
the agent benchmark.

It runs where a file system's client would (inside the client network
namespace in tests), talks to MetaDataID addresses through `MetaFlowClient`,
verifies every answer, and prints one JSON object. With `--audit IFACE` it
also captures, on the client's interface, every packet coming back from the
service port and checks its source: a reply that left the server with its
physical address instead of the MetaDataID would show up there (and the
client's TCP would not accept it).

    python -m benchmarks.agent_load --ops 10000 --workload cycle --audit veth0
"""

from __future__ import annotations

import argparse
import json
import socket
import statistics
import sys
import threading
import time
from collections import defaultdict

from client_lib.cidr import Block
from client_lib.client import MetaFlowClient, MetaFlowError
from client_lib.constants import DEFAULT_SPACE_CIDR, METAFLOW_PORT
from nat_agent.packet import TCP_ACK, TCP_SYN, parse

ETH_P_IP = 0x0800
ETH_HEADER = 14


class SourceAudit:
    """Counts packets from the service port by whether their source is a MetaDataID."""

    def __init__(self, interface: str, space: Block, port: int) -> None:
        self.space = space
        self.port = port
        self.inside = 0
        self.outside: list[str] = []
        self.outside_handshakes = 0  # SYN-ACKs among them
        self._sock = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.htons(ETH_P_IP))
        self._sock.bind((interface, 0))
        self._sock.settimeout(0.2)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._capture, daemon=True)

    def __enter__(self) -> SourceAudit:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        time.sleep(0.3)  # let the last replies arrive
        self._stop.set()
        self._thread.join()
        self._sock.close()

    def _capture(self) -> None:
        while not self._stop.is_set():
            try:
                frame, meta = self._sock.recvfrom(65536)
            except TimeoutError:
                continue
            if meta[2] == socket.PACKET_OUTGOING:
                continue
            info = parse(frame[ETH_HEADER:])
            if info is None or info.sport != self.port:
                continue
            if self.space.contains(info.src):
                self.inside += 1
            else:
                self.outside.append(f"{socket.inet_ntoa(info.src.to_bytes(4, 'big'))} "
                                    f"port {info.dport} flags {info.tcp_flags:#04x}")
                self.outside_handshakes += info.tcp_flags & (TCP_SYN | TCP_ACK) == TCP_SYN | TCP_ACK

    def report(self) -> dict:
        return {"replies_from_mdid": self.inside, "replies_from_elsewhere": len(self.outside),
                "elsewhere_syn_acks": self.outside_handshakes, "elsewhere_sample": self.outside[:5]}


def _summary(samples: list[float]) -> dict:
    ordered = sorted(samples)
    return {"n": len(ordered), "mean_us": round(statistics.fmean(ordered), 1),
            "p50_us": round(ordered[len(ordered) // 2], 1),
            "p99_us": round(ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))], 1)}


def run(client: MetaFlowClient, workload: str, ops: int, prefix: str, value_size: int) -> dict:
    """Run `ops` requests; returns latency summaries per command and any mismatches."""
    lat: dict[str, list[float]] = defaultdict(list)
    wrong: list[str] = []
    value = b"m" * value_size
    # Fewer keys than the client keeps idle connections (64), so that with
    # reuse every request rides an open connection: the round trip alone.
    keys = [f"{prefix}/{i // 10}/{i}" for i in range(50)]

    def timed(kind: str, call, *args):
        start = time.perf_counter_ns()
        result = call(*args)
        lat[kind].append((time.perf_counter_ns() - start) / 1000)
        return result

    if workload == "get":
        for key in keys:
            client.put(key, value)
    done = 0
    cpu_started = time.process_time()
    started = time.perf_counter()
    while done < ops:
        if workload == "cycle":  # put, get, delete of one new path: 3 round trips
            path = f"{prefix}/{done // 300}/{done}"
            timed("set", client.put, path, value + path.encode())
            if timed("get", client.get, path) != value + path.encode():
                wrong.append(path)
            retries = client.stats.retries
            if not timed("del", client.delete, path) and \
                    (client.stats.retries == retries or client.get(path) is not None):
                # A retried DEL whose first reply was lost reports False by
                # contract (`client_lib.client`, Idempotency): wrong only if
                # nothing was retried, or the path is still there.
                wrong.append(path)
            done += 3
        elif workload == "set":
            timed("set", client.put, keys[done % len(keys)], value)
            done += 1
        else:
            if timed("get", client.get, keys[done % len(keys)]) != value:
                wrong.append(keys[done % len(keys)])
            done += 1
    seconds = time.perf_counter() - started
    return {"ops": done, "seconds": round(seconds, 3), "ops_per_s": round(done / seconds, 1),
            "cpu_s": round(time.process_time() - cpu_started, 4),
            "latency": {kind: _summary(v) for kind, v in lat.items()}, "wrong": wrong[:10],
            "wrong_count": len(wrong)}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--space", default=DEFAULT_SPACE_CIDR)
    p.add_argument("--port", type=int, default=METAFLOW_PORT)
    p.add_argument("--via", default=None, metavar="HOST[:PORT]",
                   help="send to one address instead of the MetaDataIDs (the no-rewrite baseline)")
    p.add_argument("--ops", type=int, default=10_000)
    p.add_argument("--workload", choices=("cycle", "set", "get"), default="cycle")
    p.add_argument("--value-size", type=int, default=250)
    p.add_argument("--prefix", default="/load")
    p.add_argument("--fresh", action="store_true",
                   help="a new TCP connection per request, as in the paper (default: reuse per ID)")
    p.add_argument("--audit", default=None, metavar="IFACE",
                   help="capture replies on IFACE and check their source addresses")
    args = p.parse_args(argv)
    space = Block.parse(args.space)
    route = None
    if args.via:
        host, _, port = args.via.partition(":")
        target = (host, int(port) if port else args.port)
        route = lambda _address: target  # noqa: E731 - one fixed destination
    client = MetaFlowClient(space=space, port=args.port, route=route, reuse=not args.fresh)
    audit = SourceAudit(args.audit, space, args.port) if args.audit else None
    try:
        if audit:
            with audit:
                report = run(client, args.workload, args.ops, args.prefix, args.value_size)
            report["audit"] = audit.report()
        else:
            report = run(client, args.workload, args.ops, args.prefix, args.value_size)
    except MetaFlowError as exc:
        print(json.dumps({"error": str(exc)}))
        return 1
    finally:
        client.close()
    report["client"] = vars(client.stats)
    print(json.dumps(report))
    return 0 if not report["wrong_count"] else 1


if __name__ == "__main__":
    sys.exit(main())
