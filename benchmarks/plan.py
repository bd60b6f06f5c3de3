"""`metaflowctl plan`: grow a MetaFlow deployment in simulation and report its flow tables.

Builds the topology, maps it onto the B-tree with the same classifier the
controller uses, inserts N keys with capacity-driven splits (key counts from a
sorted list play the agents' part as the oracle), applies every change through
the incremental flow planner, and finally checks every MetaDataID of the space
through the fake network from every switch that has hosts.
"""

from __future__ import annotations

import gc
import random
import statistics
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

from sortedcontainers import SortedList
from tqdm import tqdm

from btree.fake_network import FakeNetwork, misdelivered
from btree.flows import DEFAULT_TABLE_BUDGET, FlowPlanner
from btree.merge import apply_merge, plan_merge
from btree.split import SplitBounds, apply_split, plan_split
from btree.tree import LogicalBTree, State
from client_lib.cidr import Block
from topology.builders import TOPOLOGIES, fat_tree, paper_testbed, three_tier, two_tier
from topology.classify import map_topology

from .keysets import skewed_ids, uniform_ids

VARIANTS = {
    # name: (split method, forced bounds or None, minimal tables)
    "paper": ("traversal", None, False),
    "exact50": ("traversal", SplitBounds(0.5, 0.5), False),
    "optimized": ("aligned", None, True),
}


@dataclass
class PlanConfig:
    topology: str = "fattree"
    k: int = 32
    servers: int | None = 2000
    core: int = 1
    agg: int = 2
    edges: int = 10
    servers_per_edge: int = 20
    edge_uplinks: int = 1
    keys: int | None = None          # default: 0.7 x servers x capacity
    capacity: int = 1000
    bounds: SplitBounds = field(default_factory=SplitBounds)
    variant: str = "optimized"
    keys_dist: str = "uniform"
    bootstrap: str = "preallocate"   # organic | preallocate | preallocate:N
    space: str = "0.0.0.0/0"
    seed: int = 1
    progress: bool = True
    merge: bool = True
    """Free a cold busy server (`btree.merge`) for a split that finds no idle one."""
    table_budget: int | None = DEFAULT_TABLE_BUDGET
    """MetaFlow entries any one switch may hold; None: no limit."""


def build_graph(cfg: PlanConfig):
    if cfg.topology == "fattree":
        return fat_tree(cfg.k, servers=cfg.servers)
    if cfg.topology == "three-tier":
        return three_tier(core=cfg.core, agg=cfg.agg, edges=cfg.edges,
                          servers_per_edge=cfg.servers_per_edge, edge_uplinks=cfg.edge_uplinks)
    if cfg.topology == "two-tier":
        return two_tier(core=cfg.core, edges=cfg.edges, servers_per_edge=cfg.servers_per_edge)
    if cfg.topology == "testbed":
        return paper_testbed(servers_per_edge=cfg.servers_per_edge)
    raise ValueError(f"unknown topology {cfg.topology!r}; one of {', '.join(TOPOLOGIES)}")


def bootstrap(tree: LogicalBTree, policy: str) -> None:
    """`organic` (the paper: one leaf owns everything) or `preallocate[:N]`
    (N busy leaves spread over the tree; default half of them, so that every
    edge keeps idle servers for splits and failures under the same parent)."""
    if policy == "organic":
        tree.bootstrap_organic()
        return
    name, _, count = policy.partition(":")
    if name != "preallocate":
        raise ValueError(f"bootstrap must be organic or preallocate[:N], not {policy!r}")
    tree.bootstrap_preallocate(int(count) if count else max(1, len(tree.leaves()) // 2))


class _Timer:
    def __init__(self) -> None:
        self.samples: list[float] = []

    @contextmanager
    def time(self) -> Iterator[None]:
        start = time.perf_counter()
        yield
        self.samples.append(time.perf_counter() - start)

    def summary_ms(self) -> dict[str, float]:
        if not self.samples:
            return {"count": 0, "mean": 0.0, "p99": 0.0, "max": 0.0}
        ordered = sorted(self.samples)
        return {"count": len(ordered), "mean": 1000 * statistics.fmean(ordered),
                "p99": 1000 * ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))],
                "max": 1000 * ordered[-1]}


