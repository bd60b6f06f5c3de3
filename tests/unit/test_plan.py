"""`metaflowctl plan` end to end on the three-tier testbed with skewed IDs:
with merges no split is refused while a server is under 40 % of capacity,
keys spread within 1.5x of the mean, and every ID of the space still routes
to its owner; without them (the behaviour before), splits are refused
beside empty servers."""

from __future__ import annotations

from benchmarks.plan import PlanConfig, format_report, run_plan


def plan(merge: bool) -> dict:
    return run_plan(PlanConfig(topology="three-tier", capacity=200, keys_dist="skewed", seed=3,
                               progress=False, merge=merge))


def test_merges_free_cold_servers_for_the_splits_that_found_none() -> None:
    merged, static = plan(True), plan(False)
    assert merged["verified"] and static["verified"]
    assert static["splits_refused_with_a_server_under_low"] > 0 and static["merges"] == 0
    assert merged["merges"] > 0 and merged["splits_refused_with_a_server_under_low"] == 0
    assert merged["keys_per_busy_server"]["max_over_mean"] <= 1.5
    assert merged["keys_per_busy_server"]["max_over_mean"] < static["keys_per_busy_server"]["max_over_mean"]
    assert merged["keys_moved_by_merges"] > 0
    text = format_report(merged)
    assert f"merges {merged['merges']} (keys moved {merged['keys_moved_by_merges']:,})" in text
