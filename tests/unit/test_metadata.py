"""FileMetadata: HDFS-sized objects that round-trip and reject garbage."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from benchmarks.namespace import generate_paths
from client_lib.errors import InvalidArgument, InvalidPath, MetaFlowError
from client_lib.metadata import FileMetadata, MetadataFormatError

NOW = 1_795_000_000_000


def test_sizes_match_the_papers_objects_on_a_realistic_namespace():
    """The paper measures with ~250-byte file and ~290-byte directory objects."""
    paths = generate_paths(2000, seed=3)
    block_ids = [1 << 30, (1 << 30) + 1, (1 << 30) + 2]
    files = [len(FileMetadata.new_file(p, 300 << 20, NOW, block_ids=block_ids).to_bytes()) for p in paths]
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
    with pytest.raises(InvalidPath, match="absolute"):
        FileMetadata("relative/path")
    with pytest.raises(InvalidArgument, match="kind"):
        FileMetadata("/x", "socket")


@pytest.mark.parametrize("fields, message", [
    ({"path": 42}, "path must be str or bytes"),
    ({"size": "big"}, "size must be an integer"),
    ({"size": -1}, "size must be at least 0"),
    ({"mtime": 1.5}, "mtime must be an integer"),
    ({"replication": True}, "replication must be an integer"),
    ({"mode": 0o10000}, "mode"),
    ({"owner": None}, "owner must be a string"),
    ({"blocks": [1, "2"]}, "blocks must be a list of int"),
    ({"blocks": (1, 2)}, "blocks must be a list of int"),
    ({"acl": "user::rwx"}, "acl must be a list of str"),
    ({"ns_quota": -2}, "ns_quota must be at least -1"),
    ({"snapshottable": 1}, "snapshottable"),
])
def test_bad_fields_are_invalid_arguments(fields, message):
    """A dataclass does not check types: without these checks a record with a
    string for its size was stored and only failed in whoever read it."""
    fields = {"path": "/x", **fields}
    with pytest.raises(InvalidArgument, match=message):
        FileMetadata(**fields)


@pytest.mark.parametrize("call", [
    lambda: FileMetadata.new_file("/f", 10, NOW, block_size=0),
    lambda: FileMetadata.new_file("/f", -1, NOW),
    lambda: FileMetadata.new_file("/f", "10", NOW),  # type: ignore[arg-type]
    lambda: FileMetadata.new_dir("/d", NOW, children=-1),
])
def test_constructors_refuse_bad_sizes_in_the_family(call):
    """block_size=0 was a ZeroDivisionError, a string size a TypeError."""
    with pytest.raises(InvalidArgument):
        call()


@pytest.mark.parametrize("data", [b"", b"\xff\xfe", b"[]", b'{"v":2,"p":"/a"}', b'{"v":1,"p":"/a","zz":1}',
                                  b'{"v":1,"p":"rel"}', b'{"v":1}', b'{"v":true,"p":"/a"}',
                                  b'{"v":1,"p":"/a","s":"big"}', b'{"v":1,"p":"/a","b":[1.5]}',
                                  b'{"v":1,"p":"/a","k":"link"}'])
def test_garbage_is_a_format_error(data):
    """In the one family, and a ValueError as before."""
    with pytest.raises(MetadataFormatError) as caught:
        FileMetadata.from_bytes(data)
    assert isinstance(caught.value, MetaFlowError) and isinstance(caught.value, ValueError)
