"""A switch that refuses NORMAL, against the real controller process.

Open vSwitch never refuses the NORMAL action, so the switch here is a
minimal OpenFlow 1.0 one over TCP (hello, features with its ports and its
name, echo, barrier): it accepts every flow mod but hybrid mode's NORMAL
entry, which it answers with the error a switch without NORMAL sends
(OFPET_BAD_ACTION, OFPBAC_BAD_OUT_PORT, the refused request as data). The
controller (`--mode hybrid`) must name the switch at connect: the
`normal-refused` event over REST and an ERROR line, then stop cleanly.
"""

from __future__ import annotations

import signal
import socket
import struct
import subprocess
import sys
import time
from pathlib import Path

from os_ken.ofproto import ofproto_v1_0 as ofp

from client_lib.api.auth import load_secret, write_secret
from client_lib.api.clients import ApiClient
from client_lib.api.rest import REST
from client_lib.constants import COOKIE_NORMAL
from client_lib.errors import ApiError
from mininet_scenarios.daemons import ROOT
from nat_agent.ports import listen_port

HEADER = struct.Struct("!BBHI")
SWITCH_NAME = b"br-refuser"
DPID = 0x2A


def _message(msg_type: int, xid: int, body: bytes = b"") -> bytes:
    return HEADER.pack(ofp.OFP_VERSION, msg_type, HEADER.size + len(body), xid) + body


def _port(number: int, name: bytes) -> bytes:
    """An ofp_phy_port: number, MAC, name, config, state, features."""
    return struct.pack("!H6s16sIIIIII", number, bytes([2, 0, 0, 0, 0, number & 0xFF]), name, 0, 0, 0, 0, 0, 0)


def _features(xid: int) -> bytes:
    ports = _port(1, b"eth1") + _port(2, b"eth2") + _port(ofp.OFPP_LOCAL, SWITCH_NAME)
    return _message(ofp.OFPT_FEATURES_REPLY, xid, struct.pack("!QIB3xII", DPID, 0, 1, 0, 0xFFF) + ports)


class RefusingSwitch:
    """Speaks just enough OpenFlow 1.0; refuses flow mods with our NORMAL cookie."""

    def __init__(self, port: int) -> None:
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=1)
        self.sock.sendall(_message(ofp.OFPT_HELLO, 1))
        self.buffer = b""
        self.refused = 0

    def serve(self, seconds: float) -> None:
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            try:
                data = self.sock.recv(65536)
            except TimeoutError:
                continue
            if not data:
                return
            self.buffer += data
            while len(self.buffer) >= HEADER.size:
                _version, msg_type, length, xid = HEADER.unpack_from(self.buffer)
                if len(self.buffer) < length:
                    break
                msg, self.buffer = self.buffer[:length], self.buffer[length:]
                self._answer(msg_type, xid, msg)

    def _answer(self, msg_type: int, xid: int, msg: bytes) -> None:
        if msg_type == ofp.OFPT_FEATURES_REQUEST:
            self.sock.sendall(_features(xid))
        elif msg_type == ofp.OFPT_ECHO_REQUEST:
            self.sock.sendall(_message(ofp.OFPT_ECHO_REPLY, xid, msg[HEADER.size:]))
        elif msg_type == ofp.OFPT_BARRIER_REQUEST:
            self.sock.sendall(_message(ofp.OFPT_BARRIER_REPLY, xid))
        elif msg_type == ofp.OFPT_FLOW_MOD and struct.unpack_from("!Q", msg, 48)[0] == COOKIE_NORMAL:
            self.refused += 1
            self.sock.sendall(_message(ofp.OFPT_ERROR, xid, struct.pack(
                "!HH", ofp.OFPET_BAD_ACTION, ofp.OFPBAC_BAD_OUT_PORT) + msg))


def test_hybrid_mode_names_a_switch_that_refuses_normal_at_connect(tmp_path: Path) -> None:
    secret = write_secret(tmp_path / "secret")
    of_port, rest_port = listen_port(), listen_port()
    log_path = tmp_path / "controller.log"
    with open(log_path, "wb") as log:
        argv = [sys.executable, "-m", "controller.launcher", "--secret-file", str(secret),
                "--of-port", str(of_port), "--rest-port", str(rest_port), "--mode", "hybrid"]
        proc = subprocess.Popen(argv, cwd=ROOT, stdout=log, stderr=log)
    try:
        api = ApiClient(f"http://127.0.0.1:{rest_port}", load_secret(secret), timeout=5)
        deadline = time.monotonic() + 30
        while True:   # REST answers, then os-ken opens the OpenFlow port
            try:
                api.call(REST.tree)
                switch = RefusingSwitch(of_port)
                break
            except (ApiError, ConnectionRefusedError):
                assert time.monotonic() < deadline and proc.poll() is None, log_path.read_text()
                time.sleep(0.2)
        events: list[dict] = []
        while not events:
            switch.serve(0.5)
            events = [e for e in api.call(REST.events).events if e["event"] == "normal-refused"]
            assert time.monotonic() < deadline + 30, log_path.read_text()
        assert switch.refused >= 1
        (event,) = events
        assert event["switch"] == f"{SWITCH_NAME.decode()} (dpid {DPID})", event
        assert event["error"] == f"type {ofp.OFPET_BAD_ACTION} code {ofp.OFPBAC_BAD_OUT_PORT}"
    finally:
        proc.send_signal(signal.SIGTERM)
        code = proc.wait(15)
    text = log_path.read_text()
    assert code == 0, text
    name = SWITCH_NAME.decode()
    assert f"ERROR metaflow.controller: normal-refused switch={name} (dpid {DPID})" in text, text
