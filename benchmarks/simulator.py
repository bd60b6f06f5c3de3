"""The paper's simulation (Figs. 13 and 15) as a queueing model, calibrated from our benchmark.

Why a model and not an event simulator: the paper's claims are about where
CPU goes. MetaFlow's switches route a request straight to its owner, so an
op costs the storage servers only the store (plus the NAT agent's rewrite);
the baselines also answer lookup RPCs on those same servers, competing with
the store for CPU. A product-form queueing network captures exactly that and
solves 2000 servers x 500 clients in microseconds, so every number below is
reproducible and explainable from a handful of per-op costs.

The network (closed, solved by exact mean value analysis, MVA):

* C clients, each keeping `window` ops in flight (the brief's model is
  window = 1, one op at a time); population P = C x window.
* A delay station (no queueing) per op:
      Z = client_us x exchanges + rtt_us x round_trips
  `exchanges` is 1 + (1 if the scheme has a lookup): the client handles the
  lookup reply and the storage reply (Chord forwards recursively, G-HBA's
  home server multicasts, so the client still sees one lookup exchange);
  `client_us` is calibrated on hash, where an op is one exchange.
* Queueing stations: the N server CPUs. Per op, the storage request goes to
  a uniformly random server (S_st), and every lookup RPC costs S_lk at the
  server that answers it:
      hash      0 lookups,                          1 round trip
      metaflow  0 lookups + nat_us at the owner,    1 round trip
      onehop    1 lookup at a random server,        2 round trips
      central   1 lookup at the one coordinator,    2 round trips
      chord     h(N) lookups at random servers,     1 + h(N) round trips
      ghba      1 + f_group (M-1) + f_global (N-1), 2 + f_group + f_global
  h(N) is the mean RPC count of the real `placement.Chord` lookup over N
  servers, sampled; M(N) is G-HBA's group size (`ghba.group_size_for`, the
  rule our G-HBA uses), and the fractions say how often a lookup climbs to
  the group / global multicast (multicasts go out in parallel: one extra
  round trip each).
  Random targets make the N servers statistically identical: each has demand
      D = (S_st + lookups x S_lk + nat_us) / N
  per op. The central coordinator is one more station with demand
  S_st / N + S_lk (it also stores its share; the other N - 1 keep S_st / N).

MVA recursion for n = 1..P (k identical stations of demand D, one extra of
demand Dx, Q the mean queue lengths, Q(0) = 0):
      R(n)  = D (1 + Q(n-1)),   Rx(n) = Dx (1 + Qx(n-1))
      X(n)  = n / (Z + k R(n) + Rx(n))
      Q(n)  = X(n) R(n),        Qx(n) = X(n) Rx(n)
O(P) per point, exact because the identical stations keep identical queues;
all points of a panel run through the recursion together as numpy vectors.
Throughput is X(P); latency is the cycle time P / X(P) = Z + k R + Rx, i.e.
service and queueing at the servers plus network and client time.

Experiments: the throughput ratio r (lookup / storage throughput on a core)
sets S_lk = S_st / r (Fig. 13, r = 100, 2, 1.5, 1); the latency ratio q sets
the lookup's service time S_lk = q S_st (Fig. 15, q = 0.001, 0.5, 0.7, 1).
Both figures add a "measured" panel at our benchmark's S_lk. The ideal
system scales linearly: N / S_st. Latency is reported relative to hash at the
same N.

Caveat on scale: with window = 1 the 500 clients cannot keep 2000 servers
busy (hash itself stays far below N / S_st); the paper's "maximum number of
operations" is a saturated cluster, which a larger --window approaches.

Calibration (`Calibration.from_bench`) reads `metaflowctl bench`'s JSON; every
field is optional and `Calibration.sources` says which were used. `validate`
reruns the model at the benchmark's size and concurrencies. In our Mininet
emulation clients, servers and Open vSwitch share the machine's few cores, so
`shared_cpu_cores=m` replaces the per-server stations by one station holding
all CPU (server + client + OVS) with m cores, by Seidmann's approximation: a
queue of demand D/m plus a delay of D (m-1)/m. That mode is approximate; the
paper-scale figures never use it (their switches are hardware, clients have
their own CPUs).

    python -m benchmarks.simulator [--calibration benchmarks/results/bench.json]
        [--out benchmarks/results] [--servers 50,100,...,2000] [--clients 500]
        [--window 1] [--shared-cpu-cores 2] [--json]
"""

