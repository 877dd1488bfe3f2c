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

import struct
from dataclasses import dataclass

from replicad.records.batch import (
    COMPRESSION_CODEC_MASK,
    LENGTH_POSITION,
    LOG_OVERHEAD,
    MAGIC_V2,
    NO_PARTITION_LEADER_EPOCH,
    RECORD_BATCH_OVERHEAD,
    TRANSACTIONAL_FLAG_MASK,
    V2_ATTRIBUTES_POSITION,
    V2_CRC_POSITION,
    V2_CRC_START,
    V2_LAST_OFFSET_DELTA_POSITION,
    V2_LEADER_EPOCH_POSITION,
    V2_PRODUCER_ID_POSITION,
    V2_RECORD_COUNT_POSITION,
    BatchHeader,
    Compression,
)
from replicad.records.codecs import compress, decompress
from replicad.records.crc import crc32c
from replicad.records.records import MAX_SEQUENCE
from replicad.records.varint import SMALL_UVARINTS, varint

# The fields of a magic 2 header this module rewrites (their positions: records/header.py).
_BASE_OFFSET = struct.Struct(">q")
_LEADER_EPOCH = struct.Struct(">i")
_CRC = struct.Struct(">I")
_ATTRIBUTES = struct.Struct(">h")
# producer id (int64), producer epoch (int16), base sequence (int32), one after another.
_PRODUCER = struct.Struct(">qhi")
_INT32 = struct.Struct(">i")
# Zigzag values SMALL_UVARINTS holds, and the non-negative ints whose zigzag it holds.
_SMALL = len(SMALL_UVARINTS)
_SMALL_POSITIVE = _SMALL >> 1


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
    header, records = restamped(batch, stamp, base_sequence)
    return header + records


def restamped(
    batch: bytes | bytearray | memoryview, stamp: ProducerStamp, base_sequence: int
) -> tuple[bytearray, bytes | memoryview]:
    """`restamp` without the copy: the batch's new 61-byte header, and its records
    section -- a view of `batch`'s own (or, for a batch thinned by compaction, its records
    renumbered). Header then records is the batch to produce."""
    view = memoryview(batch)
    if len(view) < RECORD_BATCH_OVERHEAD:
        raise ValueError(f"a batch is at least {RECORD_BATCH_OVERHEAD} bytes, got {len(view)}")
    out = bytearray(view[:RECORD_BATCH_OVERHEAD])
    records: bytes | memoryview = view[RECORD_BATCH_OVERHEAD:]
    _BASE_OFFSET.pack_into(out, 0, 0)  # the base offset opens every entry
    _LEADER_EPOCH.pack_into(out, V2_LEADER_EPOCH_POSITION, NO_PARTITION_LEADER_EPOCH)
    (attributes,) = _ATTRIBUTES.unpack_from(out, V2_ATTRIBUTES_POSITION)
    _ATTRIBUTES.pack_into(out, V2_ATTRIBUTES_POSITION, attributes & ~TRANSACTIONAL_FLAG_MASK)
    (last_offset_delta,) = _INT32.unpack_from(out, V2_LAST_OFFSET_DELTA_POSITION)
    (count,) = _INT32.unpack_from(out, V2_RECORD_COUNT_POSITION)
    if last_offset_delta != count - 1:
        _INT32.pack_into(out, V2_LAST_OFFSET_DELTA_POSITION, count - 1)
        codec = Compression(attributes & COMPRESSION_CODEC_MASK)
        records = compress(codec, renumbered(memoryview(decompress(codec, records)), count))
    # The header's length counts from after itself to the end of the records.
    _INT32.pack_into(out, LENGTH_POSITION, RECORD_BATCH_OVERHEAD - LOG_OVERHEAD + len(records))
    _PRODUCER.pack_into(
        out, V2_PRODUCER_ID_POSITION, stamp.producer_id, stamp.producer_epoch, base_sequence
    )
    crc = crc32c(records, crc32c(memoryview(out)[V2_CRC_START:]))
    _CRC.pack_into(out, V2_CRC_POSITION, crc)
    return out, records


def renumbered(records: memoryview, count: int) -> bytes:
    """An uncompressed records section whose `count` records get offset deltas 0..count-1;
    everything else of each record is copied (see the module rules)."""
    out = bytearray()
    rewrite_records(records, count, out)
    return bytes(out)


