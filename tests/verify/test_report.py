"""What `verify --against-source` prints and exits with (replicad/verify/report.py)."""

from __future__ import annotations

import json

from replicad.types import TopicPartition
from replicad.verify.compare import Kind, Mismatch, OffsetRange, PartitionResult
from replicad.verify.report import (
    EXIT_CLEAN,
    EXIT_MISMATCH,
    EXIT_UNVERIFIED,
    dumps,
    exit_code,
    partition_line,
    summary_line,
)


def result(**kwargs) -> PartitionResult:
    values = dict(tp=TopicPartition("t", 0), replica=OffsetRange(0, 100), verified_to=100)
    values.update(kwargs)
    return PartitionResult(**values)


def test_retention_and_the_not_yet_replicated_tail_are_said_but_clean():
    r = result(
        gone_at_source=[OffsetRange(0, 40)],
        not_at_source=OffsetRange(90, 100),
        batches_compared=7,
        bytes_compared=700,
    )
    line = partition_line(r)
    assert line.startswith("t-0: ok")
    assert "no longer at the source (retention): 0..39" in line
    assert "not at the source yet (past its high watermark): 90..99" in line
    assert exit_code([r]) == EXIT_CLEAN


def test_a_mismatch_names_its_offset_and_exits_1_before_an_unverified_partition():
    bad = result(mismatches=[Mismatch(42, 44, Kind.DIFFERENT_BYTES, "first difference at byte 9")])
    unverified = result(tp=TopicPartition("t", 1), unverified="at offset 3: no leader")
    assert "t-0: MISMATCH" in partition_line(bad)
    assert "offset 42..44: different_bytes: first difference at byte 9" in partition_line(bad)
    assert exit_code([unverified]) == EXIT_UNVERIFIED
    assert exit_code([bad, unverified]) == EXIT_MISMATCH
    assert "1 mismatches, 1 not compared to the end" in summary_line([bad, unverified], seed=None)


def test_the_json_holds_every_field_and_the_seed():
    r = result(sample=(3, 9), batches_compared=2, rewritten_at_source=[OffsetRange(5, 8)])
    report = json.loads(dumps([r], seed=17))
    assert report["sample_seed"] == 17 and report["exit_code"] == EXIT_CLEAN
    (entry,) = report["partitions"]
    assert entry["sample"] == [3, 9]
    assert entry["rewritten_at_source"] == [{"start": 5, "end": 8}]
    assert entry["not_at_source"] == [] and entry["clean"] is True
    assert "2 of 2 sampled batches compared" in partition_line(r)
