"""Coalescing runs of small batches (replicad/mirror/coalesce.py): every record of the run,
in order, with its key, value, headers and timestamp, in one valid batch of the run's codec."""

from __future__ import annotations

import pytest

from replicad.mirror.coalesce import PlainReader, RunCut, can_join, coalesce
from replicad.mirror.restamp import ProducerStamp, restamp
from replicad.records.batch import (
    COMPRESSION_CODEC_MASK,
    RECORD_BATCH_OVERHEAD,
    Compression,
    scan_batches,
)
from replicad.records.codecs import LZ4_STEP, decompress
from replicad.records.records import decode_batch
from tools.logdata.batches import producer_batch


def batch(base: int, n: int, codec: Compression, ts: int) -> bytes:
    return producer_batch(
        base,
        [b"value-%d" % (base + i) for i in range(n)],
        keys=[None if (base + i) % 3 == 0 else b"k%d" % (base + i) for i in range(n)],
        headers=[("h", b"%d" % base)],
        codec=codec,
        timestamps=[ts + 7 * i for i in range(n)],
    )


@pytest.mark.parametrize("codec", list(Compression))
def test_a_run_becomes_one_batch_with_every_record(codec: Compression) -> None:
    # Timestamps out of order across batches (a later batch may carry older records).
    batches = [batch(0, 1, codec, 5_000), batch(1, 3, codec, 4_000), batch(4, 2, codec, 9_000)]
    headers = [scan_batches(b).batches[0] for b in batches]
    assert all(can_join(headers[0], h) for h in headers)
    made = coalesce(batches, headers, 1 << 16)
    assert isinstance(made, bytes)
    merged = restamp(made, ProducerStamp(42, 1), 17)
    scan = scan_batches(merged)  # the CRC is checked
    (h,) = scan.batches
    assert (h.record_count, h.last_offset_delta, h.producer_id, h.base_sequence) == (6, 5, 42, 17)
    assert h.max_timestamp == 9_007
    got = decode_batch(merged, h).records
    want = [r for b, hh in zip(batches, headers, strict=True) for r in decode_batch(b, hh).records]
    assert [(r.offset, r.key, r.value, r.headers, r.timestamp) for r in got] == [
        (i, r.key, r.value, r.headers, r.timestamp) for i, r in enumerate(want)
    ]


def test_batches_of_another_codec_or_thinned_do_not_join() -> None:
    first = scan_batches(batch(0, 1, Compression.NONE, 0)).batches[0]
    assert can_join(first, first)
    gzip = first._replace(attributes=int(Compression.GZIP))
    log_append_time = first._replace(attributes=0x08)
    thinned = first._replace(record_count=2, last_offset_delta=2)
    control = first._replace(attributes=0x30)
    for other in (gzip, log_append_time, thinned, control):
        assert not can_join(first, other)


def test_one_plain_reader_decompresses_batches_of_every_codec_within_what_is_asked() -> None:
    """Small batches, codecs mixed, through one PlainReader (one coalescing call's): each
    batch's records as the codec decompresses them; one holding more than asked (a small
    batch of zeros) is None; the reader's LZ4 context and scratch serve every batch after
    it."""
    reader = PlainReader(4096)
    for round_ in range(2):
        for codec in Compression:
            b = producer_batch(round_, [b"value %d " % i * 50 for i in range(3)], codec=codec)
            (h,) = scan_batches(b).batches
            assert h.attributes & COMPRESSION_CODEC_MASK == codec  # compressed indeed
            got = reader(h, memoryview(b), 4096)
            assert got is not None
            assert reader(h, memoryview(b), len(got) - 1) is None
            assert bytes(got) == decompress(codec, memoryview(b)[RECORD_BATCH_OVERHEAD:])
            if codec is not Compression.NONE:
                zeros = producer_batch(0, [bytes(64 << 10)], codec=codec)
                (hz,) = scan_batches(zeros).batches
                assert hz.size < 4096  # small stored, over the bound decompressed
                assert reader(hz, memoryview(zeros), 1 << 20) is None  # over the reader's


@pytest.mark.parametrize("codec", [Compression.NONE, Compression.LZ4, Compression.ZSTD])
def test_a_run_over_its_decompressed_bound_is_cut_where_the_batch_that_overflows_starts(
    codec: Compression,
) -> None:
    """Each batch is decompressed into what is left of the run's bound: the one that does
    not fit cuts the run there (the batches before it are what may be joined); a batch of
    zeros small stored but over the bound by itself cuts a run at its own start; records
    that do not rewrite cut it too."""
    tiny = [producer_batch(i, [b"value %03d " % i * 20], codec=codec) for i in range(4)]
    zeros = producer_batch(4, [bytes(1 << 20)], codec=codec)
    batches = [*tiny, zeros, tiny[0]]
    headers = [scan_batches(b).batches[0] for b in batches]
    assert {h.attributes & COMPRESSION_CODEC_MASK for h in headers} == {codec}
    per_batch = len(PlainReader(1 << 20)(headers[0], memoryview(tiny[0]), 1 << 20) or b"")
    assert per_batch > 200
    whole = coalesce(batches[:4], headers[:4], 4 * per_batch + 8)
    assert isinstance(whole, bytes)
    assert joined(coalesce(batches[:4], headers[:4], 3 * per_batch + 1)) == 3
    limit = 64 << 10
    if codec is not Compression.NONE:  # stored small, 1 MiB decompressed
        assert len(zeros) < 16 << 10
        assert joined(coalesce(batches, headers, limit)) == 4
        assert joined(coalesce(batches[4:], headers[4:], limit)) == 0
    # The header says two records, the batch holds one: its records do not rewrite.
    bad = headers[1]._replace(record_count=2, last_offset_delta=1)
    cut = coalesce([tiny[0], tiny[1]], [headers[0], bad], limit)
    assert isinstance(cut, RunCut) and cut.joined == 1 and "source offset 1" in cut.reason


