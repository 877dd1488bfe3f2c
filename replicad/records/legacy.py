"""Legacy message sets (magic 0 and 1), seen through the same shallow view as v2 batches.

Rules this module keeps:
- A legacy log entry is one message: `offset: int64, size: int32, crc: uint32, magic: int8,
  attributes: int8, [timestamp: int64 if magic 1], key: bytes, value: bytes`. The CRC is a
  CRC32 (zlib's) over everything from the magic byte to the end of the message.
- A compressed message is a *wrapper*: its value is a compressed message set of inner
  messages. Its offset is the offset of the last inner message (Kafka's rule, for magic 0
  and 1 alike). For magic 1 the inner offsets are relative: inner offset `r` is absolute
  offset `wrapper_offset - last_inner_relative + r`; for magic 0 they are absolute.
- The shallow header (`BatchHeader`) therefore reports base_offset == last_offset == the
  entry's offset, last_offset_delta 0 and record_count 1 for a plain message or -1 for a
  wrapper (unknown without decompressing); decoding the records (`records.py`) gives the
  real first offset. Producer id/epoch, base sequence and leader epoch are -1 (not carried).
"""

from __future__ import annotations

import struct
import zlib

from replicad.records.header import (
    LEGACY_CRC_START,
    MAGIC_V0,
    MAGIC_V1,
    NO_PARTITION_LEADER_EPOCH,
    NO_PRODUCER_ID,
    NO_TIMESTAMP,
    V1_TIMESTAMP_POSITION,
    BatchHeader,
)

# Size of a message without key and value bytes, counted from the CRC (Kafka's
# LegacyRecord.RECORD_OVERHEAD_V0/V1): crc 4, magic 1, attributes 1, [timestamp 8],
# key length 4, value length 4.
RECORD_OVERHEAD_V0 = 14
RECORD_OVERHEAD_V1 = 22
# Codec bits of the attributes byte; magic 0/1 know NONE, GZIP, SNAPPY, LZ4 only.
LEGACY_CODEC_MASK = 0x07
LEGACY_MAX_CODEC = 3
# Magic 1 only: 0 = create time, 1 = log append time.
LEGACY_TIMESTAMP_TYPE_MASK = 0x08

_HEAD = struct.Struct(">qiIbb")  # offset, size, crc, magic, attributes
_TIMESTAMP = struct.Struct(">q")


def min_length(magic: int) -> int:
    return RECORD_OVERHEAD_V0 if magic == MAGIC_V0 else RECORD_OVERHEAD_V1


def entry_header(mv: memoryview, pos: int, end: int, verify_crc: bool) -> BatchHeader | str:
    """The shallow header of the legacy message at `pos` (whole, ending at `end`), or an error."""
    offset, size, crc, magic, attributes = _HEAD.unpack_from(mv, pos)
    codec = attributes & LEGACY_CODEC_MASK
    if codec > LEGACY_MAX_CODEC:
        return f"unknown compression codec {codec} in magic {magic} message at position {pos}"
    if verify_crc:
        computed = zlib.crc32(mv[pos + LEGACY_CRC_START : end])
        if computed != crc:
            return (
                f"CRC32 mismatch in magic {magic} message at position {pos} (offset {offset}): "
                f"stored {crc:#010x}, computed {computed:#010x}"
            )
    timestamp = NO_TIMESTAMP
    if magic == MAGIC_V1:
        (timestamp,) = _TIMESTAMP.unpack_from(mv, pos + V1_TIMESTAMP_POSITION)
    return BatchHeader(
        position=pos,
        base_offset=offset,
        batch_length=size,
        partition_leader_epoch=NO_PARTITION_LEADER_EPOCH,
        magic=magic,
        crc=crc,
        attributes=attributes,
        last_offset_delta=0,
        base_timestamp=timestamp,
        max_timestamp=timestamp,
        producer_id=NO_PRODUCER_ID,
        producer_epoch=-1,
        base_sequence=-1,
        record_count=1 if codec == 0 else -1,
    )
