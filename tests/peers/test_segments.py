"""tools/peers/segments.py on hand-built segment files (the real broker's are in test_produce)."""

from __future__ import annotations

import struct
from pathlib import Path

import pytest

from tools.peers.segments import (
    broker_batches,
    iter_batches,
    read_broker_batches,
    segment_files,
)

TOPIC = "orders"


def batch(base_offset: int, records: int, attributes: int = 0, payload: bytes = b"") -> bytes:
    """A magic-2 batch whose header fields the framing reads; CRC and records are filler."""
    after_length = (
        struct.pack(">ibIhi", 0, 2, 0, attributes, records - 1)
        + bytes(61 - 27)  # the rest of the 61-byte header
        + payload
    )
    return struct.pack(">qi", base_offset, len(after_length)) + after_length


def write_partition(log_dir: Path, segments: dict[int, list[bytes]]) -> Path:
    directory = log_dir / f"{TOPIC}-0"
    directory.mkdir(parents=True)
    for base, batches in segments.items():
        (directory / f"{base:020d}.log").write_bytes(b"".join(batches))
        (directory / f"{base:020d}.index").write_bytes(b"\0" * 8)
    return directory


def test_iter_batches_reads_offsets_and_attribute_bits() -> None:
    data = batch(0, 3, attributes=0x01) + batch(3, 1, attributes=0x30) + batch(4, 2, 0x14)
    got = list(iter_batches(data))
    assert [(b.base_offset, b.last_offset) for b in got] == [(0, 2), (3, 3), (4, 5)]
    assert [b.codec for b in got] == ["gzip", "none", "zstd"]
    assert [b.is_control for b in got] == [False, True, False]
    assert [b.is_transactional for b in got] == [False, True, True]
    assert b"".join(b.raw for b in got) == data


def test_a_partial_trailing_batch_is_an_error() -> None:
    data = batch(0, 1) + batch(1, 1)[:-5]
    with pytest.raises(ValueError, match="offset 1 runs past the end"):
        list(iter_batches(data))
    with pytest.raises(ValueError, match="stray bytes"):
        list(iter_batches(batch(0, 1) + b"\0\0\0"))
    # A Fetch response may end that way: then the partial batch is dropped.
    assert [b.base_offset for b in iter_batches(data, partial_tail=True)] == [0]
    assert [b.base_offset for b in iter_batches(data[:-30], partial_tail=True)] == [0]


def test_segments_are_ordered_by_base_offset_not_by_name_length(tmp_path: Path) -> None:
    write_partition(tmp_path, {10: [batch(10, 1)], 9: [batch(9, 1)], 100: [batch(100, 1)]})
    names = [p.name for p in segment_files(tmp_path, TOPIC, 0)]
    assert names == [f"{n:020d}.log" for n in (9, 10, 100)]


def test_read_broker_batches_spans_segments_and_cuts_at_batch_boundaries(tmp_path: Path) -> None:
    first = [batch(0, 5), batch(5, 5)]
    second = [batch(10, 5), batch(15, 1, attributes=0x30)]
    write_partition(tmp_path, {0: first, 10: second})
    assert read_broker_batches(tmp_path, TOPIC, 0) == b"".join(first + second)
    # A range starting inside a batch includes that whole batch.
    assert read_broker_batches(tmp_path, TOPIC, 0, start_offset=7, end_offset=15) == b"".join(
        [first[1], second[0]]
    )
    bases = [b.base_offset for b in broker_batches(tmp_path, TOPIC, 0, start_offset=10)]
    assert bases == [10, 15]
    assert read_broker_batches(tmp_path, TOPIC, 0, start_offset=16) == b""


def test_a_missing_partition_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match=f"{TOPIC}-3"):
        read_broker_batches(tmp_path, TOPIC, 3)
