"""Where a benchmark's results go: ``NAME.json`` and the plot ``NAME.png``
in the output directory, and the report on stdout, with the paths."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any


def publish(results: dict[str, Any], out: Path, name: str, plot: Callable[[dict[str, Any], Path], None],
            report: Callable[[dict[str, Any]], str]) -> None:
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{name}.json").write_text(json.dumps(results, indent=2) + "\n")
    plot(results, out / f"{name}.png")
    print(report(results))
    print(f"\nwritten: {out / (name + '.json')}, {out / (name + '.png')}")
