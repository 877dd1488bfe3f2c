"""A shallow view over Kafka record batches: headers and boundaries, never the records.

Rules this module keeps:
- Input is a buffer of concatenated log entries, as a Fetch response or a `.log` file holds
  them. Every entry starts with `base_offset: int64, length: int32`; the magic byte sits at
  position 16 in every format, so one scan walks magic 2 batches and magic 0/1 message sets
  (see `legacy.py`) alike.
- A scan stops at the first thing it cannot accept and says why (`ScanStop`):
  END when the buffer was consumed exactly, PARTIAL when what is left is the start of an
  entry that is cut off (normal at the end of a fetch response: KIP-74, KIP-283), CORRUPT
  when an entry is malformed (length below the minimum, unknown magic, unknown codec, CRC
  mismatch). `valid_bytes` covers exactly the whole, valid entries before the stop.
- No record is decoded and nothing is copied: headers come from `struct.unpack_from` on a
  memoryview, the CRC32C is computed over a memoryview slice. This is the replication hot
  path.
"""

from __future__ import annotations

import dataclasses
import enum
import struct
from dataclasses import dataclass

from crc32c import crc32c

# Every log entry starts with base offset (int64) and length (int32): Kafka's LOG_OVERHEAD.
LOG_OVERHEAD = 12
# Position of the magic byte in every entry format (v2: after the partition leader epoch;
# v0/v1: after the CRC).
MAGIC_POSITION = 16
HEADER_SIZE_UP_TO_MAGIC = MAGIC_POSITION + 1

MAGIC_V0 = 0
MAGIC_V1 = 1
MAGIC_V2 = 2

# Magic 2 batch header (DefaultRecordBatch): base offset, length, partition leader epoch,
# magic, crc, attributes, last offset delta, base timestamp, max timestamp, producer id,
# producer epoch, base sequence, record count.
V2_HEADER = struct.Struct(">qiibIhiqqqhii")
RECORD_BATCH_OVERHEAD = V2_HEADER.size  # 61
assert RECORD_BATCH_OVERHEAD == 61
# The CRC32C covers everything from the attributes to the end of the batch.
V2_CRC_START = 21
V2_MIN_BATCH_LENGTH = RECORD_BATCH_OVERHEAD - LOG_OVERHEAD

# Attribute bits of a magic 2 batch.
COMPRESSION_CODEC_MASK = 0x07
TIMESTAMP_TYPE_MASK = 0x08
TRANSACTIONAL_FLAG_MASK = 0x10
CONTROL_FLAG_MASK = 0x20
DELETE_HORIZON_FLAG_MASK = 0x40

NO_TIMESTAMP = -1
NO_PRODUCER_ID = -1
NO_PARTITION_LEADER_EPOCH = -1

_LENGTH_AT_8 = struct.Struct(">i")


class Compression(enum.IntEnum):
    NONE = 0
    GZIP = 1
    SNAPPY = 2
    LZ4 = 3
    ZSTD = 4


class TimestampType(enum.IntEnum):
    NO_TIMESTAMP_TYPE = -1
    CREATE_TIME = 0
    LOG_APPEND_TIME = 1


class ScanStop(enum.Enum):
    END = "end"
    PARTIAL = "partial"
    CORRUPT = "corrupt"


@dataclass(frozen=True, slots=True)
class BatchHeader:
    """The header of one log entry at `position` in the scanned buffer.

    For magic 0/1 entries (legacy message sets) the fields a v2 batch has and a message
    lacks carry Kafka's "none" values (-1), and base_offset is the entry's own offset: for
    an uncompressed message its offset, for a compressed wrapper the offset of its *last*
    inner message (Kafka's rule for wrappers), so `base_offset == last_offset` and
    `record_count` is -1 (unknown until decompressed; `records.decode_batch` tells).
    """

    position: int
    base_offset: int
    batch_length: int
    partition_leader_epoch: int
    magic: int
    crc: int
    attributes: int
    last_offset_delta: int
    base_timestamp: int
    max_timestamp: int
    producer_id: int
    producer_epoch: int
    base_sequence: int
    record_count: int

    @property
    def size(self) -> int:
        return self.batch_length + LOG_OVERHEAD

    @property
    def end_position(self) -> int:
        return self.position + self.batch_length + LOG_OVERHEAD

    @property
    def last_offset(self) -> int:
        return self.base_offset + self.last_offset_delta

    @property
    def next_offset(self) -> int:
        return self.base_offset + self.last_offset_delta + 1

    @property
    def compression(self) -> Compression:
        return Compression(self.attributes & COMPRESSION_CODEC_MASK)

    @property
    def timestamp_type(self) -> TimestampType:
        if self.magic == MAGIC_V0:
            return TimestampType.NO_TIMESTAMP_TYPE
        if self.attributes & TIMESTAMP_TYPE_MASK:
            return TimestampType.LOG_APPEND_TIME
        return TimestampType.CREATE_TIME

    @property
    def is_transactional(self) -> bool:
        return self.magic >= MAGIC_V2 and bool(self.attributes & TRANSACTIONAL_FLAG_MASK)

    @property
    def is_control(self) -> bool:
        return self.magic >= MAGIC_V2 and bool(self.attributes & CONTROL_FLAG_MASK)


@dataclass(frozen=True, slots=True)
class ScanResult:
    batches: list[BatchHeader]
    valid_bytes: int
    stop: ScanStop
    error: str | None = None

    @property
    def next_offset(self) -> int | None:
        """Offset after the last whole batch, or None when there is none."""
        return self.batches[-1].next_offset if self.batches else None


