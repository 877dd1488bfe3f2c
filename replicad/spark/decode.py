"""Record batches (magic 2) to Arrow columns, many batches at once: the reader's hot path.

The same records as `records.decode_batch` (the reference, and what tests compare with),
decoded column by column instead of record by record. Rules:
- The records section of each batch is decompressed once; the sections of the batches
  decoded together are joined into one buffer.
- Only the record framing is walked in Python: each record's length varint says where the
  next record starts, so that chain cannot be computed all at once. Every other field is
  decoded for all records together with numpy: a varint by gathering up to its longest
  (5 bytes for a varint, 10 for the timestamp delta's varlong) from each record's cursor,
  then zigzag; headers one header index at a time.
- offset = base offset + offset delta; timestamp = base timestamp + delta, or the batch's
  max timestamp for LOG_APPEND_TIME (Kafka's rule). A negative key, value or header value
  length is null.
- Keys and values are gathered from the buffer by Arrow (`binary_array`): no Python
  object per field.
- Integrity, as strict as the reference and as Kafka: a varint longer than allowed, a
  record whose fields do not end exactly at its length, records not filling exactly their
  batch's section, a negative header count, a null or non-UTF-8 header key: all are
  CorruptRecordError naming the batch's base offset.
"""

from __future__ import annotations

import functools
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import pyarrow as pa

from replicad.errors import CorruptRecordError
from replicad.records.batch import RECORD_BATCH_OVERHEAD, BatchHeader, Compression, TimestampType
from replicad.records.codecs import decompress

if TYPE_CHECKING:
    from replicad.records.records import Record  # its module imports kio: reader.py says why

VARINT_MAX_BYTES = 5
VARLONG_MAX_BYTES = 10
CONTINUATION = 0x80
PAYLOAD_BITS = 0x7F
MAX_BINARY_BYTES = 2**31 - 1  # Arrow binary offsets are int32

HEADER_TYPE = pa.struct([("key", pa.string()), ("value", pa.binary())])
HEADERS_TYPE = pa.list_(HEADER_TYPE)

_POSITIONS = {n: np.arange(n, dtype=np.int64) for n in (VARINT_MAX_BYTES, VARLONG_MAX_BYTES)}
_SHIFTS = {n: (7 * np.arange(n, dtype=np.uint64)) for n in _POSITIONS}


@dataclass(frozen=True, slots=True)
class RecordColumns:
    """The records of consecutive batches in file order, column by column.

    `rows_per_batch[i]` records came from the i-th batch decoded, so per-batch fields
    become columns with `np.repeat(values, rows_per_batch)`.
    """

    offsets: np.ndarray  # int64
    timestamps: np.ndarray  # int64 milliseconds; < 0: none
    keys: pa.Array  # binary
    values: pa.Array  # binary
    headers: pa.Array  # list<struct<key: string, value: binary>>
    rows_per_batch: np.ndarray  # int64

    @property
    def num_rows(self) -> int:
        return len(self.offsets)


class _Corrupt(Exception):
    """A record that does not decode: `row` is its index among the records decoded."""

    def __init__(self, row: int, reason: str) -> None:
        super().__init__(reason)
        self.row = row
        self.reason = reason


def decode_v2_columns(
    buf: bytes | bytearray | memoryview, batches: Sequence[BatchHeader]
) -> RecordColumns:
    """The records of `batches` (magic 2, positions within `buf`), as columns."""
    mv = memoryview(buf).cast("B") if not isinstance(buf, memoryview) else buf
    ranges = [(h.position + RECORD_BATCH_OVERHEAD, h.end_position) for h in batches]
    data: bytes | memoryview = mv
    if any(h.compression != Compression.NONE for h in batches):
        sections: list[bytes | memoryview] = []
        for header, (start, end) in zip(batches, ranges, strict=True):
            body: bytes | memoryview = mv[start:end]
            if header.compression != Compression.NONE:
                try:
                    body = decompress(header.compression, body)
                except CorruptRecordError as exc:
                    raise _batch_error(header, str(exc)) from exc
            sections.append(body)
        data = b"".join(sections)
        ends = np.cumsum([len(section) for section in sections]).tolist()
        ranges = list(zip([0, *ends[:-1]], ends, strict=True))
    counts = np.fromiter((h.record_count for h in batches), np.int64, len(batches))
    first_rows = np.concatenate(([0], np.cumsum(counts)))
    try:
        starts, ends = _frame(data, ranges, counts.tolist())
        return _fields(data, batches, counts, starts, ends)
    except _Corrupt as exc:
        batch = int(np.searchsorted(first_rows, exc.row, side="right")) - 1
        batch = min(max(batch, 0), len(batches) - 1)
        record = exc.row - int(first_rows[batch])
        raise _batch_error(
            batches[batch], f"record {record} does not decode: {exc.reason}"
        ) from None


