"""What a lookup RPC's reply must look like before the baselines use it."""

from __future__ import annotations

import pytest

from benchmarks.baselines.rpc import RpcError, expect, located
from client_lib.resp import ErrorReply, SimpleString


def test_a_lookup_answer_is_checked_field_by_field() -> None:
    assert located("s1", [b"10.0.0.1", 2, b"chord"]) == (b"10.0.0.1", 2, b"chord")
    assert located("s1", [None, 0, b"miss"]) == (None, 0, b"miss")
    for bad in ([b"10.0.0.1", b"2", b"chord"], [b"10.0.0.1", 2], b"10.0.0.1", None,
                SimpleString("OK"), ErrorReply("ERR x"), [b"ip", 1, b"level", b"extra"]):
        with pytest.raises(RpcError, match="s1: not a lookup answer"):
            located("s1", bad)


def test_expect_names_the_peer_and_the_type() -> None:
    assert expect("s2", [b"a"], list) == [b"a"]
    with pytest.raises(RpcError, match=r"s2: expected a bytes reply, got 7"):
        expect("s2", 7, bytes)
