"""Decompression of record payloads with Kafka's four codecs (cramjam does the work), and
compression for the one writer that must (the mirror re-encodes a batch thinned by
compaction; replicad never re-compresses anything else).

- GZIP: a gzip stream (possibly several members).
- SNAPPY: Kafka's Java client writes xerial framing (`\\x82SNAPPY\\x00`, version, compat,
  then `int32 length + raw snappy block` chunks); other clients write raw snappy, and some
  the official snappy framing format. All three are accepted.
- LZ4: the LZ4 frame format (KIP-57 fixed Kafka's framing for magic 1+), by python-lz4's
  `lz4.frame`: cramjam's frame decoder took 11 us for a one-record frame and ran at about
  260 MB/s on large ones, lz4.frame 1.4 us and 3 GB/s (the mirror coalescing one-record
  batches decompresses one frame a record). Compressed in lz4's fast mode: cramjam's
  default was the high-compression mode, 30 times slower for 0.5% smaller output.
- ZSTD: a zstd frame, with or without the content size in its header.
Bad input raises CorruptRecordError naming the codec.
"""

from __future__ import annotations

import mmap
import struct
from typing import Any

import cramjam
import lz4.frame

from replicad.errors import CorruptRecordError
from replicad.records.batch import Compression

XERIAL_MAGIC = b"\x82SNAPPY\x00"
# Magic (8) + version (int32) + compatible version (int32).
XERIAL_HEADER_SIZE = 16
# The official snappy framing format starts with a stream identifier chunk.
SNAPPY_FRAMED_MAGIC = b"\xff\x06\x00\x00sNaPpY"

_INT32 = struct.Struct(">i")

# decompress_at_most's LZ4 output is asked for in steps of this many bytes: python-lz4
# allocates its whole `max_length` for every call, and an allocation above glibc's mmap
# threshold (the daemon pins it at 128 KiB) is an mmap and munmap of its own -- with the
# bound as `max_length`, a one-record frame took 11.7 us instead of 1.8.
LZ4_STEP = 64 * 1024


def decompress(codec: Compression, data: bytes | bytearray | memoryview) -> bytes:
    """The decompressed bytes of `data`, compressed with `codec`."""
    try:
        if codec == Compression.NONE:
            return bytes(data)
        if codec == Compression.GZIP:
            return bytes(cramjam.gzip.decompress(data))
        if codec == Compression.SNAPPY:
            return _snappy(data)
        if codec == Compression.LZ4:
            return lz4.frame.decompress(data)
        if codec == Compression.ZSTD:
            return bytes(cramjam.zstd.decompress(data))
    except (cramjam.DecompressionError, RuntimeError) as exc:  # lz4.frame raises RuntimeError
        raise CorruptRecordError(f"{codec.name} payload does not decompress: {exc}") from exc
    raise CorruptRecordError(f"unknown compression codec {int(codec)}")


# Xerial framing as Kafka's Java client writes it: version 1, compatible version 1, blocks of
# at most 32 KiB of input.
XERIAL_VERSION = 1
XERIAL_BLOCK = 32 * 1024


def compress(codec: Compression, data: bytes | bytearray | memoryview) -> bytes:
    """`data` compressed with `codec` in the framing Kafka's Java client writes."""
    if codec == Compression.NONE:
        return bytes(data)
    if codec == Compression.GZIP:
        return bytes(cramjam.gzip.compress(data))
    if codec == Compression.SNAPPY:
        mv = memoryview(data).cast("B")
        out = bytearray(XERIAL_MAGIC + struct.pack(">ii", XERIAL_VERSION, XERIAL_VERSION))
        for pos in range(0, len(mv), XERIAL_BLOCK):
            block = bytes(cramjam.snappy.compress_raw(mv[pos : pos + XERIAL_BLOCK]))
            out += _INT32.pack(len(block)) + block
        return bytes(out)
    if codec == Compression.LZ4:
        # Kafka's LZ4 reader takes independent blocks only ("Dependent block stream is
        # unsupported"); no content size in the header, as Kafka's Java client writes it.
        return lz4.frame.compress(
            data, block_linked=False, content_checksum=False, store_size=False
        )
    if codec == Compression.ZSTD:
        return bytes(cramjam.zstd.compress(data))
    raise CorruptRecordError(f"unknown compression codec {int(codec)}")


def _snappy(data: bytes | bytearray | memoryview) -> bytes:
    mv = memoryview(data).cast("B")
    if bytes(mv[: len(XERIAL_MAGIC)]) == XERIAL_MAGIC:
        return _xerial(mv)
    if bytes(mv[: len(SNAPPY_FRAMED_MAGIC)]) == SNAPPY_FRAMED_MAGIC:
        return bytes(cramjam.snappy.decompress(mv))
    return bytes(cramjam.snappy.decompress_raw(mv))


