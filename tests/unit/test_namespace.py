"""The synthetic namespace must be a valid, realistic and reproducible file tree."""

from __future__ import annotations

import statistics
from collections import Counter

import pytest

from benchmarks.namespace import MAX_DEPTH, generate_entries, generate_paths
from client_lib import normalize_path

N = 100_000


@pytest.fixture(scope="module")
def entries() -> list[tuple[str, bool]]:
    return generate_entries(N, seed=7)


def _parent(path: str) -> str:
    return path.rsplit("/", 1)[0] or "/"


def _check_tree(entries: list[tuple[str, bool]]) -> None:
    """Unique paths, parents listed as directories before their children."""
    kinds: dict[str, bool] = {}
    for path, is_dir in entries:
        assert path not in kinds, path
        parent = _parent(path)
        assert parent == "/" or kinds.get(parent) is True, path
        kinds[path] = is_dir


def test_size_and_uniqueness(entries: list[tuple[str, bool]]) -> None:
    paths = [path for path, _ in entries]
    assert len(paths) == N
    assert len(set(paths)) == N


def test_closed_under_parents_and_parents_first(entries: list[tuple[str, bool]]) -> None:
    _check_tree(entries)


@pytest.mark.parametrize("n", [0, 1, 2, 3, 5, 6, 7, 13, 50, 333, 2_000])
def test_small_n(n: int) -> None:
    entries = generate_entries(n, seed=1)
    assert len(entries) == n
    _check_tree(entries)


def test_negative_n_rejected() -> None:
    with pytest.raises(ValueError):
        generate_entries(-1)


def test_deterministic_per_seed() -> None:
    assert generate_entries(20_000, seed=3) == generate_entries(20_000, seed=3)
    assert generate_paths(5_000) == generate_paths(5_000, seed=0)


def test_seeds_differ() -> None:
    a, b = generate_paths(20_000, seed=1), generate_paths(20_000, seed=2)
    assert a != b
    assert len(set(a) & set(b)) < len(a) // 2


def test_generate_paths_matches_entries() -> None:
    assert generate_paths(3_000, seed=5) == [path for path, _ in generate_entries(3_000, seed=5)]


def test_every_path_is_normalized(entries: list[tuple[str, bool]]) -> None:
    for path, _ in entries:
        assert normalize_path(path) == path.encode(), path


def test_top_level_trees(entries: list[tuple[str, bool]]) -> None:
    top = Counter(path.split("/")[1] for path, _ in entries)
    assert set(top) == {"data", "warehouse", "home", "var", "tmp"}
    assert [path for path, _ in entries if path.count("/") == 1] == [
        "/data",
        "/warehouse",
        "/home",
        "/var",
        "/tmp",
    ]
    paths = {path for path, _ in entries}
    assert "/var/log" in paths
    assert any(p.startswith("/warehouse/") and "/dt=" in p and p.endswith(".parquet") for p in paths)


def test_depth_distribution(entries: list[tuple[str, bool]]) -> None:
    file_depths = Counter(path.count("/") for path, is_dir in entries if not is_dir)
    assert min(file_depths) >= 2
    assert max(file_depths) <= MAX_DEPTH
    assert 4 <= file_depths.most_common(1)[0][0] <= 6
    share_4_to_6 = sum(file_depths[d] for d in (4, 5, 6)) / sum(file_depths.values())
    assert share_4_to_6 > 0.5
    assert max(file_depths) >= 9  # a tail of deep trees exists


def test_name_lengths(entries: list[tuple[str, bool]]) -> None:
    names = [path.rsplit("/", 1)[1] for path, _ in entries]
    lengths = [len(name) for name in names]
    assert min(lengths) == 1
    assert max(lengths) <= 64
    assert 8 <= statistics.median(lengths) <= 25
    assert sum(length >= 40 for length in lengths) > N // 100
    assert all(name not in ("", ".", "..") and "/" not in name for name in names)
    assert all(name == name.strip() for name in names)
    non_ascii = sum(not name.isascii() for name in names)
    spaced = sum(" " in name for name in names)
    assert 0 < non_ascii < N // 20
    assert 0 < spaced < N // 20


def test_directories_hold_files(entries: list[tuple[str, bool]]) -> None:
    directories = [path for path, is_dir in entries if is_dir]
    files = [path for path, is_dir in entries if not is_dir]
    assert 7 <= len(files) / len(directories) <= 14  # about one directory per ten files
    with_files = {_parent(path) for path in files}
    assert len(with_files) > len(directories) // 2
    parents = {_parent(path) for path, _ in entries}
    files_set = set(files)
    assert not parents & files_set  # nothing lives below a file

