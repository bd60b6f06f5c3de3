"""One Hypothesis seed per test run, printed so that any failure can be replayed.

Every property test of the run draws its examples from that one seed: it
comes from ``HYPOTHESIS_SEED`` (or ``--hypothesis-seed``), else it is drawn
at random and printed in the header. A failing run prints it again at the
end with the command that reruns the failing tests on the same examples.

A forced seed also keeps Hypothesis away from its example database, so a
``.hypothesis/`` directory left by an earlier run (or missing, as in a fresh
CI clone) changes nothing: the seed alone decides what runs. A failing
example is printed with its ``@reproduce_failure`` blob as well.

No deadline: a property test checks what is computed, not how fast (speed
targets live in benchmarks/), and on a shared two-core machine a deadline
is a test that fails at random.

Under pytest-xdist (``make test`` runs the unit tests on both cores) the
workers run on the seed the controller drew and printed.

Not derandomized, even where the environment sets ``CI``: Hypothesis then
loads its own ``ci`` profile (derandomize=True), which a profile registered
here would inherit, and every seed would draw the same examples.
"""

from __future__ import annotations

import os
import secrets
import shlex
import sys

import pytest
from hypothesis import settings

SEED_ENV = "HYPOTHESIS_SEED"
PROFILE = "metaflow"
MAX_LISTED = 20
"""Failing tests named in the replay command; beyond that, the run's own arguments."""

_SEED = pytest.StashKey[int]()

settings.register_profile(PROFILE, deadline=None, print_blob=True, derandomize=False)
settings.load_profile(PROFILE)


def _chosen_seed(config: pytest.Config) -> int:
    given = config.getoption("hypothesis_seed") or os.environ.get(SEED_ENV)
    if given is None or given == "":
        return secrets.randbelow(2**32)
    try:
        return int(given)
    except ValueError:
        raise pytest.UsageError(f"{SEED_ENV} / --hypothesis-seed must be an integer, not {given!r}") from None


@pytest.hookimpl(tryfirst=True)
def pytest_configure(config: pytest.Config) -> None:
    """Runs before Hypothesis's own plugin, which then forces the seed. An
    xdist worker takes the seed its controller chose and printed."""
    workerinput = getattr(config, "workerinput", {})
    seed = int(workerinput[SEED_ENV]) if SEED_ENV in workerinput else _chosen_seed(config)
    config.option.hypothesis_seed = str(seed)
    config.stash[_SEED] = seed


@pytest.hookimpl(optionalhook=True)
def pytest_configure_node(node) -> None:  # noqa: ANN001 (xdist's WorkerController, untyped)
    """xdist: hand the run's one seed to every worker (each would draw its own)."""
    node.workerinput[SEED_ENV] = node.config.stash[_SEED]


def pytest_report_header(config: pytest.Config) -> str:
    seed = config.stash[_SEED]
    return f"hypothesis seed {seed} (replay a run with {SEED_ENV}={seed}; profile {PROFILE!r})"


def pytest_sessionstart(session: pytest.Session) -> None:
    """The header is hidden by -q (how `make test` runs), the seed must not be."""
    if session.config.get_verbosity() < 0:
        reporter = session.config.pluginmanager.get_plugin("terminalreporter")
        if reporter is not None:
            reporter.write_line(pytest_report_header(session.config))


def replay_command(seed: int, failed: list[str], args: list[str]) -> str:
    """The shell command that reruns `failed` (or the run's `args`) on `seed`'s examples."""
    targets = failed if failed and len(failed) <= MAX_LISTED else args
    return " ".join([f"{SEED_ENV}={seed}", shlex.quote(sys.executable), "-m", "pytest",
                     *(shlex.quote(t) for t in targets)])


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter, exitstatus: int,
                            config: pytest.Config) -> None:
    failed = [report.nodeid for kind in ("failed", "error")
              for report in terminalreporter.stats.get(kind, []) if getattr(report, "nodeid", "")]
    if exitstatus == 0 or not failed:
        return
    seed = config.stash[_SEED]
    terminalreporter.write_sep("-", f"hypothesis seed {seed}")
    terminalreporter.write_line("replay the failures on the same examples:")
    terminalreporter.write_line("  " + replay_command(seed, sorted(set(failed)), list(config.args)))
