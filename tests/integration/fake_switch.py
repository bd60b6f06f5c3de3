"""An OpenFlow 1.0 switch with no ports, over TCP, that records what a
controller sends it: enough of the protocol for os-ken's handshake
(hello, features, echo, barrier, empty flow stats, Nicira role replies),
so a test can tell which controller sent what, and when, with no Open
vSwitch. Used to prove that a standby, or a leader woken past its lease,
sends no flow mod and claims no master role.
"""

from __future__ import annotations

import socket
import struct
import threading
import time
from dataclasses import dataclass

from os_ken.ofproto import ofproto_common
from os_ken.ofproto import ofproto_v1_0 as ofp

HEADER = struct.Struct("!BBHI")
NXT_ROLE_REQUEST, NXT_ROLE_REPLY = 10, 11


@dataclass(frozen=True)
class Received:
    at: float
    type: int
    body: bytes

    @property
    def role(self) -> int | None:
        """The role of a Nicira role request, else None."""
        if self.type != ofp.OFPT_VENDOR or len(self.body) < 12:
            return None
        vendor, subtype, role = struct.unpack("!III", self.body[:12])
        return role if vendor == ofproto_common.NX_EXPERIMENTER_ID and subtype == NXT_ROLE_REQUEST else None

    @property
    def cookie(self) -> int | None:
        """A flow mod's cookie (after the 40-byte match), else None."""
        if self.type != ofp.OFPT_FLOW_MOD:
            return None
        return int(struct.unpack("!Q", self.body[40:48])[0])


class FakeSwitch:
    """One connection to one controller's OpenFlow port, read in a thread."""

    def __init__(self, port: int, dpid: int, host: str = "127.0.0.1") -> None:
        self.dpid = dpid
        self.received: list[Received] = []
        self.sock = socket.create_connection((host, port), timeout=10)
        self.sock.settimeout(None)
        self._lock = threading.Lock()
        self._send(ofp.OFPT_HELLO, 1, b"")
        self.thread = threading.Thread(target=self._read, daemon=True)
        self.thread.start()

    def messages(self, since: float = 0.0) -> list[Received]:
        with self._lock:
            return [r for r in self.received if r.at >= since]

    def roles(self, since: float = 0.0) -> list[int]:
        return [r.role for r in self.messages(since) if r.role is not None]

    def flow_mods(self, cookie: int, since: float = 0.0) -> int:
        return sum(r.cookie == cookie for r in self.messages(since))

    def close(self) -> None:
        try:
            self.sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self.sock.close()

    def _send(self, kind: int, xid: int, body: bytes) -> None:
        self.sock.sendall(HEADER.pack(ofp.OFP_VERSION, kind, HEADER.size + len(body), xid) + body)

    def _exact(self, n: int) -> bytes:
        out = b""
        while len(out) < n:
            got = self.sock.recv(n - len(out))
            if not got:
                raise ConnectionError("closed")
            out += got
        return out

    def _read(self) -> None:
        try:
            while True:
                _, kind, length, xid = HEADER.unpack(self._exact(HEADER.size))
                body = self._exact(length - HEADER.size)
                with self._lock:
                    self.received.append(Received(time.monotonic(), kind, body))
                self._answer(kind, xid, body)
        except (ConnectionError, OSError):
            return

    def _answer(self, kind: int, xid: int, body: bytes) -> None:
        if kind == ofp.OFPT_ECHO_REQUEST:
            self._send(ofp.OFPT_ECHO_REPLY, xid, body)
        elif kind == ofp.OFPT_FEATURES_REQUEST:
            # datapath id, buffers, tables, pad, capabilities, actions; no ports
            self._send(ofp.OFPT_FEATURES_REPLY, xid, struct.pack("!QIB3xII", self.dpid, 0, 1, 0, 0xFFF))
        elif kind == ofp.OFPT_GET_CONFIG_REQUEST:
            self._send(ofp.OFPT_GET_CONFIG_REPLY, xid, struct.pack("!HH", 0, 128))
        elif kind == ofp.OFPT_BARRIER_REQUEST:
            self._send(ofp.OFPT_BARRIER_REPLY, xid, b"")
        elif kind == ofp.OFPT_STATS_REQUEST:
            self._send(ofp.OFPT_STATS_REPLY, xid, body[:2] + b"\0\0")
        elif kind == ofp.OFPT_VENDOR:
            role = Received(0.0, kind, body).role
            if role is not None:
                reply = struct.pack("!III", ofproto_common.NX_EXPERIMENTER_ID, NXT_ROLE_REPLY, role)
                self._send(ofp.OFPT_VENDOR, xid, reply)
