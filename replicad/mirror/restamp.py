"""Re-stamping a stored record batch for the destination's idempotent producer.

Rules this module keeps (sans-I/O: bytes in, bytes out):
- Only magic 2 batches can be produced idempotently (Kafka refuses a producer id on older
  formats), so a magic 0/1 entry is `NotMirrorable`, named with its offset.
- The records section (everything after the 61-byte header) is copied as it is: compressed
  records stay compressed in the source's codec and are never decoded.
- What changes: producer id, producer epoch and base sequence (the mirror's producer);
  the transactional flag is cleared (a committed transaction's data is produced by a plain
  idempotent producer, see partition_mirror.py); the base offset is 0 and the partition
  leader epoch -1 (the broker assigns both, as it does for any producer); the CRC32C is
  recomputed over the new attributes-to-end bytes.
- Kafka refuses a batch whose offset range does not match its record count (a batch thinned
  by compaction keeps its last offset delta); such a batch is `NotMirrorable` too -- the
  caller decides (the records would have to be re-encoded, which this module never does).
- Control batches are never produced (a producer may not write them): `NotMirrorable`.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

from crc32c import crc32c

from replicad.records.batch import (
    MAGIC_V2,
    RECORD_BATCH_OVERHEAD,
    TRANSACTIONAL_FLAG_MASK,
    V2_CRC_START,
    BatchHeader,
)

# Positions inside a magic 2 batch (DefaultRecordBatch's layout).
_BASE_OFFSET = struct.Struct(">q")
_BASE_OFFSET_AT = 0
_LEADER_EPOCH = struct.Struct(">i")
_LEADER_EPOCH_AT = 12
_CRC = struct.Struct(">I")
_CRC_AT = 17
_ATTRIBUTES = struct.Struct(">h")
_ATTRIBUTES_AT = 21
# producer id (int64), producer epoch (int16), base sequence (int32).
_PRODUCER = struct.Struct(">qhi")
_PRODUCER_AT = 43

UNASSIGNED_LEADER_EPOCH = -1
MAX_SEQUENCE = 2**31 - 1


@dataclass(frozen=True, slots=True)
class ProducerStamp:
    """The destination producer a batch is stamped with."""

    producer_id: int
    producer_epoch: int


@dataclass(frozen=True, slots=True)
class NotMirrorable:
    """Why a stored batch cannot be produced as it is."""

    base_offset: int
    reason: str


def next_sequence(base_sequence: int, record_count: int) -> int:
    """The base sequence of the batch after one of `record_count` records (Kafka wraps
    sequences at int32 max back to 0)."""
    return (base_sequence + record_count) % (MAX_SEQUENCE + 1)


def mirrorable(header: BatchHeader) -> NotMirrorable | None:
    """None when `header`'s batch can be re-stamped and produced as it is."""
    if header.magic != MAGIC_V2:
        return NotMirrorable(
            header.base_offset, f"magic {header.magic} entry: only magic 2 can be produced"
        )
    if header.is_control:
        return NotMirrorable(header.base_offset, "control batch: producers may not write one")
    if header.record_count != header.last_offset_delta + 1:
        return NotMirrorable(
            header.base_offset,
            f"batch holds {header.record_count} records over {header.last_offset_delta + 1} "
            "offsets (thinned by compaction); Kafka refuses such a batch from a producer",
        )
    return None


def restamp(
    batch: bytes | bytearray | memoryview, stamp: ProducerStamp, base_sequence: int
) -> bytearray:
    """A copy of the one magic 2 batch in `batch` with the producer fields rewritten and
    the CRC recomputed (see the module rules). The caller has checked `mirrorable`."""
    out = bytearray(batch)
    if len(out) < RECORD_BATCH_OVERHEAD:
        raise ValueError(f"a batch is at least {RECORD_BATCH_OVERHEAD} bytes, got {len(out)}")
    _BASE_OFFSET.pack_into(out, _BASE_OFFSET_AT, 0)
    _LEADER_EPOCH.pack_into(out, _LEADER_EPOCH_AT, UNASSIGNED_LEADER_EPOCH)
    (attributes,) = _ATTRIBUTES.unpack_from(out, _ATTRIBUTES_AT)
    _ATTRIBUTES.pack_into(out, _ATTRIBUTES_AT, attributes & ~TRANSACTIONAL_FLAG_MASK)
    _PRODUCER.pack_into(out, _PRODUCER_AT, stamp.producer_id, stamp.producer_epoch, base_sequence)
    _CRC.pack_into(out, _CRC_AT, crc32c(memoryview(out)[V2_CRC_START:]))
    return out
