"""The client's idle pool: bounded, and past the bound it closes the least
recently used single connection, not every connection to an address."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from client_lib.client import _IdlePool


class Conn:
    """A stand-in connection that remembers being closed (the pool is pure)."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.closed = False

    def close(self) -> None:
        assert not self.closed, f"{self.name} closed twice"
        self.closed = True


def test_one_more_than_the_limit_closes_one_connection_not_the_address() -> None:
    """The issue's case: 65 connections to one address came back (a burst of
    parallel requests) with max_idle=64; the pool emptied to 0."""
    pool: _IdlePool[Conn] = _IdlePool(64, Conn.close)
    conns = [Conn(f"c{i}") for i in range(65)]
    for conn in conns:
        pool.give("100.64.0.1", conn)
    assert [c for c in conns if c.closed] == [conns[0]]  # the least recently returned
    assert len(pool) == 64
    taken = [pool.take("100.64.0.1") for _ in range(64)]
    assert taken == conns[:0:-1]  # most recent first: the likeliest still open
    assert pool.take("100.64.0.1") is None and len(pool) == 0


def test_eviction_is_least_recently_used_across_addresses() -> None:
    pool: _IdlePool[Conn] = _IdlePool(3, Conn.close)
    a1, b1, a2, c1 = Conn("a1"), Conn("b1"), Conn("a2"), Conn("c1")
    for address, conn in (("a", a1), ("b", b1), ("a", a2), ("c", c1)):
        pool.give(address, conn)
    assert a1.closed and not (b1.closed or a2.closed or c1.closed)
    assert pool.take("a") is a2 and pool.take("a") is None
    pool.give("b", Conn("b2"))
    pool.give("d", Conn("d1"))  # 4 idle now: b1 is the oldest
    assert b1.closed and len(pool) == 3


def test_limit_zero_keeps_nothing_and_drain_hands_everything_back() -> None:
    empty: _IdlePool[Conn] = _IdlePool(0, Conn.close)
    conn = Conn("x")
    empty.give("a", conn)
    assert conn.closed and len(empty) == 0 and empty.take("a") is None
    pool: _IdlePool[Conn] = _IdlePool(10, Conn.close)
    conns = [Conn(str(i)) for i in range(5)]
    for i, c in enumerate(conns):
        pool.give("ab"[i % 2], c)
    assert sorted(c.name for c in pool.drain()) == [c.name for c in conns]
    assert len(pool) == 0 and pool.take("a") is None and not any(c.closed for c in conns)


@given(st.integers(0, 6), st.lists(st.tuples(st.booleans(), st.sampled_from("abc")), max_size=60))
def test_matches_a_list_model(limit: int, ops: list[tuple[bool, str]]) -> None:
    """Against the obvious model (one list, oldest first): the same connections
    idle, the same ones closed, whatever the interleaving of takes and gives."""
    pool: _IdlePool[Conn] = _IdlePool(limit, Conn.close)
    model: list[tuple[str, Conn]] = []
    closed: list[Conn] = []
    for n, (give, address) in enumerate(ops):
        if give:
            conn = Conn(f"{address}{n}")
            pool.give(address, conn)
            model.append((address, conn))
            while len(model) > limit:
                closed.append(model.pop(0)[1])
        else:
            mine = [i for i, (a, _) in enumerate(model) if a == address]
            expected = model.pop(mine[-1])[1] if mine else None
            assert pool.take(address) is expected
        assert len(pool) == len(model)
        assert [c for c in closed if not c.closed] == []
    assert {c.name for c in pool.drain()} == {c.name for _, c in model}
    assert all(not c.closed for _, c in model)
