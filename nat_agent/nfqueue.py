"""The paper's user-space NAT agent: MetaDataID rewrite through NFQUEUE.

The iptables rules (`nat_agent.rules`, mode ``nfqueue``) queue the client's
requests (destination = an mdid in the space, port 9000) and our replies
(source = our address, port 9000) to one queue. For each packet the
`Translator` rewrites the request's destination to our address, remembering
the mdid per client connection (`FlowTable`), and the reply's source back to
that mdid; a connection that would meet another one from the same client
port once the mdid is gone also gets another port (`nat_agent.flowtable`).
Replies to clients we have no flow for (they talked to our own address
directly) pass unchanged.

The queue is served in a child process (`NfqueueWorker`), so the per-packet
Python work runs on its own interpreter and GIL instead of competing with
the agent's asyncio service; counters live in shared memory so the agent can
report them, including the nanoseconds spent per packet.

Two limits of NetfilterQueue 1.1 are worked around here, because a
truncated copy handed back with a verdict would cut the packet short:
* `bind(range=...)` is capped at 4016 bytes, so after binding we send the
  kernel our own config message raising the copy range to 64 KiB
  (`_set_copy_range`);
* `run()` reads the netlink socket with a 4 KiB buffer, so we feed
  `run_socket()` a reader that reads whole messages (`_WholeMessages`).
The kernel still segments GSO/GRO packets before queueing them (we do not
ask for NFQA_CFG_F_GSO), and completes their checksums, so every queued
packet is at most one MTU and has a checksum that can be adjusted
incrementally; with the range raised, that holds for any MTU up to 64 KiB.
"""

from __future__ import annotations

import multiprocessing
import os
import select
import signal
import socket
import struct
import time
from collections.abc import MutableSequence
from multiprocessing.connection import Connection

from netfilterqueue import NetfilterQueue, Packet

from client_lib.cidr import Block
from nat_agent.flowtable import FlowTable
from nat_agent.packet import (
    parse,
    replace_destination,
    replace_destination_port,
    replace_source,
    replace_source_port,
)

__all__ = ["COUNTERS", "FlowTable", "NfqueueWorker", "Translator"]

# Indexes of the shared counters. Two clocks per packet: `translate_ns` is
# our own work (copy out, parse, flow table, rewrite, copy back);
# `callback_ns` adds the verdict, a syscall in which the kernel carries the
# packet on through its stack (routing, TCP, the veth peer) before returning,
# so it measures what the agent's process spends per packet, not what
# Python costs.
INBOUND, OUTBOUND, REWRITTEN, PASSED, ERRORS, FLOWS, REMAPPED, TRANSLATE_NS, CALLBACK_NS = range(9)
COUNTERS = ("inbound", "outbound", "rewritten", "passed", "errors", "flows", "remapped",
            "translate_ns", "callback_ns")


class Translator:
    """Decides and performs the rewrite of one queued packet.

    Pure apart from the flow table's clock: `translate` takes the queued
    bytes and returns the rewritten packet, or None to accept it unchanged,
    counting into `counters` (indexed by the constants above).
    """

    def __init__(self, space: Block, own_ip: str, port: int, flows: FlowTable,
                 counters: MutableSequence[int]) -> None:
        self._first = space.first
        self._last = space.last
        self._own = int.from_bytes(socket.inet_aton(own_ip), "big")
        self._port = port
        self.flows = flows
        self.counters = counters

    def translate(self, payload: bytes) -> bytearray | None:
        """The packet to send on instead of `payload`, or None for unchanged."""
        counters = self.counters
        info = parse(payload)
        if info is None:
            counters[PASSED] += 1
            return None
        if info.dport == self._port and self._first <= info.dst <= self._last:
            counters[INBOUND] += 1
            port = self.flows.inbound((info.proto, info.src, info.sport), info.dst, info.tcp_flags)
            counters[FLOWS] = len(self.flows)
            counters[REMAPPED] = self.flows.remapped
            packet = bytearray(payload)
            replace_destination(packet, self._own)
            replace_source_port(packet, port)
        elif info.sport == self._port and info.src == self._own:
            counters[OUTBOUND] += 1
            found = self.flows.outbound((info.proto, info.dst, info.dport), info.tcp_flags)
            counters[FLOWS] = len(self.flows)
            if found is None:
                counters[PASSED] += 1
                return None
            mdid, port = found
            packet = bytearray(payload)
            replace_source(packet, mdid)
            replace_destination_port(packet, port)
        else:
            counters[PASSED] += 1
            return None
        counters[REWRITTEN] += 1
        return packet


