"""scan_batches over real producer batches (kafka-python's builder), cut and damaged."""

from __future__ import annotations

import struct

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from replicad.records.batch import (
    LOG_OVERHEAD,
    RECORD_BATCH_OVERHEAD,
    V2_CRC_START,
    Compression,
    ScanStop,
    TimestampType,
    scan_batches,
)
from tools.logdata.batches import producer_batch

CODECS = list(Compression)


def _stream(count: int = 5, codec: Compression = Compression.NONE) -> tuple[bytes, list[bytes]]:
    batches = []
    offset = 100
    for i in range(count):
        values = [f"value-{offset + j}-".encode() * 40 for j in range(i + 1)]
        batches.append(producer_batch(offset, values, codec=codec, leader_epoch=3 + i // 2))
        offset += len(values)
    return b"".join(batches), batches


@pytest.mark.parametrize("codec", CODECS, ids=[c.name for c in CODECS])
def test_headers_of_producer_batches(codec: Compression) -> None:
    data, parts = _stream(4, codec)
    result = scan_batches(data)
    assert result.stop is ScanStop.END
    assert result.error is None
    assert result.valid_bytes == len(data)
    assert [b.size for b in result.batches] == [len(p) for p in parts]
    assert [b.base_offset for b in result.batches] == [100, 101, 103, 106]
    assert [b.last_offset for b in result.batches] == [100, 102, 105, 109]
    assert result.next_offset == 110
    first = result.batches[0]
    assert first.position == 0
    assert first.magic == 2
    assert first.compression is codec
    assert first.timestamp_type is TimestampType.CREATE_TIME
    assert not first.is_transactional and not first.is_control
    assert first.record_count == 1
    assert first.base_timestamp == 1_700_000_000_000
    assert result.batches[3].max_timestamp == 1_700_000_000_003
    assert [b.partition_leader_epoch for b in result.batches] == [3, 3, 4, 4]
    assert result.batches[1].position == len(parts[0])


def test_empty_buffer_is_end() -> None:
    result = scan_batches(b"")
    assert (result.stop, result.valid_bytes, result.batches) == (ScanStop.END, 0, [])


@given(cut=st.integers(min_value=1, max_value=10_000))
@settings(max_examples=200, deadline=None)
def test_any_cut_is_partial_with_whole_batches_before(cut: int) -> None:
    data, parts = _stream(6)
    cut = cut % len(data)
    ends = []
    pos = 0
    for p in parts:
        pos += len(p)
        ends.append(pos)
    result = scan_batches(memoryview(data)[:cut])
    whole = [e for e in ends if e <= cut]
    assert result.valid_bytes == (whole[-1] if whole else 0)
    assert len(result.batches) == len(whole)
    expected = ScanStop.END if cut in ends or cut == 0 else ScanStop.PARTIAL
    assert result.stop is expected


@given(where=st.integers(min_value=0, max_value=10_000), bit=st.integers(0, 7))
@settings(max_examples=200, deadline=None)
def test_flipped_bit_under_the_crc_is_corrupt(where: int, bit: int) -> None:
    data, parts = _stream(3)
    target = 1  # damage the second batch inside its CRC-covered part
    start = len(parts[0]) + V2_CRC_START
    end = len(parts[0]) + len(parts[1])
    pos = start + where % (end - start)
    damaged = bytearray(data)
    damaged[pos] ^= 1 << bit
    result = scan_batches(bytes(damaged))
    assert result.stop is ScanStop.CORRUPT
    assert result.valid_bytes == len(parts[0])
    assert len(result.batches) == target
    assert result.error is not None and f"position {len(parts[0])}" in result.error


def test_crc_not_checked_when_asked() -> None:
    data, _ = _stream(2)
    damaged = bytearray(data)
    damaged[-1] ^= 0xFF
    assert scan_batches(bytes(damaged)).stop is ScanStop.CORRUPT
    assert scan_batches(bytes(damaged), verify_crc=False).stop is ScanStop.END


def test_bad_magic_is_corrupt_and_named() -> None:
    data, parts = _stream(2)
    damaged = bytearray(data)
    damaged[len(parts[0]) + 16] = 7
    result = scan_batches(bytes(damaged))
    assert result.stop is ScanStop.CORRUPT
    assert "unknown magic 7" in (result.error or "")
    assert result.valid_bytes == len(parts[0])


def test_length_below_minimum_is_corrupt() -> None:
    data, _ = _stream(1)
    damaged = bytearray(data)
    struct.pack_into(">i", damaged, 8, RECORD_BATCH_OVERHEAD - LOG_OVERHEAD - 1)
    result = scan_batches(bytes(damaged))
    assert result.stop is ScanStop.CORRUPT
    assert "below the minimum" in (result.error or "")


def test_zeroed_tail_is_not_a_batch() -> None:
    data, _ = _stream(2)
    result = scan_batches(data + bytes(4096))
    # A zero length is below every format's minimum: preallocated or zero-filled tails stop
    # the scan as corrupt, never as data.
    assert result.stop is ScanStop.CORRUPT
    assert result.valid_bytes == len(data)


def test_unknown_codec_is_corrupt() -> None:
    data = bytearray(producer_batch(0, [b"x"]))
    struct.pack_into(">h", data, 21, 7)
    result = scan_batches(bytes(data), verify_crc=False)
    assert result.stop is ScanStop.CORRUPT
    assert "codec 7" in (result.error or "")


def test_scans_a_slice_of_a_bigger_buffer_without_copy() -> None:
    data, parts = _stream(3)
    framed = b"junk" + data + b"junk"
    view = memoryview(framed)[4 : 4 + len(data)]
    result = scan_batches(view)
    assert result.stop is ScanStop.END
    assert result.batches[2].position == len(parts[0]) + len(parts[1])