def joined(made: bytes | RunCut) -> int | None:
    return made.joined if isinstance(made, RunCut) else None


def test_a_plain_reader_reads_an_lz4_frame_of_several_steps_whole_and_goes_on() -> None:
    """A frame longer than one LZ4 step (python-lz4 allocates each step whole) comes back
    whole, and the context serves the one-record frames after it."""
    big = producer_batch(0, [b"%d," % i * 10 for i in range(5_000)], codec=Compression.LZ4)
    small = producer_batch(1, [b"small " * 40], codec=Compression.LZ4)
    reader = PlainReader(1 << 20)
    for b in (big, small, big, small):
        (h,) = scan_batches(b).batches
        want = decompress(Compression.LZ4, memoryview(b)[RECORD_BATCH_OVERHEAD:])
        assert len(want) > LZ4_STEP or b is small
        assert reader(h, memoryview(b), 1 << 20) == want
        assert reader(h, memoryview(b), len(want) - 1) is None


def test_one_record_lz4_batches_keep_every_record_across_deltas_of_every_width() -> None:
    """The tiny workload's shape (one record a batch, LZ4), the way coalesce takes it
    without its general calls: hundreds of batches (offset deltas past one varint byte),
    timestamps before and after the first batch's (shifts of one byte, two, and beyond
    SMALL_UVARINTS' table), values from empty to 2 KiB (one- and two-byte record lengths),
    keys and headers on some, a three-record batch among them; every record comes back
    with its own offset, key, value, headers and timestamp."""
    base_ts = 1_700_000_000_000
    batches = []
    for i in range(300):
        value = None if i == 7 else bytes([i % 251]) * (i * 7 % 2_100)
        ts = base_ts + (i * 37 if i % 2 else -i) + (1 << 24 if i % 50 == 9 else 0)
        batches.append(
            producer_batch(
                i,
                [value] if i != 150 else [b"a", b"b" * 300, None],
                codec=Compression.LZ4,
                keys=[b"k%d" % i if i % 3 else None] * (1 if i != 150 else 3),
                headers=[("h", b"%d" % i)] if i % 5 == 0 else [],
                timestamps=[ts] if i != 150 else [ts, ts + 1, ts - 1],
            )
        )
    headers = [scan_batches(b).batches[0] for b in batches]
    made = coalesce([memoryview(b) for b in batches], headers, 4 << 20)
    assert isinstance(made, bytes)
    merged = restamp(made, ProducerStamp(7, 0), 0)
    (h,) = scan_batches(merged).batches
    got = decode_batch(merged, h).records
    want = [r for b, hh in zip(batches, headers, strict=True) for r in decode_batch(b, hh).records]
    assert len(got) == 302
    assert [(r.offset, r.key, r.value, r.headers, r.timestamp) for r in got] == [
        (i, r.key, r.value, r.headers, r.timestamp) for i, r in enumerate(want)
    ]
    assert h.max_timestamp == max(r.timestamp for r in want)


def test_a_one_record_lz4_batch_over_the_bound_cuts_the_run_and_the_next_run_is_whole() -> None:
    """A one-record LZ4 batch whose records do not fit what is left of the run's bound cuts
    the run where it starts (the fast way stops inside its frame): the next run, through
    the same reader, opening with it alone, and one of small batches, come back whole."""
    small = [producer_batch(i, [b"x%03d" % i * 60], codec=Compression.LZ4) for i in range(3)]
    zeros = producer_batch(3, [bytes(200_000)], codec=Compression.LZ4)
    batches = [*small, zeros, *small]
    headers = [scan_batches(b).batches[0] for b in batches]
    reader = PlainReader(100_000)
    cut = coalesce(batches, headers, 100_000, reader)
    assert isinstance(cut, RunCut) and cut.joined == 3 and "source offset 3" in cut.reason
    assert joined(coalesce(batches[3:], headers[3:], 100_000, reader)) == 0
    again = coalesce(batches[4:], headers[4:], 100_000, reader)
    assert isinstance(again, bytes)
    merged = restamp(again, ProducerStamp(7, 0), 0)
    (h,) = scan_batches(merged).batches
    assert [r.value for r in decode_batch(merged, h).records] == [
        b"x%03d" % i * 60 for i in range(3)
    ]
