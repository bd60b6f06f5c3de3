"""File contents in chunks (`client_lib.fs.filedata`) on a real agent, against a
bytearray: random writes, reads, truncates and the reclaim on unlink; a chunk
that changed on disk is refused; concurrent writers to one chunk lose nothing."""

from __future__ import annotations

import secrets
import threading

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from client_lib import MetaFlowClient
from client_lib.fs.filedata import ChecksumMismatch, FileData, chunk_key

SMALL = 64   # bytes per chunk in the model test: many chunk boundaries in a few hundred bytes


@pytest.fixture(scope="module")
def client(standalone_client: MetaFlowClient) -> MetaFlowClient:
    return standalone_client


ops = st.lists(st.one_of(
    st.tuples(st.just("write"), st.integers(0, 600), st.binary(min_size=1, max_size=200)),
    st.tuples(st.just("read"), st.integers(0, 700), st.integers(0, 300)),
    st.tuples(st.just("truncate"), st.integers(0, 700), st.just(0))), min_size=1, max_size=25)


@given(ops=ops)
@settings(max_examples=50, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
def test_chunks_behave_like_one_byte_array(client: MetaFlowClient,
                                           ops: list[tuple[str, int, object]]) -> None:
    data = FileData(client, chunk_size=SMALL)
    ino = secrets.randbits(63)   # a file of its own in every run, replays included
    model = bytearray()
    for op, offset, arg in ops:
        if op == "write":
            assert isinstance(arg, bytes)
            data.write(ino, offset, arg)
            model[len(model):] = bytes(max(0, offset - len(model)))
            model[offset:offset + len(arg)] = arg
        elif op == "read":
            assert isinstance(arg, int)
            assert data.read(ino, offset, arg, len(model)) == bytes(model[offset:offset + arg])
        else:
            if offset < len(model):
                data.truncate(ino, len(model), offset)
                del model[offset:]
    assert data.read(ino, 0, len(model), len(model)) == bytes(model)
    data.remove(ino, len(model))
    assert not any(client.exists(chunk_key(ino, i)) for i in range(-(-len(model) // SMALL) + 1))


def test_a_changed_chunk_is_refused_and_a_sparse_gigabyte_costs_one_chunk(client: MetaFlowClient) -> None:
    data = FileData(client)
    ino = secrets.randbits(63)
    end = 1 << 30
    data.write(ino, end - 10, b"0123456789")                   # the last 10 bytes of a 1 GiB file
    assert data.read(ino, end - 12, 100, end) == b"\0\0" + b"0123456789"
    assert data.read(ino, 0, 4, end) == b"\0" * 4
    last = chunk_key(ino, (end - 1) // data.chunk_size)
    raw = client.get(last)
    assert raw is not None and sum(client.exists(chunk_key(ino, i)) for i in range(3)) == 0
    client.put(last, raw[:-1] + bytes([raw[-1] ^ 1]))           # one bit flips on disk
    with pytest.raises(ChecksumMismatch):
        data.read(ino, end - 10, 10, end)
    client.put(last, b"not a chunk")
    with pytest.raises(ChecksumMismatch):
        data.read(ino, end - 1, 1, end)


def test_concurrent_writers_to_one_chunk_lose_nothing(client: MetaFlowClient) -> None:
    """Eight threads write disjoint bytes of the same chunks at once: the
    read-modify-write is a compare-and-set, so every byte lands."""
    data = FileData(client, chunk_size=256)
    ino = secrets.randbits(63)

    def writer(n: int) -> None:
        for i in range(64):
            data.write(ino, i * 8 + n, bytes([n + 1]))

    threads = [threading.Thread(target=writer, args=(n,)) for n in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert data.read(ino, 0, 512, 512) == bytes([n + 1 for _ in range(64) for n in range(8)])
