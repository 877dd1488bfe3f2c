"""The continuous check's bookkeeping (replicad/verify/progress.py), pass by pass."""

from __future__ import annotations

from replicad.types import TopicPartition
from replicad.verify.compare import Kind, Mismatch, OffsetRange, PartitionResult
from replicad.verify.progress import MAX_KEPT, VerifyProgress, Walk

A = TopicPartition("a", 0)
B = TopicPartition("b", 1)


def result(tp, start, end, verified_to, **fields) -> PartitionResult:
    return PartitionResult(tp, OffsetRange(start, end), verified_to, **fields)


def mismatch(offset: int) -> Mismatch:
    return Mismatch(offset, offset + 2, Kind.DIFFERENT_BYTES, "first difference at byte 70")


def test_a_first_pass_walks_every_partition_from_its_log_start():
    progress = VerifyProgress()
    walks = progress.plan({B: OffsetRange(5, 9), A: OffsetRange(0, 100)})
    assert walks == [Walk(A, OffsetRange(0, 100), 0), Walk(B, OffsetRange(5, 9), 5)]


def test_the_next_pass_walks_only_what_is_new_and_skips_partitions_with_nothing_new():
    progress = VerifyProgress()
    progress.plan({A: OffsetRange(0, 100), B: OffsetRange(0, 10)})
    progress.walked(result(A, 0, 100, 100, batches_compared=5))
    progress.walked(result(B, 0, 10, 10))
    assert progress.plan({A: OffsetRange(0, 150), B: OffsetRange(0, 10)}) == [
        Walk(A, OffsetRange(0, 150), 100)
    ]
    (row, _) = progress.snapshot()["partitions"]
    assert row["verified_offset"] == 100 and row["unverified_offsets"] == 50


def test_offsets_past_the_sources_high_watermark_are_walked_again_not_failed():
    progress = VerifyProgress()
    progress.plan({A: OffsetRange(0, 100)})
    progress.walked(result(A, 0, 100, 80, not_at_source=OffsetRange(80, 100)))
    assert progress.plan({A: OffsetRange(0, 100)}) == [Walk(A, OffsetRange(0, 100), 80)]
    assert progress.snapshot()["mismatches_total"] == 0


def test_local_retention_moves_the_verified_offset_up_to_the_log_start():
    progress = VerifyProgress()
    progress.plan({A: OffsetRange(0, 100)})
    progress.walked(result(A, 0, 100, 40, unverified="at offset 40: the source is down"))
    assert progress.plan({A: OffsetRange(60, 120)}) == [Walk(A, OffsetRange(60, 120), 60)]


def test_a_mismatch_stays_an_error_and_is_counted_once():
    progress = VerifyProgress()
    progress.plan({A: OffsetRange(0, 100)})
    new = progress.walked(result(A, 0, 100, 100, mismatches=[mismatch(30)]))
    assert new == [mismatch(30)]
    # A re-check finds it again: not new, not counted twice.
    assert progress.walked(result(A, 0, 100, 0, mismatches=[mismatch(30)]), sampled=True) == []
    progress.plan({A: OffsetRange(0, 200)})
    progress.walked(result(A, 100, 200, 200))
    snap = progress.snapshot()
    assert snap["mismatches_total"] == 1 and snap["partitions_mismatched"] == 1
    (row,) = snap["partitions"]
    assert row["mismatches"] == [
        {"offset": 30, "last_offset": 32, "kind": "different_bytes", "detail": mismatch(30).detail}
    ]


def test_mismatches_past_the_first_few_are_counted_not_kept():
    progress = VerifyProgress()
    progress.plan({A: OffsetRange(0, 1000)})
    many = [mismatch(10 * i) for i in range(MAX_KEPT + 5)]
    assert len(progress.walked(result(A, 0, 1000, 1000, mismatches=many))) == MAX_KEPT + 5
    (row,) = progress.snapshot()["partitions"]
    assert row["mismatch_count"] == MAX_KEPT + 5 and len(row["mismatches"]) == MAX_KEPT


def test_retention_at_the_source_and_the_cleaner_are_counted_never_errors():
    progress = VerifyProgress()
    progress.plan({A: OffsetRange(0, 100)})
    progress.walked(
        result(
            A,
            0,
            100,
            100,
            gone_at_source=[OffsetRange(0, 20)],
            rewritten_at_source=[OffsetRange(40, 43)],
        )
    )
    snap = progress.snapshot()
    (row,) = snap["partitions"]
    assert (row["gone_at_source"], row["rewritten_at_source"]) == (20, 3)
    assert snap["mismatches_total"] == 0


def test_only_the_named_topics_and_partitions_still_replicated_are_kept():
    progress = VerifyProgress(topics=["a"])
    assert [w.tp for w in progress.plan({A: OffsetRange(0, 1), B: OffsetRange(0, 1)})] == [A]
    progress.plan({})
    assert progress.snapshot()["partitions"] == []


def test_rechecks_are_drawn_below_the_verified_offset_and_repeat_from_their_seed():
    progress = VerifyProgress(sample=5)
    progress.plan({A: OffsetRange(10, 1000)})
    assert progress.sample_offsets(A, seed=7) == []  # nothing verified yet
    progress.walked(result(A, 10, 1000, 500))
    drawn = progress.sample_offsets(A, seed=7)
    assert drawn == progress.sample_offsets(A, seed=7) and drawn == sorted(drawn)
    assert 1 <= len(drawn) <= 5 and all(10 <= o < 500 for o in drawn)
    assert VerifyProgress(sample=0).sample_offsets(A, seed=7) == []


def test_a_pass_is_counted_with_its_time_and_a_problem_shown():
    progress = VerifyProgress()
    progress.problem = "the source cannot be asked: connection refused"
    progress.pass_done(now_ms=1234)
    snap = progress.snapshot()
    assert (snap["passes"], snap["last_pass_ms"], snap["problem"]) == (
        1,
        1234,
        "the source cannot be asked: connection refused",
    )


def test_saved_offsets_are_held_at_the_first_mismatch_and_resume_the_walk():
    progress = VerifyProgress()
    progress.plan({A: OffsetRange(0, 100), B: OffsetRange(0, 50)})
    progress.walked(result(A, 0, 100, 100, mismatches=[mismatch(70), mismatch(30)]))
    progress.walked(result(B, 0, 50, 40))
    saved = progress.checkpoint()
    assert saved == {A: 30, B: 40}

    after_restart = VerifyProgress()
    after_restart.resume(saved)
    # A: walked again from its first mismatch (found again); B: from where it got. A saved
    # offset past the log end (the replica lost its tail) counts up to the log end.
    assert after_restart.plan({A: OffsetRange(0, 120), B: OffsetRange(0, 35)}) == [
        Walk(A, OffsetRange(0, 120), 30)
    ]
    assert after_restart.checkpoint() == {A: 30, B: 35}