def run_plan(cfg: PlanConfig) -> dict:
    if cfg.variant not in VARIANTS:
        raise ValueError(f"unknown variant {cfg.variant!r}; one of {', '.join(VARIANTS)}")
    started = time.perf_counter()
    method, forced_bounds, minimize = VARIANTS[cfg.variant]
    bounds = forced_bounds or cfg.bounds
    space = Block.parse(cfg.space)

    graph = build_graph(cfg)
    classification, tree, fabric = map_topology(graph, space)
    servers = len(tree.leaves())
    n_keys = cfg.keys if cfg.keys is not None else int(0.7 * servers * cfg.capacity)
    bar = tqdm(total=n_keys, desc="hashing paths", unit="key", delay=2, disable=not cfg.progress,
               leave=False)
    if cfg.keys_dist == "uniform":
        ids = uniform_ids(n_keys, space, cfg.seed, progress=bar.update)
    elif cfg.keys_dist == "skewed":
        ids = skewed_ids(n_keys, space, cfg.seed)
    else:
        raise ValueError(f"unknown key distribution {cfg.keys_dist!r}; uniform or skewed")
    bar.close()
    random.Random(cfg.seed).shuffle(ids)

    bootstrap(tree, cfg.bootstrap)
    planner = FlowPlanner(tree, fabric, minimize=minimize)
    keys: SortedList[int] = SortedList()

    def oracle(_leaf: str, first: int, last: int) -> int:
        return keys.bisect_right(last) - keys.bisect_left(first)

    def load(leaf: str) -> int:
        return sum(oracle(leaf, b.first, b.last) for b in tree.blocks(leaf))

    counts: dict[str, int] = {}
    cost = planner.cost_of if minimize else None
    fits = planner.keeps(cfg.table_budget)
    split_timer, update_timer = _Timer(), _Timer()
    splits, refused, out_of_bounds, traversal_steps = 0, 0, 0, []
    merges, merged_keys, refused_with_cold, moved_by_splits = 0, 0, 0, 0

    def keys_of(leaf: str) -> int:
        return counts.get(leaf, 0)
    full_servers: set[str] = set()
    switches_touched: list[int] = []
    refusal_reasons: dict[str, int] = {}
    group_layer = {sw.group: sw.layer for sw in fabric.switches.values() if sw.group}
    splits_by_layer = {"edge": 0, "agg": 0, "core": 0}
    gc.disable()  # no cycles are made here; gen-2 sweeps over millions of keys distort timings
    for ident in tqdm(ids, desc=f"inserting ({cfg.variant})", unit="key", delay=2,
                      disable=not cfg.progress, leave=False, mininterval=0.5):
        keys.add(ident)
        owner = tree.owner(ident)
        count = counts.get(owner, 0) + 1
        counts[owner] = count
        if count < cfg.capacity or owner in full_servers:
            continue
        with split_timer.time():
            plan = plan_split(tree, owner, oracle, bounds, method, cost, fits=fits)
            if plan.wants_room and cfg.merge:
                merge = plan_merge(tree, owner, keys_of, cfg.capacity, fits=fits)
                if merge.ok:
                    assert merge.source is not None and merge.target is not None
                    moves = apply_merge(tree, merge)
                    with update_timer.time():
                        planner.update(moves)
                    merges += 1
                    merged_keys += merge.keys
                    counts[merge.target] = keys_of(merge.target) + merge.keys
                    counts[merge.source] = 0
                    plan = plan_split(tree, owner, oracle, bounds, method, cost, fits=fits)
        if not plan.ok:
            refused += 1
            refused_with_cold += min((keys_of(leaf) for leaf in tree.leaves_in(State.BUSY)),
                                     default=cfg.capacity) < bounds.low * cfg.capacity
            full_servers.add(owner)  # stays over capacity; do not retry on every key
            refusal_reasons[plan.reason] = refusal_reasons.get(plan.reason, 0) + 1
            continue
        target = plan.target
        assert target is not None   # an accepted plan names its target
        moves = apply_split(tree, plan)
        with update_timer.time():
            diff = planner.update(moves)
        switches_touched.append(len(diff))
        splits += 1
        moved_by_splits += plan.keys_moved
        splits_by_layer[group_layer[tree.lca(plan.leaf, target)]] += 1
        out_of_bounds += not plan.within_bounds
        traversal_steps.append(plan.iterations)
        counts[plan.leaf], counts[target] = load(plan.leaf), load(target)

    gc.enable()
    tree.check()
    verify_start = time.perf_counter()
    verified, checked_from = verify(tree, fabric, planner, space)
    verify_seconds = time.perf_counter() - verify_start
    rebuild_start = time.perf_counter()
    planner.rebuild()
    for dpid in fabric.switches:   # write out every switch's entries, then let them go
        planner.table(dpid)
    rebuild_seconds = time.perf_counter() - rebuild_start

    busy = tree.leaves_in(State.BUSY)
    loads = [load(leaf) for leaf in busy]
    layers = planner.layer_stats()
    return {
        "topology": graph.graph.get("name", cfg.topology),
        "variant": cfg.variant,
        "split_method": method,
        "tables": "minimal (ORTC)" if minimize else "plain prefix cover",
        "keys_dist": cfg.keys_dist,
        "bootstrap": cfg.bootstrap,
        "space": str(space),
        "bounds": [bounds.low, bounds.high],
        "keys": n_keys,
        "capacity": cfg.capacity,
        "servers": servers,
        "switches": len(fabric.switches),
        "layers": {name: {k: round(v, 2) for k, v in stats.items()}
                   for name, stats in sorted(layers.items())},
        "total_entries": planner.total_entries(),
        "splits": splits,
        "splits_out_of_bounds": out_of_bounds,
        "splits_by_common_ancestor": splits_by_layer,
        "splits_refused": refused,
        "table_budget": cfg.table_budget,
        "splits_refused_with_a_server_under_low": refused_with_cold,
        "merges": merges,
        "keys_moved_by_merges": merged_keys,
        "keys_moved_by_splits": moved_by_splits,
        "refusal_reasons": refusal_reasons,
        "traversal_steps_mean": round(statistics.fmean(traversal_steps), 2) if traversal_steps else 0,
        "busy_servers": len(busy),
        "idle_servers": len(tree.leaves_in(State.IDLE)),
        "over_capacity": sum(1 for x in loads if x > cfg.capacity),
        "keys_per_busy_server": {"min": min(loads), "mean": round(statistics.fmean(loads), 1),
                                 "max": max(loads),
                                 "max_over_mean": round(max(loads) / statistics.fmean(loads), 2)},
        "blocks": len(tree.partition()),
        "verified": verified,
        "verified_from_switches": checked_from,
        "split_plan_ms": split_timer.summary_ms(),
        "incremental_update_ms": update_timer.summary_ms(),
        "switches_touched_per_split": {
            "mean": round(statistics.fmean(switches_touched), 2) if switches_touched else 0,
            "max": max(switches_touched, default=0)},
        "full_generation_seconds": round(rebuild_seconds, 3),
        "verify_seconds": round(verify_seconds, 3),
        "seconds": round(time.perf_counter() - started, 2),
    }


