"""Coalescing runs of small batches (replicad/mirror/coalesce.py): every record of the run,
in order, with its key, value, headers and timestamp, in one valid batch of the run's codec."""

from __future__ import annotations

import dataclasses

import pytest

from replicad.mirror.coalesce import PlainReader, can_join, coalesce, plain_records
from replicad.mirror.restamp import ProducerStamp, restamp
from replicad.records.batch import (
    COMPRESSION_CODEC_MASK,
    RECORD_BATCH_OVERHEAD,
    Compression,
    scan_batches,
)
from replicad.records.codecs import decompress
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
    scratch = bytearray(1 << 16)
    plains = [
        plain_records(h, memoryview(b), 1 << 16, scratch)
        for b, h in zip(batches, headers, strict=True)
    ]
    assert all(p is not None for p in plains)
    merged = restamp(coalesce(plains, headers), ProducerStamp(42, 1), 17)
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
    gzip = dataclasses.replace(first, attributes=int(Compression.GZIP))
    log_append_time = dataclasses.replace(first, attributes=0x08)
    thinned = dataclasses.replace(first, record_count=2, last_offset_delta=2)
    control = dataclasses.replace(first, attributes=0x30)
    for other in (gzip, log_append_time, thinned, control):
        assert not can_join(first, other)


def test_one_plain_reader_decompresses_a_reads_batches_of_every_codec_within_its_bound() -> None:
    """A read's small batches, codecs mixed, through one PlainReader: each batch's records
    as the codec decompresses them; one holding more than the bound (a small batch of
    zeros) is None; the reader's LZ4 reader and scratch serve every batch after it."""
    reader = PlainReader(4096)
    for round_ in range(2):
        for codec in Compression:
            b = producer_batch(round_, [b"value %d " % i * 50 for i in range(3)], codec=codec)
            (h,) = scan_batches(b).batches
            assert h.attributes & COMPRESSION_CODEC_MASK == codec  # compressed indeed
            got = reader(h, memoryview(b))
            assert got is not None
            assert bytes(got) == decompress(codec, memoryview(b)[RECORD_BATCH_OVERHEAD:])
            if codec is not Compression.NONE:
                zeros = producer_batch(0, [bytes(64 << 10)], codec=codec)
                (hz,) = scan_batches(zeros).batches
                assert hz.size < 4096  # small stored, over the bound decompressed
                assert reader(hz, memoryview(zeros)) is None
