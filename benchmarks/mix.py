"""What the benchmark's clients ask for: keys, operations and values.

The paper's mix is 20 % get and 80 % put on metadata objects of about 250
bytes (a file) and 290 bytes (a directory); keys come from a realistic
namespace (`benchmarks.namespace`) and are drawn with Zipf popularity, the
most popular entries scattered over the namespace (not the first ones
generated). mdtest-like phases use fresh paths per client instead:
create them, stat them, remove them. Pure: no I/O.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from benchmarks.namespace import generate_entries
from client_lib.metadata import FileMetadata

PHASES = ("mixed", "create", "stat", "remove")


@dataclass(frozen=True)
class Entry:
    key: bytes        # normalized path
    value: bytes      # the metadata object written by a put


def entries(count: int, seed: int, now_ms: int = 1_700_000_000_000) -> list[Entry]:
    """The shared namespace: every client builds the same list from the seed."""
    out = []
    for path, is_dir in generate_entries(count, seed):
        meta = FileMetadata.new_dir(path, now_ms) if is_dir else \
            FileMetadata.new_file(path, 4096 * (len(path) % 97 + 1), now_ms)
        out.append(Entry(path.encode(), meta.to_bytes()))
    return out


def mdtest_entries(client: str, count: int, now_ms: int = 1_700_000_000_000) -> list[Entry]:
    """A client's own fresh files for the create/stat/remove phases."""
    paths = [f"/mdtest/{client}/d{i // 100:03d}/file.{i:06d}" for i in range(count)]
    return [Entry(path.encode(), FileMetadata.new_file(path, 0, now_ms).to_bytes()) for path in paths]


class MixedOps:
    """An endless stream of (is_get, entry index) under Zipf popularity."""

    def __init__(self, population: int, get_fraction: float, zipf: float, seed: int,
                 batch: int = 65536) -> None:
        if population < 1:
            raise ValueError("the namespace is empty")
        if not 0 <= get_fraction <= 1:
            raise ValueError(f"get fraction {get_fraction} outside 0..1")
        self.rng = np.random.default_rng(seed)
        ranks = np.arange(1, population + 1, dtype=float)
        weights = ranks ** -zipf if zipf > 0 else np.ones(population)
        self.cdf = np.cumsum(weights / weights.sum())
        self.order = self.rng.permutation(population)   # popularity rank -> entry index
        self.get_fraction = get_fraction
        self.batch = batch
        self._pending: list[tuple[bool, int]] = []

    def __next__(self) -> tuple[bool, int]:
        if not self._pending:
            ranks = np.minimum(np.searchsorted(self.cdf, self.rng.random(self.batch)), len(self.cdf) - 1)
            gets = self.rng.random(self.batch) < self.get_fraction
            self._pending = list(zip(gets.tolist(), self.order[ranks].tolist(), strict=True))[::-1]
        return self._pending.pop()

    def __iter__(self) -> MixedOps:
        return self
