"""replicad/records/header.py: one BatchHeader for every entry format."""

from __future__ import annotations

import pytest

from replicad.records.batch import header_at, scan_batches
from replicad.records.header import (
    CONTROL_FLAG_MASK,
    MAGIC_V0,
    MAGIC_V1,
    MAGIC_V2,
    TRANSACTIONAL_FLAG_MASK,
    BatchHeader,
    TimestampType,
    header_from,
)
from tools.logdata.batches import batch_stream, legacy_message_set


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


def _fields(header: BatchHeader) -> dict[str, object]:
    return header._asdict()
