"""Settings of the local log store, named after Kafka's topic/broker configs."""

from __future__ import annotations

from dataclasses import dataclass

GIB = 1024 * 1024 * 1024
MIB = 1024 * 1024


@dataclass(frozen=True, slots=True)
class LogConfig:
    # Roll a new segment when the active one reaches this size (Kafka `segment.bytes`).
    segment_bytes: int = GIB
    # ... or when its first batch is this old (Kafka `segment.ms`, default 7 days).
    segment_ms: int = 7 * 24 * 3600 * 1000
    # Bytes between offset-index entries (Kafka `index.interval.bytes`).
    index_interval_bytes: int = 4096
    # Preallocated size of .index/.timeindex files; a full index rolls the segment
    # (Kafka `segment.index.bytes`).
    segment_index_bytes: int = 10 * MIB
    # fsync after this many appended records; None = leave it to the OS and to rolls
    # and checkpoints (Kafka `flush.messages`, default Long.MAX_VALUE).
    flush_messages: int | None = None
    # fsync when the oldest unflushed data is this old; None = never by time (`flush.ms`).
    flush_ms: int | None = None
    # Local retention; -1 keeps everything (a replica's default: the source decides).
    retention_bytes: int = -1
    retention_ms: int = -1
    # Segment files (.log, .index, .timeindex) open at once, for all partitions together;
    # the least recently used are closed and reopened on demand (replicad's own: Kafka
    # keeps every segment file open and relies on the limit being high enough).
    max_open_files: int = 4096
