"""The controller's liveness logic (controller.liveness.Liveness, Registry.silent), without sockets."""

from __future__ import annotations

from client_lib.api.rest import Heartbeat, Registration
from client_lib.cidr import Block
from client_lib.liveness import ACK, NUDGE, LivenessKey, decode_reply, encode_beat, state_digest
from controller.liveness import ACK_EVERY_S, OUTCOMES, Liveness
from controller.registry import Registry

SECRET = b"k" * 32
KEY = LivenessKey(SECRET)
SPACE = Block.parse("100.64.0.0/10")
OWN = [Block.parse("100.64.0.0/11")]
WALL = 1_800_000_000.0


class World:
    """A registry, a leadership and two clocks the test moves."""

    def __init__(self) -> None:
        self.registry = Registry(SPACE)
        self.leads = True
        self.now = 100.0
        self.liveness = Liveness(SECRET, lambda: self.registry, lambda: self.leads, lambda: 4,
                                 clock=lambda: self.now, wall=lambda: WALL)
        self.registry.heard = self.liveness.heard
        self.seq = int(WALL * 1e6)

    def register(self, name: str) -> None:
        reg = Registration(name, f"10.0.0.{len(self.registry.servers) + 1}", "02:00:00:00:00:01", 9000,
                           f"http://{name}:9001", "leveldb", 1000, SPACE, OWN)
        self.registry.register(reg, self.now)

    def beat(self, name: str, digest: bytes | None = None, keys: int = 7) -> tuple[str, int | None]:
        self.seq += 1
        data = encode_beat(KEY, name, self.seq, state_digest(OWN, [], []) if digest is None else digest, keys)
        outcome, reply, _ = self.liveness.take(data)
        assert outcome in OUTCOMES
        return outcome, None if reply is None else decode_reply(reply, KEY, WALL).kind


def test_a_registered_server_is_heard_and_acked_and_the_sweep_sees_it() -> None:
    w = World()
    w.register("s1")
    w.register("s2")
    w.now = 101.5
    assert w.beat("s1", keys=7) == ("accepted", ACK)
    w.now = 101.7   # the next beat counts too, but its ACK waits (ACK_EVERY_S): half the replies
    assert w.beat("s1", keys=42) == ("accepted", None)
    w.now = 101.5 + ACK_EVERY_S
    assert w.beat("s1", keys=42) == ("accepted", ACK)
    w.now = 102.2   # s1 heard 0.3 s ago by datagram, s2 at registration 2.2 s ago
    w.registry.catch_up()
    silent = w.registry.silent(w.now, 1.0)
    assert [s.name for s in silent] == ["s2"]
    s1 = w.registry["s1"]
    assert (s1.last_seen, s1.keys) == (101.5 + ACK_EVERY_S, 42)


def test_an_http_heartbeat_newer_than_the_datagram_wins() -> None:
    w = World()
    w.register("s1")
    w.beat("s1", keys=5)
    w.now = 103.0
    w.registry.heartbeat("s1", Heartbeat(9, OWN, []), w.now)
    w.registry.catch_up()
    assert (w.registry["s1"].last_seen, w.registry["s1"].keys) == (103.0, 9)


def test_unknown_failed_standby_and_stale_state_are_nudged() -> None:
    w = World()
    assert w.beat("nobody") == ("unknown", NUDGE)
    w.register("s1")
    assert w.beat("s1", digest=state_digest(OWN, OWN, [])) == ("stale", NUDGE)   # alive, state newer
    assert w.liveness.heard["s1"][0] == w.now
    w.registry.heartbeat("s1", Heartbeat(0, OWN, OWN), w.now)   # the HTTP heartbeat brings the state
    assert w.beat("s1", digest=state_digest(OWN, OWN, [])) == ("accepted", ACK)
    w.leads = False
    assert w.beat("s1", digest=state_digest(OWN, OWN, [])) == ("standby", NUDGE)
    w.leads = True
    w.registry["s1"].failed = "no heartbeat for 1.2 s"
    heard = w.liveness.heard["s1"]
    w.now += 5
    assert w.beat("s1") == ("failed", NUDGE)
    assert w.liveness.heard["s1"] == heard   # a failed server's beats do not count


def test_refused_datagrams_get_no_reply_and_replays_are_caught_per_name() -> None:
    w = World()
    w.register("s1")
    data = encode_beat(KEY, "s1", w.seq + 10, state_digest(OWN, [], []))
    outcome, reply, name = w.liveness.take(data)
    assert (outcome, name) == ("accepted", "s1") and reply is not None
    assert w.liveness.take(data) == ("replay", None, "")
    forged = encode_beat(LivenessKey(b"x" * 32), "s1", w.seq + 20, state_digest(OWN, [], []))
    assert w.liveness.take(forged)[:2] == ("signature", None)
    assert w.liveness.take(b"junk")[:2] == ("malformed", None)
