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
"""

from __future__ import annotations

from collections.abc import Sequence

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
from replicad.records.codecs import compress, decompress

_ATTRIBUTES_KEPT = COMPRESSION_CODEC_MASK | TIMESTAMP_TYPE_MASK
# The Java producer's default batch.size: a stored batch this large was batched by its
# producer, and is produced as stored.
SMALL_BATCH_BYTES = 16 * 1024


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


def coalesce(
    batches: Sequence[bytes | bytearray | memoryview], headers: Sequence[BatchHeader]
) -> bytes:
    """One magic 2 batch holding every record of `batches` (their headers: `headers`), as
    the module rules say; base offset 0, producer fields none (restamp sets them)."""
    if len(batches) == 1:
        return bytes(batches[0])
    first = headers[0]
    codec = Compression(first.attributes & COMPRESSION_CODEC_MASK)
    base_ts = first.base_timestamp
    out = bytearray()
    index = 0
    for data, h in zip(batches, headers, strict=True):
        plain = decompress(codec, memoryview(data)[RECORD_BATCH_OVERHEAD:])
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
