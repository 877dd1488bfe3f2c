"""Magic 0/1 message sets through scan_batches (kafka-python's legacy builder)."""

from __future__ import annotations

import pytest

from replicad.records.batch import Compression, ScanStop, TimestampType, scan_batches
from tools.logdata.batches import legacy_message_set


@pytest.mark.parametrize("magic", [0, 1])
def test_plain_messages_are_one_entry_each(magic: int) -> None:
    data = legacy_message_set(40, [b"a", b"bb", None], magic=magic)
    result = scan_batches(data)
    assert result.stop is ScanStop.END
    assert [b.base_offset for b in result.batches] == [40, 41, 42]
    assert all(b.last_offset == b.base_offset and b.record_count == 1 for b in result.batches)
    assert {b.magic for b in result.batches} == {magic}
    first = result.batches[0]
    assert first.producer_id == -1 and first.partition_leader_epoch == -1
    if magic == 1:
        assert first.timestamp_type is TimestampType.CREATE_TIME
        assert first.max_timestamp == 1_700_000_000_000
    else:
        assert first.timestamp_type is TimestampType.NO_TIMESTAMP_TYPE
        assert first.max_timestamp == -1


@pytest.mark.parametrize(
    ("magic", "codec"),
    [(0, Compression.GZIP), (1, Compression.GZIP), (1, Compression.SNAPPY), (1, Compression.LZ4)],
)
def test_compressed_wrapper_offset_is_its_last_inner_offset(magic: int, codec: Compression) -> None:
    data = legacy_message_set(10, [b"x", b"y", b"z"], magic=magic, codec=codec)
    result = scan_batches(data)
    assert result.stop is ScanStop.END
    assert len(result.batches) == 1
    wrapper = result.batches[0]
    assert wrapper.compression is codec
    assert wrapper.base_offset == wrapper.last_offset == 12
    assert wrapper.next_offset == 13
    assert wrapper.record_count == -1


def test_crc32_mismatch_is_corrupt() -> None:
    data = bytearray(legacy_message_set(0, [b"abc", b"def"], magic=1))
    data[-1] ^= 1
    result = scan_batches(bytes(data))
    assert result.stop is ScanStop.CORRUPT
    assert "CRC32 mismatch" in (result.error or "")
    assert len(result.batches) == 1


def test_mixed_legacy_then_v2_in_one_buffer() -> None:
    from tools.logdata.batches import producer_batch

    data = legacy_message_set(0, [b"a", b"b"], magic=1) + producer_batch(2, [b"c", b"d"])
    result = scan_batches(data)
    assert result.stop is ScanStop.END
    assert [b.magic for b in result.batches] == [1, 1, 2]
    assert result.next_offset == 4


def test_cut_legacy_message_is_partial() -> None:
    data = legacy_message_set(0, [b"abc" * 10, b"def" * 10], magic=0)
    result = scan_batches(data[:-3])
    assert result.stop is ScanStop.PARTIAL
    assert len(result.batches) == 1
