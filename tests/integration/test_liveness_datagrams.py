"""Liveness by datagram between a real agent and a real controller process.

The agent learns the controller's UDP port from its registration and beats
by signed datagram (the controller counts them); datagrams the test forges
or replays are refused and counted, with no reply; one from a name the
controller does not know is nudged; and an HTTP heartbeat that changes
the server's state still reaches the controller: the agent's next beats
no longer match it ("stale"), the controller nudges the agent, and the
agent's own HTTP heartbeat puts its real state back.
"""

from __future__ import annotations

import socket
import time
from collections.abc import Callable
from pathlib import Path

from benchmarks.liveness import controller, datagram_counts
from client_lib.api.clients import ApiClient
from client_lib.api.rest import REST, Heartbeat
from client_lib.cidr import Block
from client_lib.liveness import NUDGE, LivenessKey, Sequence, decode_reply, encode_beat, state_digest
from mininet_scenarios.daemons import AgentProcess

OWN = Block.parse("100.64.0.0/12")


def _until(condition: Callable[[], bool], timeout: float = 15.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out waiting"
        time.sleep(0.1)


def test_an_agent_beats_by_datagram_and_forgeries_replays_and_state_changes_are_handled(
        tmp_path: Path) -> None:
    with controller(tmp_path) as ctl:
        secret_file = tmp_path / "secret"
        api = ApiClient(ctl["url"], ctl["secret"], timeout=10)
        with AgentProcess(f"leveldb:{tmp_path / 'db'}", "--controller", ctl["url"], "--heartbeat", "0.2",
                          "--liveness-datagrams", "--data-ip", "127.0.0.1", own=[str(OWN)],
                          log_path=tmp_path / "agent.log", secret_file=secret_file) as agent:
            counts = lambda: datagram_counts(ctl["metrics"])   # noqa: E731
            _until(lambda: counts().get("accepted", 0) >= 10)   # about 2 s of beats, by datagram
            assert api.call(REST.servers).servers[agent.name].blocks == [OWN]

            # Forged, replayed, unknown: from the test's own socket, to the port the agent was told.
            port = int(ctl["url"].rsplit(":", 1)[1])
            sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
            sock.settimeout(2)
            seq = Sequence()
            forged = encode_beat(LivenessKey(b"not the cluster secret!!"), agent.name, seq.next(),
                                 state_digest([OWN], [], []))
            key = LivenessKey(ctl["secret"])
            ghost = encode_beat(key, "ghost", seq.next(), state_digest([], [], []))
            before = counts()
            sock.sendto(forged, ("127.0.0.1", port))
            sock.sendto(ghost, ("127.0.0.1", port))
            nudge = decode_reply(sock.recv(512), key, time.time())   # only the ghost is answered
            assert (nudge.kind, nudge.name) == (NUDGE, "ghost")
            sock.sendto(ghost, ("127.0.0.1", port))   # the same datagram again
            _until(lambda: counts().get("replay", 0) == before.get("replay", 0) + 1)
            after = counts()
            assert after["signature"] == before.get("signature", 0) + 1
            assert after["unknown"] == before.get("unknown", 0) + 1
            sock.settimeout(0.5)
            try:
                extra = sock.recv(512)
            except TimeoutError:
                extra = b""
            assert extra == b"", "a replay or a forgery was answered"
            sock.close()

            # An HTTP heartbeat with another state reaches the controller: the agent's beats are then
            # stale, the controller nudges it, and the agent's HTTP heartbeat brings its state back.
            stale = counts().get("stale", 0)
            api.call(REST.heartbeat, Heartbeat(0, [], []), name=agent.name)
            _until(lambda: counts().get("stale", 0) > stale)
            _until(lambda: api.call(REST.servers).servers[agent.name].blocks == [OWN])
            settled = counts()
            _until(lambda: counts()["accepted"] >= settled["accepted"] + 5)
            assert counts().get("stale", 0) <= settled.get("stale", 0) + 1


def test_an_agent_beating_slower_than_the_ack_wait_stays_on_datagrams(tmp_path: Path) -> None:
    """Beats every 1.5 s, each answered: the last reply is always older than
    `ACK_WAIT_S` when the next beat goes out, which is no silence (the scale
    bench's real agents, beating every 1 s, fell back to HTTP for that)."""
    with controller(tmp_path) as ctl:
        with AgentProcess(f"leveldb:{tmp_path / 'db'}", "--controller", ctl["url"], "--heartbeat", "1.5",
                          "--liveness-datagrams", "--data-ip", "127.0.0.1", own=[str(OWN)],
                          log_path=tmp_path / "agent.log", secret_file=tmp_path / "secret") as agent:
            _until(lambda: datagram_counts(ctl["metrics"]).get("accepted", 0) >= 5, timeout=30)
            assert "no answer to our liveness datagrams" not in agent.log()
