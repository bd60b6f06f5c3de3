"""Liveness at scale: what N servers beating four times a second cost the controller, by datagram and by HTTP.

A real controller process (no switches: liveness is all it does here) takes
N emulated servers through the real, signed registration route, then two
sender processes beat for all of them at 4/s each: signed datagrams
(`client_lib.liveness`, as `nat_agent.registration` sends them), and then,
side by side on the same controller, the signed HTTP heartbeat
(`REST.heartbeat`), as fast as 16 threads per process get answers. For
each: the controller's CPU over the window (utime + stime from
/proc/PID/stat, as a share of one core, minus its idle share measured
first), what it took (datagrams counted ``accepted`` by its metrics; HTTP
heartbeats answered), and per datagram the time to its ACK, which the
controller sends after it has recorded the beat: the delay between a beat
leaving an agent and the controller's silent-server sweep seeing it.

Detection itself (a server declared failed) needs a built fabric, which
this benchmark does not emulate (`make bench-scale` and the fail-over
benchmark do); what it adds to the mechanism, which is unchanged (the
sweep every tick, ``--heartbeat-timeout``), is that ACK delay.

    python -m benchmarks.liveness --out benchmarks/results
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import re
import socket
import sys
import tempfile
import threading
import time
import urllib.request
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from benchmarks.cpu import cpu_seconds
from client_lib.api.auth import write_secret
from client_lib.api.clients import ApiClient
from client_lib.api.rest import REST, Heartbeat, Registration
from client_lib.cidr import Block
from client_lib.constants import DEFAULT_SPACE_CIDR
from client_lib.errors import ApiError
from client_lib.liveness import LivenessError, LivenessKey, Sequence, decode_reply, encode_beat, state_digest
from mininet_scenarios.metaflow_net import ControllerProcess
from nat_agent.ports import listen_port
from nat_agent.registration import STATE_PERIOD_S

SIZES = (200, 2000)
RATE_HZ = 4.0
"""Beats a second per server: the agents' default (``--heartbeat`` 0.25 s)."""
WINDOW_S = 10.0
WARMUP_S = 2.0
IDLE_S = 5.0
SENDERS = 2
HTTP_THREADS = 16
TARGET_CORE = 0.25
"""The issue's target: liveness at 2,000 servers costs at most a quarter of a core."""
SPACE = Block.parse(DEFAULT_SPACE_CIDR)
HOST = "127.0.0.1"


def _names(n: int) -> list[str]:
    return [f"s{i:05d}" for i in range(n)]


@contextmanager
def controller(workdir: Path) -> Iterator[dict[str, Any]]:
    """A controller process on free ports; what a run needs of it."""
    secret = write_secret(workdir / "secret")
    rest, metrics = listen_port(), listen_port()
    ctl = ControllerProcess(listen_port(), HOST, rest, secret, workdir / "controller.log",
                            ["--metrics-port", str(metrics), "--locate-timeout", "86400",
                             "--log-level", "WARNING"]).start()
    proc = ctl.proc
    assert proc is not None
    url = f"http://{HOST}:{rest}"
    key = secret.read_bytes().strip()
    try:
        api = ApiClient(url, key, timeout=5)
        deadline = time.monotonic() + 60
        while True:
            try:
                api.call(REST.tree)
                break
            except ApiError:
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError((workdir / "controller.log").read_text()) from None
                time.sleep(0.2)
        yield {"pid": proc.pid, "url": url, "secret": key, "metrics": metrics}
    finally:
        ctl.stop()


def register(url: str, secret: bytes, names: list[str]) -> int:
    """Every name through the signed registration route; the controller's liveness port."""
    def one(i: int) -> int:
        a, b = divmod(i + 1, 250)
        reg = Registration(names[i], f"10.{a // 250}.{a % 250}.{b + 1}", f"02:00:00:{i >> 16 & 255:02x}:"
                           f"{i >> 8 & 255:02x}:{i & 255:02x}", 9000, f"http://10.200.{a}.{b + 1}:9001",
                           "leveldb", 100_000, SPACE, [])
        return ApiClient(url, secret, timeout=30).call(REST.register, reg).liveness_port
    with ThreadPoolExecutor(8) as pool:
        ports = set(pool.map(one, range(len(names))))
    assert len(ports) == 1 and 0 not in ports, f"the controller took no datagrams: {ports}"
    return ports.pop()


