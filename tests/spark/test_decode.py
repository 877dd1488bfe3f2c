"""Columnar decoding of record batches: the same records as the reference decoder
(records.decode_batch) for any batches a real producer builds (kafka-python's builder),
every codec; damaged records sections rejected at least wherever the reference rejects
them, and only ever as CorruptRecordError."""

from __future__ import annotations

import struct
import tracemalloc

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from kafka.record.default_records import DefaultRecordBatchBuilder

from replicad.errors import CorruptRecordError
from replicad.records.batch import (
    MAGIC_V2,
    RECORD_BATCH_OVERHEAD,
    Compression,
    TimestampType,
    scan_batches,
)
from replicad.records.records import Header, Record, decode_batch
from replicad.spark.decode import (
    VARINT_MAX_BYTES,
    RecordColumns,
    _varints,
    binary_array,
    columns_from_records,
    decode_v2_columns,
)
from tools.logdata.batches import log_append_time

TS = 1_700_000_000_000
_UNLIMITED = 1 << 30
_BASE_OFFSET = struct.Struct(">q")

payloads = st.one_of(st.none(), st.binary(max_size=300))
header_lists = st.lists(
    st.tuples(st.text(max_size=12), st.one_of(st.none(), st.binary(max_size=20))), max_size=3
)
records = st.lists(
    st.tuples(payloads, payloads, header_lists, st.integers(-5_000, 5_000_000)),
    min_size=1,
    max_size=40,
)
codecs = st.sampled_from(list(Compression))


def build(base_offset: int, recs, codec: Compression) -> bytes:
    builder = DefaultRecordBatchBuilder(
        magic=MAGIC_V2,
        compression_type=int(codec),
        is_transactional=False,
        producer_id=-1,
        producer_epoch=-1,
        base_sequence=-1,
        batch_size=_UNLIMITED,
    )
    for i, (key, value, headers, ts_step) in enumerate(recs):
        assert builder.append(i, TS + ts_step, key, value, list(headers)) is not None
    data = bytearray(builder.build())
    _BASE_OFFSET.pack_into(data, 0, base_offset)
    return bytes(data)


def reference(data: bytes) -> list[Record]:
    return [r for h in scan_batches(data).batches for r in decode_batch(data, h).records]


def as_records(columns: RecordColumns) -> list[Record]:
    headers = [
        tuple(Header(h["key"], h["value"]) for h in hs) for hs in columns.headers.to_pylist()
    ]
    return [
        Record(offset, ts, key, value, hs)
        for offset, ts, key, value, hs in zip(
            columns.offsets.tolist(),
            columns.timestamps.tolist(),
            columns.keys.to_pylist(),
            columns.values.to_pylist(),
            headers,
            strict=True,
        )
    ]


def without_sequence(records: list[Record]) -> list[Record]:
    return [Record(r.offset, r.timestamp, r.key, r.value, r.headers) for r in records]


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.tuples(records, codecs), min_size=1, max_size=5), st.integers(0, 2**40))
def test_columns_equal_the_reference_decoder(batches, first_offset):
    raw, offset = [], first_offset
    for recs, codec in batches:
        raw.append(build(offset, recs, codec))
        offset += len(recs)
    data = b"".join(raw)
    headers = scan_batches(data).batches
    columns = decode_v2_columns(data, headers)
    assert columns.rows_per_batch.tolist() == [len(recs) for recs, _ in batches]
    assert as_records(columns) == without_sequence(reference(data))
    for array in (columns.keys, columns.values, columns.headers):
        array.validate(full=True)


def test_a_subset_of_a_buffers_batches_in_any_codec():
    raw = [
        build(i * 10, [(b"k%d" % i, b"v" * i * 50, [("h", b"x")], j) for j in range(10)], codec)
        for i, codec in enumerate([*Compression, Compression.NONE, Compression.GZIP])
    ]
    data = b"".join(raw)
    headers = scan_batches(data).batches
    chosen = headers[1:3] + headers[5:]  # batches skipped in between, as hidden ones are
    columns = decode_v2_columns(memoryview(data), chosen)
    expected = [r for h in chosen for r in decode_batch(data, h).records]
    assert as_records(columns) == without_sequence(expected)
    assert columns.offsets.tolist()[:3] == [10, 11, 12]


def test_log_append_time_records_carry_the_batch_max_timestamp():
    created = build(0, [(None, b"a", [], 5), (None, b"b", [], 9)], Compression.NONE)
    data = log_append_time(created, TS + 777) + build(2, [(None, b"c", [], 3)], Compression.LZ4)
    headers = scan_batches(data).batches
    assert headers[0].timestamp_type == TimestampType.LOG_APPEND_TIME
    columns = decode_v2_columns(data, headers)
    assert columns.timestamps.tolist() == [TS + 777, TS + 777, TS + 3]
    assert columns.timestamps.tolist() == [r.timestamp for r in reference(data)]


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(records, st.data())
def test_damaged_records_fail_as_corrupt_at_least_where_the_reference_does(recs, draw):
    data = bytearray(build(0, recs, Compression.NONE))
    body = range(RECORD_BATCH_OVERHEAD, len(data))
    for _ in range(draw.draw(st.integers(1, 3))):
        data[draw.draw(st.sampled_from(body))] = draw.draw(st.integers(0, 255))
    data = bytes(data)
    header = scan_batches(data, verify_crc=False).batches[0]
    try:
        expected = without_sequence(list(decode_batch(data, header).records))
    except CorruptRecordError:
        expected = None
    try:
        got = as_records(decode_v2_columns(data, [header]))
    except CorruptRecordError as exc:
        assert "base offset 0" in str(exc)
        return
    assert expected is not None, "the reference rejects what the columns accepted"
    assert got == expected


