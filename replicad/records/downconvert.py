"""KIP-283 lazy, chunked down-conversion: magic 2 batches (or magic 1 messages) from a log
region, handed out as magic 0/1 message sets for Fetch v0-v3 clients, in bounded memory.

Rules (KIP-283, as Kafka's LazyDownConversionRecords/-Send and RecordsUtil.downConvert apply
them):
- The size is committed before anything is sent: S_pre = max(S_source, size of the first
  converted batch), where S_source is the region's size (a trailing partial batch included)
  and the first converted batch is the first one whose conversion is not empty. Exactly
  S_pre bytes come out of `chunks()`, whatever conversion turns out to produce:
    S_post > S_pre: the output is cut at S_pre (the last message arrives partial and the
                    client drops it; the first batch always fits, so the client progresses);
    S_post < S_pre: the rest is an overflow entry -- offset -1, a length larger than what is
                    left -- padded with zeros, which clients read as a partial message.
- A region holding whole batches of which none converts to anything (only control batches)
  commits LOG_OVERHEAD bytes: one overflow entry, so the client sees a partial message (and
  a Java client asks for a larger fetch size). A region without a whole batch commits 0.
- Conversion: entries with magic <= the target are copied as they are. Control batches are
  dropped (magic 0/1 has no transaction markers); headers are dropped. An uncompressed batch
  becomes one message per record, skipping records below the fetch offset (librdkafka relies
  on that); a compressed batch becomes one wrapper message with the same codec, holding
  all its records (wrapper offset = last inner offset; magic 1 inner offsets relative to the
  first; wrapper timestamp = log append time or the largest inner timestamp). LOG_APPEND_TIME
  is kept as the magic 1 timestamp-type bit on wrapper and inner messages.
- ZSTD has no magic 0/1 form: a ZSTD first batch refuses the whole conversion
  (`ConversionRefused`, answered UNSUPPORTED_COMPRESSION_TYPE); a ZSTD batch met later ends
  the output with the overflow entry, so the client fetches again from that batch and is
  refused then.
- Memory: the region is read `chunk_bytes` (default 128 KiB) at a time, whole batches only
  (more when a single batch is larger); only the chunk being converted and its output are
  held. `stats.peak_bytes` records the most held at once.
This module does no I/O of its own: the caller passes `read_at(position, size)` over the
region (a pread on the segment file).
"""

from __future__ import annotations

import struct
import zlib
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

import cramjam

from replicad.records.batch import (
    LOG_OVERHEAD,
    MAGIC_V0,
    MAGIC_V1,
    RECORD_BATCH_OVERHEAD,
    BatchHeader,
    Compression,
    ScanStop,
    TimestampType,
    scan_batches,
)
from replicad.records.codecs import XERIAL_MAGIC
from replicad.records.legacy import LEGACY_TIMESTAMP_TYPE_MASK
from replicad.records.records import Record, decode_batch

# Kafka's LazyDownConversionRecordsSend.MAX_READ_SIZE.
DEFAULT_CHUNK_BYTES = 128 * 1024
# The smallest piece of zeros an overflow entry is sent in.
MIN_PIECE_BYTES = 4096
# The offset an overflow entry carries; no real entry has it.
OVERFLOW_OFFSET = -1
# Xerial snappy framing as Kafka's Java client writes it: version 1, compatible with 1,
# then blocks of at most 32 KiB, each `int32 length + raw snappy`.
XERIAL_VERSION = 1
XERIAL_COMPATIBLE_VERSION = 1
XERIAL_BLOCK_BYTES = 32 * 1024

# A region of the log: `read_at(position, size)` returns those bytes (fewer at its end).
ReadAt = Callable[[int, int], bytes]

_ENTRY_HEAD = struct.Struct(">qi")  # offset, size
_CRC = struct.Struct(">I")
_TIMESTAMP = struct.Struct(">q")
_INT32 = struct.Struct(">i")
_XERIAL_HEADER = struct.Struct(">8sii")
_LEGACY_CODECS = (Compression.NONE, Compression.GZIP, Compression.SNAPPY, Compression.LZ4)


@dataclass(frozen=True, slots=True)
class ConversionRefused:
    """The region cannot be down-converted at all: answer UNSUPPORTED_COMPRESSION_TYPE."""

    reason: str


@dataclass(slots=True)
class ConversionStats:
    records_converted: int = 0
    batches_converted: int = 0
    # Entries that had to be copied as they were (already old enough).
    batches_copied: int = 0
    source_bytes_read: int = 0
    # Most bytes held at once: the chunk read plus what it converted to.
    peak_bytes: int = 0


