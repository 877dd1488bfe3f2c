"""Coalescing a run of small stored batches into one batch for the destination (the
mirror's `coalesce_bytes` option; sans-I/O: bytes in, bytes out).

Why: a source producer with `linger.ms` 0 stores one record a batch, and the mirror
produces batches as stored, at most five in flight per partition: a partition then moves
five records per destination round trip. MirrorMaker 2 re-batches (its producer batches
what its consumer read); this is the same, for runs of consecutive small batches.

Rules:
- Only batches that can be merged as they are: magic 2, not control, not thinned by
  compaction (consecutive offsets), create-time timestamps (a log-append-time batch's
  readers take its one max timestamp for every record: merged, each would lose its own),
  the same codec (`can_join`).
- Only small batches (`small`: at most SMALL_BATCH_BYTES, or the limit when that is
  lower): a well-batched topic is produced as stored, its records never decompressed; the
  option pays its re-compression only where it saves a destination round trip per few
  records.
- The merged batch holds every record of the run, in order, each with its own key, value,
  headers and timestamp: offset deltas are renumbered 0..n-1 across the run, timestamp
  deltas are taken against the first batch's base timestamp; the max timestamp is the
  run's. Its records are compressed again in their codec -- the one cost of the option.
- What the batch's producer fields and CRC become is restamp.py's (`restamp` is applied to
  the merged batch as to any other).
- A run takes as many destination offsets as it has records, so every source batch in it
  still maps to its own destination offsets (the offset map records each).
- Bounded: a run holds at most `run_plain_bytes` decompressed bytes and RUN_RECORDS
  records. A small batch's records are decompressed once, when the shell reads it (a
  worker thread), into at most that many bytes: a batch that holds more (a few hundred
  bytes of zstd can hold gigabytes of zeros) is produced as stored, never decompressed
  in full. The re-compression runs on a worker thread too, never on the event loop.
"""

from __future__ import annotations

import mmap
from collections.abc import Sequence

from lz4.frame import LZ4FrameDecompressor

from replicad.mirror.restamp import rewrite_records
from replicad.records.batch import (
    COMPRESSION_CODEC_MASK,
    LOG_OVERHEAD,
    MAGIC_V2,
    RECORD_BATCH_OVERHEAD,
    TIMESTAMP_TYPE_MASK,
    V2_HEADER,
    BatchHeader,
    Compression,
)
from replicad.records.codecs import compress, decompress_at_most, scratch_buffer

_ATTRIBUTES_KEPT = COMPRESSION_CODEC_MASK | TIMESTAMP_TYPE_MASK
# The Java producer's default batch.size: a stored batch this large was batched by its
# producer, and is produced as stored.
SMALL_BATCH_BYTES = 16 * 1024
# A run's decompressed records at most this many times `coalesce_bytes` (1 MiB at the
# default 256 KiB: a run then compresses to about Kafka's default max.message.bytes).
PLAIN_PER_STORED = 4
# A run's records at most (each is rewritten in Python: about 10 us a record).
RUN_RECORDS = 10_000


def run_plain_bytes(coalesce_bytes: int) -> int:
    """The decompressed bytes a run of `coalesce_bytes` may hold (see the module rules)."""
    return PLAIN_PER_STORED * coalesce_bytes


def plain_records(
    header: BatchHeader,
    batch: memoryview,
    limit: int,
    scratch: bytearray | mmap.mmap | None = None,
    lz4_reader: LZ4FrameDecompressor | None = None,
) -> bytes | memoryview | None:
    """The records of stored `batch` decompressed (a view for an uncompressed one), or None
    when they are more than `limit` bytes or do not decompress: then it is produced as
    stored. `scratch` (at least `limit` + 1 bytes) and `lz4_reader`: reused across calls
    (codecs.decompress_at_most; PlainReader keeps them for a read's batches)."""
    records = batch[RECORD_BATCH_OVERHEAD:]
    codec = Compression(header.attributes & COMPRESSION_CODEC_MASK)
    if codec == Compression.NONE:
        return records if len(records) <= limit else None
    if codec == Compression.LZ4:
        scratch = None  # LZ4 writes no scratch (codecs.LZ4_STEP)
    return decompress_at_most(codec, records, limit, scratch, lz4_reader)


# The codecs whose bounded decompression writes into a scratch buffer (codecs.py).
_SCRATCH_CODECS = frozenset({Compression.GZIP, Compression.SNAPPY, Compression.ZSTD})


class PlainReader:
    """plain_records for the small batches of one local-log read (one worker thread): the
    LZ4 reader and the scratch buffer are made at the first batch that needs each, and
    reused for the rest. Nothing is made for a read without such a batch; the scratch is
    anonymous memory, so only the pages a codec writes cost anything -- a zeroed bytearray
    of the bound (1 MiB), made per read, cost more than the decompression of a read's
    one-record batches."""

    __slots__ = ("_lz4", "_scratch", "limit")

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self._scratch: mmap.mmap | None = None
        self._lz4: LZ4FrameDecompressor | None = None

    def __call__(self, header: BatchHeader, batch: memoryview) -> bytes | memoryview | None:
        codec = Compression(header.attributes & COMPRESSION_CODEC_MASK)
        if codec == Compression.LZ4 and self._lz4 is None:
            self._lz4 = LZ4FrameDecompressor()
        elif codec in _SCRATCH_CODECS and self._scratch is None:
            self._scratch = scratch_buffer(self.limit)
        return plain_records(header, batch, self.limit, self._scratch, self._lz4)


def small(size: int, limit: int) -> bool:
    """Whether a stored batch of `size` bytes may be coalesced into runs of up to `limit`
    bytes (see the module rules)."""
    return size <= min(SMALL_BATCH_BYTES, limit)


def can_join(first: BatchHeader, other: BatchHeader) -> bool:
    """Whether `other` may be merged into a run that `first` opened."""
    return (
        _mergeable(first)
        and _mergeable(other)
        and (first.attributes & _ATTRIBUTES_KEPT) == (other.attributes & _ATTRIBUTES_KEPT)
    )


def _mergeable(h: BatchHeader) -> bool:
    return (
        h.magic == MAGIC_V2
        and not h.is_control
        and not h.attributes & TIMESTAMP_TYPE_MASK  # log append time
        and h.last_offset_delta == h.record_count - 1
    )


def coalesce(plains: Sequence[bytes | memoryview], headers: Sequence[BatchHeader]) -> bytes:
    """One magic 2 batch holding every record of a run: `plains` are its batches' records,
    decompressed (plain_records), `headers` their headers; as the module rules say. Base
    offset 0, producer fields none (restamp sets them). CPU work: a worker thread's."""
    first = headers[0]
    codec = Compression(first.attributes & COMPRESSION_CODEC_MASK)
    base_ts = first.base_timestamp
    out = bytearray()
    index = 0
    for plain, h in zip(plains, headers, strict=True):
        index = rewrite_records(
            memoryview(plain),
            h.record_count,
            out,
            first_index=index,
            shift_ms=h.base_timestamp - base_ts,
        )
    records = compress(codec, out)
    count = index
    body = bytearray(RECORD_BATCH_OVERHEAD) + records
    V2_HEADER.pack_into(
        body,
        0,
        0,  # base offset: the broker assigns it
        len(body) - LOG_OVERHEAD,
        -1,  # partition leader epoch
        MAGIC_V2,
        0,  # crc: restamp computes it
        first.attributes & _ATTRIBUTES_KEPT,
        count - 1,
        base_ts,
        max(h.max_timestamp for h in headers),
        -1,
        -1,
        -1,
        count,
    )
    return bytes(body)
