"""FileMetadata: HDFS-sized objects that round-trip and reject garbage."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from benchmarks.namespace import generate_paths
from client_lib.metadata import FileMetadata, MetadataFormatError

NOW = 1_795_000_000_000


def test_sizes_match_the_papers_objects_on_a_realistic_namespace():
    """The paper measures with ~250-byte file and ~290-byte directory objects."""
    paths = generate_paths(2000, seed=3)
    files = [len(FileMetadata.new_file(p, 300 << 20, NOW, block_ids=[1 << 30, (1 << 30) + 1, (1 << 30) + 2]).to_bytes())
             for p in paths]
    dirs = [len(FileMetadata.new_dir(p, NOW, children=1200, ns_quota=100_000, ds_quota=1 << 40).to_bytes())
            for p in paths]
    mean_file, mean_dir = sum(files) / len(files), sum(dirs) / len(dirs)
    assert 220 <= mean_file <= 280, mean_file
    assert 260 <= mean_dir <= 320, mean_dir
    assert mean_dir > mean_file


@settings(deadline=None)
@given(st.text(min_size=1, max_size=60).map(lambda s: "/" + s.replace("\0", "")),
       st.integers(0, 1 << 36), st.booleans())
def test_round_trip(path, size, is_dir):
    meta = FileMetadata.new_dir(path, NOW) if is_dir else FileMetadata.new_file(path, size, NOW)
    assert FileMetadata.from_bytes(meta.to_bytes()) == meta


def test_paths_are_normalized_and_directories_have_no_blocks():
    meta = FileMetadata("/a//b/./c/", "dir", blocks=[1, 2])
    assert meta.path == "/a/b/c"
    assert meta.blocks == [] and meta.replication == 0
    with pytest.raises(ValueError, match="absolute"):
        FileMetadata("relative/path")
    with pytest.raises(ValueError, match="kind"):
        FileMetadata("/x", "socket")


@pytest.mark.parametrize("data", [b"", b"\xff\xfe", b"[]", b'{"v":2,"p":"/a"}', b'{"v":1,"p":"/a","zz":1}',
                                  b'{"v":1,"p":"rel"}', b'{"v":1}'])
def test_garbage_is_a_format_error(data):
    with pytest.raises(MetadataFormatError):
        FileMetadata.from_bytes(data)
