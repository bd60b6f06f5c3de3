"""The snapshot format (`controller.snapshot_format`): block files, the
manifest, and every way a snapshot can be unfinished or corrupt."""

from __future__ import annotations

import dataclasses
import hashlib
import json
from pathlib import Path

import pytest

from client_lib.api.admin import encode_records
from client_lib.cidr import Block
from controller.snapshot_format import (
    BLOCKS,
    FORMAT,
    MANIFEST,
    VERSION,
    BlockWriter,
    Manifest,
    SnapshotError,
    block_file,
    missing,
    read_manifest,
    records,
    verify,
    write_manifest,
)

SPACE = Block.parse("100.64.0.0/10")
LOW, HIGH = SPACE.halves()
RECORDS = {
    LOW: [(LOW.first, "/a", b"\x00a"), (LOW.first, "/a\0x", b"entry"), (LOW.first + 5, "/b\udcff", b"")],
    HIGH: [(HIGH.last, "/z", bytes(range(256)))],
}


def _snapshot(root: Path) -> Manifest:
    (root / BLOCKS).mkdir(parents=True)
    entries = []
    for block, rows in RECORDS.items():
        writer = BlockWriter(root, block)
        writer.add(encode_records(rows[:1]))
        writer.add(encode_records(rows[1:]))
        entries.append(writer.finish("s1", 3))
    manifest = Manifest(FORMAT, VERSION, "2026-11-26T13:00:00+00:00", "http://c:8080", SPACE,
                        sum(map(len, RECORDS.values())), entries)
    write_manifest(root, manifest)
    return manifest


def test_a_snapshot_reads_back_what_was_written(tmp_path: Path) -> None:
    manifest = _snapshot(tmp_path)
    assert read_manifest(tmp_path) == manifest
    verify(tmp_path, manifest)
    for entry in manifest.blocks:
        assert entry.file == block_file(entry.block)
        assert [r for batch in records(tmp_path, entry, batch=2) for r in batch] == RECORDS[entry.block]
        data = (tmp_path / entry.file).read_bytes()
        assert (entry.bytes, entry.sha256) == (len(data), hashlib.sha256(data).hexdigest())
        assert data.count(b"\n") == entry.records
    assert not list(tmp_path.rglob("*.part"))


def test_block_files_are_named_by_block_in_both_widths() -> None:
    assert block_file(LOW) == f"{BLOCKS}/100.64.0.0_11.jsonl"
    assert block_file(Block.parse("fd00::/8")) == f"{BLOCKS}/fd00--_8.jsonl"


def test_missing_finds_the_gaps_and_refuses_overlaps() -> None:
    a, b = LOW.halves()
    assert missing(SPACE, [LOW, HIGH]) == []
    assert missing(SPACE, [b]) == [a, HIGH]
    with pytest.raises(SnapshotError, match="overlap"):
        missing(SPACE, [LOW, a])


def test_a_writer_refuses_records_out_of_order_or_outside_its_block(tmp_path: Path) -> None:
    (tmp_path / BLOCKS).mkdir()
    writer = BlockWriter(tmp_path, LOW)
    writer.add(encode_records([(LOW.first + 1, "/b", b"")]))
    with pytest.raises(SnapshotError, match="out of order"):
        writer.add(encode_records([(LOW.first + 1, "/a", b"")]))
    with pytest.raises(SnapshotError, match="outside the block"):
        writer.add(encode_records([(HIGH.first, "/z", b"")]))
    writer.discard()
    assert list((tmp_path / BLOCKS).iterdir()) == []


def _edit_manifest(root: Path, **changes: object) -> None:
    data = json.loads((root / MANIFEST).read_text())
    data.update(changes)
    (root / MANIFEST).write_text(json.dumps(data))


@pytest.mark.parametrize(("changes", "error"), [
    ({"format": "tarball"}, "not a metaflow-snapshot manifest"),
    ({"version": VERSION + 1}, f"version {VERSION + 1}"),
    ({"records": 99}, "99 records in all"),
    ({"space": "100.128.0.0/10"}, "outside the space"),
    ({"space": "100.0.0.0/8"}, "leave out 100.0.0.0/10"),
    ({"created": 5}, "created"),
])
def test_a_manifest_that_does_not_fit_the_format_is_refused(tmp_path: Path, changes: dict[str, object],
                                                             error: str) -> None:
    _snapshot(tmp_path)
    _edit_manifest(tmp_path, **changes)
    with pytest.raises(SnapshotError, match=error):
        read_manifest(tmp_path)


def test_an_unfinished_snapshot_or_one_with_a_block_left_out_is_refused(tmp_path: Path) -> None:
    with pytest.raises(SnapshotError, match="unfinished"):
        read_manifest(tmp_path)
    manifest = _snapshot(tmp_path)
    data = json.loads((tmp_path / MANIFEST).read_text())
    data["blocks"] = data["blocks"][:1]
    data["records"] = manifest.blocks[0].records
    (tmp_path / MANIFEST).write_text(json.dumps(data))
    with pytest.raises(SnapshotError, match=f"leave out {HIGH}"):
        read_manifest(tmp_path)


def test_verify_finds_a_changed_byte_a_missing_file_and_a_wrong_count(tmp_path: Path) -> None:
    manifest = _snapshot(tmp_path)
    entry = manifest.blocks[0]
    path = tmp_path / entry.file
    good = path.read_bytes()
    path.write_bytes(good.replace(b"/a", b"/A", 1))
    with pytest.raises(SnapshotError, match=f"{entry.file} is corrupt"):
        verify(tmp_path, manifest)
    path.unlink()
    with pytest.raises(SnapshotError, match=entry.file):
        verify(tmp_path, manifest)
    path.write_bytes(good)
    wrong = dataclasses.replace(manifest, blocks=[dataclasses.replace(entry, records=entry.records + 1),
                                                  *manifest.blocks[1:]])
    with pytest.raises(SnapshotError, match="holds 3 records, the manifest says 4"):
        verify(tmp_path, wrong)


@pytest.mark.parametrize(("line", "error"), [
    (b'[1,"/a"]\n', ":1: "),
    (b"not json\n", ":1: "),
    (json.dumps([HIGH.first, "/z", ""]).encode() + b"\n", "outside 100.64.0.0/11"),
    (json.dumps([LOW.first, "/a", "!!"]).encode() + b"\n", "not base64"),
])
def test_a_block_file_whose_checksum_fits_but_whose_lines_do_not_is_refused(
        tmp_path: Path, line: bytes, error: str) -> None:
    manifest = _snapshot(tmp_path)
    entry = manifest.blocks[0]
    (tmp_path / entry.file).write_bytes(line)
    with pytest.raises(SnapshotError, match=error):
        list(records(tmp_path, entry))
