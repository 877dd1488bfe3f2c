"""Decoding the records of one batch: for dump-log, verify and readers such as Spark.

Not on the replication path (that one never looks inside a batch). Rules:
- Magic 2: the records section (after the 61-byte header) is decompressed with the batch's
  codec, then read as `record_count` varint-framed records. Offsets are base_offset +
  offset delta; timestamps are base_timestamp + delta for CREATE_TIME and the batch's
  max_timestamp for LOG_APPEND_TIME (Kafka's rule); sequences are base_sequence + offset
  delta (wrapping at 2^31-1) when the batch has one.
- Control batches hold one control record whose key is `version: int16, type: int16`
  (0 ABORT, 1 COMMIT, ...); for ABORT/COMMIT the value is `version: int16,
  coordinator_epoch: int32` (an end-transaction marker).
- Magic 0/1: a plain message is one record; a compressed wrapper's value is decompressed and
  read as a message set; magic 1 inner offsets are relative to the wrapper (see legacy.py).
- Anything inconsistent (lengths overrunning, counts not matching) raises CorruptRecordError.

kio's `kio.records.read_batch` is not used: it reads the records section without
decompressing it, truncates timestamps to whole seconds and knows no legacy formats.
Its varint readers (kio.serial.readers) are used.
"""

from __future__ import annotations

import enum
import struct
from dataclasses import dataclass

from kio.serial.errors import BufferUnderflow
from kio.serial.readers import read_signed_varint, read_signed_varlong

from replicad.errors import CorruptRecordError
from replicad.records.batch import (
    LOG_OVERHEAD,
    MAGIC_V1,
    MAGIC_V2,
    NO_TIMESTAMP,
    RECORD_BATCH_OVERHEAD,
    BatchHeader,
    Compression,
    ScanStop,
    TimestampType,
    scan_batches,
)
from replicad.records.codecs import decompress

MAX_SEQUENCE = 2**31 - 1
NO_SEQUENCE = -1

_CONTROL_KEY = struct.Struct(">hh")
_END_TXN_VALUE = struct.Struct(">hi")
_INT32 = struct.Struct(">i")


class ControlType(enum.IntEnum):
    ABORT = 0
    COMMIT = 1
    LEADER_CHANGE = 2
    SNAPSHOT_HEADER = 3
    SNAPSHOT_FOOTER = 4
    KRAFT_VERSION = 5
    KRAFT_VOTERS = 6


@dataclass(frozen=True, slots=True)
class Header:
    key: str
    value: bytes | None


@dataclass(frozen=True, slots=True)
class Record:
    offset: int
    timestamp: int
    key: bytes | None
    value: bytes | None
    headers: tuple[Header, ...] = ()
    sequence: int = NO_SEQUENCE


@dataclass(frozen=True, slots=True)
class ControlMarker:
    """What a control record says; coordinator_epoch only for ABORT/COMMIT markers."""

    type_id: int
    version: int
    coordinator_epoch: int | None

    @property
    def type(self) -> ControlType | None:
        try:
            return ControlType(self.type_id)
        except ValueError:
            return None


@dataclass(frozen=True, slots=True)
class DecodedBatch:
    header: BatchHeader
    records: tuple[Record, ...]


def decode_batch(buf: bytes | bytearray | memoryview, header: BatchHeader) -> DecodedBatch:
    """Decode the records of the batch `header` describes; `buf` is the scanned buffer."""
    mv = memoryview(buf).cast("B") if not isinstance(buf, memoryview) else buf
    entry = mv[header.position : header.end_position]
    if header.magic == MAGIC_V2:
        return DecodedBatch(header, _decode_v2(entry, header))
    return DecodedBatch(header, _decode_legacy(entry, header))


def first_record_at(
    entry: bytes | memoryview, header: BatchHeader, timestamp: int, start: int
) -> Record | None:
    """In one batch (`entry`: its bytes alone), the first record at or past offset `start`
    whose timestamp is >= `timestamp`; None when none is. Kafka's findOffsetByTimestamp
    inside a batch: a batch reaching the target may begin with older records."""
    batch = decode_batch(entry, header._replace(position=0))
    for record in batch.records:
        if record.timestamp >= timestamp and record.offset >= start:
            return record
    return None


def control_marker(record: Record) -> ControlMarker:
    """Read the control record of a control batch."""
    if record.key is None or len(record.key) < _CONTROL_KEY.size:
        raise CorruptRecordError(f"control record at offset {record.offset} has no valid key")
    version, type_id = _CONTROL_KEY.unpack_from(record.key)
    epoch = None
    if type_id in (ControlType.ABORT, ControlType.COMMIT):
        if record.value is None or len(record.value) < _END_TXN_VALUE.size:
            raise CorruptRecordError(
                f"end transaction marker at offset {record.offset} has no valid value"
            )
        _, epoch = _END_TXN_VALUE.unpack_from(record.value)
    return ControlMarker(type_id, version, epoch)


