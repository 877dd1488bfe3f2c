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
- A batch thinned by compaction holds fewer records than offsets (its records keep their
  offset deltas, its last offset delta stays). Kafka refuses such a batch from a producer
  ("inconsistent batch offset range"), and for a compressed one whose inner offsets are not
  consecutive it would rewrite the batch itself, which fails on a compacted topic
  ("key is skipped in PartialDefaultRecord", seen on Kafka 4). So such a batch is re-encoded
  here: each record's offset delta renumbered 0..n-1 (only that varint and the record's
  length change), the last offset delta set to n-1, and a compressed one decompressed and
  compressed again in its own codec -- the one case where the mirror re-compresses.
"""

from __future__ import annotations

import io
import struct
from dataclasses import dataclass

from kio.serial.readers import read_signed_varint, read_signed_varlong
from kio.serial.writers import write_signed_varint, write_signed_varlong

from replicad.records.batch import (
    COMPRESSION_CODEC_MASK,
    LOG_OVERHEAD,
    MAGIC_V2,
    RECORD_BATCH_OVERHEAD,
    TRANSACTIONAL_FLAG_MASK,
    V2_CRC_START,
    BatchHeader,
    Compression,
)
from replicad.records.codecs import compress, decompress
from replicad.records.crc import crc32c

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
_INT32 = struct.Struct(">i")
_LENGTH_AT = 8
_LAST_OFFSET_DELTA_AT = 23
_RECORD_COUNT_AT = 57

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
    if header.record_count < 1:
        return NotMirrorable(header.base_offset, "empty batch: nothing to produce")
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
    (last_offset_delta,) = _INT32.unpack_from(out, _LAST_OFFSET_DELTA_AT)
    (count,) = _INT32.unpack_from(out, _RECORD_COUNT_AT)
    if last_offset_delta != count - 1:
        _INT32.pack_into(out, _LAST_OFFSET_DELTA_AT, count - 1)
        codec = Compression(attributes & COMPRESSION_CODEC_MASK)
        plain = decompress(codec, memoryview(out)[RECORD_BATCH_OVERHEAD:])
        records = compress(codec, renumbered(memoryview(plain), count))
        del out[RECORD_BATCH_OVERHEAD:]
        out += records
        _INT32.pack_into(out, _LENGTH_AT, len(out) - LOG_OVERHEAD)
    _PRODUCER.pack_into(out, _PRODUCER_AT, stamp.producer_id, stamp.producer_epoch, base_sequence)
    _CRC.pack_into(out, _CRC_AT, crc32c(memoryview(out)[V2_CRC_START:]))
    return out


def renumbered(records: memoryview, count: int) -> bytes:
    """An uncompressed records section whose `count` records get offset deltas 0..count-1;
    everything else of each record is copied (see the module rules)."""
    out = io.BytesIO()
    rewrite_records(records, count, out)
    return out.getvalue()


def rewrite_records(
    records: memoryview, count: int, out: io.BytesIO, *, first_index: int = 0, shift_ms: int = 0
) -> int:
    """Append the `count` records of an uncompressed records section to `out` with offset
    deltas first_index, first_index + 1, ... and timestamp deltas moved by `shift_ms`;
    everything else of each record is copied. Returns the next offset delta. ValueError
    when the records do not fill the section exactly."""
    pos = 0
    index = first_index
    for n in range(count):
        length, size = read_signed_varint(records, pos)
        body = pos + size
        end = body + length
        if length < 0 or end > len(records):
            raise ValueError(f"record {n} overruns the batch")
        ts_at = body + 1  # after the attributes byte
        ts_delta, ts_size = read_signed_varlong(records, ts_at)
        delta_at = ts_at + ts_size
        delta_size = read_signed_varint(records, delta_at)[1]
        fields = io.BytesIO()
        if shift_ms:
            write_signed_varlong(fields, ts_delta + shift_ms)
        else:
            fields.write(records[ts_at:delta_at])
        write_signed_varint(fields, index)
        new_fields = fields.getvalue()
        rest = records[delta_at + delta_size : end]
        write_signed_varint(out, (ts_at - body) + len(new_fields) + len(rest))
        out.write(records[body:ts_at])
        out.write(new_fields)
        out.write(rest)
        pos = end
        index += 1
    if pos != len(records):
        raise ValueError(f"{len(records) - pos} bytes left after {count} records")
    return index
