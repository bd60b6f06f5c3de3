"""Several controllers and one leader, from the agent's side, without I/O:
which controller to talk to next, and the term fence."""

from __future__ import annotations

import pytest

from client_lib.api.leaders import Leaders, controller_urls, moves_on
from client_lib.errors import ApiError, AuthError, Conflict, InvalidArgument, NotLeader
from nat_agent.fence import StaleTerm, TermFence

A, B, C, X = "http://10.255.0.1:8080", "http://10.255.0.2:8080", "http://10.255.0.3:8080", "http://10.9.9.9:8080"


def test_controller_urls_are_split_checked_and_deduplicated() -> None:
    assert controller_urls(A) == [A]
    assert controller_urls(f" {A}/ ,{B},{A}") == [A, B]
    assert controller_urls([A, f"{B},{C}"]) == [A, B, C]
    for bad in ("", ",", "10.255.0.1:8080", f"{A},https://x:1", "http://:8080"):
        with pytest.raises(InvalidArgument, match="--controller"):
            controller_urls(bad)


def test_only_no_answer_or_not_leader_moves_on() -> None:
    assert moves_on(ApiError("timed out")) and moves_on(NotLeader("standby"))
    assert not moves_on(ApiError("HTTP 500", 500))
    assert not moves_on(Conflict("bound", 409)) and not moves_on(AuthError("secret", 401))


def test_rotation_goes_round_in_order() -> None:
    leaders = Leaders([A, B, C])
    assert leaders.current == A and leaders.several
    assert [leaders.move() for _ in range(4)] == [B, C, A, B]


def test_a_named_leader_is_followed_and_then_the_order_resumes() -> None:
    leaders = Leaders([A, B, C])
    assert leaders.move(C + "/") == C            # a listed one: jump there
    assert leaders.move() == A                   # and continue after it
    assert leaders.move(X) == X                  # a leader we were not given is followed too
    assert leaders.move() == B                   # it failed: the URL after the one that named it
    assert leaders.move(B) == C                  # naming itself is no leader to follow
    assert leaders.move(None) == A


def test_one_url_is_todays_single_controller() -> None:
    leaders = Leaders([A])
    assert not leaders.several
    assert leaders.move() == A and leaders.move(A) == A
    assert leaders.move(X) == X and leaders.move() == A
    with pytest.raises(InvalidArgument):
        Leaders([])


def test_the_fence_refuses_older_terms_and_keeps_the_highest() -> None:
    fence = TermFence()
    assert fence.admit(None, "x") is False and fence.admit(0, "x") is False and fence.term == 0
    assert fence.admit(5, "assign") is True and fence.term == 5
    assert fence.admit(5, "assign") is False
    with pytest.raises(StaleTerm, match=r"POST /assign: from an older leader: term 3 < 5") as caught:
        fence.admit(3, "POST /assign")
    assert isinstance(caught.value, Conflict) and caught.value.status == 409 and fence.term == 5
    assert fence.admit(None, "metaflowctl") is False and fence.admit(0, "one controller") is False
    assert fence.admit(7, "x") is True and fence.term == 7
    assert TermFence(7).term == 7
    with pytest.raises(ValueError):
        TermFence(-1)
