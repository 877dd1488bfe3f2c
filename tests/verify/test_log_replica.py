"""The daemon's replica reader (replicad/verify/log_replica.py) over a real PartitionLog."""

from __future__ import annotations

from pathlib import Path

import pytest

from replicad.log.config import LogConfig
from replicad.log.partition import PartitionLog
from replicad.records.batch import scan_batches
from replicad.types import TopicPartition
from replicad.verify.compare import OffsetRange
from replicad.verify.log_replica import LogReplica, ReplicaMoved
from tools.logdata.batches import batch_stream

TP = TopicPartition("orders", 3)
SMALL = LogConfig(segment_bytes=16 * 1024, index_interval_bytes=1024, segment_index_bytes=2048)


@pytest.fixture
def written(tmp_path: Path) -> tuple[PartitionLog, list[bytes]]:
    log = PartitionLog.create(tmp_path / "orders-3", TP, SMALL, now_ms=0)
    batches = batch_stream(11, 120, epoch_every=40)
    for raw in batches:
        log.append(raw, scan_batches(raw).batches, now_ms=0)
    yield log, batches
    log.close()


def _first(raw: bytes):
    return scan_batches(raw).batches[0]


def test_a_slice_is_every_batch_over_the_offsets_asked_across_segments(written):
    log, batches = written
    assert len(log.segments) > 3
    replica = LogReplica(log, max_bytes=1024)
    assert replica.offsets() == OffsetRange(0, log.log_end_offset)
    headers = [_first(raw) for raw in batches]
    # From inside the 10th batch to inside the 90th: the batches holding both, whole.
    low = headers[10].base_offset + 1
    high = headers[90].last_offset - 1
    got = replica.slice(low, high)
    assert got.unreadable_at is None
    assert [b.data for b in got.batches] == batches[10:91]


def test_the_batch_that_holds_an_offset_is_found(written):
    log, batches = written
    third = _first(batches[3])
    assert LogReplica(log, 1024).batch_start(third.last_offset) == third.base_offset
    assert LogReplica(log, 1024).batch_start(log.log_end_offset) is None


def test_a_damaged_entry_ends_the_slice_where_reading_stopped(written):
    log, batches = written
    victim = _first(batches[5])
    position = sum(len(raw) for raw in batches[:5])  # in the first segment
    with open(log.segments[0].log_path, "r+b") as f:
        # The batch's magic byte: a format no batch has, so the scan stops there.
        f.seek(position + 16)
        f.write(b"\x07")
    got = LogReplica(log, 64 * 1024).slice(0, _first(batches[8]).last_offset)
    assert [b.data for b in got.batches] == batches[:5]
    assert got.unreadable_at == victim.base_offset


def test_a_slice_from_a_damaged_batch_names_it_not_the_next_segment(written):
    """The log refuses the read at a batch whose header is damaged (DamagedLogError): the
    slice ends there, unreadable, instead of holding the next segment's batches (which
    compare.py would have called missing in the replica)."""
    log, batches = written
    second = log.segments[1]
    index = next(
        i for i, raw in enumerate(batches) if _first(raw).base_offset == second.base_offset
    )
    victim = _first(batches[index + 2])
    position = sum(len(raw) for raw in batches[index : index + 2])
    with open(second.log_path, "r+b") as f:
        f.seek(position + 16)  # the magic byte
        f.write(b"\x07")
    replica = LogReplica(log, 64 * 1024)
    got = replica.slice(victim.base_offset, victim.last_offset)
    assert got.batches == []
    assert got.unreadable_at == victim.base_offset
    assert "magic" in got.unreadable_detail
    assert replica.batch_start(victim.base_offset) == victim.base_offset


def test_retention_passing_the_offset_asked_is_the_replica_moving_not_a_result(written):
    log, _ = written
    replica = LogReplica(log, 1024)
    log.maybe_increment_log_start_offset(log.segments[2].base_offset)
    with pytest.raises(ReplicaMoved):
        replica.slice(0, 10)
    assert replica.offsets().start == log.segments[0].base_offset
