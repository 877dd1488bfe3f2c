"""Roll, flush and retention decisions."""

from __future__ import annotations

from replicad.log.config import LogConfig
from replicad.log.policy import (
    ActiveSegmentState,
    AppendRun,
    RetentionReason,
    RollReason,
    SegmentSummary,
    plan_append,
    plan_retention,
    should_flush_messages,
    should_flush_time,
)
from replicad.records.batch import BatchHeader, scan_batches
from tools.logdata.batches import producer_batch


def _batches(count: int, *, first_offset: int = 0, ts_step: int = 0) -> list[BatchHeader]:
    data = b"".join(
        producer_batch(first_offset + 10 * i, [b"v" * 90] * 10, timestamp_ms=1000 + ts_step * i)
        for i in range(count)
    )
    return scan_batches(data).batches


def _empty(base: int = 0) -> ActiveSegmentState:
    return ActiveSegmentState(base, 0, 0, 0, 0, None, 0)


def test_everything_fits_in_one_run() -> None:
    batches = _batches(5)
    assert plan_append(_empty(), batches, LogConfig(), 0) == [AppendRun(0, 5, None)]


def test_rolls_on_segment_bytes_per_batch() -> None:
    batches = _batches(5)
    config = LogConfig(segment_bytes=2 * batches[0].size + 10)
    runs = plan_append(_empty(), batches, config, 0)
    assert runs == [
        AppendRun(0, 2, None),
        AppendRun(2, 4, RollReason.SEGMENT_BYTES),
        AppendRun(4, 5, RollReason.SEGMENT_BYTES),
    ]


def test_never_rolls_an_empty_segment_for_size() -> None:
    batches = _batches(1)
    config = LogConfig(segment_bytes=10)
    assert plan_append(_empty(), batches, config, 0) == [AppendRun(0, 1, None)]


def test_rolls_on_segment_ms_by_record_time_then_by_clock() -> None:
    batches = _batches(3, ts_step=600)
    config = LogConfig(segment_ms=1000)
    runs = plan_append(_empty(), batches, config, 0)
    # Batch 2 is 1200 ms after the segment's first batch.
    assert runs == [AppendRun(0, 2, None), AppendRun(2, 3, RollReason.SEGMENT_MS)]
    no_timestamps = ActiveSegmentState(0, 100, 0, 0, 0, -1, created_ms=0)
    assert plan_append(no_timestamps, batches[:1], config, now_ms=999)[0].roll is None
    assert (
        plan_append(no_timestamps, batches[:1], config, now_ms=1001)[0].roll
        is RollReason.SEGMENT_MS
    )


def test_rolls_when_index_full_and_on_offset_overflow() -> None:
    batches = _batches(40)
    config = LogConfig(index_interval_bytes=1, segment_index_bytes=5 * 12)
    runs = plan_append(_empty(), batches, config, 0)
    assert all(r.roll in (None, RollReason.INDEX_FULL) for r in runs)
    assert len(runs) > 1
    far = _batches(1, first_offset=2**31 + 5)
    assert plan_append(_empty(0), far, LogConfig(), 0) == [
        AppendRun(0, 1, RollReason.OFFSET_OVERFLOW)
    ]


def test_flush_rules() -> None:
    assert not should_flush_messages(10**9, LogConfig())
    assert should_flush_messages(5, LogConfig(flush_messages=5))
    assert not should_flush_messages(4, LogConfig(flush_messages=5))
    assert not should_flush_time(0, 10**12, LogConfig())
    assert should_flush_time(100, 1100, LogConfig(flush_ms=1000))
    assert not should_flush_time(None, 1100, LogConfig(flush_ms=1000))


def test_retention_by_time_and_by_size_never_the_active_segment() -> None:
    segments = [
        SegmentSummary(0, 100, 1_000),
        SegmentSummary(10, 100, 2_000),
        SegmentSummary(20, 100, 9_000),
        SegmentSummary(30, 100, 1_000),  # active: never deleted
    ]
    by_time = plan_retention(segments, LogConfig(retention_ms=5_000), now_ms=8_000)
    assert by_time.delete == [0, 10] and by_time.reason is RetentionReason.RETENTION_MS
    by_size = plan_retention(segments, LogConfig(retention_bytes=250), now_ms=0)
    assert by_size.delete == [0] and by_size.reason is RetentionReason.RETENTION_BYTES
    assert plan_retention(segments, LogConfig(retention_bytes=0), now_ms=0).delete == [0, 10, 20]
    assert plan_retention(segments, LogConfig(), now_ms=10**12).delete == []