from __future__ import annotations

import argparse
import json
import random
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field, fields, replace
from functools import cache
from pathlib import Path
from typing import Any

import numpy as np
from tqdm import tqdm

from benchmarks.baselines.ghba import group_size_for
from benchmarks.baselines.placement import Chord

SCHEMES = ("hash", "metaflow", "central", "onehop", "chord", "ghba")
THROUGHPUT_RATIOS = (100.0, 2.0, 1.5, 1.0)
LATENCY_RATIOS = (0.001, 0.5, 0.7, 1.0)
DEFAULT_SERVERS = (50, 100, 250, 500, 1000, 1500, 2000)
RTT_FLOOR_US = 1.0
CHORD_SAMPLES = 300

# Section VII-B/C, at up to 2000 servers: % below ideal, latency x hash, throughput factors.
PAPER_THROUGHPUT: dict[float, dict[str, object]] = {
    1.0: {"metaflow": "12-20%", "onehop": "45-50%", "chord": "80-85%",
          "metaflow/chord": "3.2x", "metaflow/onehop": "2.0x",
          "ops_per_s": {"metaflow": 8.0e5, "onehop": 4.0e5, "chord": 2.5e5}},
    2.0: {"metaflow": "12-17%", "onehop": "30-36%", "chord": "75-80%"},
}
PAPER_LATENCY: dict[float, dict[str, object]] = {
    1.0: {"metaflow": "<=1.4x", "onehop": "~2.0x", "chord": "~7.0x"},
    0.7: {"metaflow": "<=1.05x", "onehop": ">=1.2x", "chord": ">=1.5x"},
    0.5: {"metaflow": "<=1.05x", "onehop": ">=1.2x", "chord": ">=1.5x"},
    0.001: {"metaflow": "~1x", "onehop": "~1x"},
}


@dataclass(frozen=True)
class Calibration:
    """Per-op costs in microseconds. Defaults are round numbers in the
    paper's regime (lookup as expensive as storage: ratio 1, its Redis case;
    a 10 Gb/s fabric; a NAT rewrite of a few % of the store, our bench's
    target), so the model runs without any benchmark file."""

    storage_us: float = 100.0      # S_st: server CPU per storage request
    lookup_us: float = 100.0       # S_lk: server CPU per lookup RPC (the "measured" ratio)
    nat_us: float = 2.0            # MetaFlow's NAT agent, per op, at the owner
    client_us: float = 20.0        # client CPU per request/response exchange
    rtt_us: float = 20.0           # one network round trip
    ovs_us: float = 0.0            # Open vSwitch CPU per round trip (shared-CPU mode only)
    f_group: float = 0.05          # G-HBA lookups reaching the group multicast
    f_global: float = 0.01         # ... and the global multicast
    group_size: Callable[[int], int] = group_size_for
    sources: Mapping[str, str] = field(default_factory=dict, compare=False)

    def __post_init__(self) -> None:
        if self.storage_us <= 0 or self.lookup_us <= 0:
            raise ValueError("storage_us and lookup_us must be positive")

    @classmethod
    def from_bench(cls, data: Mapping) -> Calibration:
        """Costs measured by `metaflowctl bench`; a missing field keeps its default."""
        schemes = data.get("schemes", {})
        found: dict[str, tuple[float, str]] = {}
        storage = _number(schemes, "hash", "storage_cpu_us_per_op")
        if storage and storage > 0:
            found["storage_us"] = (storage, "schemes.hash.storage_cpu_us_per_op")
        for scheme in ("onehop", "chord"):
            cpu = _number(schemes, scheme, "lookup_cpu_us_per_op")
            rpcs = _number(schemes, scheme, "lookup_rpcs_per_op")
            if cpu and rpcs and cpu > 0 and rpcs > 0:
                found["lookup_us"] = (cpu / rpcs,
                                      f"schemes.{scheme}.lookup_cpu_us_per_op / lookup_rpcs_per_op")
                break
        for name, scheme, key in (("nat_us", "metaflow", "nat_cpu_us_per_op"),
                                  ("client_us", "hash", "client_cpu_us_per_op"),
                                  ("ovs_us", "hash", "ovs_cpu_us_per_op")):
            value = _number(schemes, scheme, key)
            if value is not None and value >= 0:
                found[name] = (value, f"schemes.{scheme}.{key}")
            elif value is not None and name == "nat_us":  # an A/B difference within its noise
                found[name] = (0.0, f"schemes.{scheme}.{key} ({value}, below the A/B's noise: 0)")
        base = replace(cls(), **_values(found))
        rtt = _rtt_from_sweep(schemes.get("hash", {}), base.storage_us, base.client_us)
        if rtt is not None:
            found["rtt_us"] = (rtt, "schemes.hash.sweep[lowest concurrency].mean_ms - storage_us - client_us")
        fractions = _ghba_fractions(schemes.get("ghba", {}).get("levels"))
        if fractions is not None:
            found["f_group"] = (fractions[0], "schemes.ghba.levels")
            found["f_global"] = (fractions[1], "schemes.ghba.levels")
        sources = {name: found[name][1] if name in found else "default" for name in NUMERIC_FIELDS}
        return replace(cls(sources=sources), **_values(found))

    def with_lookup(self, lookup_us: float) -> Calibration:
        return replace(self, lookup_us=lookup_us)

    def describe(self) -> dict:
        """The numbers and where each came from, for sim.json."""
        return {**{name: getattr(self, name) for name in NUMERIC_FIELDS},
                "group_size": getattr(self.group_size, "__name__", repr(self.group_size)),
                "sources": {name: self.sources.get(name, "default") for name in NUMERIC_FIELDS}}


