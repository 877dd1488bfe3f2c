"""How far a micro-batch reads: Spark Kafka source JSON, limits, data loss (no Spark)."""

from __future__ import annotations

import json

from replicad.spark.admission import (
    Available,
    Limits,
    TriggerDelay,
    from_json,
    next_ends,
    pending,
    start_of,
    to_json,
    truncation,
)
from replicad.types import TopicPartition

A0, A1, B0 = TopicPartition("a", 0), TopicPartition("a", 1), TopicPartition("b", 0)


def no_bytes(*_: object) -> int:
    raise AssertionError("bytes asked for without maxBytesPerTrigger")


def test_offsets_are_spark_kafka_json_sorted_by_topic_and_partition_number():
    offsets = {B0: 7, TopicPartition("a", 10): 3, TopicPartition("a", 2): 5}
    text = json.dumps(to_json(offsets))
    assert text == '{"a": {"2": 5, "10": 3}, "b": {"0": 7}}'
    assert from_json(json.loads(text)) == offsets


def test_without_limits_every_partition_ends_at_its_readable_end():
    ends = next_ends(
        {A0: 0, A1: 5}, {A0: 100, A1: 9}, None, offset_after_bytes=no_bytes, bytes_between=no_bytes
    )
    assert ends == {A0: 100, A1: 9}


def test_max_offsets_are_shared_in_proportion_as_spark_kafka_does():
    begins, ends = {A0: 0, A1: 0, B0: 10}, {A0: 300, A1: 100, B0: 11}
    chosen = next_ends(
        begins, ends, Limits(max_offsets=100), offset_after_bytes=no_bytes, bytes_between=no_bytes
    )
    # 300/401 and 100/401 of 100 round down; B0's share (0.25) rounds up to one offset.
    assert chosen == {A0: 74, A1: 24, B0: 11}
    assert pending(begins, chosen) <= 100 + len(chosen)


def test_max_bytes_become_offsets_through_the_callers_index():
    sizes = {A0: 1000, A1: 3000}
    asked = []

    def after(tp, begin, budget):
        asked.append((tp, begin, budget))
        return begin + budget // 10  # 10 bytes per record

    chosen = next_ends(
        {A0: 0, A1: 0},
        {A0: 100, A1: 300},
        Limits(max_bytes=400),
        offset_after_bytes=after,
        bytes_between=lambda tp, a, b: sizes[tp],
    )
    assert asked == [(A0, 0, 100), (A1, 0, 300)]
    assert chosen == {A0: 10, A1: 30}


def test_a_byte_budget_below_one_batch_still_moves():
    chosen = next_ends(
        {A0: 5},
        {A0: 100},
        Limits(max_bytes=1),
        offset_after_bytes=lambda tp, begin, budget: begin,
        bytes_between=lambda tp, a, b: 10_000,
    )
    assert chosen == {A0: 6}


def test_min_offsets_wait_for_the_delay_then_a_batch_resets_it():
    limits = Limits(min_offsets=100, max_trigger_delay_ms=1000)
    delay = TriggerDelay()
    assert not delay.admits(10, limits, now_ms=0)
    assert not delay.admits(10, limits, now_ms=999)
    assert delay.admits(10, limits, now_ms=1000)
    delay.batch_planned(1000)
    assert not delay.admits(50, limits, now_ms=1500)
    assert delay.admits(100, limits, now_ms=1500)
    assert TriggerDelay().admits(0, Limits(), now_ms=0)


def test_start_below_the_log_start_is_data_loss_named_by_partition_and_offsets():
    begin, loss = start_of(A0, {A0: 10}, Available(log_start=50, end=80), joined=False)
    assert begin == 50
    assert loss is not None and loss.count == 40
    assert loss.line().startswith("data lost in a-0: offsets 10..49 (deleted by retention")


def test_a_partition_joining_later_starts_at_its_log_start():
    assert start_of(A1, {A0: 3}, Available(0, 10), joined=True) == (0, None)
    begin, loss = start_of(A1, {A0: 3}, Available(20, 30), joined=True)
    assert begin == 20 and loss is not None and (loss.first, loss.end) == (0, 20)
    # Present when the stream began: no loss, whatever its log start.
    assert start_of(A1, {}, Available(20, 30), joined=False) == (20, None)


def test_a_readable_end_below_the_position_is_a_truncation():
    assert truncation(A0, 40, Available(0, 40)) is None
    loss = truncation(A0, 40, Available(0, 35))
    assert loss is not None and (loss.first, loss.end) == (35, 40)
    assert "truncated" in loss.line()