def _batch_error(header: BatchHeader, reason: str) -> CorruptRecordError:
    return CorruptRecordError(f"batch at base offset {header.base_offset}: {reason}")


def _frame(
    data: bytes | memoryview, ranges: list[tuple[int, int]], counts: list[int]
) -> tuple[np.ndarray, np.ndarray]:
    """Where each record's fields start and where it ends; `ranges` are the batches'
    records sections in `data`.

    The Python loop only follows the chain of record lengths, noting where each length
    starts (`heads`): nothing is checked in it, so it costs as little as a loop over
    records can. Every check is then made on all records at once (`_checked_frame`), in the
    order a record-by-record walk would meet them, so the first fault found is the one
    reported. A corrupt length can send the chain anywhere (backwards, past the data): the
    loop runs at most one record per byte of its section and stops a batch whose chain did
    not end at the section's end; the checks then find the first record at fault.
    """
    heads: list[int] = []
    add = heads.append
    # A record's length is mostly one or two bytes long: the two bytes at a position,
    # read as one 16-bit number (of the view of its parity), index the step to the next
    # record (_length_steps); 0 sends the rest (longer varints, the data's last byte) the
    # long way, which computes the same step.
    steps = _length_steps()
    mv = memoryview(data)
    n = len(mv)
    pairs = (mv[: n & ~1].cast("H"), mv[1 : 1 + ((n - 1) & ~1)].cast("H"))
    try:
        for count, (pos, section_end) in zip(counts, ranges, strict=True):
            for _ in range(min(count, section_end - pos + 1)):
                add(pos)
                try:
                    step = steps[pairs[pos & 1][pos >> 1]]
                except IndexError:
                    step = 0
                if step:
                    pos += step
                    continue
                b = data[pos]
                if b < CONTINUATION:
                    pos += 1 + ((b >> 1) ^ -(b & 1))
                    continue
                b2 = data[pos + 1]
                if b2 < CONTINUATION:
                    raw = (b & PAYLOAD_BITS) | (b2 << 7)
                    pos += 2 + ((raw >> 1) ^ -(raw & 1))
                else:
                    raw, after = _varint(data, pos, section_end, len(heads) - 1)
                    pos = after + ((raw >> 1) ^ -(raw & 1))
            if pos != section_end:
                break
    except (IndexError, _Corrupt):
        pass  # the checks below name the first record at fault
    return _checked_frame(data, ranges, counts, np.array(heads, dtype=np.int64))


@functools.cache
def _length_steps() -> list[int]:
    """For each 16-bit number two bytes make in this machine's byte order: the size of the
    zigzag varint they start plus its value (the step from a record's length to the next
    record), when it is one or two bytes long; else 0."""
    v = np.arange(1 << 16, dtype=np.int64)
    first, second = (v & 0xFF, v >> 8) if sys.byteorder == "little" else (v >> 8, v & 0xFF)
    one = first < CONTINUATION
    raw = np.where(one, first, (first & PAYLOAD_BITS) | (second << 7))
    steps = np.where(one, 1, 2) + ((raw >> 1) ^ -(raw & 1))
    steps[~one & (second >= CONTINUATION)] = 0
    return steps.tolist()