NUMERIC_FIELDS = tuple(f.name for f in fields(Calibration) if f.name not in ("group_size", "sources"))


def _values(found: Mapping[str, tuple[float, str]]) -> dict[str, Any]:
    """Measured costs by field name, for `replace`: every name is a float
    field of `Calibration` (NUMERIC_FIELDS), which a plain dict cannot say."""
    return {name: value for name, (value, _) in found.items()}


def _number(schemes: Mapping, scheme: str, key: str) -> float | None:
    value = schemes.get(scheme, {}).get(key)
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def _rtt_from_sweep(hash_entry: Mapping, storage_us: float, client_us: float) -> float | None:
    """Network time of one round trip: hash's least-loaded latency minus its
    CPU. The least-loaded point has the least queueing left in it."""
    sweep = [p for p in hash_entry.get("sweep", []) if "mean_ms" in p and "concurrency" in p]
    if not sweep:
        return None
    lightest = min(sweep, key=lambda p: p["concurrency"])
    return max(lightest["mean_ms"] * 1000.0 - storage_us - client_us, RTT_FLOOR_US)


def _ghba_fractions(levels: Mapping[str, int] | None) -> tuple[float, float] | None:
    """G-HBA climbs levels in order, so a lookup answered at "global" (or a
    "miss") also sent the group multicast first."""
    if not levels or sum(levels.values()) <= 0:
        return None
    total = sum(levels.values())
    beyond_group = levels.get("global", 0) + levels.get("miss", 0)
    return (levels.get("group", 0) + beyond_group) / total, beyond_group / total


@cache
def chord_hops(servers: int, samples: int = CHORD_SAMPLES, seed: int = 1) -> float:
    """Mean lookup RPCs of the real Chord over `servers` nodes, by sampling random keys."""
    ring = Chord([f"s{i}" for i in range(servers)])
    rng = random.Random(seed)
    return sum(ring.lookup(rng.randbytes(16), rng).rpcs for _ in range(samples)) / samples


@dataclass(frozen=True)
class Profile:
    """What one op of a scheme costs in messages, whatever the timings."""

    lookups: float        # lookup RPCs answered by uniformly random servers
    coordinator: float    # lookup RPCs answered by the single coordinator
    round_trips: float    # sequential network round trips, the storage request's included
    exchanges: int        # request/response pairs the client handles itself
    nat: bool             # the owner's NAT agent rewrites the request


