"""KIP-283 down-conversion: magic 2 batches in, magic 0/1 message sets out, read back by
kafka-python's own legacy record reader (a reader nobody here wrote); S_pre committed up
front and kept exactly; memory bounded by the chunk size."""

from __future__ import annotations

import random
import struct
from collections.abc import Sequence

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from kafka.record import MemoryRecords

from replicad.records.batch import (
    LOG_OVERHEAD,
    MAGIC_V0,
    MAGIC_V1,
    Compression,
    scan_batches,
)
from replicad.records.downconvert import (
    ConversionRefused,
    LazyDownConversion,
    convert_entry,
    legacy_message,
    overflow_entry,
    prepare_down_conversion,
)
from replicad.records.records import decode_batch
from tools.logdata.batches import (
    batch_stream,
    control_batch,
    legacy_message_set,
    log_append_time,
    producer_batch,
)

TS = 1_700_000_000_000
LEGACY_CODECS = (Compression.NONE, Compression.GZIP, Compression.SNAPPY, Compression.LZ4)
LOG_APPEND_TIME_ATTRIBUTE = 0x08
_HEAD = struct.Struct(">qi")


class RecordingReader:
    """`read_at` over bytes, remembering the size of every read."""

    def __init__(self, data: bytes) -> None:
        self.data = data
        self.reads: list[int] = []

    def __call__(self, position: int, size: int) -> bytes:
        self.reads.append(size)
        return self.data[position : position + size]


def convert(data: bytes, to_magic: int, first_offset: int = 0, chunk: int = 128 * 1024):
    prepared = prepare_down_conversion(
        RecordingReader(data),
        len(data),
        to_magic=to_magic,
        first_offset=first_offset,
        chunk_bytes=chunk,
    )
    return prepared


def sent(conversion: LazyDownConversion) -> bytes:
    return b"".join(conversion.chunks())


def client_records(data: bytes) -> list[tuple[int, int, bytes | None, bytes | None, int]]:
    """What kafka-python's consumer-side reader makes of a message set (partial tail dropped)."""
    out = []
    records = MemoryRecords(data)
    while (batch := records.next_batch()) is not None:
        for r in batch:
            out.append((r.offset, r.timestamp, r.key, r.value, batch.magic))
    return out


def source_records(
    data: bytes, first_offset: int = 0
) -> list[tuple[int, int, bytes | None, bytes | None]]:
    out = []
    for header in scan_batches(data).batches:
        if header.is_control:
            continue
        for r in decode_batch(data, header).records:
            if header.compression == Compression.NONE and r.offset < first_offset:
                continue
            out.append((r.offset, r.timestamp, r.key, r.value))
    return out


@pytest.mark.parametrize("codec", LEGACY_CODECS, ids=lambda c: c.name)
@pytest.mark.parametrize("to_magic", [MAGIC_V0, MAGIC_V1])
def test_every_legacy_codec_converts_and_reads_back_with_kafka_python(codec, to_magic) -> None:
    data = b"".join(
        producer_batch(
            base,
            [f"value-{base + i}".encode() for i in range(5)],
            codec=codec,
            keys=[f"k{base + i}".encode() for i in range(5)],
            headers=[("dropped", random.Random(base).randbytes(200))],  # conversion shrinks
        )
        for base in (0, 5, 10)
    )
    conversion = convert(data, to_magic)
    assert isinstance(conversion, LazyDownConversion)
    out = sent(conversion)
    assert len(out) == conversion.size
    got = client_records(out)
    assert [(o, k, v) for o, _, k, v, _ in got] == [
        (o, k, v) for o, _, k, v in source_records(data)
    ]
    assert {m for *_, m in got} == {to_magic}
    if to_magic == MAGIC_V1:
        assert [t for _, t, *_ in got] == [t for _, t, _, _ in source_records(data)]
    else:
        assert {t for _, t, *_ in got} == {None}  # magic 0 has no timestamps


def test_uncompressed_batches_skip_records_below_the_fetch_offset() -> None:
    data = producer_batch(100, [b"a", b"b", b"c", b"d"])
    out = sent(convert(data, MAGIC_V1, first_offset=102))  # type: ignore[arg-type]
    assert [(o, v) for o, _, _, v, _ in client_records(out)] == [(102, b"c"), (103, b"d")]