def rewrite_records(
    records: memoryview, count: int, out: bytearray, *, first_index: int = 0, shift_ms: int = 0
) -> int:
    """Append the `count` records of an uncompressed records section to `out` with offset
    deltas first_index, first_index + 1, ... and timestamp deltas moved by `shift_ms`;
    everything else of each record is copied. Returns the next offset delta. ValueError
    when the records do not fill the section exactly.

    The coalescing mirror runs this once per record mirrored: the varints are read and
    written inline (kio's readers and writers cost a call and a buffer per field)."""
    if count == 1 and rewrite_one(records, out, first_index, shift_ms):
        return first_index + 1
    pos = 0
    index = first_index
    size = len(records)
    try:
        for n in range(count):
            length, body = _read_varint(records, pos)
            end = body + length
            if length < 0 or end > size:
                raise ValueError(f"record {n} overruns the batch")
            ts_at = body + 1  # after the attributes byte
            ts_delta, delta_at = _read_varint(records, ts_at)
            delta_end = _skip_varint(records, delta_at)
            timestamp = varint(ts_delta + shift_ms) if shift_ms else records[ts_at:delta_at]
            delta = varint(index)
            out += varint(1 + len(timestamp) + len(delta) + (end - delta_end))
            out.append(records[body])  # the record's attributes
            out += timestamp
            out += delta
            out += records[delta_end:end]
            pos = end
            index += 1
    except IndexError:
        raise ValueError(f"a record overruns the batch at byte {pos}") from None
    if pos != size:
        raise ValueError(f"{size - pos} bytes left after {count} records")
    return index


def rewrite_one(records: bytes | memoryview, out: bytearray, index: int, shift_ms: int) -> bool:
    """`rewrite_records` of a section holding one record (a producer with linger.ms 0
    stores one a batch) whose timestamp delta and offset delta are one byte each, in fewer
    steps: appends it to `out` with offset delta `index` and returns True; False (nothing
    appended) for any other section, which the loop of `rewrite_records` takes. The
    coalescing mirror calls it once per one-record batch, without rewrite_records' call."""
    size = len(records)
    if size < 5:
        return False
    first = records[0]
    if first < 0x80:
        length, body = (first >> 1) ^ -(first & 1), 1
    elif records[1] < 0x80:
        raw = (first & 0x7F) | (records[1] << 7)
        length, body = (raw >> 1) ^ -(raw & 1), 2
    else:
        return False
    ts_at = body + 1
    if length != size - body or size <= ts_at + 1:
        return False
    ts_byte = records[ts_at]
    if ts_byte >= 0x80 or records[ts_at + 1] >= 0x80:
        return False
    if shift_ms:
        moved = ((ts_byte >> 1) ^ -(ts_byte & 1)) + shift_ms
        raw = (moved << 1) ^ (moved >> 63)  # zigzag (varint's, without its call)
        timestamp = SMALL_UVARINTS[raw] if raw < _SMALL else varint(moved)
    else:
        timestamp = SMALL_UVARINTS[ts_byte]
    delta = SMALL_UVARINTS[index << 1] if index < _SMALL_POSITIVE else varint(index)
    length += len(timestamp) + len(delta) - 2
    out += SMALL_UVARINTS[length << 1] if length < _SMALL_POSITIVE else varint(length)
    out.append(records[body])  # the record's attributes
    out += timestamp
    out += delta
    out += records[ts_at + 2 :]
    return True


def _read_varint(buf: memoryview, pos: int) -> tuple[int, int]:
    """The zigzag varint (or varlong) at `pos`, and the position after it."""
    byte = buf[pos]
    if byte < 0x80:  # one byte: most lengths under 64, every small delta
        return (byte >> 1) ^ -(byte & 1), pos + 1
    raw = byte & 0x7F
    shift = 7
    while True:
        pos += 1
        byte = buf[pos]
        raw |= (byte & 0x7F) << shift
        if byte < 0x80:
            return (raw >> 1) ^ -(raw & 1), pos + 1
        shift += 7
        if shift > 63:
            raise ValueError(f"varint longer than 10 bytes at byte {pos}")


def _skip_varint(buf: memoryview, pos: int) -> int:
    while buf[pos] >= 0x80:
        pos += 1
    return pos + 1