def profile(scheme: str, servers: int, cal: Calibration) -> Profile:
    if scheme in ("hash", "metaflow"):
        return Profile(0.0, 0.0, 1.0, 1, scheme == "metaflow")
    if scheme == "onehop":
        return Profile(1.0, 0.0, 2.0, 2, False)
    if scheme == "central":
        return Profile(0.0, 1.0, 2.0, 2, False)
    if scheme == "chord":
        hops = chord_hops(servers)
        return Profile(hops, 0.0, 1.0 + hops, 2, False)
    if scheme == "ghba":
        group = max(1, cal.group_size(servers))
        lookups = 1.0 + cal.f_group * (group - 1) + cal.f_global * (servers - 1)
        return Profile(lookups, 0.0, 2.0 + cal.f_group + cal.f_global, 2, False)
    raise ValueError(f"unknown scheme {scheme!r}; expected one of {SCHEMES}")


@dataclass(frozen=True)
class Network:
    """`k` identical queueing stations of demand `d`, one more of demand
    `dx` (the coordinator; 0 if none) and a delay `z`, all in us per op."""

    k: int
    d: float
    dx: float
    z: float


def network(scheme: str, servers: int, cal: Calibration, shared_cpu_cores: int | None = None) -> Network:
    """The queueing network of one scheme at N servers (see the module docstring)."""
    p = profile(scheme, servers, cal)
    server_cpu = cal.storage_us + (p.lookups + p.coordinator) * cal.lookup_us + (cal.nat_us if p.nat else 0.0)
    network_us = cal.rtt_us * p.round_trips
    client_cpu = cal.client_us * p.exchanges
    if shared_cpu_cores is not None:
        return _shared(server_cpu + client_cpu + cal.ovs_us * p.round_trips, shared_cpu_cores, network_us)
    if p.coordinator:
        share = cal.storage_us / servers
        return Network(servers - 1, share, share + p.coordinator * cal.lookup_us, network_us + client_cpu)
    return Network(servers, server_cpu / servers, 0.0, network_us + client_cpu)


def _shared(cpu_us: float, cores: int, delay_us: float) -> Network:
    """All CPU in one m-core station, by Seidmann's approximation."""
    if cores < 1:
        raise ValueError(f"shared_cpu_cores must be >= 1, got {cores}")
    return Network(1, cpu_us / cores, 0.0, delay_us + cpu_us * (cores - 1) / cores)