def test_compressed_batches_keep_every_record_with_relative_inner_offsets() -> None:
    data = producer_batch(100, [b"a" * 100, b"b" * 100, b"c" * 100], codec=Compression.GZIP)
    assert scan_batches(data).batches[0].compression == Compression.GZIP
    out = sent(convert(data, MAGIC_V1, first_offset=102))  # type: ignore[arg-type]
    entries = scan_batches(out).batches
    assert len(entries) == 1
    wrapper = entries[0]
    assert (wrapper.magic, wrapper.compression, wrapper.base_offset) == (1, Compression.GZIP, 102)
    assert wrapper.max_timestamp == TS + 2  # the largest inner timestamp
    assert [o for o, *_ in client_records(out)] == [100, 101, 102]


def test_log_append_time_is_kept_as_the_timestamp_type_bit() -> None:
    data = log_append_time(producer_batch(0, [b"a", b"b"]), append_ms=TS + 1)
    header = scan_batches(data).batches[0]
    out = convert_entry(data, header, MAGIC_V1, 0)
    for message in scan_batches(out).batches:
        assert message.attributes & LOG_APPEND_TIME_ATTRIBUTE
        assert message.max_timestamp == header.max_timestamp


def test_control_batches_are_dropped() -> None:
    data = batch_with_commit_marker()
    out = sent(convert(data, MAGIC_V1))  # type: ignore[arg-type]
    got = client_records(out)
    assert [v for _, _, _, v, _ in got] == [b"tx-0", b"tx-1"]


def batch_with_commit_marker() -> bytes:
    """Two records of producer 9, then its COMMIT marker (a control batch)."""
    data = producer_batch(0, [b"tx-0", b"tx-1"], producer_id=9, producer_epoch=0, base_sequence=0)
    return data + control_batch(2, producer_id=9)


def test_magic_0_and_1_entries_are_copied_when_already_old_enough() -> None:
    data = legacy_message_set(0, [b"x", b"y"], magic=MAGIC_V1, codec=Compression.GZIP)
    conversion = convert(data, MAGIC_V1)
    assert isinstance(conversion, LazyDownConversion)
    assert sent(conversion) == data
    assert conversion.stats.batches_copied == 1


def test_a_zstd_first_batch_refuses_the_conversion() -> None:
    data = producer_batch(0, [b"z" * 200], codec=Compression.ZSTD) + producer_batch(1, [b"n"])
    assert scan_batches(data).batches[0].compression == Compression.ZSTD
    assert isinstance(convert(data, MAGIC_V1), ConversionRefused)


def test_a_zstd_batch_after_the_first_ends_the_output_with_an_overflow_entry() -> None:
    data = producer_batch(0, [b"n" * 50]) + producer_batch(1, [b"z" * 200], codec=Compression.ZSTD)
    assert scan_batches(data).batches[1].compression == Compression.ZSTD
    conversion = convert(data, MAGIC_V1)
    assert isinstance(conversion, LazyDownConversion)
    out = sent(conversion)
    assert len(out) == conversion.size == len(data)
    assert [o for o, *_ in client_records(out)] == [0]
    scan = scan_batches(out)
    assert scan.stop.value == "partial"
    assert _HEAD.unpack_from(out, scan.valid_bytes)[0] == -1