class NfqueueWorker:
    """Serves one NFQUEUE in a child process until `stop` (or our death).

    `start` returns once the child has bound the queue and raised its copy
    range, or raises with the child's error (e.g. the queue number is bound
    by another process). The child also exits by itself when this process
    dies, even by SIGKILL, so a restarted agent can bind the queue again.
    """

    def __init__(self, space: Block, own_ip: str, port: int, queue_num: int,
                 idle_timeout: float = 300.0, closing_timeout: float = 10.0) -> None:
        self._ctx = multiprocessing.get_context("spawn")
        self.queue_num = queue_num
        self._args = (space, own_ip, port, queue_num, idle_timeout, closing_timeout)
        self._counters = self._ctx.RawArray("q", len(COUNTERS))
        self._process: multiprocessing.process.BaseProcess | None = None

    def start(self, timeout: float = 30.0) -> None:
        if self._process is not None:
            raise RuntimeError("nfqueue worker already started")
        receive, send = self._ctx.Pipe(duplex=False)
        process = self._ctx.Process(target=_serve, args=(*self._args, self._counters, send),
                                    name=f"metaflow-nfqueue-{self.queue_num}", daemon=True)
        process.start()
        send.close()
        try:
            if not receive.poll(timeout):
                raise RuntimeError(f"nfqueue worker not ready after {timeout} s")
            error = receive.recv()
        except EOFError:
            error = f"nfqueue worker died while starting (exit code {process.exitcode})"
        except BaseException:
            _terminate(process)
            raise
        finally:
            receive.close()
        if error is not None:
            _terminate(process)
            raise RuntimeError(f"nfqueue {self.queue_num}: {error}")
        self._process = process

    def stop(self) -> None:
        """Stop the child (idempotent). The kernel unbinds the queue when its
        socket closes; with --queue-bypass, later packets pass the rule."""
        if self._process is not None:
            _terminate(self._process)
            self._process = None

    @property
    def alive(self) -> bool:
        return self._process is not None and self._process.is_alive()

    def stats(self) -> dict[str, int | float | bool | None]:
        """The counters, `alive`, the worker's `pid`, and the mean µs per
        packet of each clock (`us_translate_per_packet`, `us_callback_per_packet`)."""
        values = dict(zip(COUNTERS, self._counters, strict=True))
        per_packet_us = 1e-3 / max(1, values["rewritten"] + values["passed"] + values["errors"])
        return {**values, "alive": self.alive,
                "pid": self._process.pid if self._process is not None else None,
                "us_translate_per_packet": values["translate_ns"] * per_packet_us,
                "us_callback_per_packet": values["callback_ns"] * per_packet_us}


def _terminate(process: multiprocessing.process.BaseProcess) -> None:
    process.terminate()
    process.join(5)
    if process.is_alive():
        process.kill()
        process.join()


