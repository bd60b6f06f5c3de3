"""`nat_agent.latency.Latency`: the request path's histogram, as Prometheus reads it."""

from __future__ import annotations

from nat_agent.latency import Latency


def test_observations_land_in_the_first_bucket_at_or_above_them_and_add_up() -> None:
    latency = Latency([0.001, 0.01, 0.1])
    for seconds in (0.0005, 0.001, 0.002, 0.05, 7.0):
        latency.observe(seconds)
    # an observation equal to a bound counts in that bound's bucket (Prometheus' `le`)
    assert latency.cumulative() == [("0.001", 2), ("0.01", 3), ("0.1", 4), ("+Inf", 5)]
    assert abs(latency.total - 7.0535) < 1e-9


def test_an_unobserved_histogram_is_all_zeros() -> None:
    assert Latency([0.5]).cumulative() == [("0.5", 0), ("+Inf", 0)]
