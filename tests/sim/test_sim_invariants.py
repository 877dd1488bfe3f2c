"""Each invariant of tools/sim fails on what it is meant to catch, and passes otherwise."""

from __future__ import annotations

import uuid

import pytest

from replicad.types import TopicPartition
from tools.logdata.batches import producer_batch
from tools.sim.cluster import History, SimBatch
from tools.sim.invariants import (
    HighWatermarkWatch,
    InvariantError,
    LogFacts,
    batches_from,
    check_lineage,
    check_response_size,
)

TP = TopicPartition("t", 0)
TID = uuid.UUID(int=1)


def _history(*lineages: list[bytes]) -> History:
    history = History()
    for lineage in lineages:
        parent = b""
        for data in lineage:
            history.record(TID, 0, SimBatch(0, 1, 0, data), parent)
            parent = data
    return history


def _batch(offset: int, epoch: int, tag: bytes) -> bytes:
    return producer_batch(offset, [tag], leader_epoch=epoch)


A0, A1, A2 = _batch(0, 0, b"a0"), _batch(1, 0, b"a1"), _batch(2, 0, b"a2")
B2 = _batch(2, 1, b"b2")  # an unclean election's new leader wrote offset 2 anew


def test_a_prefix_of_a_lineage_passes_from_any_start():
    history = _history([A0, A1, A2], [A0, A1, B2])
    check_lineage(TP, A0 + A1 + A2, TID, history)
    check_lineage(TP, A1 + B2, TID, history)
    check_lineage(TP, b"", TID, history)


def test_a_kept_divergent_tail_fails():
    # B2 follows A1 in its leader's log; A2 + B2 mixes two lineages (offsets do not even
    # line up: a gap check would name it too), so build one that lines up.
    b3 = _batch(3, 1, b"b3")
    history = _history([A0, A1, A2], [A0, A1, B2, b3])
    with pytest.raises(InvariantError, match="does not follow"):
        check_lineage(TP, A0 + A1 + A2 + b3, TID, history)


def test_a_batch_no_leader_wrote_fails_and_so_does_another_topics():
    history = _history([A0, A1])
    corrupt = bytearray(A1)
    corrupt[-1] ^= 1
    with pytest.raises(InvariantError):
        check_lineage(TP, A0 + bytes(corrupt), TID, history)
    with pytest.raises(InvariantError, match="never written"):
        check_lineage(TP, A0, uuid.UUID(int=2), history)


def test_a_gap_or_overlap_fails():
    history = _history([A0, A1, A2])
    with pytest.raises(InvariantError, match="gap or overlap"):
        check_lineage(TP, A0 + A2, TID, history)


def test_batches_from_an_offset():
    assert batches_from(A0 + A1 + A2, 1) == A1 + A2
    assert batches_from(A0 + A1, 5) == b""


def test_the_high_watermark_may_not_move_back_without_a_truncation():
    watch = HighWatermarkWatch()
    watch.check({TP: LogFacts(0, 10, 8)}, "a")
    watch.check({TP: LogFacts(0, 12, 9)}, "b")
    with pytest.raises(InvariantError, match="moved back"):
        watch.check({TP: LogFacts(0, 12, 0)}, "checkpoint")


def test_a_truncation_below_it_lowers_it():
    watch = HighWatermarkWatch()
    watch.check({TP: LogFacts(0, 10, 8)}, "a")
    watch.saw_end(TP, 5, 0)  # truncated to 5, then appended up to 12 in the same event
    watch.check({TP: LogFacts(0, 12, 5)}, "turn")
    with pytest.raises(InvariantError, match="outside"):
        watch.check({TP: LogFacts(0, 12, 13)}, "turn")


def test_a_response_must_fit_the_pool_unless_it_is_one_batch():
    check_response_size(900, [800], 1_000, 1_000)
    check_response_size(5_000, [4_900], 1_000, 1_000)  # KIP-74: one batch over the limit
    with pytest.raises(InvariantError, match="does not fit"):
        check_response_size(5_000, [2_000, 2_900], 1_000, 1_000)


def test_below_what_retention_deleted_upstream_a_lineage_break_is_not_asked_of_the_follower():
    """An unclean election, then retention past the divergence: the leader's epoch cache
    starts at its new log start and cannot tell the follower that its older data came from
    another lineage (Kafka's cannot either). The replica keeps it (log.retention -1)."""
    b6 = _batch(3, 1, b"b3")
    history = _history(
        [A0, A1, A2], [_batch(0, 1, b"x0"), _batch(1, 1, b"x1"), _batch(2, 1, b"x2"), b6]
    )
    with pytest.raises(InvariantError, match="does not follow"):
        check_lineage(TP, A0 + A1 + A2 + b6, TID, history)
    history.retain(TID, 0, 3)
    check_lineage(TP, A0 + A1 + A2 + b6, TID, history)