def _checked_frame(
    data: bytes | memoryview, ranges: list[tuple[int, int]], counts: list[int], heads: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """(starts, ends) of the records whose length fields start at `heads`, as the framing
    loop found them (all of them, or up to where it stopped), checked in record order: a
    record past its section's end, a length varint too long or cut off by the section's
    end, a length that is negative or overruns the section; after a batch's last record,
    bytes left in its section. Raises _Corrupt for the first."""
    arr = np.frombuffer(data, dtype=np.uint8)
    n = len(heads)
    first_rows = np.concatenate(([0], np.cumsum(counts))).astype(np.int64)
    # Each framed record's batch, from the records framed: a corrupt header's record count
    # (up to 2^31 - 1) must not size anything.
    batch_of = np.searchsorted(first_rows, np.arange(n), side="right") - 1
    section_ends = np.array([end for _, end in ranges], dtype=np.int64)
    row_end = section_ends[batch_of]
    past = heads >= row_end
    raw, size, too_long = _varint_fields(arr, np.clip(heads, 0, None), VARINT_MAX_BYTES)
    length = _zigzag(raw)
    cut = ~too_long & (heads + size > row_end)
    ends = heads + size + length
    overrun = (length < 0) | (ends > row_end)
    bad_row = past | too_long | cut | overrun
    # A batch's bytes after its last record, checked once its records are (the walk would
    # meet it before the next batch's first record).
    complete = first_rows[1:] <= n
    last_end = np.where(
        complete & (first_rows[1:] > first_rows[:-1]),
        ends[np.clip(first_rows[1:] - 1, 0, max(n - 1, 0))] if n else 0,
        np.array([start for start, _ in ranges], dtype=np.int64),
    )
    bad_batch = complete & (last_end != section_ends)
    row = int(np.flatnonzero(bad_row)[0]) if bad_row.any() else n
    batch = int(np.flatnonzero(bad_batch)[0]) if bad_batch.any() else len(counts)
    if batch < len(counts) and first_rows[batch + 1] <= row:
        leftover = int(section_ends[batch] - last_end[batch])
        raise _Corrupt(
            max(int(first_rows[batch + 1]) - 1, 0), f"{leftover} bytes after the records"
        )
    if row < n:
        if past[row]:
            raise _Corrupt(row, "the records section ends before the record count")
        if too_long[row]:
            raise _Corrupt(row, f"varint longer than {VARINT_MAX_BYTES} bytes")
        if cut[row]:
            raise _Corrupt(row, "record length cut off")
        raise _Corrupt(row, f"record length {int(length[row])} overruns the batch")
    if n < first_rows[-1]:  # the loop stopped (data ended) where no check above did
        raise _Corrupt(n, "record length cut off")
    return heads + size, ends


def _varint(data: bytes | memoryview, pos: int, limit: int, row: int) -> tuple[int, int]:
    """An unsigned varint of at most 5 bytes at `pos` (not zigzag-decoded), and after it."""
    raw = 0
    for i in range(VARINT_MAX_BYTES):
        if pos >= limit:
            raise _Corrupt(row, "varint cut off")
        b = data[pos]
        pos += 1
        raw |= (b & PAYLOAD_BITS) << (7 * i)
        if b < CONTINUATION:
            return raw, pos
    raise _Corrupt(row, "varint longer than 5 bytes")


def _varints(arr: np.ndarray, at: np.ndarray, max_bytes: int) -> tuple[np.ndarray, np.ndarray]:
    """Zigzag varints at positions `at` of `arr`: (values, sizes). Positions past the end
    read the last byte: the caller's end checks reject what that misreads."""
    raw, sizes, too_long = _varint_fields(arr, at, max_bytes)
    if too_long.any():
        row = int(np.flatnonzero(too_long)[0])
        raise _Corrupt(row, f"varint longer than {max_bytes} bytes")
    return _zigzag(raw), sizes


def _zigzag(raw: np.ndarray) -> np.ndarray:
    """Zigzag-decoded int64 from raw varints held in int64 (the bits of a uint64)."""
    return (raw.view(np.uint64) >> np.uint64(1)).view(np.int64) ^ -(raw & 1)


def _varint_fields(
    arr: np.ndarray, at: np.ndarray, max_bytes: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Unsigned varints at positions `at` (not zigzag-decoded): (raw values as int64,
    sizes, too long). Positions past the end read the last byte."""
    n = len(at)
    if n == 0:
        return np.zeros(0, np.int64), np.zeros(0, np.int64), np.zeros(0, np.bool_)
    fits = np.zeros(n, np.bool_)
    last = len(arr) - 1
    first = arr[np.minimum(at, last)]
    one = first < CONTINUATION
    if one.all():
        return first.astype(np.int64), np.ones(n, np.int64), fits
    # One or two bytes: lengths and deltas under 8 KiB (a 1 KB value's length, an offset
    # delta past 63), most records' fields. Two gathers instead of a row of max_bytes each.
    second = arr[np.minimum(at + 1, last)]
    if (one | (second < CONTINUATION)).all():
        low = first.astype(np.int64)
        raw = np.where(one, low, (low & PAYLOAD_BITS) | (second.astype(np.int64) << 7))
        return raw, np.where(one, 1, 2).astype(np.int64), fits
    index = at[:, None] + _POSITIONS[max_bytes]
    np.minimum(index, last, out=index)
    octets = arr[index]
    more = octets >= CONTINUATION
    too_long = more.all(axis=1)
    final = np.argmin(more, axis=1)  # the first byte without the continuation bit
    payload = (octets & PAYLOAD_BITS).astype(np.uint64) << _SHIFTS[max_bytes]
    payload[_POSITIONS[max_bytes][None, :] > final[:, None]] = 0
    raw_u = np.bitwise_or.reduce(payload, axis=1)
    return raw_u.view(np.int64), final.astype(np.int64) + 1, too_long


def _fields(
    data: bytes | memoryview,
    batches: Sequence[BatchHeader],
    counts: np.ndarray,
    starts: np.ndarray,
    ends: np.ndarray,
) -> RecordColumns:
    arr = np.frombuffer(data, dtype=np.uint8)
    at = starts + 1  # the attributes byte: unused by the format so far
    ts_delta, size = _varints(arr, at, VARLONG_MAX_BYTES)
    at = at + size
    offset_delta, size = _varints(arr, at, VARINT_MAX_BYTES)
    at += size
    key_length, size = _varints(arr, at, VARINT_MAX_BYTES)
    key_start = at + size
    at = key_start + np.maximum(key_length, 0)
    value_length, size = _varints(arr, at, VARINT_MAX_BYTES)
    value_start = at + size
    at = value_start + np.maximum(value_length, 0)
    header_count, size = _varints(arr, at, VARINT_MAX_BYTES)
    at += size
    # Each header takes two bytes at least: a count beyond that is corrupt (and bounded).
    bad = (header_count < 0) | (header_count * 2 > ends - at)
    if bad.any():
        row = int(np.flatnonzero(bad)[0])
        raise _Corrupt(row, f"header count {int(header_count[row])} does not fit the record")
    headers, at = _header_fields(arr, header_count, at)
    wrong_end = at != ends
    if wrong_end.any():
        row = int(np.flatnonzero(wrong_end)[0])
        raise _Corrupt(row, "the record's fields do not end at its length")
    per_batch = np.array(
        [
            (
                h.base_offset,
                h.max_timestamp if h.timestamp_type == TimestampType.LOG_APPEND_TIME else -1,
                h.base_timestamp,
                h.timestamp_type == TimestampType.LOG_APPEND_TIME,
            )
            for h in batches
        ],
        dtype=np.int64,
    ).reshape(len(batches), 4)
    base_offset, append_time, base_timestamp, log_append = (
        np.repeat(per_batch[:, i], counts) for i in range(4)
    )
    timestamps = np.where(log_append != 0, append_time, base_timestamp + ts_delta)
    return RecordColumns(
        offsets=base_offset + offset_delta,
        timestamps=timestamps,
        keys=binary_array(data, key_start, key_length),
        values=binary_array(data, value_start, value_length),
        headers=headers.array(data),
        rows_per_batch=counts,
    )


@dataclass(frozen=True, slots=True)
class _HeaderFields:
    """Where the headers' keys and values are, flattened in record order."""

    list_offsets: np.ndarray  # int32: record i's headers are [list_offsets[i], [i + 1])
    key_start: np.ndarray
    key_length: np.ndarray
    value_start: np.ndarray
    value_length: np.ndarray

    def array(self, data: bytes | memoryview) -> pa.Array:
        keys = binary_array(data, self.key_start, self.key_length, pa.string())
        try:
            keys.validate(full=True)  # UTF-8
        except pa.ArrowInvalid as exc:
            bad = _first_invalid_utf8(keys)
            owner = int(np.searchsorted(self.list_offsets, bad, side="right")) - 1
            raise _Corrupt(owner, f"header key is not UTF-8: {exc}") from None
        values = binary_array(data, self.value_start, self.value_length)
        structs = pa.StructArray.from_arrays([keys, values], fields=list(HEADER_TYPE))
        return pa.ListArray.from_arrays(pa.array(self.list_offsets, pa.int32()), structs)


def _header_fields(
    arr: np.ndarray, count: np.ndarray, at: np.ndarray
) -> tuple[_HeaderFields, np.ndarray]:
    """Where the records' headers are, and the positions after them."""
    list_offsets = np.concatenate(([0], np.cumsum(count))).astype(np.int32)
    total = int(list_offsets[-1])
    key_start = np.zeros(total, np.int64)
    key_length = np.zeros(total, np.int64)
    value_start = np.zeros(total, np.int64)
    value_length = np.zeros(total, np.int64)
    at = at.copy()
    for j in range(int(count.max()) if len(count) else 0):
        rows = np.flatnonzero(count > j)
        slots = list_offsets[rows] + j
        length, size = _varints(arr, at[rows], VARINT_MAX_BYTES)
        null_key = length < 0
        if null_key.any():
            raise _Corrupt(int(rows[np.flatnonzero(null_key)[0]]), "header with a null key")
        key_start[slots] = at[rows] + size
        key_length[slots] = length
        after_key = key_start[slots] + length
        length, size = _varints(arr, after_key, VARINT_MAX_BYTES)
        value_start[slots] = after_key + size
        value_length[slots] = length
        at[rows] = value_start[slots] + np.maximum(length, 0)
    fields = _HeaderFields(list_offsets, key_start, key_length, value_start, value_length)
    return fields, at


def _first_invalid_utf8(keys: pa.Array) -> int:
    for i, key in enumerate(keys.cast(pa.binary()).to_pylist()):
        try:
            key.decode("utf-8")
        except UnicodeDecodeError:
            return i
    return 0


def binary_array(
    data: bytes | memoryview,
    starts: np.ndarray,
    lengths: np.ndarray,
    arrow_type: pa.DataType | None = None,
) -> pa.Array:
    """data[start:start + length] for each pair as an Arrow binary (or string) array; a
    negative length is null. The pairs must be in order and not overlap (as fields of
    records are).

    Arrow does the copying: `data` is seen as one large_binary array whose elements are,
    alternately, the bytes between two fields and a field; taking every second element
    gathers the fields at memcpy speed (a Python loop over the fields is five times slower).
    """
    arrow_type = arrow_type or pa.binary()
    n = len(starts)
    valid = lengths >= 0
    sizes = np.where(valid, lengths, 0)
    offsets = np.zeros(n + 1, np.int64)
    np.cumsum(sizes, out=offsets[1:])
    if offsets[-1] > MAX_BINARY_BYTES:
        raise CorruptRecordError(f"{offsets[-1]} bytes of keys or values in one read")
    bounds = np.empty(2 * n + 2, np.int64)
    bounds[0], bounds[-1] = 0, len(data)
    bounds[1:-1:2] = starts
    bounds[2:-1:2] = starts + sizes
    pieces = pa.Array.from_buffers(
        pa.large_binary(), 2 * n + 1, [None, pa.py_buffer(bounds), pa.py_buffer(data)]
    )
    # int32 indices: Arrow's take gathers with them a quarter faster than with int64.
    fields = pieces.take(pa.array(np.arange(1, 2 * n, 2, dtype=np.int32)))
    nulls = n - int(np.count_nonzero(valid))
    validity = pa.py_buffer(np.packbits(valid, bitorder="little")) if nulls else None
    return pa.Array.from_buffers(
        arrow_type,
        n,
        [validity, pa.py_buffer(offsets.astype(np.int32)), fields.buffers()[2]],
        null_count=nulls,
    )


def columns_from_records(records: Sequence[Record]) -> RecordColumns:
    """Records decoded one by one (legacy message sets) as the same columns."""
    headers = pa.array([[(h.key, h.value) for h in r.headers] for r in records], type=HEADERS_TYPE)
    return RecordColumns(
        offsets=np.fromiter((r.offset for r in records), np.int64, len(records)),
        timestamps=np.fromiter((r.timestamp for r in records), np.int64, len(records)),
        keys=pa.array([r.key for r in records], pa.binary()),
        values=pa.array([r.value for r in records], pa.binary()),
        headers=headers,
        rows_per_batch=np.array([len(records)], np.int64),
    )