@dataclass(frozen=True, slots=True)
class _Chunk:
    converted: bytes
    # Source bytes consumed: the whole batches converted.
    consumed: int
    # A batch that cannot be converted (ZSTD) stopped this chunk; nothing after it converts.
    stopped_at_unsupported: bool


class LazyDownConversion:
    """One partition's records, down-converted as they are sent. See the module rules."""

    def __init__(
        self,
        read_at: ReadAt,
        source_size: int,
        *,
        to_magic: int,
        first_offset: int,
        chunk_bytes: int,
        first: bytes,
        after_first: int,
        size: int,
        stats: ConversionStats,
    ) -> None:
        self._read_at = read_at
        self._source_size = source_size
        self.to_magic = to_magic
        self.first_offset = first_offset
        self.chunk_bytes = chunk_bytes
        self._first: bytes | None = first
        self._position = after_first
        # S_pre: exactly this many bytes come out of chunks().
        self.size = size
        self.stats = stats
        self._started = False

    def chunks(self) -> Iterator[bytes]:
        """The converted bytes, S_pre in total, a chunk at a time. Iterate once."""
        if self._started:
            raise RuntimeError("a LazyDownConversion is sent once")
        self._started = True
        remaining = self.size
        first, self._first = self._first, None
        if first:
            piece = first[:remaining]
            remaining -= len(piece)
            yield piece
        stopped = False
        while remaining > 0 and not stopped and self._position < self._source_size:
            chunk = _convert_chunk(
                self._read_at,
                self._position,
                self._source_size,
                self.to_magic,
                self.first_offset,
                self.chunk_bytes,
                self.stats,
                first_only=False,
            )
            if chunk.consumed == 0 and not chunk.converted:
                break  # only a partial trailing batch is left
            self._position += chunk.consumed
            stopped = chunk.stopped_at_unsupported
            if chunk.converted:
                piece = chunk.converted[:remaining]
                remaining -= len(piece)
                yield piece
        if remaining > 0:
            yield from overflow_entry(remaining, self.chunk_bytes)


def prepare_down_conversion(
    read_at: ReadAt,
    source_size: int,
    *,
    to_magic: int,
    first_offset: int,
    chunk_bytes: int = DEFAULT_CHUNK_BYTES,
) -> LazyDownConversion | ConversionRefused:
    """Convert the first non-empty batch now (it fixes S_pre); the rest waits for chunks()."""
    if to_magic not in (MAGIC_V0, MAGIC_V1):
        raise ValueError(f"down-conversion targets magic 0 or 1, not {to_magic}")
    stats = ConversionStats()
    position = 0
    saw_whole_batch = False
    first = b""
    while position < source_size:
        chunk = _convert_chunk(
            read_at, position, source_size, to_magic, first_offset, 0, stats, first_only=True
        )
        if chunk.stopped_at_unsupported and not chunk.converted:
            return ConversionRefused(
                f"batch at region position {position} is compressed with a codec that "
                f"message format {to_magic} does not have (ZSTD)"
            )
        if chunk.consumed == 0:
            break
        saw_whole_batch = True
        position += chunk.consumed
        if chunk.converted:
            first = chunk.converted
            break
    # Whole batches that convert to nothing still commit one overflow entry.
    empty_size = LOG_OVERHEAD if saw_whole_batch else 0
    size = max(source_size, len(first)) if first else empty_size
    return LazyDownConversion(
        read_at,
        source_size,
        to_magic=to_magic,
        first_offset=first_offset,
        chunk_bytes=chunk_bytes,
        first=first,
        after_first=position,
        size=size,
        stats=stats,
    )


def overflow_entry(size: int, piece_bytes: int = DEFAULT_CHUNK_BYTES) -> Iterator[bytes]:
    """`size` bytes that read as the start of an entry too long to be there (KIP-283)."""
    head = _ENTRY_HEAD.pack(OVERFLOW_OFFSET, max(size + 1, RECORD_BATCH_OVERHEAD))
    first = head[:size]
    yield first
    left = size - len(first)
    zeros = bytes(min(left, max(piece_bytes, MIN_PIECE_BYTES)))
    while left > 0:
        piece = zeros if left >= len(zeros) else zeros[:left]
        left -= len(piece)
        yield piece


