"""The multi-site paper's two workflow shapes (its section VI-D, Fig. 9)
as jobs for `benchmarks.sites_node`, and its three scenarios (Table I).
Pure data: no I/O.

* **BuzzFlow**, near-pipeline: stages one after another, each with one job
  per site; a job of stage k reads what the job of stage k-1 in the *next*
  site wrote (its data crosses the WAN, as a geo-distributed pipeline's
  does), computes, and writes its own outputs. A job waits for each input
  entry to appear, so stage k starts as soon as stage k-1's outputs show.
* **Montage**, split / parallel jobs / merge: one split job writes every
  parallel job's inputs; the parallel jobs, spread over the sites, each read
  theirs, compute and write their outputs; one merge job reads them all and
  writes the result.

A job's operations are its reads plus its writes; a scenario gives them per
job and the computation (a sleep, as the paper simulates it). The paper's
Table I (32 nodes): small scale 100 operations and 1 s per node,
computation-intensive 200 and 5 s, metadata-intensive 1,000 and 1 s;
`SCENARIOS` keeps the computation and divides the operations by `OPS_SCALE`
to fit this machine's runs in minutes (stated with the results).
"""

from __future__ import annotations

from dataclasses import dataclass

OPS_SCALE = 5
"""Table I's operations per node are divided by this here."""


@dataclass(frozen=True)
class Scenario:
    name: str
    ops: int
    compute_s: float


SCENARIOS = (Scenario("small", 100 // OPS_SCALE, 1.0),
             Scenario("computation-intensive", 200 // OPS_SCALE, 5.0),
             Scenario("metadata-intensive", 1000 // OPS_SCALE, 1.0))


@dataclass(frozen=True)
class Job:
    """One node's work: in which site, the entries it waits for and reads,
    its computation, and the entries it writes."""

    site: str
    reads: tuple[str, ...]
    compute_s: float
    writes: tuple[str, ...]

    def as_json(self) -> dict[str, object]:
        return {"reads": list(self.reads), "compute_s": self.compute_s, "writes": list(self.writes)}


def _names(tag: str, job: str, count: int) -> tuple[str, ...]:
    return tuple(f"/{tag}/{job}/out{k}" for k in range(count))


def buzzflow(sites: list[str], nodes: int, scenario: Scenario, tag: str) -> list[Job]:
    """`nodes` // len(`sites`) stages of one job per site; a first-stage job
    writes all its operations, a later one reads half and writes half."""
    stages = max(1, nodes // len(sites))
    jobs = []
    half = scenario.ops // 2
    for stage in range(stages):
        for i, site in enumerate(sites):
            if stage == 0:
                reads: tuple[str, ...] = ()
                writes = _names(tag, f"s0j{i}", scenario.ops)
            else:
                source = (i + 1) % len(sites)
                reads = _names(tag, f"s{stage - 1}j{source}", half)
                writes = _names(tag, f"s{stage}j{i}", half)
            jobs.append(Job(site, reads, scenario.compute_s, writes))
    return jobs


def montage(sites: list[str], nodes: int, scenario: Scenario, tag: str) -> list[Job]:
    """A split job in the first site, `nodes` - 2 parallel jobs spread over
    the sites (each reading half its operations and writing half), and a
    merge job in the last site reading every parallel output."""
    parallel = max(1, nodes - 2)
    half = scenario.ops // 2
    inputs = [_names(tag, f"in{p}", half) for p in range(parallel)]
    outputs = [_names(tag, f"out{p}", half) for p in range(parallel)]
    jobs = [Job(sites[0], (), scenario.compute_s, tuple(n for names in inputs for n in names))]
    jobs += [Job(sites[(p + 1) % len(sites)], inputs[p], scenario.compute_s, outputs[p])
             for p in range(parallel)]
    jobs.append(Job(sites[-1], tuple(n for names in outputs for n in names), scenario.compute_s,
                    _names(tag, "merged", 1)))
    return jobs


WORKFLOWS = {"buzzflow": buzzflow, "montage": montage}
