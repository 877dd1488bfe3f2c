"""The header every log entry format shares a view of: `BatchHeader`, and the constants
of the formats (magic 2 record batches, magic 0/1 messages).

batch.py parses magic 2 headers and scans buffers of entries, legacy.py parses magic 0/1
messages; both build this one `BatchHeader`, so the rest of replicad never asks which
format an entry was written in unless it must.
"""

from __future__ import annotations

import enum
from functools import partial
from typing import NamedTuple

# Every log entry starts with base offset (int64) and length (int32): Kafka's LOG_OVERHEAD.
LOG_OVERHEAD = 12
LENGTH_POSITION = 8
# Position of the magic byte in every entry format (v2: after the partition leader epoch;
# v0/v1: after the CRC).
MAGIC_POSITION = 16
HEADER_SIZE_UP_TO_MAGIC = MAGIC_POSITION + 1

# Where each field of a magic 2 batch's header sits (Kafka's DefaultRecordBatch *_OFFSET;
# batch.py's V2_HEADER unpacks them all at once, and tests/records/test_header.py holds the
# two to each other). The CRC32C stored at V2_CRC_POSITION covers everything from the
# attributes to the end of the batch; base offset and leader epoch are outside it, so a
# broker sets them without computing it again.
V2_LEADER_EPOCH_POSITION = 12
V2_CRC_POSITION = 17
V2_ATTRIBUTES_POSITION = 21
V2_CRC_START = V2_ATTRIBUTES_POSITION
V2_LAST_OFFSET_DELTA_POSITION = 23
V2_BASE_TIMESTAMP_POSITION = 27
V2_MAX_TIMESTAMP_POSITION = 35
V2_PRODUCER_ID_POSITION = 43
V2_PRODUCER_EPOCH_POSITION = 51
V2_BASE_SEQUENCE_POSITION = 53
V2_RECORD_COUNT_POSITION = 57
# A magic 0/1 message (Kafka's LegacyRecord): its CRC32 follows the length and covers
# everything from the magic byte on; v1's timestamp follows magic and attributes.
LEGACY_CRC_POSITION = LOG_OVERHEAD
LEGACY_CRC_START = MAGIC_POSITION
V1_TIMESTAMP_POSITION = MAGIC_POSITION + 2

MAGIC_V0 = 0
MAGIC_V1 = 1
MAGIC_V2 = 2

# Attribute bits of a magic 2 batch.
COMPRESSION_CODEC_MASK = 0x07
TIMESTAMP_TYPE_MASK = 0x08
TRANSACTIONAL_FLAG_MASK = 0x10
CONTROL_FLAG_MASK = 0x20
DELETE_HORIZON_FLAG_MASK = 0x40

NO_TIMESTAMP = -1
NO_PRODUCER_ID = -1
NO_PARTITION_LEADER_EPOCH = -1


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


class BatchHeader(NamedTuple):
    """The header of one log entry at `position` in the scanned buffer.

    For magic 0/1 entries (legacy message sets) the fields a v2 batch has and a message
    lacks carry Kafka's "none" values (-1), and base_offset is the entry's own offset: for
    an uncompressed message its offset, for a compressed wrapper the offset of its *last*
    inner message (Kafka's rule for wrappers), so `base_offset == last_offset` and
    `record_count` is -1 (unknown until decompressed; `records.decode_batch` tells).

    Read-only, as every value here, but a `NamedTuple` rather than a frozen dataclass: it is
    made once a batch on the follower's and the mirror's paths, and a frozen dataclass's
    `__init__` (fourteen `object.__setattr__` calls) cost about ten times a tuple's making
    (15% of the mirror path's samples, issue 32); `header_from` makes one with no Python
    call at all. Being a tuple, a header also indexes and unpacks as its fields in this
    order, and `_replace` gives a changed copy.
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


# `header_from((position, *fields))`: a BatchHeader of all fourteen fields in order, made
# by tuple.__new__ itself (no Python frame: the run's headers, records/run.py).
header_from = partial(tuple.__new__, BatchHeader)