def _decode_v2(entry: memoryview, header: BatchHeader) -> tuple[Record, ...]:
    body = entry[RECORD_BATCH_OVERHEAD:]
    data = memoryview(decompress(header.compression, body))
    log_append = header.timestamp_type == TimestampType.LOG_APPEND_TIME
    records = []
    pos = 0
    for _ in range(header.record_count):
        try:
            record, pos = _read_v2_record(data, pos, header, log_append)
        except (BufferUnderflow, ValueError, IndexError, struct.error, UnicodeDecodeError) as exc:
            raise CorruptRecordError(
                f"record {len(records)} of batch at base offset {header.base_offset} "
                f"does not decode: {exc}"
            ) from exc
        records.append(record)
    if pos != len(data):
        raise CorruptRecordError(
            f"batch at base offset {header.base_offset}: {len(data) - pos} bytes left after "
            f"{header.record_count} records"
        )
    return tuple(records)


def _read_bytes(data: memoryview, pos: int) -> tuple[bytes | None, int]:
    length, size = read_signed_varint(data, pos)
    pos += size
    if length < 0:
        return None, pos
    if pos + length > len(data):
        raise ValueError(f"field of {length} bytes overruns the record data")
    return bytes(data[pos : pos + length]), pos + length


def _read_v2_record(
    data: memoryview, pos: int, header: BatchHeader, log_append: bool
) -> tuple[Record, int]:
    length, size = read_signed_varint(data, pos)
    pos += size
    end = pos + length
    if length < 0 or end > len(data):
        raise ValueError(f"record length {length} overruns the batch")
    pos += 1  # attributes: unused by the format so far
    ts_delta, size = read_signed_varlong(data, pos)
    pos += size
    offset_delta, size = read_signed_varint(data, pos)
    pos += size
    key, pos = _read_bytes(data, pos)
    value, pos = _read_bytes(data, pos)
    count, size = read_signed_varint(data, pos)
    pos += size
    headers = []
    for _ in range(count):
        hkey, pos = _read_bytes(data, pos)
        hvalue, pos = _read_bytes(data, pos)
        if hkey is None:
            raise ValueError("record header with a null key")
        headers.append(Header(hkey.decode("utf-8"), hvalue))
    if pos != end:
        raise ValueError(f"record length {length} does not match its fields")
    sequence = NO_SEQUENCE
    if header.base_sequence >= 0:
        sequence = (header.base_sequence + offset_delta) % (MAX_SEQUENCE + 1)
    timestamp = header.max_timestamp if log_append else header.base_timestamp + ts_delta
    record = Record(
        header.base_offset + offset_delta, timestamp, key, value, tuple(headers), sequence
    )
    return record, pos


def _legacy_key_value(entry: memoryview, magic: int) -> tuple[bytes | None, bytes | None]:
    # The key length follows crc, magic, attributes (and the magic 1 timestamp).
    pos = LOG_OVERHEAD + 6 + (8 if magic == MAGIC_V1 else 0)
    fields: list[bytes | None] = []
    for _ in range(2):
        (length,) = _INT32.unpack_from(entry, pos)
        pos += 4
        if length < 0:
            fields.append(None)
            continue
        if pos + length > len(entry):
            raise CorruptRecordError(f"legacy message field of {length} bytes overruns the message")
        fields.append(bytes(entry[pos : pos + length]))
        pos += length
    return fields[0], fields[1]


def _decode_legacy(entry: memoryview, header: BatchHeader) -> tuple[Record, ...]:
    key, value = _legacy_key_value(entry, header.magic)
    if header.compression == Compression.NONE:
        return (Record(header.base_offset, header.max_timestamp, key, value),)
    if value is None:
        raise CorruptRecordError(f"compressed wrapper at offset {header.base_offset} has no value")
    inner = decompress(header.compression, value)
    scan = scan_batches(inner)
    if scan.stop is not ScanStop.END:
        raise CorruptRecordError(
            f"inner message set of wrapper at offset {header.base_offset}: "
            f"{scan.error or 'cut off'}"
        )
    shift = 0
    if header.magic == MAGIC_V1 and scan.batches:
        shift = header.base_offset - scan.batches[-1].base_offset
    log_append = header.timestamp_type == TimestampType.LOG_APPEND_TIME
    records = []
    for inner_header in scan.batches:
        ikey, ivalue = _legacy_key_value(
            memoryview(inner)[inner_header.position : inner_header.end_position],
            inner_header.magic,
        )
        timestamp = header.max_timestamp if log_append else inner_header.max_timestamp
        if header.magic < MAGIC_V1:
            timestamp = NO_TIMESTAMP
        records.append(Record(inner_header.base_offset + shift, timestamp, ikey, ivalue))
    return tuple(records)
