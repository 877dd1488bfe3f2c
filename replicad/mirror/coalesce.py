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
  records. The partition's core bounds a run by its stored bytes and records; its
  records are decompressed only here, when the run is coalesced (by the shell's send
  loop, a run at a time: the bound is also what one run holds the event loop for),
  each batch into what is left of the run's bound: a batch that holds
  more (a few hundred bytes of zstd can hold gigabytes of zeros), or whose records do
  not decompress or rewrite, cuts the run (`RunCut`): the batches before it go as one
  run, and it heads the next one -- alone, as stored, when it does not fit by itself.
  Nothing is decompressed at read time: a batch waiting to be sent holds only its
  stored bytes (decompressing every small batch as it was read, to bound runs in the
  core, was most of the tiny-batch regression: docs/benchmarks.md).
"""

from __future__ import annotations

import mmap
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from lz4.frame import decompress_chunk, reset_decompression_context

from replicad.mirror.restamp import rewrite_one, rewrite_records
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
from replicad.records.codecs import (
    LZ4_STEP,
    compress,
    decompress_at_most,
    new_lz4_context,
    scratch_buffer,
)

# What batches of one run share.
JOIN_ATTRIBUTES = COMPRESSION_CODEC_MASK | TIMESTAMP_TYPE_MASK
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
    lz4_context: Any = None,
) -> bytes | memoryview | None:
    """The records of stored `batch` decompressed (a view for an uncompressed one), or None
    when they are more than `limit` bytes or do not decompress. `scratch` (at least
    `limit` + 1 bytes) and `lz4_context`: reused across calls (codecs.decompress_at_most;
    PlainReader keeps them for a coalescing call's batches)."""
    records = batch[RECORD_BATCH_OVERHEAD:]
    codec = header.attributes & COMPRESSION_CODEC_MASK
    if codec == Compression.NONE:
        return records if len(records) <= limit else None
    if codec == Compression.LZ4:
        scratch = None  # LZ4 writes no scratch (codecs.LZ4_STEP)
    return decompress_at_most(Compression(codec), records, limit, scratch, lz4_context)


# The codecs whose bounded decompression writes into a scratch buffer (codecs.py).
_SCRATCH_CODECS = frozenset({Compression.GZIP, Compression.SNAPPY, Compression.ZSTD})


class PlainReader:
    """plain_records for the batches of the runs one coalescing call makes (one worker
    thread), each within at most `limit` bytes: the LZ4 context and the scratch buffer
    are made at the first batch that needs each, and reused for the rest. The scratch is
    anonymous memory, so only the pages a codec writes cost anything (a zeroed bytearray
    of the bound, 1 MiB, cost more than decompressing a run's one-record batches)."""

    __slots__ = ("_lz4", "_scratch", "limit")

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self._scratch: mmap.mmap | None = None
        self._lz4: Any = None

    def lz4_context(self) -> Any:
        """The reader's LZ4 context (made at the first ask), ready for a frame's start: a
        caller that stops inside a frame resets it."""
        if self._lz4 is None:
            self._lz4 = new_lz4_context()
        return self._lz4

    def __call__(
        self, header: BatchHeader, batch: memoryview, at_most: int
    ) -> bytes | memoryview | None:
        """`batch`'s records within `at_most` (at most `limit`) bytes, or None."""
        at_most = min(at_most, self.limit)
        codec = header.attributes & COMPRESSION_CODEC_MASK
        if codec == Compression.LZ4:
            if self._lz4 is None:
                self._lz4 = new_lz4_context()
            # A one-record frame is one call: what codecs.decompress_at_most would do,
            # without its calls around it (they were a third of its time per batch).
            records = batch[RECORD_BATCH_OVERHEAD:]
            try:
                out, _, eof = decompress_chunk(
                    self._lz4, records, max_length=min(at_most + 1, LZ4_STEP)
                )
            except RuntimeError:
                eof = False
            else:
                if eof:
                    return out if len(out) <= at_most else None
            reset_decompression_context(self._lz4)  # the whole frame, from its start:
        elif codec in _SCRATCH_CODECS and self._scratch is None:
            self._scratch = scratch_buffer(self.limit)
        return plain_records(header, batch, at_most, self._scratch, self._lz4)


@dataclass(frozen=True, slots=True)
class RunCut:
    """A run `coalesce` could not make whole: its first `joined` batches fit the run's
    bound and rewrite, the next one does not (`reason`); see the module rules."""

    joined: int
    reason: str


def small(size: int, limit: int) -> bool:
    """Whether a stored batch of `size` bytes may be coalesced into runs of up to `limit`
    bytes (see the module rules)."""
    return size <= min(SMALL_BATCH_BYTES, limit)


def can_join(first: BatchHeader, other: BatchHeader) -> bool:
    """Whether `other` may be merged into a run that `first` opened."""
    return (
        mergeable(first)
        and mergeable(other)
        and (first.attributes & JOIN_ATTRIBUTES) == (other.attributes & JOIN_ATTRIBUTES)
    )


def mergeable(h: BatchHeader) -> bool:
    """Whether `h`'s batch may be merged into a run at all (see the module rules)."""
    return (
        h.magic == MAGIC_V2
        and not h.is_control
        and not h.attributes & TIMESTAMP_TYPE_MASK  # log append time
        and h.last_offset_delta == h.record_count - 1
    )


def coalesce(
    batches: Sequence[bytes | memoryview],
    headers: Sequence[BatchHeader],
    plain_limit: int,
    reader: PlainReader | None = None,
) -> bytes | RunCut:
    """One magic 2 batch holding every record of a run, as the module rules say: `batches`
    are its stored batches, `headers` their headers; their records decompressed within
    `plain_limit` bytes in all (by `reader`, made for the call without one), else where
    the run must be cut. Base offset 0, producer fields none (restamp sets them)."""
    first = headers[0]
    codec = Compression(first.attributes & COMPRESSION_CODEC_MASK)
    base_ts = first.base_timestamp
    if reader is None:
        reader = PlainReader(plain_limit)
    out = bytearray()
    index = 0
    left = plain_limit
    lz4_context = reader.lz4_context() if codec == Compression.LZ4 else None
    for joined, (batch, h) in enumerate(zip(batches, headers, strict=True)):
        if lz4_context is not None and h.record_count == 1:
            # The tiny workload's batch (one record, LZ4): PlainReader's and
            # rewrite_records' first steps without their calls around them (a third of
            # the time a batch took); anything else goes the general way below.
            try:
                # max_length (at most `left` + 1 bytes, an LZ4 step) passed by position,
                # and without min(): its keyword and the call were half of this call's
                # time on a one-record frame.
                plain, _, eof = decompress_chunk(
                    lz4_context,
                    batch[RECORD_BATCH_OVERHEAD:],
                    LZ4_STEP if left >= LZ4_STEP else left + 1,
                )
            except RuntimeError:
                eof = False
            if not eof:
                reset_decompression_context(lz4_context)
            elif len(plain) <= left and rewrite_one(plain, out, index, h.base_timestamp - base_ts):
                left -= len(plain)
                index += 1
                continue
        plain = reader(h, memoryview(batch), left)
        if plain is None:
            return RunCut(
                joined,
                f"the records of the batch at source offset {h.base_offset} do not "
                f"decompress within the {left} bytes left of the run's bound",
            )
        left -= len(plain)
        try:
            index = rewrite_records(
                memoryview(plain),
                h.record_count,
                out,
                first_index=index,
                shift_ms=h.base_timestamp - base_ts,
            )
        except ValueError as exc:
            return RunCut(
                joined, f"the records of the batch at source offset {h.base_offset}: {exc}"
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
        first.attributes & JOIN_ATTRIBUTES,
        count - 1,
        base_ts,
        max(h.max_timestamp for h in headers),
        -1,
        -1,
        -1,
        count,
    )
    return bytes(body)