def _convert_chunk(
    read_at: ReadAt,
    position: int,
    source_size: int,
    to_magic: int,
    first_offset: int,
    chunk_bytes: int,
    stats: ConversionStats,
    *,
    first_only: bool,
) -> _Chunk:
    """Read whole batches from `position` (chunk_bytes' worth, at least one) and convert them."""
    want = min(max(chunk_bytes, RECORD_BATCH_OVERHEAD), source_size - position)
    data = read_at(position, want)
    scan = scan_batches(data, verify_crc=False)
    if not scan.batches and scan.stop is ScanStop.PARTIAL and len(data) >= LOG_OVERHEAD:
        # The first batch is larger than a chunk: read it whole, if the region holds it.
        (length,) = _INT32.unpack_from(data, 8)
        whole = LOG_OVERHEAD + length
        if length > 0 and position + whole <= source_size:
            data = read_at(position, whole)
            scan = scan_batches(data, verify_crc=False)
    stats.source_bytes_read += len(data)
    headers = scan.batches[:1] if first_only else scan.batches
    out = bytearray()
    consumed = 0
    stopped = False
    for header in headers:
        if header.compression == Compression.ZSTD and header.magic > to_magic:
            stopped = True
            break
        out += convert_entry(data, header, to_magic, first_offset, stats)
        consumed = header.end_position
    stats.peak_bytes = max(stats.peak_bytes, len(data) + len(out))
    return _Chunk(bytes(out), consumed, stopped)


def convert_entry(
    buf: bytes | bytearray | memoryview,
    header: BatchHeader,
    to_magic: int,
    first_offset: int,
    stats: ConversionStats | None = None,
) -> bytes:
    """One log entry of `buf` in message format `to_magic` (b"" when nothing is left of it)."""
    stats = stats if stats is not None else ConversionStats()
    if header.magic <= to_magic:
        stats.batches_copied += 1
        return bytes(memoryview(buf)[header.position : header.end_position])
    if header.is_control:
        return b""
    if header.compression not in _LEGACY_CODECS:
        raise ValueError(f"{header.compression.name} batches have no magic {to_magic} form")
    records: Sequence[Record] = decode_batch(buf, header).records
    compressed = header.compression != Compression.NONE
    if not compressed:
        records = [r for r in records if r.offset >= first_offset]
    if not records:
        return b""
    log_append = header.timestamp_type == TimestampType.LOG_APPEND_TIME
    stats.batches_converted += 1
    stats.records_converted += len(records)
    if not compressed:
        return b"".join(
            legacy_message(to_magic, r.offset, r.timestamp, r.key, r.value, log_append=log_append)
            for r in records
        )
    base = records[0].offset
    relative = to_magic >= MAGIC_V1
    inner = b"".join(
        legacy_message(
            to_magic,
            r.offset - base if relative else r.offset,
            r.timestamp,
            r.key,
            r.value,
            log_append=log_append,
        )
        for r in records
    )
    wrapper_ts = header.max_timestamp if log_append else max(r.timestamp for r in records)
    return legacy_message(
        to_magic,
        records[-1].offset,
        wrapper_ts,
        None,
        compress_legacy(header.compression, inner),
        log_append=log_append,
        codec=header.compression,
    )


def legacy_message(
    magic: int,
    offset: int,
    timestamp: int,
    key: bytes | None,
    value: bytes | None,
    *,
    log_append: bool = False,
    codec: Compression = Compression.NONE,
) -> bytes:
    """One magic 0/1 message with its log entry head (offset, size); CRC32 computed."""
    attributes = int(codec)
    if magic >= MAGIC_V1 and log_append:
        attributes |= LEGACY_TIMESTAMP_TYPE_MASK
    body = bytearray()
    body += bytes((magic, attributes))
    if magic >= MAGIC_V1:
        body += _TIMESTAMP.pack(timestamp)
    for field in (key, value):
        if field is None:
            body += _INT32.pack(-1)
        else:
            body += _INT32.pack(len(field))
            body += field
    crc = zlib.crc32(body)
    return _ENTRY_HEAD.pack(offset, len(body) + _CRC.size) + _CRC.pack(crc) + bytes(body)


def compress_legacy(codec: Compression, data: bytes) -> bytes:
    """A wrapper message's value as Kafka's clients write it for magic 0/1."""
    if codec == Compression.GZIP:
        return bytes(cramjam.gzip.compress(data))
    if codec == Compression.SNAPPY:
        return _xerial_snappy(data)
    if codec == Compression.LZ4:
        # The standard LZ4 frame (KIP-57). Magic 0 clients expect Kafka's old, wrong header
        # checksum; kafka-python and librdkafka repair the header before reading it.
        return bytes(cramjam.lz4.compress(data))
    raise ValueError(f"no magic 0/1 wrapper for {codec.name}")


def _xerial_snappy(data: bytes) -> bytes:
    out = bytearray(_XERIAL_HEADER.pack(XERIAL_MAGIC, XERIAL_VERSION, XERIAL_COMPATIBLE_VERSION))
    view = memoryview(data)
    for start in range(0, len(data), XERIAL_BLOCK_BYTES):
        block = bytes(cramjam.snappy.compress_raw(view[start : start + XERIAL_BLOCK_BYTES]))
        out += _INT32.pack(len(block))
        out += block
    return bytes(out)
