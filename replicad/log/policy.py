"""When to roll, flush and delete: the log's decisions, as pure functions of state and time.

Rules:
- Roll (Kafka's LogSegment.shouldRoll, decided per batch so one append can span segments):
  before a batch, the active segment rolls when it is non-empty and the batch would take it
  past `segment_bytes`; when it is non-empty and the batch's max timestamp is more than
  `segment_ms` after the segment's first batch's max timestamp (or, without timestamps, the
  segment is older than `segment_ms` by the clock); when its offset or time index is full;
  or when the batch's last offset does not fit an int32 relative to the segment's base.
  The new segment is named after the batch's base offset, so gaps never make empty segments
  (an empty active segment whose base is too far below the batch is replaced).
- Flush: after an append once `flush_messages` records are unflushed; by time once the oldest
  unflushed append is `flush_ms` old. Rolls and checkpoints flush regardless.
- Retention: only inactive segments are deleted, oldest first: by time when a segment's
  largest timestamp is older than `retention_ms`, by size while the log minus the oldest
  segment still holds at least `retention_bytes`. -1 disables either rule. Between two
  plans of the same segments (`next_retention_ms`), only time can change the plan, and only
  once the first inactive segment the time rule keeps is `retention_ms` old: until then a
  partition nothing was written to needs no plan (manager.py's retention pass).
"""

from __future__ import annotations

import enum
import math
from collections.abc import Sequence
from dataclasses import dataclass

from replicad.log.config import LogConfig
from replicad.log.index import OFFSET_ENTRY_SIZE, TIME_ENTRY_SIZE, fits_relative
from replicad.records.batch import BatchHeader, BatchRun
from replicad.records.run import MAX_TIMESTAMP


class RollReason(enum.Enum):
    SEGMENT_BYTES = "segment.bytes"
    SEGMENT_MS = "segment.ms"
    INDEX_FULL = "index full"
    OFFSET_OVERFLOW = "relative offset overflow"


@dataclass(frozen=True, slots=True)
class ActiveSegmentState:
    """What the roll rule needs to know about the active segment."""

    base_offset: int
    size: int
    index_entries: int
    time_index_entries: int
    bytes_since_last_index_entry: int
    # Max timestamp of the segment's first batch (Kafka's rollingBasedTimestamp), if any.
    rolling_timestamp: int | None
    created_ms: int


@dataclass(frozen=True, slots=True)
class AppendRun:
    """Batches [start, end) of an append go to one segment, rolled first if `roll` says why."""

    start: int
    end: int
    roll: RollReason | None