def _xerial(mv: memoryview) -> bytes:
    out = bytearray()
    pos = XERIAL_HEADER_SIZE
    n = len(mv)
    while pos < n:
        if n - pos < _INT32.size:
            raise CorruptRecordError(f"SNAPPY xerial block header cut off at byte {pos}")
        (length,) = _INT32.unpack_from(mv, pos)
        pos += _INT32.size
        if length < 0 or pos + length > n:
            raise CorruptRecordError(f"SNAPPY xerial block of {length} bytes at {pos} overruns")
        out += cramjam.snappy.decompress_raw(mv[pos : pos + length])
        pos += length
    return bytes(out)


def scratch_buffer(limit: int) -> mmap.mmap:
    """An output buffer for decompress_at_most's `limit`: anonymous memory, so it costs
    only the pages a codec writes into (a bytearray of the bound zeroed all of them: a
    1 MiB one, made per local-log read, took 0.8 ms of mapping and page faults)."""
    return mmap.mmap(-1, limit + 1)


def decompress_at_most(
    codec: Compression,
    data: bytes | bytearray | memoryview,
    limit: int,
    scratch: bytearray | mmap.mmap | None = None,
    lz4_context: Any = None,
) -> bytes | None:
    """The decompressed bytes of `data` if they are at most `limit` bytes, else None; also
    None for what does not decompress. Never more than `limit` + 1 bytes are written (a
    few hundred bytes of zstd can hold gigabytes of zeros). `scratch`, at least `limit` + 1
    bytes long, is the one output buffer of the codecs that need one (None: one is made
    for the call, scratch_buffer), and `lz4_context` an LZ4 frame decompression context
    (lz4.frame.create_decompression_context; made afresh without one); the caller may
    reuse both across calls (a new context costs about as much as a small frame's
    decompression)."""
    try:
        if codec == Compression.LZ4:
            context = lz4_context if lz4_context is not None else new_lz4_context()
            return _lz4_at_most(context, data, limit)
        if codec == Compression.NONE:
            return bytes(data) if len(data) <= limit else None
        if codec == Compression.SNAPPY:
            mv = memoryview(data).cast("B")
            if bytes(mv[: len(XERIAL_MAGIC)]) == XERIAL_MAGIC:
                # Each block says its decompressed length: summed before anything is made.
                if _xerial_length(mv) > limit:
                    return None
                return _xerial(mv)
            if bytes(mv[: len(SNAPPY_FRAMED_MAGIC)]) != SNAPPY_FRAMED_MAGIC:
                if cramjam.snappy.decompress_raw_len(mv) > limit:
                    return None
                return bytes(cramjam.snappy.decompress_raw(mv))
            module: Any = cramjam.snappy
        elif codec == Compression.GZIP:
            module = cramjam.gzip
        elif codec == Compression.ZSTD:
            module = cramjam.zstd
        else:
            return None
        if scratch is None:
            scratch = scratch_buffer(limit)
        view = memoryview(scratch)[: limit + 1]
        # cramjam refuses ("failed to write whole buffer") once the buffer is full.
        n = module.decompress_into(data, view)
        return bytes(view[:n]) if n <= limit else None
    except (cramjam.DecompressionError, RuntimeError, CorruptRecordError, ValueError):
        return None


def new_lz4_context() -> Any:
    """A context for decompress_at_most's LZ4 frames (reusable: one frame after another)."""
    return lz4.frame.create_decompression_context()


def _lz4_at_most(context: Any, data: bytes | bytearray | memoryview, limit: int) -> bytes | None:
    """One LZ4 frame's bytes if at most `limit`, asked for LZ4_STEP bytes at a time (never
    more than `limit` + 1 in all); None when over, cut short or not a frame. python-lz4's
    low-level call, not LZ4FrameDecompressor: its Python wrapper copied a memoryview's
    bytes and took twice the time of a one-record frame's decompression. A frame read to
    its end mark leaves `context` ready for the next one; any other end resets it."""
    view = memoryview(data)
    eof = False
    try:
        out, read, eof = lz4.frame.decompress_chunk(
            context, view, max_length=min(limit + 1, LZ4_STEP)
        )
        if eof:
            return out if len(out) <= limit else None
        parts = [out]
        total = len(out)
        pos = read
        while total <= limit:
            out, read, eof = lz4.frame.decompress_chunk(
                context, view[pos:], max_length=min(limit + 1 - total, LZ4_STEP)
            )
            if not out and not read and not eof:
                return None  # the frame ends before its end mark
            pos += read
            total += len(out)
            parts.append(out)
            if eof:
                return b"".join(parts) if total <= limit else None
        return None
    finally:
        if not eof:
            lz4.frame.reset_decompression_context(context)


def _xerial_length(mv: memoryview) -> int:
    total = 0
    pos = XERIAL_HEADER_SIZE
    while pos + _INT32.size <= len(mv):
        (length,) = _INT32.unpack_from(mv, pos)
        pos += _INT32.size
        if length < 0 or pos + length > len(mv):
            raise CorruptRecordError(f"SNAPPY xerial block of {length} bytes at {pos} overruns")
        total += cramjam.snappy.decompress_raw_len(mv[pos : pos + length])
        pos += length
    return total
