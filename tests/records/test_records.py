"""Decoding records of real producer batches, control batches and legacy message sets."""

from __future__ import annotations

import struct

import pytest

from replicad.errors import CorruptRecordError
from replicad.records.batch import (
    Compression,
    scan_batches,
)
from replicad.records.records import (
    ControlType,
    Header,
    control_marker,
    decode_batch,
    first_record_at,
)
from tools.logdata.batches import control_batch, legacy_message_set, log_append_time, producer_batch


@pytest.mark.parametrize("codec", list(Compression), ids=[c.name for c in Compression])
def test_decode_producer_batch(codec: Compression) -> None:
    values = [f"value {i} ".encode() * 30 for i in range(20)]
    keys = [f"k{i}".encode() if i % 3 else None for i in range(20)]
    data = producer_batch(
        500,
        values,
        keys=keys,
        codec=codec,
        headers=[("trace", b"abc"), ("empty", None)],
        producer_id=77,
        producer_epoch=1,
        base_sequence=2**31 - 5,
        timestamps=[1000 + 7 * i for i in range(20)],
    )
    header = scan_batches(data).batches[0]
    assert header.compression is codec
    decoded = decode_batch(data, header)
    assert [r.offset for r in decoded.records] == list(range(500, 520))
    assert [r.value for r in decoded.records] == values
    assert [r.key for r in decoded.records] == keys
    assert [r.timestamp for r in decoded.records] == [1000 + 7 * i for i in range(20)]
    assert decoded.records[0].headers == (Header("trace", b"abc"), Header("empty", None))
    # Sequences wrap from 2^31-1 to 0, as Kafka's DefaultRecordBatch.incrementSequence.
    assert [r.sequence for r in decoded.records[:6]] == [
        2**31 - 5,
        2**31 - 4,
        2**31 - 3,
        2**31 - 2,
        2**31 - 1,
        0,
    ]


def test_log_append_time_gives_every_record_the_batch_max_timestamp() -> None:
    data = log_append_time(producer_batch(0, [b"a", b"b"], timestamps=[5, 9]), append_ms=9)
    header = scan_batches(data).batches[0]
    assert [r.timestamp for r in decode_batch(data, header).records] == [9, 9]


def test_control_batch_commit_marker() -> None:
    data = control_batch(0, producer_id=9, coordinator_epoch=42, timestamp_ms=1234)
    header = scan_batches(data).batches[0]
    assert header.is_control and header.is_transactional
    (record,) = decode_batch(data, header).records
    marker = control_marker(record)
    assert marker.type is ControlType.COMMIT
    assert marker.coordinator_epoch == 42


def test_truncated_records_section_raises() -> None:
    data = bytearray(producer_batch(0, [b"abc" * 10, b"def" * 10]))
    struct.pack_into(">i", data, 57, 3)  # claims three records, holds two
    header = scan_batches(bytes(data), verify_crc=False).batches[0]
    with pytest.raises(CorruptRecordError, match="base offset 0"):
        decode_batch(bytes(data), header)


@pytest.mark.parametrize(
    ("magic", "codec"),
    [
        (0, Compression.NONE),
        (1, Compression.NONE),
        (0, Compression.GZIP),
        (1, Compression.SNAPPY),
        (1, Compression.LZ4),
    ],
)
def test_decode_legacy(magic: int, codec: Compression) -> None:
    values = [b"one", b"two", None, b"four"]
    data = legacy_message_set(70, values, magic=magic, codec=codec, timestamp_ms=5000)
    scan = scan_batches(data)
    records = [r for h in scan.batches for r in decode_batch(data, h).records]
    assert [r.offset for r in records] == [70, 71, 72, 73]
    assert [r.value for r in records] == values
    expected_ts = [5000, 5001, 5002, 5003] if magic == 1 else [-1] * 4
    assert [r.timestamp for r in records] == expected_ts


def test_the_first_record_at_a_time_may_follow_older_records_of_its_batch() -> None:
    """A batch whose max timestamp reaches the target may begin with older records (Kafka's
    findOffsetByTimestamp decides inside the batch), and the starting offset is kept."""
    entry = producer_batch(40, [b"a", b"b", b"c", b"d"], timestamps=[10, 5, 20, 30])
    (header,) = scan_batches(entry).batches
    assert first_record_at(entry, header, 6, 40).offset == 40
    assert first_record_at(entry, header, 11, 40).offset == 42
    assert first_record_at(entry, header, 6, 41).offset == 42
    assert first_record_at(entry, header, 31, 40) is None