# -- rules 7 and 8: what a checkpoint may name -------------------------------------------


def _log(tmp_path, *epochs: int):
    from replicad.log.config import LogConfig
    from replicad.log.partition import PartitionLog
    from replicad.records.batch import scan_batches

    plog = PartitionLog.create(tmp_path / "t-0", TP, LogConfig(), now_ms=0)
    plog.disk_later = lambda job, what, key: None  # epoch files written late, never here
    for offset, epoch in enumerate(epochs):
        raw = _batch(offset, epoch, b"x%d" % offset)
        plog.append(raw, scan_batches(raw).batches, now_ms=0)
    return plog


def test_the_fsync_witness_sees_only_what_was_synced_and_a_rewrite_as_new(tmp_path):
    from tools.sim.invariants import FsyncWitness

    witness = FsyncWitness()
    with witness:
        plog = _log(tmp_path, 0, 0)
        assert witness.durable_end(plog) == 0
        plog.flush()
        assert witness.durable_end(plog) == 2
        plog.truncate_to(1)
        raw = _batch(1, 1, b"other")  # offset 1 written again, not synced
        from replicad.records.batch import scan_batches

        plog.append(raw, scan_batches(raw).batches, now_ms=0)
        assert witness.durable_end(plog) == 1
    assert witness._depth == 0


def test_an_epoch_file_behind_the_checkpointed_recovery_point_is_caught(tmp_path):
    from tools.sim.invariants import check_epoch_file

    plog = _log(tmp_path, 0, 3)  # the file is still empty: both entries are late
    check_epoch_file(TP, plog, 0)  # nothing below a checkpointed recovery point
    with pytest.raises(InvariantError, match="batch at 0 is of leader epoch 0"):
        check_epoch_file(TP, plog, 2)
    plog.save_epochs()
    check_epoch_file(TP, plog, 2)


def test_the_durable_bytes_of_a_segment_file_end_at_its_first_unsynced_batch(tmp_path):
    from tools.sim.invariants import FsyncWitness

    witness = FsyncWitness()
    with witness:
        plog = _log(tmp_path, 0, 0)
        path = plog.active_segment.log_path
        assert witness.durable_bytes(path) == 0
        plog.flush()
        synced = path.stat().st_size
        assert witness.durable_bytes(path) == synced
        raw = _batch(2, 0, b"x2")
        from replicad.records.batch import scan_batches

        plog.append(raw, scan_batches(raw).batches, now_ms=0)
        assert witness.durable_bytes(path) == synced < path.stat().st_size


def _halted(end: int, topic_id: uuid.UUID = TID):
    from types import SimpleNamespace

    return SimpleNamespace(log_end_offset=end, topic_id=topic_id)


def test_a_gap_halt_needs_a_leader_that_started_above_the_local_log_end():
    from tools.sim.invariants import judge_halt

    history = History()
    history.retain(TID, 0, 5)
    judge_halt(TP, "gap: leader starts at 5, local log ends at 3", _halted(3), {}, history)
    with pytest.raises(InvariantError, match="no leader's log ever started above"):
        judge_halt(TP, "gap: leader starts at 5, local log ends at 5", _halted(5), {}, history)


def test_another_lineage_needs_a_leader_batch_across_the_local_log_end():
    from tools.sim.invariants import judge_halt

    across = producer_batch(1, [b"b1", b"b2", b"b3"], leader_epoch=1)  # offsets 1..3
    history = _history([A0, across])
    reason = "another lineage: the leader's batch at offsets 1..3 holds our log end 2"
    judge_halt(TP, reason, _halted(2), {}, history)
    for end in (1, 4):  # at its start or past it: nothing holds the end from below
        with pytest.raises(InvariantError, match="ever wrote a batch that starts below"):
            judge_halt(TP, reason, _halted(end), {}, history)


def test_a_recreated_topic_halt_needs_another_topic_id_and_unknown_reasons_fail():
    from tools.sim.invariants import judge_halt

    reason = "topic recreated upstream (topic id differs from the replica's)"
    judge_halt(TP, reason, _halted(0), {"t": uuid.UUID(int=2)}, History())
    judge_halt(TP, reason, _halted(0), {}, History())  # deleted, not re-created yet
    with pytest.raises(InvariantError, match="still the log's"):
        judge_halt(TP, reason, _halted(0), {"t": TID}, History())
    with pytest.raises(InvariantError, match="cannot judge"):
        judge_halt(TP, "opening the log failed", _halted(0), {}, History())
