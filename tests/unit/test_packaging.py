"""Each role's extra in pyproject.toml covers what its packages import, and no more
than the role needs: the client is the standard library alone, and the agent
and the controller never import each other's packages.

Imports are read from the source (every ``import`` statement, lazy ones
included), and each third-party module is mapped to the distribution that
provides it in this venv. `make check-install` then installs each role
alone on every supported Python. Which package may import which is the
layering rule's (tests/unit/test_layers.py).

The compiled extension is declared to setuptools-rust, so that a wheel
carries it (abi3) and an sdist carries its crate.
"""

from __future__ import annotations

import ast
import importlib
import re
import subprocess
import sys
import tomllib
from collections.abc import Iterator
from functools import cache
from importlib import metadata
from pathlib import Path
from typing import Any

import pytest
from setuptools.command.egg_info import FileList

from controller.ctl import COMMAND_GROUP, COMMANDS, Command

ROOT = Path(__file__).resolve().parents[2]
OURS = frozenset({"btree", "topology", "controller", "nat_agent", "client_lib", "benchmarks",
                  "mininet_scenarios"})
SYSTEM = frozenset({"mininet"})
"""Installed from Debian (python3-mininet), not from an extra: see the Makefile."""

CLIENT_FILES = ("client_lib", "controller/ctl.py", "controller/status.py", "controller/backup.py",
                "controller/snapshot_format.py")
"""What `metaflowctl status|get|put|del|stat|secret|snapshot|restore` runs."""
MOUNT = ("client_lib/fs/mount.py", "client_lib/fs/fuse_session.py", "client_lib/fs/mount_reads.py")
"""The FUSE shim and its reads: the fs role's, left out of the others' client_lib."""

ROLES = {
    # role: (what it runs, the first-party packages it may import)
    "client": (CLIENT_FILES, None),
    "agent": (("nat_agent", "client_lib"), {"nat_agent", "client_lib"}),
    "controller": (("controller", "btree", "topology", "client_lib"),
                   {"controller", "btree", "topology", "client_lib"}),
    "bench": (tuple(sorted(OURS)), None),
    "fs": (MOUNT, None),
}


def _normal(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


@cache
def _pyproject() -> dict[str, Any]:
    with open(ROOT / "pyproject.toml", "rb") as f:
        return tomllib.load(f)


def _project() -> dict[str, Any]:
    project: dict[str, Any] = _pyproject()["project"]
    return project


def _requirement(text: str) -> tuple[str, set[str]]:
    match = re.match(r"\s*([A-Za-z0-9._-]+)\s*(?:\[([^\]]*)\])?", text)
    assert match, text
    return _normal(match.group(1)), {e.strip() for e in (match.group(2) or "").split(",") if e.strip()}


def extra(name: str) -> set[str]:
    """Distributions an install of ``metaflow-sdn[name]`` brings, self-references expanded."""
    project = _project()
    out: set[str] = set()
    for text in [*project["dependencies"], *project["optional-dependencies"][name]]:
        dist, wanted = _requirement(text)
        if dist == _normal(str(project["name"])):
            for other in wanted:
                out |= extra(other)
        else:
            out.add(dist)
    return out


def _files(where: str) -> Iterator[Path]:
    path = ROOT / where
    yield from ([path] if path.suffix == ".py" else sorted(path.rglob("*.py")))


def imports(where: str) -> dict[str, set[str]]:
    """Top-level module -> the files under `where` that import it (relative imports excluded)."""
    found: dict[str, set[str]] = {}
    for file in _files(where):
        for node in ast.walk(ast.parse(file.read_text(), str(file))):
            names = []
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module]
            for name in names:
                found.setdefault(name.partition(".")[0], set()).add(str(file.relative_to(ROOT)))
    return found


def _role_imports(role: str) -> dict[str, set[str]]:
    merged: dict[str, set[str]] = {}
    for where in ROLES[role][0]:
        for module, files in imports(where).items():
            if role not in ("fs", "bench"):
                files = files - set(MOUNT)
            if files:
                merged.setdefault(module, set()).update(files)
    return merged


def _third_party(found: dict[str, set[str]]) -> dict[str, set[str]]:
    return {m: f for m, f in found.items()
            if m not in sys.stdlib_module_names and m not in OURS and m not in SYSTEM and m != "__future__"}


def test_the_distribution_itself_depends_on_nothing() -> None:
    assert _project()["dependencies"] == []
    assert extra("client") == set()


@pytest.mark.parametrize("role", sorted(ROLES))
def test_each_role_extra_covers_its_imports(role: str) -> None:
    provided = metadata.packages_distributions()
    wanted = extra(role)
    missing = {}
    for module, files in _third_party(_role_imports(role)).items():
        dists = {_normal(d) for d in provided.get(module, [])}
        if not dists & wanted:
            missing[module] = (sorted(dists) or "not installed", sorted(files))
    assert not missing, f"the {role} extra lacks what these imports need: {missing}"