def _beat_by_datagram(url: str, secret: bytes, port: int, names: list[str], seconds: float, out: Any) -> None:
    """One sender process: every name beats `RATE_HZ` times a second, spread evenly, ACK delays sampled;
    and, as agents do, one HTTP heartbeat per name every `STATE_PERIOD_S` (the safety net)."""
    safety = threading.Thread(target=_http_sender, args=(url, secret, names, seconds, 1.0 / STATE_PERIOD_S, 1,
                                                          []), daemon=True)
    safety.start()
    key, seq, digest = LivenessKey(secret), Sequence(), state_digest([], [], [])
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4 << 20)
    sock.setblocking(False)
    sent: dict[int, float] = {}
    delays: list[float] = []
    acks = count = 0
    gap = 1.0 / RATE_HZ / len(names)
    start = time.monotonic()
    end = start + seconds
    while True:
        now = time.monotonic()
        if now >= end:
            break
        due = start + count * gap
        if due > now:
            time.sleep(min(due - now, 0.002))
        else:
            s = seq.next()
            sock.sendto(encode_beat(key, names[count % len(names)], s, digest), (HOST, port))
            if count % 10 == 0:
                sent[s] = time.monotonic()
            count += 1
        while True:
            try:
                data = sock.recv(512)
            except BlockingIOError:
                break
            try:
                reply = decode_reply(data, key, time.time())
            except LivenessError:
                continue
            acks += 1
            at = sent.pop(reply.seq, None)
            if at is not None:
                delays.append(time.monotonic() - at)
    out.put({"sent": count, "acks": acks, "delays": delays})


def _beat_by_http(url: str, secret: bytes, names: list[str], seconds: float, out: Any) -> None:
    """One sender process: `HTTP_THREADS` threads heartbeat over HTTP, each name at most `RATE_HZ`."""
    answered: list[float] = []
    _http_sender(url, secret, names, seconds, RATE_HZ, HTTP_THREADS, answered)
    out.put({"sent": len(answered), "acks": len(answered), "delays": answered})


def _http_sender(url: str, secret: bytes, names: list[str], seconds: float, rate: float, threads: int,
                 answered: list[float]) -> None:
    """`threads` threads heartbeat over HTTP for `names`, each at most `rate` a second; the answers' times."""
    lock = threading.Lock()
    end = time.monotonic() + seconds
    period = 1.0 / rate

    def worker(mine: list[str]) -> None:
        api = ApiClient(url, secret, timeout=10)
        beat = Heartbeat(0, [], [])
        next_at = {n: time.monotonic() + i * period / len(mine) for i, n in enumerate(mine)}
        while time.monotonic() < end:
            for name in mine:
                now = time.monotonic()
                if now >= end:
                    return
                if now < next_at[name]:
                    time.sleep(next_at[name] - now)
                next_at[name] = time.monotonic() + period
                t0 = time.monotonic()
                try:
                    api.call(REST.heartbeat, beat, name=name)
                except ApiError:
                    continue
                with lock:
                    answered.append(time.monotonic() - t0)
    workers = [threading.Thread(target=worker, args=(names[i::threads],)) for i in range(threads)]
    for t in workers:
        t.start()
    for t in workers:
        t.join()


def datagram_counts(metrics_port: int) -> dict[str, float]:
    """The controller's liveness datagrams by outcome, from its Prometheus metrics."""
    text = urllib.request.urlopen(f"http://{HOST}:{metrics_port}/metrics", timeout=10).read().decode()
    return {m[1]: float(m[2]) for m in
            re.finditer(r'^metaflow_liveness_datagrams_total\{outcome="(\w+)"\} (\S+)$', text, re.M)}


