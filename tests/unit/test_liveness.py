"""The liveness datagram codec (client_lib.liveness): round trips and every refusal."""

from __future__ import annotations

import pytest

from client_lib.cidr import Block
from client_lib.errors import InvalidArgument, MetaFlowError
from client_lib.liveness import (
    ACK,
    BEAT,
    HEADER,
    MAX_DATAGRAM,
    NUDGE,
    REASONS,
    TAG_BYTES,
    LivenessError,
    LivenessKey,
    Sequence,
    decode_beat,
    decode_reply,
    encode_beat,
    encode_reply,
    state_digest,
)

KEY = LivenessKey(b"s" * 32)
NOW = 1_800_000_000.0
SEQ = int(NOW * 1e6)
DIGEST = state_digest([Block.parse("100.64.0.0/11")], [], [])


def refused(data: bytes, reason: str, **kw: object) -> LivenessError:
    with pytest.raises(LivenessError) as info:
        decode_beat(data, kw.pop("key", KEY), kw.pop("now", NOW), **kw)  # type: ignore[arg-type]
    assert info.value.reason == reason and info.value.reason in REASONS
    return info.value


def test_round_trip_carries_every_field_and_is_small() -> None:
    data = encode_beat(KEY, "s001", SEQ, DIGEST, keys=12345, term=7)
    assert len(data) == HEADER.size + 4 + TAG_BYTES == 57
    beat = decode_beat(data, KEY, NOW)
    assert (beat.kind, beat.name, beat.seq, beat.term, beat.keys, beat.digest) == \
           (BEAT, "s001", SEQ, 7, 12345, DIGEST)
    assert beat.sent == pytest.approx(NOW)


def test_replies_echo_the_beat_and_kinds_do_not_cross() -> None:
    beat = decode_beat(encode_beat(KEY, "s001", SEQ, DIGEST), KEY, NOW)
    for kind in (ACK, NUDGE):
        reply = encode_reply(KEY, kind, beat, term=3)
        got = decode_reply(reply, KEY, NOW)
        assert (got.kind, got.name, got.seq, got.term) == (kind, "s001", SEQ, 3)
        refused(reply, "malformed")   # a reply is no beat
    with pytest.raises(LivenessError):
        decode_reply(encode_beat(KEY, "s001", SEQ, DIGEST), KEY, NOW)
    with pytest.raises(LivenessError) as info:   # an old beat's reply
        decode_reply(encode_reply(KEY, ACK, beat), KEY, NOW, last_seq={"s001": SEQ})
    assert info.value.reason == "replay"
    with pytest.raises(InvalidArgument):
        encode_reply(KEY, BEAT, beat)


def test_a_different_secret_or_any_changed_byte_is_refused() -> None:
    data = encode_beat(KEY, "s001", SEQ, DIGEST)
    refused(data, "signature", key=LivenessKey(b"t" * 32))
    for i in range(4, len(data) - 1):   # every byte after the magic/version/kind, tag included
        flipped = bytearray(data)
        flipped[i] ^= 0x01
        with pytest.raises(LivenessError) as info:
            decode_beat(bytes(flipped), KEY, NOW)
        assert info.value.reason in ("signature", "malformed")


def test_malformed_and_oversized() -> None:
    data = encode_beat(KEY, "s001", SEQ, DIGEST)
    refused(b"", "malformed")
    refused(data[:-1], "malformed")
    refused(b"XX" + data[2:], "malformed")
    refused(data[:2] + b"\x09" + data[3:], "malformed")   # another version
    refused(data + b"\x00", "malformed")                  # length does not match the name's
    refused(bytes(MAX_DATAGRAM + 1), "oversized")
    assert isinstance(refused(data[:10], "malformed"), (MetaFlowError, ValueError))


def test_replay_is_refused_and_a_newer_beat_accepted() -> None:
    data = encode_beat(KEY, "s001", SEQ, DIGEST)
    refused(data, "replay", last_seq={"s001": SEQ})
    refused(data, "replay", last_seq={"s001": SEQ + 1})
    assert decode_beat(data, KEY, NOW, last_seq={"s001": SEQ - 1, "s002": SEQ + 9}).seq == SEQ


def test_far_skewed_datagram_is_refused() -> None:
    data = encode_beat(KEY, "s001", SEQ, DIGEST)
    refused(data, "skew", now=NOW + 61)
    refused(data, "skew", now=NOW - 61)
    assert decode_beat(data, KEY, NOW + 5, window=10).name == "s001"
    refused(data, "skew", now=NOW + 11, window=10)


def test_encoder_refuses_what_no_receiver_takes() -> None:
    with pytest.raises(InvalidArgument):
        encode_beat(KEY, "", SEQ, DIGEST)
    with pytest.raises(InvalidArgument):
        encode_beat(KEY, "x" * 256, SEQ, DIGEST)
    with pytest.raises(InvalidArgument):
        encode_beat(KEY, "s001", SEQ, b"short")
    with pytest.raises(InvalidArgument):
        encode_beat(KEY, "s001", -1, DIGEST)
    with pytest.raises(InvalidArgument):
        encode_beat(KEY, "s001", SEQ, DIGEST, keys=1 << 64)
    longest = encode_beat(KEY, "é" * 127, SEQ, DIGEST)   # 254 bytes of UTF-8
    assert len(longest) <= MAX_DATAGRAM and decode_beat(longest, KEY, NOW).name == "é" * 127


def test_sequence_strictly_increases_even_when_the_clock_does_not() -> None:
    times = iter([100.0, 100.0, 99.0, 101.0])
    seq = Sequence(lambda: next(times))
    got = [seq.next() for _ in range(4)]
    assert got == [100_000_000, 100_000_001, 100_000_002, 101_000_000]


def test_state_digest_follows_the_blocks_not_the_key_count() -> None:
    a, b = Block.parse("100.64.0.0/11"), Block.parse("100.96.0.0/11")
    assert state_digest([a], [], []) != state_digest([a], [a], [])
    assert state_digest([a], [], []) != state_digest([a], [], [a])
    assert state_digest([a, b], [], []) != state_digest([a], [b], [])
    assert state_digest([a], [], []) == state_digest([a], [], [])