def _v2_header(mv: memoryview, pos: int, end: int, verify_crc: bool) -> BatchHeader | str:
    (
        base_offset,
        batch_length,
        leader_epoch,
        magic,
        crc,
        attributes,
        last_offset_delta,
        base_timestamp,
        max_timestamp,
        producer_id,
        producer_epoch,
        base_sequence,
        record_count,
    ) = V2_HEADER.unpack_from(mv, pos)
    if (attributes & COMPRESSION_CODEC_MASK) > Compression.ZSTD:
        return (
            f"unknown compression codec {attributes & COMPRESSION_CODEC_MASK} in batch at "
            f"position {pos} (base offset {base_offset})"
        )
    if last_offset_delta < 0 or record_count < 0:
        return (
            f"negative last offset delta {last_offset_delta} or record count {record_count} "
            f"in batch at position {pos} (base offset {base_offset})"
        )
    if verify_crc:
        computed = crc32c(mv[pos + V2_CRC_START : end])
        if computed != crc:
            return (
                f"CRC32C mismatch in batch at position {pos} (base offset {base_offset}): "
                f"stored {crc:#010x}, computed {computed:#010x}"
            )
    return BatchHeader(
        pos,
        base_offset,
        batch_length,
        leader_epoch,
        magic,
        crc,
        attributes,
        last_offset_delta,
        base_timestamp,
        max_timestamp,
        producer_id,
        producer_epoch,
        base_sequence,
        record_count,
    )


def scan_batches(buf: bytes | bytearray | memoryview, *, verify_crc: bool = True) -> ScanResult:
    """Walk the log entries in `buf`; see the module docstring for the stop rules."""
    mv = buf if isinstance(buf, memoryview) else memoryview(buf)
    if mv.format != "B" or mv.ndim != 1:
        mv = mv.cast("B")
    n = len(mv)
    pos = 0
    batches: list[BatchHeader] = []
    append = batches.append
    unpack_length = _LENGTH_AT_8.unpack_from
    while True:
        remaining = n - pos
        if remaining == 0:
            return ScanResult(batches, pos, ScanStop.END)
        if remaining < LOG_OVERHEAD:
            return ScanResult(batches, pos, ScanStop.PARTIAL)
        (length,) = unpack_length(mv, pos + 8)
        if remaining < HEADER_SIZE_UP_TO_MAGIC:
            if length < 0:
                return _corrupt(batches, pos, f"negative length {length} at position {pos}")
            return ScanResult(batches, pos, ScanStop.PARTIAL)
        magic = mv[pos + MAGIC_POSITION]
        if magic == MAGIC_V2:
            if length < V2_MIN_BATCH_LENGTH:
                return _corrupt(
                    batches,
                    pos,
                    f"batch length {length} below the minimum {V2_MIN_BATCH_LENGTH} "
                    f"at position {pos}",
                )
            end = pos + LOG_OVERHEAD + length
            if end > n:
                return ScanResult(batches, pos, ScanStop.PARTIAL)
            header = _v2_header(mv, pos, end, verify_crc)
        elif magic in (MAGIC_V0, MAGIC_V1):
            from replicad.records import legacy

            minimum = legacy.min_length(magic)
            if length < minimum:
                return _corrupt(
                    batches,
                    pos,
                    f"magic {magic} message length {length} below the minimum {minimum} "
                    f"at position {pos}",
                )
            end = pos + LOG_OVERHEAD + length
            if end > n:
                return ScanResult(batches, pos, ScanStop.PARTIAL)
            header = legacy.entry_header(mv, pos, end, verify_crc)
        else:
            return _corrupt(batches, pos, f"unknown magic {magic} at position {pos}")
        if isinstance(header, str):
            return _corrupt(batches, pos, header)
        append(header)
        pos = end


def _corrupt(batches: list[BatchHeader], pos: int, error: str) -> ScanResult:
    return ScanResult(batches, pos, ScanStop.CORRUPT, error)


def header_at(head: bytes | bytearray | memoryview, position: int) -> BatchHeader | str:
    """Parse the header of the entry starting at head[0] (no CRC check, records not needed).

    `head` holds at least the first 61 bytes of the entry, or all of a shorter legacy entry;
    `position` is recorded as the entry's position (e.g. in a file). Returns an error string
    when the bytes are no entry header.
    """
    mv = head if isinstance(head, memoryview) else memoryview(head)
    if len(mv) < HEADER_SIZE_UP_TO_MAGIC:
        return f"entry header cut off at position {position}"
    magic = mv[MAGIC_POSITION]
    (length,) = _LENGTH_AT_8.unpack_from(mv, 8)
    if magic == MAGIC_V2:
        if length < V2_MIN_BATCH_LENGTH or len(mv) < RECORD_BATCH_OVERHEAD:
            return f"bad batch header at position {position}"
        header = _v2_header(mv, 0, 0, False)
    elif magic in (MAGIC_V0, MAGIC_V1):
        from replicad.records import legacy

        if length < legacy.min_length(magic) or len(mv) < LOG_OVERHEAD + legacy.min_length(magic):
            return f"bad magic {magic} message header at position {position}"
        header = legacy.entry_header(mv, 0, 0, False)
    else:
        return f"unknown magic {magic} at position {position}"
    if isinstance(header, str):
        return header
    return dataclasses.replace(header, position=position)
