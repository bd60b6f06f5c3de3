"""The package layering, read from the source: who may import whom, and no cycles.

`RULE` is the whole import rule, in one table: for each layer (a package, or
a subpackage with a rule of its own), what its modules may import besides
the standard library and their own layer: first-party layers and
third-party packages alike. Every import statement counts, wherever it
is (inside a function, under ``if TYPE_CHECKING:``): a dependency is one
whether or not it runs at import time. From the bottom up:

    client_lib           the wire contract and the client: the standard library only
    client_lib.server    the serving side of the API, which both daemons use
    client_lib.fs        a file system on the client
    client_lib.fs.mount  its FUSE shim (the fs extra: trio)
    client_lib.fs.fuse_session  the shim's FUSE session on trio (the fs extra: trio)
    client_lib.fs.mount_reads  the shim's reads on trio (the fs extra: trio)
    btree, topology      the pure core
    controller           the core, the contract and os-ken
    nat_agent            the contract and its own I/O libraries
    mininet_scenarios    everything but the benchmarks
    benchmarks           everything

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
_CONTRACT = {"client_lib", "client_lib.server"}
_CORE = {"btree", "topology"}
_DAEMONS = {"controller", "nat_agent"}
_FILE_SYSTEM = {"client_lib.fs", "client_lib.fs.mount", "client_lib.fs.fuse_session",
                "client_lib.fs.mount_reads"}
RULE: dict[str, set[str]] = {
    # layer: what its modules may import besides the standard library and their own layer
    "client_lib": set(),
    "client_lib.server": {"client_lib"},
    "client_lib.fs": {"client_lib", "client_lib.fs.mount"},  # metaflow-fs: the mount, if installed
    "client_lib.fs.mount": {"client_lib", "client_lib.fs", "client_lib.fs.fuse_session",
                            "client_lib.fs.mount_reads", "trio"},
    "client_lib.fs.fuse_session": {"client_lib", "client_lib.fs", "trio"},
    "client_lib.fs.mount_reads": {"client_lib", "client_lib.fs", "trio"},
    "btree": {"client_lib", "sortedcontainers"},
    "topology": {"btree", "client_lib", "networkx"},
    "controller": _CONTRACT | _CORE | {"os_ken", "networkx", "sortedcontainers", "prometheus_client",
                                       "etcd3gw", "requests"},
    "nat_agent": _CONTRACT | {"aiohttp", "uvloop", "plyvel", "netfilterqueue", "sortedcontainers",
                              "prometheus_client"},
    "mininet_scenarios": _CONTRACT | _FILE_SYSTEM | _CORE | _DAEMONS | {"mininet", "networkx", "os_ken"},
    "benchmarks": _CONTRACT | _FILE_SYSTEM | _CORE | _DAEMONS | {"mininet_scenarios", "mininet", "os_ken",
                                                                  "networkx", "sortedcontainers", "numpy",
                                                                  "tqdm", "matplotlib", "uvloop",
                                                                  "aiohttp"},   # emulated agents' admin API
}
"""Which layer may import which: none imports a layer above it, and the client
library outside its two subpackages imports nothing else of MetaFlow, its
own server side and file system included."""
NO_IO = ("socket", "asyncio", "urllib", "http", "subprocess", "aiohttp", "plyvel", "threading",
         "prometheus_client", "os_ken.base", "os_ken.controller", "os_ken.lib.hub", "os_ken.topology")
"""What the pure core (btree, topology) and the controller's decisions must not touch
(os-ken's OpenFlow message classes and packet library are pure and allowed)."""
PURE_CONTROLLER = ("core", "world", "views", "watch", "saga", "build", "split", "move", "failover", "repair",
                   "rebalance", "migrations", "oracles", "load", "inventory", "registry", "steps",
                   "settings", "ofmsgs", "routing", "arp", "telemetry", "leadership")


def _modules() -> dict[str, Path]:
    out = {}
    for package in PACKAGES:
        for path in (ROOT / package).rglob("*.py"):
            parts = path.relative_to(ROOT).with_suffix("").parts
            name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
            out[name] = path
    return out


def _names(node: ast.Import | ast.ImportFrom, path: Path, module: str) -> set[str]:
    """What one import statement of `module` (at `path`) names: the modules, and
    for ``from X import y`` both X and X.y (y may be a module or an attribute)."""
    if isinstance(node, ast.Import):
        return {alias.name for alias in node.names}
    if node.level:
        base = module.split(".")[: -node.level] if not path.name == "__init__.py" else \
            module.split(".")[: len(module.split(".")) - node.level + 1]
        prefix = ".".join(base + ([node.module] if node.module else []))
    else:
        prefix = node.module or ""
    return {prefix} | {f"{prefix}.{alias.name}" for alias in node.names}


def _every_import(path: Path, module: str) -> set[str]:
    """Everything `module` imports anywhere: inside functions and under TYPE_CHECKING too."""
    return {name for node in ast.walk(ast.parse(path.read_text(), str(path)))
            if isinstance(node, (ast.Import, ast.ImportFrom)) for name in _names(node, path, module)}


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
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                found.update(_names(node, path, module))
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
EVERY = {name: _every_import(path, name) for name, path in MODULES.items()}


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
    """The most specific layer of `RULE` that the first-party `module` belongs to."""
    return max((p for p in RULE if module == p or module.startswith(p + ".")), key=len)


def _what(imported: str) -> str | None:
    """What an imported name counts as in `RULE`: its layer if it is ours, else
    its top-level package; None for the standard library."""
    top = imported.split(".")[0]
    if top in PACKAGES:
        return _layer(imported)
    return None if top in sys.stdlib_module_names or top == "__future__" else top


def test_the_rule_covers_every_package_and_names_only_layers_or_libraries() -> None:
    assert set(PACKAGES) <= set(RULE)
    for layer, allowed in RULE.items():
        assert layer not in allowed
        assert all(p in RULE for p in allowed if p.split(".")[0] in PACKAGES), layer


@pytest.mark.parametrize("layer", sorted(RULE))
def test_each_layer_imports_only_what_the_rule_allows(layer: str) -> None:
    modules = [m for m in MODULES if _layer(m) == layer]
    assert modules, f"no module is in {layer}"
    wrong = {}
    for module in modules:
        foreign = {what for m in EVERY[module] if (what := _what(m)) is not None} - {layer} - RULE[layer]
        if foreign:
            wrong[module] = sorted(foreign)
    assert not wrong, f"{layer} may not import these: {wrong}"


def test_the_pure_core_and_the_controller_decisions_do_no_io() -> None:
    pure = [m for m in MODULES if m.split(".")[0] in ("btree", "topology")]
    pure += [f"controller.{name}" for name in PURE_CONTROLLER]
    for module in pure:
        touched = {m for m in IMPORTS[module] if any(m == p or m.startswith(p + ".") for p in NO_IO)}
        assert not touched, f"{module} imports {sorted(touched)}"
