"""What the benchmarks add to `metaflowctl`: the `plan` and `bench` subcommands.

They reach metaflowctl as entry points of its group
(`controller.ctl.COMMAND_GROUP`, declared in pyproject.toml), so the
controller never names this package. metaflowctl loads this module to list
them, on any install, the client role's included: it imports only the
standard library and metaflowctl's own `Command`. What a subcommand runs
(`benchmarks.commands`: the pure core and tqdm for plan; numpy, the agent
and Mininet for bench) is imported only when it is chosen.
"""

from __future__ import annotations

import argparse

from controller.ctl import Command, Runner


def _plan(p: argparse.ArgumentParser) -> Runner:
    from benchmarks.commands import add_plan_arguments, run_plan_command

    add_plan_arguments(p)
    return run_plan_command


def _bench(p: argparse.ArgumentParser) -> Runner:
    from benchmarks.commands import add_bench_arguments, run_bench_command

    add_bench_arguments(p)
    return run_bench_command


PLAN = Command("simulate growth on a topology and report flow-table sizes", _plan,
               "Generate N file paths, hash them to MetaDataIDs, insert them with capacity-driven "
               "splits, verify every ID through a fake network of the generated flow tables, and "
               "report entries per switch per layer.")
BENCH = Command("MetaFlow vs hash, central, One-Hop, Chord and G-HBA in one Mininet run (root)", _bench,
                "Bring up a k=4 fat-tree (or --topology NAME: the paper's testbed, fat-tree:8) in Mininet "
                "with the controller, agents and lookup servers, "
                "load a namespace, then run every scheme in turn at rising concurrency with "
                "interleaved repetitions; print a table, write JSON and plots.")