def verify(tree: LogicalBTree, fabric, planner: FlowPlanner, space: Block) -> tuple[bool, int]:
    """Every ID of the space, from every switch with hosts, through the fake network."""
    ingress = sorted({dpid for dpid, _ in fabric.hosts.values()})
    wrong = misdelivered(FakeNetwork.from_planner(planner), tree.partition(), space, ingress)
    return not wrong, len(ingress)


def format_report(r: dict) -> str:
    lines = [
        f"MetaFlow plan: {r['topology']}, {r['servers']} servers, {r['switches']} switches, "
        f"space {r['space']}",
        f"  variant {r['variant']} (split: {r['split_method']} {r['bounds'][0]:.0%}-"
        f"{r['bounds'][1]:.0%}, tables: {r['tables']}), keys {r['keys']:,} {r['keys_dist']}, "
        f"capacity {r['capacity']:,}, bootstrap {r['bootstrap']}, table budget "
        f"{r['table_budget'] if r['table_budget'] is not None else 'none'}",
        "",
        f"  {'layer':<8}{'switches':>9}{'mean':>9}{'max':>7}{'up-rules':>10}",
    ]
    for name in ("edge", "agg", "core", "client"):
        if name in r["layers"]:
            s = r["layers"][name]
            lines.append(f"  {name:<8}{s['switches']:>9}{s['mean']:>9.1f}{s['max']:>7}"
                         f"{s['uprules_mean']:>10.1f}")
    kps = r["keys_per_busy_server"]
    upd = r["incremental_update_ms"]
    lines += [
        "",
        f"  MetaFlow entries in the network: {r['total_entries']:,} "
        f"(per-switch figures above exclude the default up-rules); the largest table "
        f"{max((s['max'] for s in r['layers'].values()), default=0)}",
        f"  splits {r['splits']} (outside bounds {r['splits_out_of_bounds']}, refused "
        f"{r['splits_refused']}), busy servers {r['busy_servers']}, idle {r['idle_servers']}, "
        f"over capacity {r['over_capacity']}",
        f"  keys per busy server: min {kps['min']:,}, mean {kps['mean']:,}, max {kps['max']:,} "
        f"(max/mean {kps['max_over_mean']})",
        f"  merges {r['merges']} (keys moved {r['keys_moved_by_merges']:,}); keys moved by splits "
        f"{r['keys_moved_by_splits']:,}; against {r['keys']:,} inserted: "
        f"{(r['keys_moved_by_merges'] + r['keys_moved_by_splits']) / max(1, r['keys']):.2f}; refused while a "
        f"server held under {r['bounds'][0]:.0%} of capacity: {r['splits_refused_with_a_server_under_low']}",
        f"  incremental update per split: mean {upd['mean']:.2f} ms, p99 {upd['p99']:.2f} ms, "
        f"max {upd['max']:.2f} ms, switches touched mean "
        f"{r['switches_touched_per_split']['mean']}",
        f"  full flow generation {r['full_generation_seconds']:.3f} s; every ID verified from "
        f"{r['verified_from_switches']} switches: {'yes' if r['verified'] else 'NO'}",
        f"  seconds {r['seconds']}",
    ]
    reasons = sorted(r["refusal_reasons"].items(), key=lambda item: -item[1])
    for reason, n in reasons[:5]:
        lines.append(f"  refused x{n}: {reason}")
    if len(reasons) > 5:
        rest = sum(n for _, n in reasons[5:])
        lines.append(f"  ... and {rest} refusals for {len(reasons) - 5} other reasons")
    return "\n".join(lines)
