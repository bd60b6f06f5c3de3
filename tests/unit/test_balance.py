"""btree.balance: Lunule's imbalance factor and the greedy transfer plan."""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from btree.balance import (
    ImbalanceModel,
    coefficient_of_variation,
    imbalance_factor,
    transfers,
    urgency,
)

loads_lists = st.lists(st.floats(0, 1e6, allow_nan=False), min_size=2, max_size=64)


def test_one_server_taking_everything_is_the_most_imbalanced() -> None:
    n = 8
    loads = [1000.0] + [0.0] * (n - 1)
    assert coefficient_of_variation(loads) / math.sqrt(n) == pytest.approx(1.0)
    assert imbalance_factor(loads, capacity=1000) == pytest.approx(urgency(1000, 1000))
    assert imbalance_factor([500.0] * n, capacity=1000) == 0


def test_urgency_is_half_at_half_capacity_and_tolerates_light_load() -> None:
    assert urgency(500, 1000) == pytest.approx(0.5)
    assert urgency(50, 1000) < 0.02 < 0.98 < urgency(950, 1000)
    # benign: very uneven, but everyone far under capacity
    assert imbalance_factor([100.0, 0.0, 0.0, 0.0], capacity=10_000) < 0.01
    with pytest.raises(ValueError):
        urgency(1, 0)


@given(loads_lists, st.floats(1, 1e6))
def test_the_factor_lies_in_zero_one_and_grows_with_the_busiest_servers_load(loads: list[float],
                                                                          capacity: float) -> None:
    factor = imbalance_factor(loads, capacity)
    assert 0 <= factor <= 1 + 1e-9
    assert urgency(max(loads), capacity) <= urgency(max(loads) * 2 + 1, capacity)


def test_the_model_acts_only_after_hold_polls_in_a_row() -> None:
    model = ImbalanceModel(capacity=1000, threshold=0.1, hold=2)
    hot = {"a": 900.0, "b": 100.0, "c": 100.0}
    calm = {"a": 300.0, "b": 300.0, "c": 300.0}
    assert model.factor(hot) > 0.1 > model.factor(calm)
    assert not model.should_rebalance([hot])
    assert not model.should_rebalance([hot, calm])
    assert model.should_rebalance([calm, hot, hot])


@given(st.dictionaries(st.text("abcdefgh", min_size=1, max_size=3), st.floats(0, 1e5, allow_nan=False),
                       min_size=1, max_size=20),
       st.floats(0, 1e5))
def test_transfers_never_cross_the_mean_nor_the_limit(loads: dict[str, float], limit: float) -> None:
    plan = transfers(loads, limit)
    mean = sum(loads.values()) / len(loads)
    after = dict(loads)
    moved_out = {n: 0.0 for n in loads}
    moved_in = {n: 0.0 for n in loads}
    for t in plan:
        assert t.load > 0 and loads[t.source] > mean > loads[t.target]
        after[t.source] -= t.load
        after[t.target] += t.load
        moved_out[t.source] += t.load
        moved_in[t.target] += t.load
    tolerance = 1e-6 * max(1.0, mean)
    for name, value in after.items():
        if loads[name] >= mean:
            assert value >= mean - tolerance   # an exporter ships at most its excess
        else:
            assert value <= mean + tolerance   # an importer takes at most its deficit
        assert moved_out[name] <= limit + tolerance and moved_in[name] <= limit + tolerance
    # with no limit, everything above the mean finds room below it
    if math.isinf(limit) or limit >= max(loads.values(), default=0):
        assert all(v == pytest.approx(mean, abs=tolerance) or loads[n] < mean for n, v in after.items())


def test_the_hottest_ships_to_the_coolest_first() -> None:
    plan = transfers({"hot": 1000.0, "warm": 600.0, "cool": 200.0, "cold": 0.0}, limit=10_000)
    assert plan[0].source == "hot" and plan[0].target == "cold"
    assert sum(t.load for t in plan if t.source == "hot") == pytest.approx(550.0)   # down to the mean, 450