@pytest.mark.parametrize("role", [r for r, (_, allowed) in ROLES.items() if allowed is not None])
def test_a_daemon_role_imports_no_other_role(role: str) -> None:
    allowed = ROLES[role][1]
    assert allowed is not None
    found = {m: sorted(f) for m, f in _role_imports(role).items() if m in OURS and m not in allowed}
    assert not found, f"the {role} role reaches into {found}"


def test_every_package_is_packaged() -> None:
    """A package missing from [tool.setuptools] packages installs in editable
    mode (the venv) and is silently absent from a wheel."""
    setuptools_packages = set(_pyproject()["tool"]["setuptools"]["packages"])
    on_disk = {str(init.parent.relative_to(ROOT)).replace("/", ".")
               for top in OURS for init in (ROOT / top).rglob("__init__.py")}
    assert setuptools_packages == on_disk


def test_every_contributed_subcommand_is_a_light_command() -> None:
    """metaflowctl loads each entry of its group to list it, on any install:
    each must be a `Command` whose module imports, when loaded, only the
    standard library and metaflowctl itself (what it runs is imported when
    it is chosen)."""
    declared = _project()["entry-points"][COMMAND_GROUP]
    assert {"plan", "bench"} <= set(declared) and not set(declared) & set(COMMANDS)
    stdlib = set(sys.stdlib_module_names) | {"__future__"}
    for name, target in declared.items():
        module, _, attribute = target.partition(":")
        assert isinstance(getattr(importlib.import_module(module), attribute), Command), name
        tree = ast.parse((ROOT / (module.replace(".", "/") + ".py")).read_text())
        loaded = {alias.name for n in tree.body if isinstance(n, ast.Import) for alias in n.names}
        loaded |= {n.module or "" for n in tree.body if isinstance(n, ast.ImportFrom)}
        assert {m for m in loaded if m.partition(".")[0] not in stdlib} <= {"controller.ctl"}, name


def test_every_console_script_resolves() -> None:
    scripts = _project()["scripts"]
    assert "metaflowctl" in scripts
    for name, target in scripts.items():
        module, _, function = target.partition(":")
        path = ROOT / (module.replace(".", "/") + ".py")
        tree = ast.parse(path.read_text())
        assert any(isinstance(n, ast.FunctionDef) and n.name == function for n in tree.body), name


# -- the compiled extension in the distribution ---------------------------------

CRATE = ROOT / "nat_agent/fastpath"


def _extension() -> dict[str, Any]:
    modules: list[dict[str, Any]] = _pyproject()["tool"]["setuptools-rust"]["ext-modules"]
    assert len(modules) == 1
    return modules[0]


def _cargo() -> dict[str, Any]:
    with open(CRATE / "Cargo.toml", "rb") as f:
        return tomllib.load(f)


def test_the_wheel_builds_the_extension_from_the_locked_crate() -> None:
    """What `pip` builds is what the agent imports (`nat_agent.extension`),
    from the crate's Cargo.lock, optimized even in an editable install."""
    requires = {_requirement(text)[0] for text in _pyproject()["build-system"]["requires"]}
    assert "setuptools-rust" in requires
    ext = _extension()
    assert ext["target"] == "nat_agent._fastpath" and ext["binding"] == "PyO3"
    assert (ROOT / ext["path"]).resolve() == CRATE / "Cargo.toml"
    lib = _cargo()["lib"]
    assert (lib["name"], lib["crate-type"]) == (ext["target"].rpartition(".")[2], ["cdylib"])
    assert "--locked" in ext["cargo-manifest-args"] and ext["debug"] is False


def test_the_wheel_is_abi3_from_the_oldest_python_claimed() -> None:
    """One wheel for every CPython from requires-python on: the wheel's tag,
    the crate's pyo3 feature and requires-python name the same version."""
    oldest = re.fullmatch(r">=3\.(\d+)", _project()["requires-python"])
    assert oldest
    minor = oldest.group(1)
    assert _pyproject()["tool"]["distutils"]["bdist_wheel"]["py-limited-api"] == f"cp3{minor}"
    assert f"abi3-py3{minor}" in _cargo()["dependencies"]["pyo3"]["features"]


def test_the_sdist_carries_the_crate_and_none_of_its_build_output(monkeypatch: pytest.MonkeyPatch) -> None:
    """MANIFEST.in, applied by setuptools to this tree, selects exactly the
    crate's files that git tracks (Cargo.toml, Cargo.lock, the sources):
    an sdist can build the extension, and ships no target/ directory."""
    monkeypatch.chdir(ROOT)
    selected = FileList()
    for line in (ROOT / "MANIFEST.in").read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            selected.process_template_line(line)
    tracked = subprocess.run(["git", "ls-files", str(CRATE.relative_to(ROOT))], cwd=ROOT, check=True,
                             capture_output=True, text=True).stdout.split()
    assert sorted(selected.files) == sorted(tracked)
    assert {Path(path).name for path in tracked} >= {"Cargo.toml", "Cargo.lock", "lib.rs"}
