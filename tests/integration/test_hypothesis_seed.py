"""The run-wide Hypothesis seed of tests/conftest.py, in pytest runs of their own."""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

CONFTEST = Path(__file__).parents[1] / "conftest.py"

PROPERTY = """
import os
from hypothesis import given, strategies as st

@given(st.integers(0, 10**9))
def test_draws(n):
    with open(os.environ["DRAWN"], "a") as out:
        out.write(f"{n}\\n")
    assert os.environ.get("FAIL") != "1" or n < 1000
"""


@pytest.fixture
def project(tmp_path: Path) -> Path:
    shutil.copy(CONFTEST, tmp_path / "conftest.py")
    (tmp_path / "test_prop.py").write_text(PROPERTY)
    return tmp_path


def _pytest(project: Path, seed: str | None, *args: str, fail: bool = False,
            drawn: str = "drawn", ci: bool = False) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k not in ("HYPOTHESIS_SEED", "CI")}
    env.update(DRAWN=str(project / drawn), FAIL="1" if fail else "0")
    if ci:   # Hypothesis then loads its derandomizing "ci" profile as the default
        env["CI"] = "true"
    if seed is not None:
        env["HYPOTHESIS_SEED"] = seed
    return subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *args],
                          cwd=project, env=env, capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize("ci", [False, True], ids=["local", "under-CI"])
def test_one_seed_draws_the_same_examples(project: Path, ci: bool) -> None:
    for seed, drawn in (("5", "a"), ("5", "b"), ("6", "c")):
        run = _pytest(project, seed, "test_prop.py", drawn=drawn, ci=ci)
        assert run.returncode == 0, run.stdout + run.stderr
        assert run.stdout.splitlines()[0].startswith(f"hypothesis seed {seed} ")
    a, b, c = ((project / name).read_text() for name in "abc")
    assert a == b and a != c and len(a.splitlines()) > 50


def test_xdist_workers_draw_from_the_seed_the_run_printed(project: Path) -> None:
    """`make test` runs the unit tests under pytest-xdist: each worker is a
    process of its own that would draw a seed of its own, and the printed
    one would replay nothing."""
    (project / "test_prop2.py").write_text(PROPERTY)
    parallel = _pytest(project, None, "-n", "2", "test_prop.py", "test_prop2.py", drawn="parallel")
    assert parallel.returncode == 0, parallel.stdout + parallel.stderr
    seed = parallel.stdout.split()[2]
    serial = _pytest(project, seed, "test_prop.py", "test_prop2.py", drawn="serial")
    assert serial.returncode == 0, serial.stdout + serial.stderr
    drawn = [sorted((project / name).read_text().splitlines()) for name in ("parallel", "serial")]
    assert drawn[0] == drawn[1] and len(drawn[0]) > 100


def test_without_a_seed_one_is_drawn_and_printed(project: Path) -> None:
    seeds = {_pytest(project, None, "test_prop.py").stdout.split()[2] for _ in range(2)}
    assert len(seeds) == 2 and all(s.isdigit() for s in seeds)


def test_a_failing_run_prints_the_replay_command_and_it_replays(project: Path) -> None:
    run = _pytest(project, "11", "test_prop.py", fail=True)
    assert run.returncode == 1
    assert "test_draws(\nE           n=1000,\nE       )" in run.stdout   # shrunk to the boundary
    assert "@reproduce_failure(" in run.stdout  # print_blob
    lines = run.stdout.splitlines()
    replay = lines[lines.index("replay the failures on the same examples:") + 1].strip()
    assert replay == f"HYPOTHESIS_SEED=11 {shlex.quote(sys.executable)} -m pytest test_prop.py::test_draws"
    assert not (project / ".hypothesis" / "examples").exists()   # a seeded run keeps no database
    env_part, *argv = shlex.split(replay)
    again = _pytest(project, env_part.partition("=")[2], *argv[3:], fail=True, drawn="again")
    assert again.returncode == 1 and "n=1000" in again.stdout
    assert (project / "again").read_text() == (project / "drawn").read_text()


def test_a_seed_that_is_not_a_number_is_refused(project: Path) -> None:
    run = _pytest(project, "soon", "test_prop.py")
    assert run.returncode == 4 and "must be an integer, not 'soon'" in run.stderr