def solve(nets: Sequence[Network], populations: Sequence[int],
          progress: tqdm | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Exact MVA for many networks at once: (ops/s, mean latency in ms), each
    network at its own population. One pass of the recursion up to the
    largest population serves every point."""
    pop = np.asarray(populations, dtype=np.int64)
    if pop.shape != (len(nets),) or (pop < 1).any():
        raise ValueError("need one population >= 1 per network")
    k, d, dx, z = (np.array([getattr(n, a) for n in nets], dtype=float) for a in ("k", "d", "dx", "z"))
    q, qx, x_at = np.zeros(len(nets)), np.zeros(len(nets)), np.zeros(len(nets))
    for n in range(1, int(pop.max()) + 1):
        r, rx = d * (1.0 + q), dx * (1.0 + qx)
        x = n / (z + k * r + rx)
        q, qx = x * r, x * rx
        np.copyto(x_at, x, where=pop == n)
        if progress is not None:
            progress.update(1)
    return x_at * 1e6, pop / x_at / 1e3


def mva(net: Network, population: int) -> tuple[float, float]:
    """One network: (ops/s, mean latency in ms)."""
    ops, ms = solve([net], [population])
    return float(ops[0]), float(ms[0])


@dataclass(frozen=True)
class Point:
    scheme: str
    servers: int
    ops_per_s: float
    latency_ms: float
    latency_vs_hash: float
    below_ideal: float     # 1 - ops_per_s / (N / S_st)


@dataclass(frozen=True)
class Panel:
    """One ratio of one figure: every scheme at every size."""

    label: str             # the ratio as printed, or "measured"
    ratio: float
    lookup_us: float
    points: tuple[Point, ...]

    def at(self, scheme: str, servers: int) -> Point:
        return next(p for p in self.points if p.scheme == scheme and p.servers == servers)


def ideal_ops_per_s(servers: int, cal: Calibration) -> float:
    return servers * 1e6 / cal.storage_us


def lookup_for(kind: str, ratio: float, cal: Calibration) -> float:
    """S_lk for a figure's ratio: throughput ratio r -> S_st / r, latency ratio q -> q S_st."""
    if kind == "throughput":
        return cal.storage_us / ratio
    if kind == "latency":
        return cal.storage_us * ratio
    raise ValueError(f"kind must be 'throughput' or 'latency', got {kind!r}")


def measured_ratio(kind: str, cal: Calibration) -> float:
    return cal.storage_us / cal.lookup_us if kind == "throughput" else cal.lookup_us / cal.storage_us


def panel_specs(kind: str, cal: Calibration,
                ratios: Sequence[float] | None = None) -> list[tuple[str, float, float]]:
    """(label, ratio, S_lk) for each panel of Fig. 13 (kind "throughput") or
    Fig. 15 ("latency"): the paper's ratios plus our "measured" one."""
    ratios = ratios if ratios is not None else (THROUGHPUT_RATIOS if kind == "throughput" else LATENCY_RATIOS)
    return [*((f"{r:g}", r, lookup_for(kind, r, cal)) for r in ratios),
            ("measured", measured_ratio(kind, cal), cal.lookup_us)]


def simulate(cal: Calibration, servers: Sequence[int], clients: int = 500, window: int = 1,
             progress: tqdm | None = None) -> dict[str, list[Panel]]:
    """Both figures, every panel, scheme and size in one vectorised MVA pass
    (the recursion's cost is its population, not its point count)."""
    specs = [(kind, spec) for kind in ("throughput", "latency") for spec in panel_specs(kind, cal)]
    keys = [(i, scheme, n) for i in range(len(specs)) for n in servers for scheme in SCHEMES]
    cals = [cal.with_lookup(lookup_us) for _, (_, _, lookup_us) in specs]
    ops, ms = solve([network(s, n, cals[i]) for i, s, n in keys], [clients * window] * len(keys), progress)
    hash_ms = {(i, n): m for (i, s, n), m in zip(keys, ms, strict=True) if s == "hash"}
    figures: dict[str, list[Panel]] = {"throughput": [], "latency": []}
    for i, (kind, (label, ratio, lookup_us)) in enumerate(specs):
        points = tuple(Point(s, n, float(o), float(m), float(m / hash_ms[j, n]),
                             float(1 - o / ideal_ops_per_s(n, cal)))
                       for (j, s, n), o, m in zip(keys, ops, ms, strict=True) if j == i)
        figures[kind].append(Panel(label, ratio, lookup_us, points))
    return figures


def validate(cal: Calibration, bench: Mapping, shared_cpu_cores: int | None = None) -> dict:
    """The model at the benchmark's size and each measured concurrency
    (total ops in flight), against what was measured, per scheme."""
    servers = int(bench.get("config", {}).get("servers", 8))
    out: dict[str, list[dict]] = {}
    for scheme, entry in bench.get("schemes", {}).items():
        if scheme not in SCHEMES:
            continue
        sweep = [p for p in entry.get("sweep", []) if p.get("concurrency", 0) >= 1]
        if not sweep:
            continue
        nets = [network(scheme, servers, cal, shared_cpu_cores)] * len(sweep)
        ops, ms = solve(nets, [int(p["concurrency"]) for p in sweep])
        out[scheme] = [{"concurrency": int(p["concurrency"]),
                        "model_ops_per_s": round(float(o), 1), "measured_ops_per_s": p.get("ops_per_s"),
                        "model_ms": round(float(m), 3), "measured_ms": p.get("mean_ms")}
                       for p, o, m in zip(sweep, ops, ms, strict=True)]
    return {"servers": servers, "shared_cpu_cores": shared_cpu_cores, "schemes": out}


def headline(panel: Panel) -> dict:
    """A panel at its largest size: per scheme ops/s, % below ideal and
    latency x hash, plus MetaFlow's throughput factors over Chord and One-Hop."""
    n = max(p.servers for p in panel.points)
    at = {s: panel.at(s, n) for s in SCHEMES}
    return {"servers": n,
            "schemes": {s: {"ops_per_s": p.ops_per_s, "below_ideal": p.below_ideal,
                            "latency_vs_hash": p.latency_vs_hash} for s, p in at.items()},
            "metaflow/chord": at["metaflow"].ops_per_s / at["chord"].ops_per_s,
            "metaflow/onehop": at["metaflow"].ops_per_s / at["onehop"].ops_per_s}


def format_table(throughput: Sequence[Panel], latency: Sequence[Panel], clients: int, window: int) -> str:
    """The compact comparison printed by the CLI, paper values in brackets."""
    lines = []
    for panel in throughput:
        h = headline(panel)
        paper: Mapping[str, object] = (PAPER_THROUGHPUT.get(panel.ratio, {})
                                       if panel.label != "measured" else {})
        lines.append(f"Fig. 13 analogue, throughput ratio {panel.label} (r={panel.ratio:.3g}), "
                     f"N={h['servers']}, C={clients} x {window} in flight:")
        lines.append(f"  {'scheme':9} {'ops/s':>9} {'below ideal':>11} {'[paper]':>9} {'lat x hash':>10}")
        for s, v in h["schemes"].items():
            lines.append(f"  {s:9} {v['ops_per_s']:9.3g} {v['below_ideal']:11.1%} {paper.get(s, ''):>9} "
                         f"{v['latency_vs_hash']:10.2f}")
        lines.append(f"  MetaFlow/Chord {h['metaflow/chord']:.2f}x [{paper.get('metaflow/chord', '-')}]  "
                     f"MetaFlow/One-Hop {h['metaflow/onehop']:.2f}x [{paper.get('metaflow/onehop', '-')}]")
    for panel in latency:
        h = headline(panel)
        paper = PAPER_LATENCY.get(panel.ratio, {}) if panel.label != "measured" else {}
        cells = "  ".join(f"{s} {h['schemes'][s]['latency_vs_hash']:.2f}x [{paper.get(s, '-')}]"
                          for s in ("metaflow", "onehop", "chord", "central", "ghba"))
        lines.append(f"Fig. 15 analogue, latency ratio {panel.label} (q={panel.ratio:.3g}), "
                     f"N={h['servers']}, latency x hash: {cells}")
    return "\n".join(lines)


def format_validation(report: Mapping) -> str:
    """Model against measurement at the benchmark's own size, one line per point."""
    lines = [f"Validation at N={report['servers']} (shared CPU cores: {report['shared_cpu_cores']}):"]
    for scheme, rows in report["schemes"].items():
        for row in rows:
            lines.append(f"  {scheme:9} c={row['concurrency']:<4} ops/s model {row['model_ops_per_s']:9.1f} "
                         f"measured {row['measured_ops_per_s']}  ms model {row['model_ms']:7.3f} "
                         f"measured {row['measured_ms']}")
    return "\n".join(lines)


def plot_throughput(panels: Sequence[Panel], cal: Calibration, path: Path) -> None:
    """Fig. 13 analogue: ops/s against cluster size, one panel per ratio, with the linear ideal."""
    _plot_panels(panels, path, "throughput", lambda p: p.ops_per_s, "ops/s", "linear",
                 ideal=lambda n: ideal_ops_per_s(n, cal))


def plot_latency(panels: Sequence[Panel], path: Path) -> None:
    """Fig. 15 analogue: latency normalised to hash mapping against cluster size
    (log scale: a saturated coordinator is orders of magnitude off)."""
    _plot_panels(panels, path, "latency", lambda p: p.latency_vs_hash, "latency / hash", "log")


def _plot_panels(panels: Sequence[Panel], path: Path, kind: str, value: Callable[[Point], float], ylabel: str,
                 yscale: str, ideal: Callable[[int], float] | None = None) -> None:
    """One subplot per ratio, one line per scheme against cluster size."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(panels), figsize=(4 * len(panels), 3.6), squeeze=False)
    for ax, panel in zip(axes[0], panels, strict=True):
        sizes = sorted({p.servers for p in panel.points})
        for scheme in SCHEMES:
            ax.plot(sizes, [value(panel.at(scheme, n)) for n in sizes], marker="o", ms=3, label=scheme)
        if ideal is not None:
            ax.plot(sizes, [ideal(n) for n in sizes], "k--", label="ideal")
        suffix = f" ({panel.ratio:.3g})" if panel.label == "measured" else ""
        ax.set(title=f"{kind} ratio {panel.label}{suffix}", xlabel="servers", ylabel=ylabel, yscale=yscale)
        ax.grid(alpha=0.3)
    axes[0][0].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def _panels_json(panels: Sequence[Panel]) -> list[dict]:
    return [{"label": p.label, "ratio": p.ratio, "lookup_us": p.lookup_us, "headline": headline(p),
             "points": [asdict(pt) for pt in p.points]} for p in panels]


def _sizes(text: str) -> list[int]:
    sizes = sorted({int(s) for s in text.split(",") if s.strip()})
    if not sizes or sizes[0] < 1:
        raise argparse.ArgumentTypeError("--servers needs positive integers, comma-separated")
    return sizes


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--calibration", type=Path,
                   help="bench JSON from `metaflowctl bench` (default: built-in costs)")
    p.add_argument("--out", type=Path, default=Path("benchmarks/results"))
    p.add_argument("--servers", type=_sizes, default=list(DEFAULT_SERVERS))
    p.add_argument("--clients", type=int, default=500)
    p.add_argument("--window", type=int, default=1, help="ops each client keeps in flight")
    p.add_argument("--shared-cpu-cores", type=int, default=None,
                   help="validation only: clients, servers and OVS share this many cores")
    p.add_argument("--rtt-us", type=float, default=None,
                   help="network round trip for the paper-scale figures (default: calibrated; our "
                        "emulated fabric's software switches take milliseconds, the paper's hardware "
                        "tens of microseconds); validation always uses the calibrated one")
    p.add_argument("--json", action="store_true", help="print sim.json instead of the table")
    args = p.parse_args(argv)
    if args.clients < 1 or args.window < 1:
        p.error("--clients and --window must be >= 1")

    bench = json.loads(args.calibration.read_text()) if args.calibration else None
    measured = Calibration.from_bench(bench) if bench is not None else Calibration()
    cal = measured if args.rtt_us is None else replace(
        measured, rtt_us=args.rtt_us, sources={**measured.sources, "rtt_us": "--rtt-us"})
    steps = len(args.servers) + args.clients * args.window
    with tqdm(total=steps, desc="simulator", file=sys.stderr, disable=not sys.stderr.isatty(),
              miniters=max(1, steps // 100)) as progress:
        for n in args.servers:
            chord_hops(n)
            progress.update(1)
        figures = simulate(cal, args.servers, args.clients, args.window, progress)
    throughput, latency = figures["throughput"], figures["latency"]
    result = {"calibration": cal.describe(), "clients": args.clients, "window": args.window,
              "servers": args.servers, "chord_hops": {n: chord_hops(n) for n in args.servers},
              "ideal_ops_per_s": {n: ideal_ops_per_s(n, cal) for n in args.servers},
              "throughput": _panels_json(throughput), "latency": _panels_json(latency),
              "validation": validate(measured, bench, args.shared_cpu_cores) if bench is not None else None,
              "paper": {"throughput": PAPER_THROUGHPUT, "latency": PAPER_LATENCY}}

    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "sim.json").write_text(json.dumps(result, indent=1) + "\n")
    plot_throughput(throughput, cal, args.out / "sim_throughput.png")
    plot_latency(latency, args.out / "sim_latency.png")
    if args.json:
        print(json.dumps(result, indent=1))
        return 0
    print(format_table(throughput, latency, args.clients, args.window))
    if result["validation"] is not None:
        print(format_validation(result["validation"]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
