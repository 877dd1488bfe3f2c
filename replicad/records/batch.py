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
  memoryview, the CRC32C is computed over a memoryview slice, once per batch. This is the
  replication hot path: the batches found are a `BatchRun` (run.py), the unpacked tuples as
  they came, with no object per batch beyond them.
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import NamedTuple

from replicad.records import legacy
from replicad.records.crc import crc32c
from replicad.records.header import (
    COMPRESSION_CODEC_MASK,
    CONTROL_FLAG_MASK,
    DELETE_HORIZON_FLAG_MASK,
    HEADER_SIZE_UP_TO_MAGIC,
    LEGACY_CRC_POSITION,
    LEGACY_CRC_START,
    LENGTH_POSITION,
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
    V1_TIMESTAMP_POSITION,
    V2_ATTRIBUTES_POSITION,
    V2_CRC_POSITION,
    V2_CRC_START,
    V2_LAST_OFFSET_DELTA_POSITION,
    V2_LEADER_EPOCH_POSITION,
    V2_MAX_TIMESTAMP_POSITION,
    V2_PRODUCER_ID_POSITION,
    V2_RECORD_COUNT_POSITION,
    BatchHeader,
    Compression,
    ScanStop,
    TimestampType,
    header_from,
)
from replicad.records.run import (
    BASE_OFFSET,
    LAST_OFFSET_DELTA,
    RECORD_COUNT,
    BatchRun,
    Fields,
    fields_of,
)

# Magic 2 batch header (DefaultRecordBatch): base offset, length, partition leader epoch,
# magic, crc, attributes, last offset delta, base timestamp, max timestamp, producer id,
# producer epoch, base sequence, record count.
V2_HEADER = struct.Struct(">qiibIhiqqqhii")
RECORD_BATCH_OVERHEAD = V2_HEADER.size  # 61
assert RECORD_BATCH_OVERHEAD == 61
V2_MIN_BATCH_LENGTH = RECORD_BATCH_OVERHEAD - LOG_OVERHEAD

_LENGTH_AT_8 = struct.Struct(">i")
# Fields of V2_HEADER that run.py does not name.
_CRC = 4
_ATTRIBUTES = 5

# What other modules import from here: this module's own names and, for them, the
# format constants and the header type defined in header.py.
__all__ = [
    "COMPRESSION_CODEC_MASK",
    "CONTROL_FLAG_MASK",
    "DELETE_HORIZON_FLAG_MASK",
    "HEADER_SIZE_UP_TO_MAGIC",
    "LEGACY_CRC_POSITION",
    "LEGACY_CRC_START",
    "LENGTH_POSITION",
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
    "V1_TIMESTAMP_POSITION",
    "V2_ATTRIBUTES_POSITION",
    "V2_CRC_POSITION",
    "V2_CRC_START",
    "V2_HEADER",
    "V2_LAST_OFFSET_DELTA_POSITION",
    "V2_LEADER_EPOCH_POSITION",
    "V2_MAX_TIMESTAMP_POSITION",
    "V2_MIN_BATCH_LENGTH",
    "V2_PRODUCER_ID_POSITION",
    "V2_RECORD_COUNT_POSITION",
    "BatchHeader",
    "BatchRun",
    "Compression",
    "ScanResult",
    "ScanStop",
    "TimestampType",
    "header_at",
    "scan_batches",
]


@dataclass(frozen=True, slots=True)
class ScanResult:
    run: BatchRun  # the whole, valid entries before the stop: what the hot path reads
    valid_bytes: int
    stop: ScanStop
    error: str | None = None
    _headers: list[BatchHeader] | None = field(default=None, repr=False, compare=False)

    @property
    def batches(self) -> list[BatchHeader]:
        """The same entries as headers, made on first use (one object per entry)."""
        if self._headers is None:
            object.__setattr__(self, "_headers", list(self.run))
        return self._headers  # type: ignore[return-value]

    @property
    def next_offset(self) -> int | None:
        """Offset after the last whole batch, or None when there is none."""
        return self.run.next_offset if self.run.fields else None


def _v2_fields(mv: memoryview, pos: int, end: int, verify_crc: bool) -> Fields | str:
    """The header fields of the magic 2 batch at `pos` (whole, ending at `end`), or what is
    wrong with it."""
    fields = V2_HEADER.unpack_from(mv, pos)
    codec = fields[_ATTRIBUTES] & COMPRESSION_CODEC_MASK
    if codec > Compression.ZSTD:
        return f"unknown compression codec {codec} {_where(pos, fields)}"
    if fields[LAST_OFFSET_DELTA] < 0 or fields[RECORD_COUNT] < 0:
        return (
            f"negative last offset delta {fields[LAST_OFFSET_DELTA]} or record count "
            f"{fields[RECORD_COUNT]} {_where(pos, fields)}"
        )
    if verify_crc:
        computed = crc32c(mv[pos + V2_CRC_START : end])
        if computed != fields[_CRC]:
            return (
                f"CRC32C mismatch {_where(pos, fields)}: "
                f"stored {fields[_CRC]:#010x}, computed {computed:#010x}"
            )
    return fields


