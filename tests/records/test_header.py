"""replicad/records/header.py: one BatchHeader for every entry format."""

from __future__ import annotations

import struct
import zlib

import pytest

from replicad.records.batch import V2_HEADER, header_at, scan_batches
from replicad.records.header import (
    CONTROL_FLAG_MASK,
    LEGACY_CRC_POSITION,
    LEGACY_CRC_START,
    LENGTH_POSITION,
    MAGIC_POSITION,
    MAGIC_V0,
    MAGIC_V1,
    MAGIC_V2,
    TRANSACTIONAL_FLAG_MASK,
    V1_TIMESTAMP_POSITION,
    V2_ATTRIBUTES_POSITION,
    V2_BASE_SEQUENCE_POSITION,
    V2_BASE_TIMESTAMP_POSITION,
    V2_CRC_POSITION,
    V2_LAST_OFFSET_DELTA_POSITION,
    V2_LEADER_EPOCH_POSITION,
    V2_MAX_TIMESTAMP_POSITION,
    V2_PRODUCER_EPOCH_POSITION,
    V2_PRODUCER_ID_POSITION,
    V2_RECORD_COUNT_POSITION,
    BatchHeader,
    TimestampType,
    header_from,
)
from tools.logdata.batches import batch_stream, legacy_message_set, producer_batch


@pytest.mark.parametrize("magic", [MAGIC_V0, MAGIC_V1])
def test_a_legacy_message_reads_as_a_one_offset_batch_without_v2_flags(magic: int) -> None:
    data = legacy_message_set(5, [b"a", b"b"], magic=magic)
    header = scan_batches(data).batches[0]
    assert header.magic == magic and header.base_offset == header.last_offset == 5
    assert header.producer_id == -1 and header.partition_leader_epoch == -1
    # Flags of a v2 batch mean nothing in a legacy attributes byte.
    flags = header.attributes | TRANSACTIONAL_FLAG_MASK | CONTROL_FLAG_MASK
    legacy = type(header)(**{**_fields(header), "attributes": flags})
    assert not legacy.is_transactional and not legacy.is_control
    expected = TimestampType.NO_TIMESTAMP_TYPE if magic == MAGIC_V0 else TimestampType.CREATE_TIME
    assert header.timestamp_type is expected


def test_header_at_reads_the_same_header_as_the_scan_for_every_format() -> None:
    for data in (b"".join(batch_stream(3, 2)), legacy_message_set(9, [b"x"], magic=MAGIC_V1)):
        scanned = scan_batches(data).batches[0]
        assert header_at(data[:61], 1234) == type(scanned)(**{**_fields(scanned), "position": 1234})
    assert scan_batches(b"".join(batch_stream(0, 1))).batches[0].magic == MAGIC_V2


def test_a_header_is_read_only_and_header_from_makes_the_same_one() -> None:
    """BatchHeader is a NamedTuple (made once a batch: cheap), still read-only; the run's
    maker (`header_from`, tuple.__new__ with no Python frame) gives an equal header."""
    scanned = scan_batches(b"".join(batch_stream(3, 2))).batches[0]
    with pytest.raises(AttributeError):
        scanned.base_offset = 7  # type: ignore[misc]
    made = header_from(tuple(scanned))
    assert made == scanned and type(made) is BatchHeader
    assert made == BatchHeader(**scanned._asdict())
    assert made.next_offset == scanned.base_offset + scanned.last_offset_delta + 1


def test_each_named_position_of_a_v2_header_holds_the_field_the_scan_reads() -> None:
    """The positions restamp, the chaos tools and the test batches write at are where the
    scan (one struct over the whole header) reads each field: a batch kafka-python's
    producer built, every field a value no other field has."""
    data = producer_batch(
        100,
        [b"a", b"b", b"c"],
        leader_epoch=7,
        producer_id=5_000_000_000,
        producer_epoch=11,
        base_sequence=40,
        timestamps=[1_700_000_000_000, 1_700_000_000_900, 1_700_000_000_500],
    )
    header = scan_batches(data).batches[0]
    # Every field from the length on, in the order the scan's one struct reads them.
    positions = (
        LENGTH_POSITION,
        V2_LEADER_EPOCH_POSITION,
        MAGIC_POSITION,
        V2_CRC_POSITION,
        V2_ATTRIBUTES_POSITION,
        V2_LAST_OFFSET_DELTA_POSITION,
        V2_BASE_TIMESTAMP_POSITION,
        V2_MAX_TIMESTAMP_POSITION,
        V2_PRODUCER_ID_POSITION,
        V2_PRODUCER_EPOCH_POSITION,
        V2_BASE_SEQUENCE_POSITION,
        V2_RECORD_COUNT_POSITION,
    )
    formats = V2_HEADER.format.removeprefix(">q")  # the base offset, at 0, left out
    read = [
        struct.unpack_from(">" + f, data, at)[0] for f, at in zip(formats, positions, strict=True)
    ]
    assert read == list(header)[2:]  # from batch_length to record_count
    assert (header.partition_leader_epoch, header.producer_epoch, header.record_count) == (7, 11, 3)


def test_the_legacy_positions_hold_a_v1_messages_crc_and_timestamp() -> None:
    data = legacy_message_set(9, [b"x"], magic=MAGIC_V1, timestamp_ms=1_700_000_000_123)
    header = scan_batches(data).batches[0]
    (crc,) = struct.unpack_from(">I", data, LEGACY_CRC_POSITION)
    assert crc == header.crc == zlib.crc32(data[LEGACY_CRC_START:])
    (timestamp,) = struct.unpack_from(">q", data, V1_TIMESTAMP_POSITION)
    assert timestamp == header.max_timestamp == 1_700_000_000_123


def _fields(header: BatchHeader) -> dict[str, object]:
    return header._asdict()
