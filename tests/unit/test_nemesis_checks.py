"""The nemesis's judgements, without a network: who serves what
(`nemesis.ownership_problems`), what a failed attempt says about its effect
(`register_client.outcome`), and the fail-over benchmark's percentiles."""

from __future__ import annotations

from benchmarks.failover import percentile
from client_lib.api.admin import Health, Member, Role
from client_lib.cidr import Block
from client_lib.errors import ServerError, Unavailable
from mininet_scenarios.nemesis import ownership_problems, ranges, serving
from mininet_scenarios.register_client import UniqueKey, outcome, why

SPACE = Block.parse("100.64.0.0/10")
A, B, C, D = (Block.parse(f"100.{64 + 16 * i}.0.0/12") for i in range(4))


def _health(roles: list[Role], suspended: bool = False) -> Health:
    return Health("ok", "a", "leveldb", SPACE, None, None, 9000, "http://x", 10, 0, [], [], [], 0.0,
                  roles, suspended)


def _role(block: Block, primary: bool = True, serving: bool = True) -> Role:
    return Role(block, 3, primary, [Member("a", "x:1"), Member("b", "y:1")], serving)


def test_an_agent_serves_the_blocks_it_is_a_serving_primary_of_unless_suspended() -> None:
    roles = [_role(A), _role(B, primary=False), _role(C, serving=False)]
    assert serving(_health(roles)) == [A]
    assert serving(_health(roles, suspended=True)) == []


def test_ranges_merge_adjacent_blocks_so_different_cuts_of_the_same_ids_compare_equal() -> None:
    assert ranges([*A.halves(), B]) == ranges([A, B]) == [(A.first, B.last)]
    assert ranges([A, C]) == [(A.first, A.last), (C.first, C.last)]


def test_a_consistent_cluster_has_no_problems() -> None:
    served = {"a": [A, B], "b": [*C.halves()], "c": [D]}
    assert ownership_problems(served, {"a": [A, B], "b": [C], "c": [D]}, SPACE) == []


def test_an_id_served_twice_is_found_even_when_the_blocks_differ_in_size() -> None:
    problems = ownership_problems({"a": [A, B, C, D], "b": [C.halves()[1]]},
                                  {"a": [A, B, C, D], "b": []}, SPACE)
    assert any("served by a and" in p and "by b" in p for p in problems)
    assert any(p.startswith("b serves") for p in problems)   # and the controller routes nothing to b


def test_ids_nobody_serves_or_served_against_the_controllers_view_are_problems() -> None:
    problems = ownership_problems({"a": [A, B, C]}, {"a": [A, B, C, D]}, SPACE)
    assert any("not the whole space" in p for p in problems)
    assert any(p.startswith("a serves") for p in problems)


def test_only_a_refusal_before_any_store_work_is_a_failed_attempt() -> None:
    def unavailable(reason: str) -> Unavailable:
        return Unavailable("/k", 1, reason)

    assert outcome(unavailable("MOVED 1234 10.0.0.1:9000")) == "fail"
    assert outcome(unavailable("TRYAGAIN 100.64.0.1 block 100.64.0.0/12 is migrating")) == "fail"
    assert outcome(unavailable("100.64.0.1: [Errno 111] Connect call failed ('100.64.0.1', 9000)")) == "fail"
    # applied here (and maybe by members) before the set failed to acknowledge it
    assert outcome(unavailable("TRYAGAIN 100.64.0.1 write not acknowledged by the set: x")) == "unknown"
    assert outcome(unavailable("TRYAGAIN store unavailable: gone")) == "unknown"
    assert outcome(unavailable("timeout after 0.5 s talking to 100.64.0.1")) == "unknown"
    assert outcome(unavailable("100.64.0.1: server closed the connection")) == "unknown"
    assert outcome(ServerError("ERR internal error")) == "unknown"
    assert why(unavailable("TRYAGAIN 100.64.0.1 block 100.64.0.0/12 is fenced")) == "TRYAGAIN is fenced"


def test_a_unique_key_may_hold_its_last_acknowledged_value_or_one_of_unknown_outcome() -> None:
    key = UniqueKey()
    assert key.acceptable() == {None}
    key.unknown.add("c1-1")
    assert key.acceptable() == {None, "c1-1"}
    key.acked = "c1-2"
    assert key.acceptable() == {"c1-2", "c1-1"}


def test_percentiles_are_nearest_rank() -> None:
    samples = [float(i) for i in range(1, 41)]   # 40 kills' worth
    assert percentile(samples, 0.5) == 20.0
    assert percentile(samples, 0.99) == 40.0     # with fewer than 100 samples, p99 is the max
    assert percentile([3.0], 0.99) == percentile([3.0], 0.0) == 3.0


def test_importing_the_scenarios_leaves_new_loggers_standard() -> None:
    """Mininet's import makes its logger class every new logger's (its own
    handler, a level above INFO); the package puts the standard class back,
    so a logger named afterwards passes INFO records to the root's handlers."""
    import logging

    import mininet.log  # noqa: F401

    import mininet_scenarios  # noqa: F401

    logger = logging.getLogger("metaflow.test.after-mininet")
    assert type(logger) is logging.Logger
    assert not logger.handlers and logger.getEffectiveLevel() == logging.getLogger().getEffectiveLevel()