def test_when_conversion_grows_the_data_it_is_cut_at_s_pre_and_the_first_batch_fits() -> None:
    # Many tiny records: v2 stores them in ~8 bytes each, magic 1 needs 34 + key/value each.
    data = b"".join(producer_batch(i * 200, [b"v"] * 200) for i in range(4))
    conversion = convert(data, MAGIC_V1)
    assert isinstance(conversion, LazyDownConversion)
    first_converted = convert_entry(data, scan_batches(data).batches[0], MAGIC_V1, 0)
    assert conversion.size == max(len(data), len(first_converted))
    out = sent(conversion)
    assert len(out) == conversion.size
    got = client_records(out)
    # Everything that fits is read, the cut-off message is dropped, nothing is invented.
    assert len(got) == (conversion.size // len(legacy_message(1, 0, TS, None, b"v")))
    assert [o for o, *_ in got] == list(range(len(got)))


def test_when_conversion_shrinks_the_data_it_is_padded_with_an_overflow_entry() -> None:
    # Headers are dropped by the conversion, so the output is smaller than the input.
    data = producer_batch(0, [b"v"] * 3, headers=[("a-long-header-name", b"x" * 200)])
    conversion = convert(data, MAGIC_V1)
    assert isinstance(conversion, LazyDownConversion)
    out = sent(conversion)
    assert conversion.size == len(data) == len(out)
    assert [o for o, *_ in client_records(out)] == [0, 1, 2]
    tail = scan_batches(out)
    offset, length = _HEAD.unpack_from(out, tail.valid_bytes)
    assert (offset, tail.stop.value) == (-1, "partial")
    assert length > len(out) - tail.valid_bytes - LOG_OVERHEAD


def test_only_control_batches_commit_one_overflow_entry() -> None:
    marker_only = batch_with_commit_marker()
    first = scan_batches(marker_only).batches[0]
    data = marker_only[first.end_position :]
    conversion = convert(data, MAGIC_V1)
    assert isinstance(conversion, LazyDownConversion)
    out = sent(conversion)
    assert conversion.size == LOG_OVERHEAD == len(out)
    assert _HEAD.unpack_from(out)[0] == -1


def test_a_region_without_a_whole_batch_commits_nothing() -> None:
    data = producer_batch(0, [b"v"] * 10)
    conversion = convert(data[:40], MAGIC_V1)
    assert isinstance(conversion, LazyDownConversion)
    assert conversion.size == 0
    assert sent(conversion) == b""


def test_a_trailing_partial_batch_is_counted_in_s_pre_but_not_converted() -> None:
    whole = producer_batch(0, [b"a"] * 3)
    data = whole + producer_batch(3, [b"b"] * 3)[:30]
    conversion = convert(data, MAGIC_V1)
    assert isinstance(conversion, LazyDownConversion)
    out = sent(conversion)
    assert len(out) == conversion.size == len(data)
    assert [o for o, *_ in client_records(out)] == [0, 1, 2]


def test_overflow_entry_is_exactly_the_size_asked_for_even_below_the_entry_head() -> None:
    for size in (0, 1, 11, 12, 13, 61, 1000, 300_000):
        assert sum(len(p) for p in overflow_entry(size, 0)) == size
        pieces = list(overflow_entry(size, 8192))
        assert sum(len(p) for p in pieces) == size
        assert all(len(p) <= 8192 for p in pieces)
        if size >= LOG_OVERHEAD:
            offset, length = _HEAD.unpack_from(b"".join(pieces))
            assert offset == -1 and length >= size - LOG_OVERHEAD + 1


def test_memory_is_bounded_by_the_chunk_not_the_region() -> None:
    batches = batch_stream(3, 600, codecs=LEGACY_CODECS, max_records=20, max_value=600)
    data = b"".join(batches)
    assert len(data) > 900_000
    chunk = 64 * 1024
    read_at = RecordingReader(data)
    conversion = prepare_down_conversion(
        read_at, len(data), to_magic=MAGIC_V1, first_offset=0, chunk_bytes=chunk
    )
    assert isinstance(conversion, LazyDownConversion)
    pieces = list(conversion.chunks())
    assert sum(len(p) for p in pieces) == conversion.size
    largest_batch = max(len(b) for b in batches)
    assert max(read_at.reads) <= max(chunk, largest_batch)
    # What was read plus what it converted to, at the worst moment: a chunk's worth.
    assert conversion.stats.peak_bytes < 3 * chunk + 4 * largest_batch
    assert conversion.stats.source_bytes_read >= len(data) - largest_batch


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    seed=st.integers(0, 10_000),
    count=st.integers(1, 30),
    codecs=st.lists(st.sampled_from(LEGACY_CODECS), min_size=1, max_size=4),
    to_magic=st.sampled_from([MAGIC_V0, MAGIC_V1]),
    chunk=st.sampled_from([0, 100, 4096, 128 * 1024]),
    skip=st.integers(0, 5),
)
def test_output_is_s_pre_bytes_and_a_prefix_of_the_source_records(
    seed: int, count: int, codecs: Sequence[Compression], to_magic: int, chunk: int, skip: int
) -> None:
    data = b"".join(batch_stream(seed, count, codecs=tuple(codecs), max_records=8, max_value=200))
    conversion = convert(data, to_magic, first_offset=skip, chunk=chunk)
    assert isinstance(conversion, LazyDownConversion)
    out = sent(conversion)
    assert len(out) == conversion.size
    got = [(o, k, v) for o, _, k, v, _ in client_records(out)]
    want = [(o, k, v) for o, _, k, v in source_records(data, skip)]
    if not want:  # every record was below the fetch offset: one overflow entry
        assert (conversion.size, got) == (LOG_OVERHEAD, [])
        return
    assert conversion.size >= len(data)
    assert got, "the first batch always fits"
    assert got == want[: len(got)]
    converted = sum(len(convert_entry(data, h, to_magic, skip)) for h in scan_batches(data).batches)
    if converted <= conversion.size:
        assert got == want