def _legacy_fields(mv: memoryview, pos: int, end: int, verify_crc: bool) -> Fields | str:
    header = legacy.entry_header(mv, pos, end, verify_crc)
    return header if isinstance(header, str) else fields_of(header)


def _where(pos: int, fields: Fields) -> str:
    return f"in batch at position {pos} (base offset {fields[BASE_OFFSET]})"


class _EntryFormat(NamedTuple):
    """How a scan reads the entries of one magic: the least length an entry of it may
    claim, the parser of its header, and its name in messages."""

    min_length: int
    parse: Callable[[memoryview, int, int, bool], Fields | str]
    name: str


_FORMATS: dict[int, _EntryFormat] = {
    MAGIC_V2: _EntryFormat(V2_MIN_BATCH_LENGTH, _v2_fields, "batch"),
    MAGIC_V1: _EntryFormat(legacy.min_length(MAGIC_V1), _legacy_fields, "magic 1 message"),
    MAGIC_V0: _EntryFormat(legacy.min_length(MAGIC_V0), _legacy_fields, "magic 0 message"),
}


def scan_batches(buf: bytes | bytearray | memoryview, *, verify_crc: bool = True) -> ScanResult:
    """Walk the log entries in `buf`; see the module docstring for the stop rules."""
    mv = buf if isinstance(buf, memoryview) else memoryview(buf)
    if mv.format != "B" or mv.ndim != 1:
        mv = mv.cast("B")
    n = len(mv)
    pos = 0
    found: list[Fields] = []
    append = found.append
    unpack_v2 = V2_HEADER.unpack_from
    unpack_length = _LENGTH_AT_8.unpack_from
    formats = _FORMATS
    # Bound once for the loop below, which runs once per batch.
    crc = crc32c
    last_header_at = n - RECORD_BATCH_OVERHEAD
    min_length, max_codec = V2_MIN_BATCH_LENGTH, int(Compression.ZSTD)
    overhead, crc_start = LOG_OVERHEAD, V2_CRC_START
    # Whether every batch's offsets rise above the one before (`BatchRun.rising`): kept
    # by the loop below, which sees each base offset anyway; a legacy entry gives it up.
    rising = True
    previous_last = -(2**63) - 1
    while True:
        # The replication path, inlined: one unpack and one CRC per whole, sound magic 2
        # batch, and no object but the unpacked tuple. Anything else (another magic, a cut
        # or bad batch, the end) leaves this loop for the general path, which says what.
        while pos <= last_header_at:
            fields = unpack_v2(mv, pos)
            base, length, _, magic, stored_crc, attributes, delta, _, _, _, _, _, count = fields
            end = pos + overhead + length
            if (
                magic != MAGIC_V2
                or length < min_length
                or end > n
                or attributes & COMPRESSION_CODEC_MASK > max_codec
                or delta < 0
                or count < 0
                or (verify_crc and crc(mv[pos + crc_start : end]) != stored_crc)
            ):
                break
            if base <= previous_last:
                rising = False
            previous_last = base + delta
            append(fields)
            pos = end
        remaining = n - pos
        if remaining == 0:
            return ScanResult(BatchRun(found, 0, pos, rising=rising), pos, ScanStop.END)
        if remaining < LOG_OVERHEAD:
            return ScanResult(BatchRun(found, 0, pos, rising=rising), pos, ScanStop.PARTIAL)
        (length,) = unpack_length(mv, pos + 8)
        if remaining < HEADER_SIZE_UP_TO_MAGIC:
            if length < 0:
                return _corrupt(found, pos, f"negative length {length} at position {pos}", rising)
            return ScanResult(BatchRun(found, 0, pos, rising=rising), pos, ScanStop.PARTIAL)
        magic = mv[pos + MAGIC_POSITION]
        entry = formats.get(magic)
        if entry is None:
            return _corrupt(found, pos, f"unknown magic {magic} at position {pos}", rising)
        minimum, parse, name = entry
        if length < minimum:
            return _corrupt(
                found,
                pos,
                f"{name} length {length} below the minimum {minimum} at position {pos}",
                rising,
            )
        end = pos + LOG_OVERHEAD + length
        if end > n:
            return ScanResult(BatchRun(found, 0, pos, rising=rising), pos, ScanStop.PARTIAL)
        parsed = parse(mv, pos, end, verify_crc)
        if isinstance(parsed, str):
            return _corrupt(found, pos, parsed, rising)
        rising = False
        append(parsed)
        pos = end


def _corrupt(found: list[Fields], pos: int, error: str, rising: bool) -> ScanResult:
    return ScanResult(BatchRun(found, 0, pos, rising=rising), pos, ScanStop.CORRUPT, error)


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
    parsed = entry.parse(mv, 0, 0, False)
    if isinstance(parsed, str):
        return parsed
    return header_from((position, *parsed))