def _window(ctl: dict[str, Any], target: Any, args: tuple[Any, ...], names: list[str],
            idle_share: float) -> dict[str, Any]:
    """Senders for `names` over warm-up + window; the controller's CPU and intake over the window."""
    ctx = mp.get_context("fork")
    out = ctx.Queue()
    parts = [names[i::SENDERS] for i in range(SENDERS)]
    procs = [ctx.Process(target=target, args=(*args, part, WARMUP_S + WINDOW_S, out)) for part in parts]
    for p in procs:
        p.start()
    time.sleep(WARMUP_S)
    cpu0, t0 = cpu_seconds(ctl["pid"]), time.monotonic()
    accepted0 = datagram_counts(ctl["metrics"])["accepted"]
    time.sleep(WINDOW_S)
    cpu1, t1 = cpu_seconds(ctl["pid"]), time.monotonic()
    accepted1 = datagram_counts(ctl["metrics"])["accepted"]
    got = [out.get(timeout=120) for _ in procs]
    for p in procs:
        p.join(30)
    delays = sorted(d for g in got for d in g["delays"])
    share = (cpu1 - cpu0) / (t1 - t0)
    return {"cpu_share": round(share, 4), "cpu_share_over_idle": round(share - idle_share, 4),
            "datagrams_accepted_per_s": round((accepted1 - accepted0) / (t1 - t0), 1),
            "sent": sum(g["sent"] for g in got), "answered": sum(g["acks"] for g in got),
            "answered_per_s": round(sum(g["acks"] for g in got) / (WARMUP_S + WINDOW_S), 1),
            "offered_per_s": round(len(names) * RATE_HZ, 1),
            "delay_p50_ms": round(1000 * _quantile(delays, 0.5), 3) if delays else None,
            "delay_p99_ms": round(1000 * _quantile(delays, 0.99), 3) if delays else None}


def _quantile(sorted_values: list[float], q: float) -> float:
    return sorted_values[min(len(sorted_values) - 1, int(q * len(sorted_values)))]


def run(sizes: tuple[int, ...], say: Any = print) -> dict[str, Any]:
    runs = []
    for n in sizes:
        with tempfile.TemporaryDirectory(prefix="mf-liveness-") as tmp, controller(Path(tmp)) as ctl:
            names = _names(n)
            t0 = time.monotonic()
            port = register(ctl["url"], ctl["secret"], names)
            registered_s = time.monotonic() - t0
            cpu0 = cpu_seconds(ctl["pid"])
            time.sleep(IDLE_S)
            idle = (cpu_seconds(ctl["pid"]) - cpu0) / IDLE_S
            say(f"N={n}: registered in {registered_s:.1f} s; controller idle at {100 * idle:.1f} % of a core")
            udp = _window(ctl, _beat_by_datagram, (ctl["url"], ctl["secret"], port), names, idle)
            say(f"N={n} datagrams: {udp}  (load average {os.getloadavg()[0]:.2f})")
            http = _window(ctl, _beat_by_http, (ctl["url"], ctl["secret"]), names, idle)
            say(f"N={n} HTTP: {http}  (load average {os.getloadavg()[0]:.2f})")
            runs.append({"servers": n, "registration_s": round(registered_s, 2), "idle_share": round(idle, 4),
                         "datagram": udp, "http": http, "loadavg_1m": round(os.getloadavg()[0], 2)})
    return {"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "rate_hz": RATE_HZ,
            "window_s": WINDOW_S, "cores": os.cpu_count(), "target_core_share": TARGET_CORE, "runs": runs}


def table(results: dict[str, Any]) -> str:
    lines = ["| servers | how | offered /s | taken /s | controller CPU (% of a core, over idle) | "
             "CPU per beat (µs) | answer p50 / p99 (ms) |", "|---|---|---|---|---|---|---|"]
    for r in results["runs"]:
        for how in ("datagram", "http"):
            m = r[how]
            taken = m["datagrams_accepted_per_s"] if how == "datagram" else m["answered_per_s"]
            per = 1e6 * m["cpu_share_over_idle"] / taken if taken else float("nan")
            lines.append(f"| {r['servers']} | {how} | {m['offered_per_s']:g} | {taken:g} | "
                         f"{100 * m['cpu_share']:.1f} ({100 * m['cpu_share_over_idle']:.1f}) | {per:.0f} | "
                         f"{m['delay_p50_ms']} / {m['delay_p99_ms']} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--servers", default=",".join(map(str, SIZES)), help="sizes to run, comma-separated")
    p.add_argument("--out", type=Path, default=None, help="write liveness.json and liveness.md here")
    args = p.parse_args(argv)
    sizes = tuple(int(s) for s in args.servers.split(","))
    results = run(sizes, say=lambda s: print(s, flush=True))
    print(table(results))
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "liveness.json").write_text(json.dumps(results, indent=2) + "\n")
        (args.out / "liveness.md").write_text(
            f"Measured {results['date']} (`python -m benchmarks.liveness`), {results['cores']} cores "
            f"shared (load average {results['runs'][-1]['loadavg_1m']}):\n\n{table(results)}\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
