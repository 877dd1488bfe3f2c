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
import struct
from collections.abc import Callable
from dataclasses import dataclass
from typing import NamedTuple

from crc32c import crc32c

from replicad.records import legacy
from replicad.records.header import (
    COMPRESSION_CODEC_MASK,
    CONTROL_FLAG_MASK,
    DELETE_HORIZON_FLAG_MASK,
    HEADER_SIZE_UP_TO_MAGIC,
    LOG_OVERHEAD,
    MAGIC_POSITION,
    MAGIC_V0,
    MAGIC_V1,
    MAGIC_V2,
    NO_PARTITION_LEADER_EPOCH,
    NO_PRODUCER_ID,
    NO_TIMESTAMP,
    TIMESTAMP_TYPE_MASK,
    TRANSACTIONAL_FLAG_MASK,
    BatchHeader,
    Compression,
    ScanStop,
    TimestampType,
)

# Magic 2 batch header (DefaultRecordBatch): base offset, length, partition leader epoch,
# magic, crc, attributes, last offset delta, base timestamp, max timestamp, producer id,
# producer epoch, base sequence, record count.
V2_HEADER = struct.Struct(">qiibIhiqqqhii")
RECORD_BATCH_OVERHEAD = V2_HEADER.size  # 61
assert RECORD_BATCH_OVERHEAD == 61
# The CRC32C covers everything from the attributes to the end of the batch.
V2_CRC_START = 21
V2_MIN_BATCH_LENGTH = RECORD_BATCH_OVERHEAD - LOG_OVERHEAD

_LENGTH_AT_8 = struct.Struct(">i")

# What other modules import from here: this module's own names and, for them, the
# format constants and the header type defined in header.py.
__all__ = [
    "COMPRESSION_CODEC_MASK",
    "CONTROL_FLAG_MASK",
    "DELETE_HORIZON_FLAG_MASK",
    "HEADER_SIZE_UP_TO_MAGIC",
    "LOG_OVERHEAD",
    "MAGIC_POSITION",
    "MAGIC_V0",
    "MAGIC_V1",
    "MAGIC_V2",
    "NO_PARTITION_LEADER_EPOCH",
    "NO_PRODUCER_ID",
    "NO_TIMESTAMP",
    "RECORD_BATCH_OVERHEAD",
    "TIMESTAMP_TYPE_MASK",
    "TRANSACTIONAL_FLAG_MASK",
    "V2_CRC_START",
    "V2_HEADER",
    "V2_MIN_BATCH_LENGTH",
    "BatchHeader",
    "Compression",
    "ScanResult",
    "ScanStop",
    "TimestampType",
    "header_at",
    "scan_batches",
]


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
    # The struct's fields are BatchHeader's, in order, after the position.
    header = BatchHeader(pos, *V2_HEADER.unpack_from(mv, pos))
    codec = header.attributes & COMPRESSION_CODEC_MASK
    if codec > Compression.ZSTD:
        return f"unknown compression codec {codec} {_where(header)}"
    if header.last_offset_delta < 0 or header.record_count < 0:
        return (
            f"negative last offset delta {header.last_offset_delta} or record count "
            f"{header.record_count} {_where(header)}"
        )
    if verify_crc:
        computed = crc32c(mv[pos + V2_CRC_START : end])
        if computed != header.crc:
            return (
                f"CRC32C mismatch {_where(header)}: "
                f"stored {header.crc:#010x}, computed {computed:#010x}"
            )
    return header


def _where(header: BatchHeader) -> str:
    return f"in batch at position {header.position} (base offset {header.base_offset})"


class _EntryFormat(NamedTuple):
    """How a scan reads the entries of one magic: the least length an entry of it may
    claim, the parser of its header, and its name in messages. (A tuple: the scan unpacks
    it once per entry, on the replication hot path.)"""

    min_length: int
    parse: Callable[[memoryview, int, int, bool], BatchHeader | str]
    name: str


_FORMATS: dict[int, _EntryFormat] = {
    MAGIC_V2: _EntryFormat(V2_MIN_BATCH_LENGTH, _v2_header, "batch"),
    MAGIC_V1: _EntryFormat(legacy.min_length(MAGIC_V1), legacy.entry_header, "magic 1 message"),
    MAGIC_V0: _EntryFormat(legacy.min_length(MAGIC_V0), legacy.entry_header, "magic 0 message"),
}


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
    formats = _FORMATS
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
        entry = formats.get(magic)
        if entry is None:
            return _corrupt(batches, pos, f"unknown magic {magic} at position {pos}")
        minimum, parse, name = entry
        if length < minimum:
            return _corrupt(
                batches,
                pos,
                f"{name} length {length} below the minimum {minimum} at position {pos}",
            )
        end = pos + LOG_OVERHEAD + length
        if end > n:
            return ScanResult(batches, pos, ScanStop.PARTIAL)
        header = parse(mv, pos, end, verify_crc)
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
    entry = _FORMATS.get(magic)
    if entry is None:
        return f"unknown magic {magic} at position {position}"
    if length < entry.min_length or len(mv) < LOG_OVERHEAD + entry.min_length:
        return f"bad {entry.name} header at position {position}"
    header = entry.parse(mv, 0, 0, False)
    if isinstance(header, str):
        return header
    return dataclasses.replace(header, position=position)
