"""MetaDataID key sets for planning: hashed paths (the real case) and a skewed set.

Hashed paths spread evenly, so splits land on aligned midpoints and tables stay
tiny. The skewed set is the stress case: IDs packed into a few narrow clusters
at random, unaligned places with Zipf-distributed weights, so that splits
must cut deep inside blocks at points no prefix boundary is near.
"""

from __future__ import annotations

import random
from collections.abc import Callable

from client_lib.cidr import Block
from client_lib.mdid import mdid

from .namespace import generate_paths

DISTRIBUTIONS = ("uniform", "skewed")


def uniform_ids(n: int, space: Block, seed: int = 0,
                progress: Callable[[int], object] | None = None) -> list[int]:
    """IDs of n generated file-system paths, hashed exactly as clients hash them."""
    md_space = Block.parse(str(space))
    out = []
    for i, path in enumerate(generate_paths(n, seed)):
        out.append(mdid(path, md_space))
        if progress and i % 65536 == 65535:
            progress(65536)
    if progress:
        progress(n % 65536)
    return out


def skewed_ids(n: int, space: Block, seed: int = 0, clusters: int = 64,
               zipf_s: float = 1.1) -> list[int]:
    """n distinct IDs drawn from Zipf-weighted clusters of log-uniform width."""
    rng = random.Random(seed)
    space_bits = space.width - space.plen
    if n > space.size // 16:
        raise ValueError(f"{n} distinct skewed IDs do not fit comfortably in {space}")
    centers = [rng.randrange(space.size) for _ in range(clusters)]
    weights = [1 / (rank + 1) ** zipf_s for rank in range(clusters)]
    # Log-uniform widths, but never so narrow that a cluster runs out of distinct IDs.
    spreads = [max(2 ** rng.uniform(8, max(9, space_bits - 6)), 2 * n * w / sum(weights))
               for w in weights]
    seen: set[int] = set()
    out: list[int] = []
    while len(out) < n:
        for c in rng.choices(range(clusters), weights, k=n - len(out)):
            offset = int(rng.gauss(0, spreads[c]))
            ident = space.first + (centers[c] + offset) % space.size
            if ident not in seen:
                seen.add(ident)
                out.append(ident)
    return out