def _serve(space: Block, own_ip: str, port: int, queue_num: int, idle_timeout: float,
           closing_timeout: float, counters: MutableSequence[int], ready: Connection) -> None:
    """Child process: bind the queue, report readiness, translate until the
    parent goes away or SIGTERM (default action) ends us."""
    # Ctrl-C reaches the whole process group; the parent decides when we stop
    # (after removing the rules that feed us), with SIGTERM, which a parent
    # that blocks it for its own sigwait must not have blocked for us.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGTERM})
    translator = Translator(space, own_ip, port, FlowTable(idle_timeout, closing_timeout),
                            counters)
    clock = time.perf_counter_ns

    def on_packet(packet: Packet) -> None:
        start = clock()
        try:
            rewritten = translator.translate(packet.get_payload())
        except Exception:  # noqa: BLE001 - one odd packet must not stop the agent
            counters[ERRORS] += 1
            rewritten = None
        if rewritten is not None:
            packet.set_payload(bytes(rewritten))
        translated = clock()
        packet.accept()
        counters[TRANSLATE_NS] += translated - start
        counters[CALLBACK_NS] += clock() - start

    try:
        queue = NetfilterQueue()
        queue.bind(queue_num, on_packet)
        sock = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, _NETLINK_NETFILTER,
                             fileno=os.dup(queue.get_fd()))
        _set_copy_range(sock, queue_num)
        sock.setblocking(False)
    except Exception as exc:  # noqa: BLE001 - reported to the parent, which raises
        ready.send(f"{type(exc).__name__}: {exc}")
        return
    ready.send(None)
    ready.close()
    parent = multiprocessing.parent_process()
    assert parent is not None, "_serve runs in the worker's child process"
    reader = _WholeMessages(sock)
    watched: list[socket.socket | int] = [sock, parent.sentinel]
    while True:
        readable, _, _ = select.select(watched, [], [])
        if parent.sentinel in readable:
            return
        # returns when the non-blocking socket is drained; the library's stub
        # asks for a socket, but run_socket only ever calls recv
        queue.run_socket(reader)  # type: ignore[arg-type]


# nfnetlink_queue protocol constants (linux/netfilter/nfnetlink_queue.h).
_NETLINK_NETFILTER = 12
_NFNL_SUBSYS_QUEUE = 3
_NFQNL_MSG_CONFIG = 2
_NFQA_CFG_PARAMS = 2
_NFQNL_COPY_PACKET = 2
_NLM_F_REQUEST = 0x1
_NLM_F_ACK = 0x4
_NLMSG_ERROR = 2
_MAX_COPY_RANGE = 0xFFFF  # the kernel caps it at 0xFFFF minus an attribute header
# One queued packet as a netlink message: the packet plus its attributes.
_RECV_SIZE = 0x10000 + 4096


def _set_copy_range(sock: socket.socket, queue_num: int) -> None:
    """Make the kernel copy whole packets (up to 64 KiB) to `queue_num`.

    Sent on the queue's own socket (the kernel accepts configuration of a
    queue only from the socket bound to it) before any rule feeds the queue
    (`Rewriter.start` purges stale rules first), so the acknowledgement is
    the only message waiting for us; a packet instead means someone else's
    rules use our queue number.
    """
    params = struct.pack("!IB3x", _MAX_COPY_RANGE, _NFQNL_COPY_PACKET)
    attr = struct.pack("=HH", 4 + 5, _NFQA_CFG_PARAMS) + params
    body = struct.pack("!BBH", socket.AF_UNSPEC, 0, queue_num) + attr
    header = struct.pack("=IHHII", 16 + len(body), _NFNL_SUBSYS_QUEUE << 8 | _NFQNL_MSG_CONFIG,
                         _NLM_F_REQUEST | _NLM_F_ACK, 1, 0)
    sock.send(header + body)
    reply = sock.recv(_RECV_SIZE)
    _, kind, _, _, _ = struct.unpack_from("=IHHII", reply)
    if kind != _NLMSG_ERROR:
        raise RuntimeError(f"queue {queue_num} got packets before it was configured; "
                           "do other rules (another agent's?) feed it?")
    (error,) = struct.unpack_from("=i", reply, 16)
    if error:
        raise OSError(-error, f"setting the copy range of queue {queue_num}: "
                              f"{os.strerror(-error)}")


class _WholeMessages:
    """What `NetfilterQueue.run_socket` reads from: a socket whose `recv`
    ignores the library's 4 KiB buffer size and returns whole messages.
    On a drained non-blocking socket it raises EAGAIN, which ends
    `run_socket`'s loop."""

    def __init__(self, sock: socket.socket) -> None:
        self._sock = sock

    def recv(self, _bufsize: int) -> bytes:
        return self._sock.recv(_RECV_SIZE)