def _roll_reason(
    state: ActiveSegmentState,
    size: int,
    entries: int,
    rolling_ts: int | None,
    batch: BatchHeader,
    config: LogConfig,
    now_ms: int,
) -> RollReason | None:
    if size > 0 and size + batch.size > config.segment_bytes:
        return RollReason.SEGMENT_BYTES
    if size > 0:
        if rolling_ts is not None and rolling_ts >= 0:
            waited = batch.max_timestamp - rolling_ts
        else:
            waited = now_ms - state.created_ms
        if waited > config.segment_ms:
            return RollReason.SEGMENT_MS
    max_offset_entries = max(config.segment_index_bytes // OFFSET_ENTRY_SIZE, 1)
    max_time_entries = max(config.segment_index_bytes // TIME_ENTRY_SIZE, 1)
    if entries >= max_offset_entries or entries >= max_time_entries:
        return RollReason.INDEX_FULL
    if not fits_relative(state.base_offset, batch.last_offset):
        return RollReason.OFFSET_OVERFLOW
    return None


def _fits_whole(state: ActiveSegmentState, run: BatchRun, config: LogConfig, now_ms: int) -> bool:
    """Whether no batch of the append can trigger a roll (the common case, decided in O(1)
    for size, index and offsets, one pass in C over timestamps)."""
    total = run.size
    if state.size + total > config.segment_bytes and (state.size > 0 or len(run) > 1):
        return False
    # At most one index entry per index_interval_bytes + 1 bytes, plus one for the carry-over.
    new_entries = (state.bytes_since_last_index_entry + total) // (config.index_interval_bytes + 1)
    entries = max(state.index_entries, state.time_index_entries) + new_entries + 1
    if entries >= min(
        config.segment_index_bytes // TIME_ENTRY_SIZE,
        config.segment_index_bytes // OFFSET_ENTRY_SIZE,
    ):
        return False
    if not fits_relative(state.base_offset, run.last_offset):
        return False
    rolling = run.fields[0][MAX_TIMESTAMP] if state.size == 0 else state.rolling_timestamp
    if rolling is None or rolling < 0:
        return state.size == 0 or now_ms - state.created_ms <= config.segment_ms
    return run.max_timestamp - rolling <= config.segment_ms


def plan_append(
    state: ActiveSegmentState,
    batches: BatchRun | Sequence[BatchHeader],
    config: LogConfig,
    now_ms: int,
) -> list[AppendRun]:
    """Split an append into runs of batches, one per segment (see the roll rule)."""
    run = BatchRun.of(batches)
    if run.fields and _fits_whole(state, run, config, now_ms):
        return [AppendRun(0, len(run), None)]
    # A roll falls inside this append: decided batch by batch, with a header each (rare:
    # once per segment).
    runs: list[AppendRun] = []
    size = state.size
    # Index entries counted conservatively: the larger of the two indexes, and one entry
    # whenever the offset index would get one (the time index gets at most that many).
    entries = max(state.index_entries, state.time_index_entries)
    since = state.bytes_since_last_index_entry
    rolling_ts = state.rolling_timestamp
    start = 0
    reason: RollReason | None = None
    for i, batch in enumerate(run):
        why = _roll_reason(state, size, entries, rolling_ts, batch, config, now_ms)
        if why is not None:
            if i > start or reason is not None:
                runs.append(AppendRun(start, i, reason))
            start, reason = i, why
            state = ActiveSegmentState(batch.base_offset, 0, 0, 0, 0, None, now_ms)
            size, entries, since, rolling_ts = 0, 0, 0, None
        if size == 0:
            rolling_ts = batch.max_timestamp
        if since > config.index_interval_bytes:
            entries += 1
            since = 0
        since += batch.size
        size += batch.size
    if len(run) > start or reason is not None:
        runs.append(AppendRun(start, len(run), reason))
    return runs


def should_flush_messages(unflushed_messages: int, config: LogConfig) -> bool:
    return config.flush_messages is not None and unflushed_messages >= config.flush_messages


def should_flush_time(first_unflushed_ms: int | None, now_ms: int, config: LogConfig) -> bool:
    return (
        config.flush_ms is not None
        and first_unflushed_ms is not None
        and now_ms - first_unflushed_ms >= config.flush_ms
    )


@dataclass(frozen=True, slots=True)
class SegmentSummary:
    base_offset: int
    size: int
    max_timestamp: int


class RetentionReason(enum.Enum):
    RETENTION_MS = "retention.ms"
    RETENTION_BYTES = "retention.bytes"


@dataclass(frozen=True, slots=True)
class RetentionPlan:
    delete: list[int]  # base offsets of segments to delete, oldest first
    reason: RetentionReason | None


def next_retention_ms(segments: Sequence[SegmentSummary], config: LogConfig, now_ms: int) -> float:
    """When the time rule could first delete more of `segments` than it does at `now_ms`:
    the first inactive segment it keeps turns `retention_ms` old (inf: never, while the
    segments stay as they are -- no time rule, no inactive segment kept by time, or one
    without a timestamp, where the rule stops)."""
    if config.retention_ms < 0:
        return math.inf
    for seg in segments[:-1]:
        if seg.max_timestamp < 0:
            return math.inf
        if now_ms - seg.max_timestamp <= config.retention_ms:
            return seg.max_timestamp + config.retention_ms + 1
    return math.inf


def plan_retention(
    segments: Sequence[SegmentSummary], config: LogConfig, now_ms: int
) -> RetentionPlan:
    """Which inactive segments (all but the last of `segments`) retention deletes."""
    inactive = list(segments[:-1])
    if config.retention_ms >= 0:
        expired = []
        for seg in inactive:
            if seg.max_timestamp >= 0 and now_ms - seg.max_timestamp > config.retention_ms:
                expired.append(seg.base_offset)
            else:
                break
        if expired:
            return RetentionPlan(expired, RetentionReason.RETENTION_MS)
    if config.retention_bytes >= 0:
        excess = sum(s.size for s in segments) - config.retention_bytes
        doomed = []
        for seg in inactive:
            if excess - seg.size < 0:
                break
            doomed.append(seg.base_offset)
            excess -= seg.size
        if doomed:
            return RetentionPlan(doomed, RetentionReason.RETENTION_BYTES)
    return RetentionPlan([], None)