@pytest.mark.parametrize(
    ("damage", "reason"),
    [
        (lambda d, p: d.__setitem__(p, 0xFE), "overruns"),  # a record length far too long
        (lambda d, p: d.__setitem__(slice(p, p + 5), b"\xff" * 5), "longer than"),
    ],
)
def test_damage_is_reported_with_the_batch_and_record(damage, reason):
    raw = build(100, [(b"key", b"value", [], i) for i in range(3)], Compression.NONE)
    good = build(0, [(b"k", b"v", [], 0)] * 100, Compression.NONE)
    data = bytearray(good + raw)
    damage(data, len(good) + RECORD_BATCH_OVERHEAD)  # the first record's length
    headers = scan_batches(bytes(data), verify_crc=False).batches
    with pytest.raises(CorruptRecordError, match=rf"base offset 100: record 0 .*{reason}"):
        decode_v2_columns(bytes(data), headers)


def test_binary_array_cuts_fields_and_nulls():
    data = b"..abc...de.f"
    array = binary_array(data, np.array([2, 8, 11, 11]), np.array([3, 2, -1, 1]))
    array.validate(full=True)
    assert array.to_pylist() == [b"abc", b"de", None, b"f"]
    assert array.null_count == 1
    empty = binary_array(data, np.zeros(0, np.int64), np.zeros(0, np.int64), pa.string())
    assert empty.type == pa.string() and len(empty) == 0


def test_columns_from_records_are_the_same_columns():
    recs = [
        Record(5, TS, b"k", None, (Header("a", b"1"), Header("b", None))),
        Record(6, -1, None, b"v"),
    ]
    columns = columns_from_records(recs)
    assert as_records(columns) == recs
    assert columns.rows_per_batch.tolist() == [2]


@pytest.mark.parametrize(
    "values",
    [
        [0, 1, -1, 63, -64],  # one byte each
        [0, 64, -65, 1000, 8191, -8192, 5],  # one and two bytes (the two-byte path)
        [64, 8192, -8193, 2**31 - 1, -(2**31)],  # three to five bytes among two
    ],
)
def test_varints_decode_as_kafkas_writer_wrote_them(values):
    import io

    from kio.serial.writers import write_signed_varint

    buffer = io.BytesIO()
    starts = []
    for value in values:
        starts.append(buffer.tell())
        write_signed_varint(buffer, value)
    arr = np.frombuffer(buffer.getvalue(), np.uint8)
    at = np.array(starts, np.int64)
    decoded, sizes = _varints(arr, at, VARINT_MAX_BYTES)
    assert decoded.tolist() == values
    assert (at + sizes).tolist() == [*starts[1:], len(arr)]


RECORD_COUNT_POSITION = 57  # of a magic 2 batch's header: after base sequence


def test_a_negative_record_length_is_named_at_its_record():
    """A length of -1 leaves the framing where it was: the record is named, not one after."""
    raw = bytearray(build(100, [(b"key", b"value", [], 0)] * 5, Compression.NONE))
    first = reference(bytes(raw))
    body = (len(raw) - RECORD_BATCH_OVERHEAD) // len(first)  # each record: 1 + its length
    raw[RECORD_BATCH_OVERHEAD + 2 * body] = 0x01  # record 2's length, zigzag -1
    headers = scan_batches(bytes(raw), verify_crc=False).batches
    with pytest.raises(CorruptRecordError, match=r"base offset 100: record 2 .*length -1 overruns"):
        decode_v2_columns(bytes(raw), headers)


def test_a_record_count_beyond_the_records_section_names_the_first_missing_record():
    raw = bytearray(build(100, [(b"key", b"value", [], 0)] * 5, Compression.NONE))
    struct.pack_into(">i", raw, RECORD_COUNT_POSITION, 2**31 - 1)
    data = bytes(raw) + build(105, [(b"k", b"v" * 200, [], 0)] * 50, Compression.NONE)
    headers = scan_batches(data, verify_crc=False).batches
    assert headers[0].record_count == 2**31 - 1
    tracemalloc.start()
    try:
        with pytest.raises(
            CorruptRecordError, match=r"base offset 100: record 5 .*ends before the record count"
        ):
            decode_v2_columns(data, headers)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 16 * 2**20  # nothing sized by the claimed count (numpy reports to tracemalloc)


def test_record_lengths_of_one_two_and_three_bytes_frame_alike():
    """The framing loop's table covers lengths of one and two bytes; longer ones, and
    lengths next to the table's bounds, take the long way to the same records."""
    sizes = [0, 40, 60, 70, 8100, 8170, 8200, 20_000, 3, 70_000, 1]
    recs = [(b"k", b"v" * n, [], 0) for n in sizes]
    data = build(0, recs, Compression.NONE) + build(len(recs), recs[::-1], Compression.NONE)
    columns = decode_v2_columns(data, scan_batches(data).batches)
    assert [len(v) for v in columns.values.to_pylist()] == sizes + sizes[::-1]
    assert as_records(columns) == without_sequence(reference(data))
