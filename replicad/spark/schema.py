"""The two tables the source serves, as Spark DDL and as the Arrow batches the reader yields.

- records (the default view): one row per record. `timestamp` is null for a record without
  one (magic 0, or -1), `leader_epoch` and `producer_id` are null where Kafka writes -1
  ("none"); `timestamp_type` keeps Kafka's ids (-1 none, 0 CreateTime, 1 LogAppendTime).
  `headers` is an empty array for a record without headers. `is_control` marks the marker
  records that `includeControl` lets through.
- batches: one row per log entry (batch or legacy message set), plus one row per problem a
  read ran into (`problem_kind` "corrupt" or "torn_tail", with its file position); the
  pipeline's verify job aggregates it.

Spark takes timestamps from Arrow in microseconds with a time zone; Kafka's are
milliseconds, so they are scaled here.
"""

from __future__ import annotations

import pyarrow as pa

MICROS_PER_MILLI = 1000

RECORDS_DDL = (
    "topic string, partition int, offset bigint, timestamp timestamp, timestamp_type int, "
    "key binary, value binary, headers array<struct<key:string,value:binary>>, "
    "leader_epoch int, producer_id bigint, is_transactional boolean, is_control boolean"
)


def records_ddl(include_headers: bool = True) -> str:
    """The records table; without `headers` when includeHeaders is false."""
    if include_headers:
        return RECORDS_DDL
    return RECORDS_DDL.replace(", headers array<struct<key:string,value:binary>>", "")


BATCHES_DDL = (
    "topic string, partition int, segment bigint, position bigint, base_offset bigint, "
    "last_offset bigint, record_count int, size int, magic int, codec string, "
    "timestamp_type int, max_timestamp timestamp, producer_id bigint, producer_epoch int, "
    "base_sequence int, leader_epoch int, is_transactional boolean, is_control boolean, "
    "crc bigint, problem string, problem_kind string"
)

TIMESTAMP = pa.timestamp("us", tz="UTC")
HEADERS = pa.list_(pa.struct([("key", pa.string()), ("value", pa.binary())]))

RECORDS_ARROW = pa.schema(
    [
        ("topic", pa.string()),
        ("partition", pa.int32()),
        ("offset", pa.int64()),
        ("timestamp", TIMESTAMP),
        ("timestamp_type", pa.int32()),
        ("key", pa.binary()),
        ("value", pa.binary()),
        ("headers", HEADERS),
        ("leader_epoch", pa.int32()),
        ("producer_id", pa.int64()),
        ("is_transactional", pa.bool_()),
        ("is_control", pa.bool_()),
    ]
)

BATCHES_ARROW = pa.schema(
    [
        ("topic", pa.string()),
        ("partition", pa.int32()),
        ("segment", pa.int64()),
        ("position", pa.int64()),
        ("base_offset", pa.int64()),
        ("last_offset", pa.int64()),
        ("record_count", pa.int32()),
        ("size", pa.int32()),
        ("magic", pa.int32()),
        ("codec", pa.string()),
        ("timestamp_type", pa.int32()),
        ("max_timestamp", TIMESTAMP),
        ("producer_id", pa.int64()),
        ("producer_epoch", pa.int32()),
        ("base_sequence", pa.int32()),
        ("leader_epoch", pa.int32()),
        ("is_transactional", pa.bool_()),
        ("is_control", pa.bool_()),
        ("crc", pa.int64()),
        ("problem", pa.string()),
        ("problem_kind", pa.string()),
    ]
)


def micros(timestamp_ms: int) -> int | None:
    """Kafka milliseconds as Spark microseconds; None for Kafka's "no timestamp" (< 0)."""
    return None if timestamp_ms < 0 else timestamp_ms * MICROS_PER_MILLI


def none_if_negative(value: int) -> int | None:
    """Kafka writes -1 for "none" in leader epoch and producer id."""
    return None if value < 0 else value
