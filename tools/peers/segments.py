"""The record batches a Kafka broker holds on disk, read straight from its segment files.

This is the test oracle for byte-identity: it reads the broker's own
`<log_dir>/<topic>-<partition>/<base offset>.log` files and frames batches by
their 12-byte prefix (base offset, batch length) only. It trusts the broker's
bytes and checks nothing else; replicad's `records` layer is the one that validates.

Framing, from Kafka's record batch format (magic 2):

    baseOffset int64 | batchLength int32 | partitionLeaderEpoch int32 | magic int8 |
    crc uint32 | attributes int16 | lastOffsetDelta int32 | ...

batchLength counts the bytes after itself, so a batch is 12 + batchLength bytes.
"""

from __future__ import annotations

import struct
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

LOG_SUFFIX = ".log"
BATCH_PREFIX = struct.Struct(">qi")  # baseOffset, batchLength
BATCH_PREFIX_SIZE = BATCH_PREFIX.size
MAGIC_OFFSET = 16
ATTRIBUTES_OFFSET = 21
LAST_OFFSET_DELTA_OFFSET = 23
ATTRIBUTES_AND_DELTA = struct.Struct(">hi")
# Smallest magic-2 batch header: everything up to and including the record count.
V2_HEADER_SIZE = 61

COMPRESSION_MASK = 0x07
TRANSACTIONAL_FLAG = 0x10
CONTROL_FLAG = 0x20
CODEC_NAMES = {0: "none", 1: "gzip", 2: "snappy", 3: "lz4", 4: "zstd"}


@dataclass(frozen=True, slots=True)
class BrokerBatch:
    """One record batch as the broker stored it."""

    base_offset: int
    last_offset: int
    magic: int
    attributes: int
    raw: bytes

    @property
    def codec(self) -> str:
        return CODEC_NAMES.get(self.attributes & COMPRESSION_MASK, "unknown")

    @property
    def is_transactional(self) -> bool:
        return bool(self.attributes & TRANSACTIONAL_FLAG)

    @property
    def is_control(self) -> bool:
        return bool(self.attributes & CONTROL_FLAG)


def segment_files(log_dir: Path, topic: str, partition: int) -> list[Path]:
    """The partition's .log segments in offset order (file names are 20-digit base offsets)."""
    partition_dir = Path(log_dir) / f"{topic}-{partition}"
    if not partition_dir.is_dir():
        raise FileNotFoundError(f"no partition directory {partition_dir}")
    return sorted(partition_dir.glob(f"*{LOG_SUFFIX}"), key=lambda p: int(p.stem))


def iter_batches(data: bytes, *, partial_tail: bool = False) -> Iterator[BrokerBatch]:
    """Frame `data` into batches.

    A partial batch at the end is an error for segment files (brokers write
    whole batches); with `partial_tail` it is dropped silently, as a client
    drops the partial batch a Fetch response may end with (KIP-74).
    """
    view = memoryview(data)
    pos = 0
    while pos < len(view):
        if len(view) - pos < BATCH_PREFIX_SIZE:
            if partial_tail:
                return
            raise ValueError(f"{len(view) - pos} stray bytes at position {pos}")
        base_offset, batch_length = BATCH_PREFIX.unpack_from(view, pos)
        end = pos + BATCH_PREFIX_SIZE + batch_length
        if end > len(view):
            if partial_tail:
                return
            raise ValueError(f"batch at offset {base_offset} runs past the end of the data")
        magic = view[pos + MAGIC_OFFSET]
        if magic >= 2 and end - pos >= V2_HEADER_SIZE:
            attributes, last_offset_delta = ATTRIBUTES_AND_DELTA.unpack_from(
                view, pos + ATTRIBUTES_OFFSET
            )
            last_offset = base_offset + last_offset_delta
        else:
            # Magic 0/1 message sets put the (last) offset where a v2 batch has its base.
            attributes, last_offset = view[pos + MAGIC_OFFSET + 1], base_offset
        yield BrokerBatch(base_offset, last_offset, magic, attributes, bytes(view[pos:end]))
        pos = end


def broker_batches(
    log_dir: Path,
    topic: str,
    partition: int,
    *,
    start_offset: int = 0,
    end_offset: int | None = None,
) -> list[BrokerBatch]:
    """The partition's batches holding an offset in [start_offset, end_offset), in order."""
    found: list[BrokerBatch] = []
    for segment in segment_files(log_dir, topic, partition):
        for batch in iter_batches(segment.read_bytes()):
            if batch.last_offset < start_offset:
                continue
            if end_offset is not None and batch.base_offset >= end_offset:
                return found
            found.append(batch)
    return found


def read_broker_batches(
    log_dir: Path,
    topic: str,
    partition: int,
    *,
    start_offset: int = 0,
    end_offset: int | None = None,
) -> bytes:
    """The raw bytes of those batches, concatenated: what a byte-identical replica must hold."""
    batches = broker_batches(
        log_dir, topic, partition, start_offset=start_offset, end_offset=end_offset
    )
    return b"".join(batch.raw for batch in batches)
