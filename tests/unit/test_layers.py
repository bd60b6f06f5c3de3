"""The package layering, read from the source: who may import whom, and no cycles.

    client_lib   the wire contract and the client: the standard library only
                 (but for the FUSE shim, client_lib.fs.mount: pyfuse3, trio)
    btree        pure core: client_lib, sortedcontainers
    topology     pure: btree, client_lib, networkx
    controller   everything above, os_ken
    nat_agent    client_lib (and btree's pure parts), its own I/O libraries

A module-level import cycle is refused anywhere, counting the imports
inside ``if TYPE_CHECKING:`` blocks: a cycle that only the type checker
sees is still two modules that cannot be understood one without the other.
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("client_lib", "btree", "topology", "controller", "nat_agent", "benchmarks", "mininet_scenarios")
ALLOWED = {
    "client_lib": {"client_lib"},
    "client_lib.fs.mount": {"client_lib", "pyfuse3", "trio"},
    "btree": {"btree", "client_lib", "sortedcontainers"},
    "topology": {"topology", "btree", "client_lib", "networkx"},
}
NO_IO = ("socket", "asyncio", "urllib", "http", "subprocess", "aiohttp", "plyvel", "threading",
         "os_ken.base", "os_ken.controller", "os_ken.lib.hub", "os_ken.topology")
"""What the pure core (btree, topology) and the controller's decisions must not touch
(os-ken's OpenFlow message classes and packet library are pure and allowed)."""
PURE_CONTROLLER = ("core", "world", "views", "saga", "build", "split", "move", "failover", "repair",
                   "rebalance", "migrations", "oracles", "load", "inventory", "registry", "steps",
                   "settings", "ofmsgs", "routing", "arp")


def _modules() -> dict[str, Path]:
    out = {}
    for package in PACKAGES:
        for path in (ROOT / package).rglob("*.py"):
            parts = path.relative_to(ROOT).with_suffix("").parts
            name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
            out[name] = path
    return out


def _runtime_imports(path: Path, module: str, typing: bool = False) -> set[str]:
    """Modules imported when `module` is imported (not inside functions; under
    TYPE_CHECKING only with `typing`)."""
    tree = ast.parse(path.read_text(), str(path))
    found: set[str] = set()

    def visit(nodes: list[ast.stmt]) -> None:
        for node in nodes:
            if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test) and not typing:
                visit(node.orelse)
                continue
            if isinstance(node, ast.Import):
                found.update(alias.name for alias in node.names)
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    base = module.split(".")[: -node.level] if not path.name == "__init__.py" else \
                        module.split(".")[: len(module.split(".")) - node.level + 1]
                    prefix = ".".join(base + ([node.module] if node.module else []))
                else:
                    prefix = node.module or ""
                found.add(prefix)
                found.update(f"{prefix}.{alias.name}" for alias in node.names)
            elif isinstance(node, (ast.If, ast.Try)):
                visit(node.body)
                visit(getattr(node, "orelse", []))
                for handler in getattr(node, "handlers", []):
                    visit(handler.body)
    visit(tree.body)
    return found


MODULES = _modules()
GRAPH = {name: {m for m in _runtime_imports(path, name, typing=True) if m in MODULES}
         for name, path in MODULES.items()}
IMPORTS = {name: _runtime_imports(path, name) for name, path in MODULES.items()}
EXTERNAL = {name: {m.split(".")[0] for m in imported} for name, imported in IMPORTS.items()}


def test_no_import_cycles() -> None:
    state: dict[str, int] = {}   # 1: on the path, 2: done
    path: list[str] = []

    def walk(node: str) -> None:
        state[node] = 1
        path.append(node)
        for nxt in sorted(GRAPH[node]):
            if state.get(nxt) == 1:
                cycle = path[path.index(nxt):] + [nxt]
                pytest.fail("import cycle: " + " -> ".join(cycle))
            if nxt not in state:
                walk(nxt)
        path.pop()
        state[node] = 2

    for module in sorted(GRAPH):
        if module not in state:
            walk(module)


def _layer(module: str) -> str:
    """The most specific entry of ALLOWED that `module` belongs to."""
    return max((p for p in ALLOWED if module == p or module.startswith(p + ".")), key=len,
               default=module.split(".")[0])


@pytest.mark.parametrize("package", sorted(ALLOWED))
def test_lower_layers_import_only_what_they_may(package: str) -> None:
    stdlib = set(sys.stdlib_module_names) | {"__future__"}
    for module, imported in EXTERNAL.items():
        if _layer(module) != package:
            continue
        foreign = imported - stdlib - ALLOWED[package]
        assert not foreign, f"{module} imports {sorted(foreign)}"


def test_the_pure_core_and_the_controller_decisions_do_no_io() -> None:
    pure = [m for m in MODULES if m.split(".")[0] in ("btree", "topology")]
    pure += [f"controller.{name}" for name in PURE_CONTROLLER]
    for module in pure:
        touched = {m for m in IMPORTS[module] if any(m == p or m.startswith(p + ".") for p in NO_IO)}
        assert not touched, f"{module} imports {sorted(touched)}"
