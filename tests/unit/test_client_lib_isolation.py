"""A file system installs `client_lib` alone: every module of it (the client,
the contract, and its subpackages: the API's serving side, `client_lib.server`,
and the file system, `client_lib.fs`) must import with the standard library
only, and import nothing of the rest of MetaFlow. The one exception is the
FUSE shim, `client_lib.fs.mount`, its session, `client_lib.fs.fuse_session`,
and its reads, `client_lib.fs.mount_reads`, which need the ``fs`` extra (trio); its
command says so when it is missing. Which of these may import which is the
layering rule's (tests/unit/test_layers.py)."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import client_lib

# Run in an isolated interpreter (-I: no environment, no user site; -S: no
# site-packages at all), from a copy of the package alone, so a third-party
# import or an import of a sibling package (btree, nat_agent...) fails there.
EXTRA = {"client_lib.fs.mount", "client_lib.fs.fuse_session", "client_lib.fs.mount_reads"}
"""The modules that need the ``fs`` extra."""
_PROBE = """
import importlib, json, pkgutil, sys
sys.path.insert(0, sys.argv[1])
import client_lib
needs_extra = set(sys.argv[2].split(","))
names = [m.name for m in pkgutil.walk_packages(client_lib.__path__, "client_lib.")
         if m.name not in needs_extra]
for name in names:
    importlib.import_module(name)
ours = {"client_lib", "__main__"}
foreign = sorted({m.split(".")[0] for m in sys.modules} - set(sys.stdlib_module_names) - ours)
print(json.dumps({"modules": names, "foreign": foreign}))
"""


def test_every_module_imports_with_the_standard_library_only(tmp_path: Path) -> None:
    package = Path(client_lib.__file__).parent
    shutil.copytree(package, tmp_path / "client_lib", ignore=shutil.ignore_patterns("__pycache__"))
    out = subprocess.run([sys.executable, "-I", "-S", "-c", _PROBE, str(tmp_path), ",".join(EXTRA)],
                         capture_output=True, text=True, timeout=60, check=False)
    assert out.returncode == 0, out.stderr
    result = json.loads(out.stdout)
    assert result["foreign"] == []
    expected = {".".join(("client_lib", *p.relative_to(package).with_suffix("").parts))
                for p in package.rglob("*.py") if p.stem != "__init__"} - EXTRA
    assert expected == set(result["modules"]) - {"client_lib.api", "client_lib.fs", "client_lib.server"}
    assert {"client_lib.api.clients", "client_lib.server.api", "client_lib.fs.namespace",
            "client_lib.fs.cli"} <= expected  # the walk really saw the subpackages


def test_the_mount_command_without_its_extra_says_what_to_install(tmp_path: Path) -> None:
    package = Path(client_lib.__file__).parent
    shutil.copytree(package, tmp_path / "client_lib", ignore=shutil.ignore_patterns("__pycache__"))
    out = subprocess.run([sys.executable, "-I", "-S", "-c",
                          "import sys; sys.path.insert(0, sys.argv[1]); from client_lib.fs.cli import main; "
                          "sys.exit(main(['/mnt']))", str(tmp_path)],
                         capture_output=True, text=True, timeout=60, check=False)
    assert out.returncode == 2 and "metaflow-sdn[fs]" in out.stderr
