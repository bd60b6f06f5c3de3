"""The compiled extension is optional, and decided in one place (`nat_agent.extension`).

Every first-party module reaches `nat_agent._fastpath` through
`nat_agent.extension` (type-only imports included), so that an install
without it has exactly one place that notices and one fallback; the tests
of the extension itself (test_fastpath.py, test_fast_lane.py) import it
directly, since without it they have nothing to test. And the one rule the
fallback restates in Python, the per-argument limits, is tied to the
compiled one here.
"""

from __future__ import annotations

import ast
from pathlib import Path

from hypothesis import given
from hypothesis import strategies as st

from nat_agent._fastpath import ArgLimits
from nat_agent.extension import python_arg_limits

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("btree", "topology", "controller", "nat_agent", "client_lib", "benchmarks", "mininet_scenarios")
EXTENSION = "nat_agent._fastpath"
ONE_PLACE = Path("nat_agent/extension.py")


def _imports_the_extension(tree: ast.AST) -> bool:
    for node in ast.walk(tree):
        if isinstance(node, ast.Import) and any(a.name == EXTENSION for a in node.names):
            return True
        if isinstance(node, ast.ImportFrom) and node.level == 0 and (
                node.module == EXTENSION
                or (node.module == "nat_agent" and any(a.name == "_fastpath" for a in node.names))):
            return True
        if isinstance(node, ast.ImportFrom) and node.level > 0 and (
                (node.module or "").endswith("_fastpath") or any(a.name == "_fastpath" for a in node.names)):
            return True
    return False


def test_only_nat_agent_extension_imports_the_compiled_extension() -> None:
    importers = {file.relative_to(ROOT) for package in PACKAGES for file in (ROOT / package).rglob("*.py")
                 if _imports_the_extension(ast.parse(file.read_text(), str(file)))}
    assert importers == {ONE_PLACE}


# Command names as clients send them: the known ones in any case, and others.
NAMES = st.one_of(st.sampled_from([b"SET", b"set", b"Set", b"ECREATE", b"ecReate", b"DELIFEQ", b"GET", b""]),
                  st.binary(max_size=8))


@given(key=st.integers(0, 1 << 20), value=st.integers(0, 1 << 30),
       values_from=st.lists(st.tuples(st.sampled_from([b"SET", b"set", b"ECREATE", b"DelIfEq", b"X\xff"]),
                                      st.integers(0, 4)), max_size=4, unique_by=lambda pair: pair[0].upper()),
       name=NAMES, index=st.integers(0, 8))
def test_the_python_argument_limits_are_the_compiled_ones(key: int, value: int,
                                                          values_from: list[tuple[bytes, int]],
                                                          name: bytes, index: int) -> None:
    compiled = ArgLimits(key, value, values_from)
    assert python_arg_limits(key, value, values_from)(name, index) == compiled(name, index)
