"""Reading a Fetch's partitions: KIP-74's budget as Kafka's readFromLog applies it, the
reader's bound (log end, high watermark, last stable offset), errors and divergence."""

from __future__ import annotations

import random

import pytest
from kio.schema.errors import ErrorCode

from replicad.leader.catalog import Catalog
from replicad.leader.reads import (
    FoldWouldWait,
    Isolation,
    PartitionAnswer,
    ReadLimits,
    RecordBytes,
    TransactionTracker,
    plan_reads,
    read_partitions,
)
from replicad.leader.transactions import AbortedTransaction
from replicad.log.manager import LogManager
from replicad.log.nowait import WouldWait, not_waiting
from replicad.log.segment import LogSegment
from replicad.records.batch import BatchHeader, scan_batches
from replicad.records.records import ControlType
from replicad.session.metadata import PartitionFetch
from replicad.types import TopicPartition
from tests.page_cache import cached, dropped
from tools.logdata.batches import producer_batch

A, B, C = TopicPartition("t", 0), TopicPartition("t", 1), TopicPartition("t", 2)
BIG = 1 << 30


def batches(first: int, count: int, value_bytes: int, *, epoch: int = 0) -> list[bytes]:
    """`count` one-record batches of about `value_bytes` each, from offset `first`."""
    return [
        producer_batch(first + i, [bytes(value_bytes)], leader_epoch=epoch) for i in range(count)
    ]


def fetch(offset: int = 0, max_bytes: int = BIG, **kwargs: int) -> PartitionFetch:
    return PartitionFetch(fetch_offset=offset, log_start_offset=-1, max_bytes=max_bytes, **kwargs)


def read(
    logs: LogManager,
    reads: list[tuple[TopicPartition, PartitionFetch]],
    *,
    max_bytes: int = BIG,
    isolation: Isolation = Isolation.HIGH_WATERMARK,
    version: int = 12,
    tracker: TransactionTracker | None = None,
) -> list[PartitionAnswer]:
    catalog = Catalog(logs, rng=random.Random(0))
    limits = ReadLimits(max_bytes, isolation, hard_max_bytes_limit=version <= 2)
    return read_partitions(catalog, reads, limits, tracker or TransactionTracker(), now_ms=0)


def offsets_in(answer: PartitionAnswer) -> list[int]:
    """Offsets of the whole batches a client finds in the answer's records."""
    if answer.records is None:
        return []
    records = answer.records
    data = records if isinstance(records, bytes) else records.read_bytes()
    scan = scan_batches(data, verify_crc=False)
    return [b.base_offset for b in scan.batches]


def size_of(batch: bytes) -> int:
    return len(batch)


# -- KIP-74 -----------------------------------------------------------------------------------


def test_the_first_partition_with_data_returns_a_whole_batch_above_every_limit(logs, fill) -> None:
    fill(logs, A, [])
    fill(logs, B, batches(0, 3, 5000))
    fill(logs, C, batches(0, 3, 100))
    answers = read(logs, [(A, fetch()), (B, fetch(max_bytes=10)), (C, fetch())], max_bytes=20)
    assert answers[0].records_size == 0
    assert offsets_in(answers[1]) == [0]  # one whole batch, far above 10 and 20 bytes
    assert answers[2].records_size == 0  # the budget is spent: limits hold again
    assert answers[2].more_data


def test_the_budget_shrinks_partition_by_partition(logs, fill) -> None:
    one = size_of(batches(0, 1, 1000)[0])
    for tp in (A, B, C):
        fill(logs, tp, batches(0, 5, 1000))
    answers = read(
        logs,
        [(A, fetch(max_bytes=2 * one)), (B, fetch(max_bytes=2 * one)), (C, fetch())],
        max_bytes=3 * one,
    )
    assert [a.records_size for a in answers] == [2 * one, one, 0]
    assert [offsets_in(a) for a in answers] == [[0, 1], [0], []]


def test_a_partial_trailing_batch_is_sent_as_kafka_slices_it(logs, fill) -> None:
    one = size_of(batches(0, 1, 1000)[0])
    fill(logs, A, batches(0, 5, 1000))
    [answer] = read(logs, [(A, fetch(max_bytes=one + one // 2))])
    assert answer.records_size == one + one // 2
    assert offsets_in(answer) == [0]


def test_v3_and_later_answer_nothing_for_a_batch_larger_than_what_is_left(logs, fill) -> None:
    fill(logs, A, batches(0, 1, 100))
    fill(logs, B, batches(0, 2, 5000))
    small = size_of(batches(0, 1, 100)[0])
    answers = read(logs, [(A, fetch()), (B, fetch())], max_bytes=small + 1000)
    assert offsets_in(answers[0]) == [0]
    assert answers[1].records is None and answers[1].more_data
    assert answers[1].error_code == ErrorCode.none


def test_v0_to_v2_send_the_cut_off_start_of_a_batch_and_never_more_than_the_limit(
    logs, fill
) -> None:
    fill(logs, A, batches(0, 2, 5000))
    [answer] = read(logs, [(A, fetch(max_bytes=300))], version=2)
    assert answer.records_size == 300  # no "min one message" before v3
    assert offsets_in(answer) == []


def test_a_spent_budget_reads_nothing_more(logs, fill) -> None:
    fill(logs, A, batches(0, 2, 500))
    fill(logs, B, batches(0, 2, 500))
    answers = read(logs, [(A, fetch()), (B, fetch())], max_bytes=1)
    assert offsets_in(answers[0]) == [0]
    assert answers[1].records is None


# -- the reader's bound -----------------------------------------------------------------------


def test_consumers_stop_at_the_high_watermark_followers_at_the_log_end(logs, fill) -> None:
    fill(logs, A, batches(0, 5, 200), hw=3)
    [consumer] = read(logs, [(A, fetch())])
    [follower] = read(logs, [(A, fetch())], isolation=Isolation.LOG_END)
    assert offsets_in(consumer) == [0, 1, 2]
    assert offsets_in(follower) == [0, 1, 2, 3, 4]
    assert (consumer.high_watermark, consumer.log_start_offset) == (3, 0)


def test_a_consumer_at_the_high_watermark_gets_nothing_and_no_error(logs, fill) -> None:
    fill(logs, A, batches(0, 5, 200), hw=3)
    [at_hw] = read(logs, [(A, fetch(3))])
    [past_end] = read(logs, [(A, fetch(6))])
    [at_end] = read(logs, [(A, fetch(5))], isolation=Isolation.LOG_END)
    assert (at_hw.error_code, at_hw.records, at_hw.more_data) == (ErrorCode.none, None, False)
    assert past_end.error_code == ErrorCode.offset_out_of_range
    assert (at_end.error_code, at_end.records) == (ErrorCode.none, None)


def test_a_damaged_batch_answers_corrupt_message_not_the_data_after_it(logs, fill) -> None:
    """Kafka's read raises CorruptRecordException where the segment's bytes are no batch, and
    the Fetch answers CORRUPT_MESSAGE; passing over it would serve later data as if the
    damaged batches were not there (or nothing, at the log's last segment)."""
    written = batches(0, 6, 200)
    plog = fill(logs, A, written)
    position = sum(len(b) for b in written[:3])
    with open(plog.active_segment.log_path, "r+b") as f:
        f.seek(position + 16)  # the magic byte of batch 3
        f.write(b"\x07")
    [damaged] = read(logs, [(A, fetch(3))])
    [before] = read(logs, [(A, fetch(0, max_bytes=len(written[0])))])
    assert damaged.error_code == ErrorCode.corrupt_message
    assert damaged.records is None
    assert (before.error_code, offsets_in(before)) == (ErrorCode.none, [0])
    assert plog.damaged_reads == 1


def test_a_high_watermark_inside_a_batch_holds_that_batch_back(logs, fill) -> None:
    fill(logs, A, [producer_batch(0, [b"a", b"b", b"c"]), producer_batch(3, [b"d"])], hw=2)
    [answer] = read(logs, [(A, fetch())])
    assert answer.records is None


def test_read_committed_stops_at_the_last_stable_offset_and_lists_aborted_transactions(
    logs, fill, txn
) -> None:
    fill(
        logs,
        A,
        [
            producer_batch(0, [b"plain"]),
            txn.data(1, [b"aborted-1", b"aborted-2"], producer_id=11),
            txn.marker(3, producer_id=11, control_type=ControlType.ABORT),
            txn.data(4, [b"open"], producer_id=12),
            producer_batch(5, [b"after"]),
        ],
    )
    [committed] = read(logs, [(A, fetch())], isolation=Isolation.TXN_COMMITTED)
    assert committed.last_stable_offset == 4
    assert offsets_in(committed) == [0, 1, 3]
    assert committed.aborted == (AbortedTransaction(1, 11, 3),)
    [uncommitted] = read(logs, [(A, fetch())])
    assert offsets_in(uncommitted) == [0, 1, 3, 4, 5]
    assert uncommitted.aborted is None


def test_the_transaction_fold_starts_over_after_a_truncation(logs, fill, txn) -> None:
    plog = fill(logs, A, [txn.data(0, [b"x"], producer_id=5)])
    tracker = TransactionTracker()
    [first] = read(logs, [(A, fetch())], isolation=Isolation.TXN_COMMITTED, tracker=tracker)
    assert first.last_stable_offset == 0
    plog.truncate_to(0)
    fill(logs, A, [producer_batch(0, [b"y"])])  # the same offsets, other batches
    [again] = read(logs, [(A, fetch())], isolation=Isolation.TXN_COMMITTED, tracker=tracker)
    assert again.last_stable_offset == 1
    assert offsets_in(again) == [0]


# -- errors and divergence --------------------------------------------------------------------


def test_errors_carry_no_offsets_and_no_records(logs, fill) -> None:
    fill(logs, A, batches(0, 2, 10, epoch=3))
    answers = read(
        logs,
        [
            (TopicPartition("nope", 0), fetch()),
            (A, fetch(current_leader_epoch=2)),
            (A, fetch(current_leader_epoch=4)),
            (A, fetch(9)),
        ],
    )
    assert [a.error_code for a in answers] == [
        ErrorCode.unknown_topic_or_partition,
        ErrorCode.fenced_leader_epoch,
        ErrorCode.unknown_leader_epoch,
        ErrorCode.offset_out_of_range,
    ]
    assert all((a.records, a.high_watermark, a.log_start_offset) == (None, -1, -1) for a in answers)
    [ok] = read(logs, [(A, fetch(current_leader_epoch=3))])
    assert offsets_in(ok) == [0, 1]


def test_an_offset_below_the_log_start_is_out_of_range(logs, fill) -> None:
    plog = fill(logs, A, batches(0, 4, 10))
    plog.maybe_increment_log_start_offset(2)
    [below] = read(logs, [(A, fetch(1))])
    [at] = read(logs, [(A, fetch(2))])
    assert below.error_code == ErrorCode.offset_out_of_range
    assert offsets_in(at) == [2, 3] and at.log_start_offset == 2


@pytest.mark.parametrize(
    ("last_fetched_epoch", "fetch_offset", "diverging"),
    [
        (1, 3, None),  # epoch 1 ends at 4: nothing diverges
        (1, 5, (1, 4)),  # asked past the end of epoch 1
        (2, 4, (1, 4)),  # epoch 2 unknown here: the largest below it, and where it ends
    ],
)
def test_a_last_fetched_epoch_that_does_not_match_ours_reports_the_divergence(
    logs, fill, last_fetched_epoch, fetch_offset, diverging
) -> None:
    fill(
        logs,
        A,
        batches(0, 2, 10, epoch=0) + batches(2, 2, 10, epoch=1) + batches(4, 2, 10, epoch=3),
    )
    [answer] = read(
        logs,
        [(A, fetch(fetch_offset, last_fetched_epoch=last_fetched_epoch))],
        isolation=Isolation.LOG_END,
    )
    got = (answer.diverging.epoch, answer.diverging.end_offset) if answer.diverging else None
    assert got == diverging
    assert answer.error_code == ErrorCode.none
    if diverging:
        assert answer.records is None


def test_a_last_fetched_epoch_older_than_our_log_diverges_where_our_log_begins(logs, fill) -> None:
    fill(logs, A, batches(0, 2, 10, epoch=5))
    [answer] = read(logs, [(A, fetch(1, last_fetched_epoch=2))], isolation=Isolation.LOG_END)
    assert answer.diverging is not None
    assert (answer.diverging.epoch, answer.diverging.end_offset) == (2, 0)


def test_a_last_fetched_epoch_newer_than_ours_is_out_of_range(logs, fill) -> None:
    fill(logs, A, batches(0, 2, 10, epoch=1))
    [answer] = read(logs, [(A, fetch(1, last_fetched_epoch=7))], isolation=Isolation.LOG_END)
    assert answer.error_code == ErrorCode.offset_out_of_range


def test_a_refusal_hook_answers_before_any_read(logs, fill) -> None:
    fill(logs, A, batches(0, 2, 10))
    catalog = Catalog(logs, rng=random.Random(0))
    answers = read_partitions(
        catalog,
        [(A, fetch())],
        ReadLimits(BIG, Isolation.HIGH_WATERMARK, False),
        TransactionTracker(),
        now_ms=0,
        refuse=lambda tp, f: ErrorCode.unknown_topic_id,
    )
    assert [(a.error_code, a.records) for a in answers] == [(ErrorCode.unknown_topic_id, None)]


def test_planning_reads_no_batch_and_the_records_step_spends_the_budget_in_order(
    logs, fill, monkeypatch
) -> None:
    """plan_reads (serve's loop) answers from the offsets alone; read_records (a worker
    thread) reads the batch headers, in request order under the budget, and a read that
    fails there answers its own error without touching the others."""
    fill(logs, A, batches(0, 3, 100))
    fill(logs, B, batches(0, 3, 100))
    fill(logs, C, batches(0, 3, 100))
    catalog = Catalog(logs, rng=random.Random(0))
    real = LogSegment.first_batch
    read_from: list[int] = []

    def watched(segment: LogSegment, offset: int) -> BatchHeader | None:
        read_from.append(offset)
        if offset == 1:
            raise OSError(5, "Input/output error")  # B's disk fails
        return real(segment, offset)

    monkeypatch.setattr(LogSegment, "first_batch", watched)
    first = size_of(batches(0, 1, 100)[0])
    reads = [(A, fetch(0, first)), (B, fetch(1, first)), (C, fetch(2, first)), (C, fetch(3))]
    limits = ReadLimits(first + first // 2, Isolation.HIGH_WATERMARK, hard_max_bytes_limit=False)
    planned = plan_reads(catalog, reads, limits, TransactionTracker(), now_ms=0)
    assert read_from == []
    assert planned.reads_disk
    answers = planned.read_records()
    # A takes one batch of the budget, B's failure none, so C has half a batch left: its
    # header is read and its batch does not fit; C at 3 is at the high watermark: no read.
    # (B's failed read is tried once more under its partition lock: log/partition.py.)
    assert read_from == [0, 1, 1, 2]
    assert (offsets_in(answers[0]), answers[0].records_size) == ([0], first)
    assert (answers[1].error_code, answers[1].records) == (ErrorCode.kafka_storage_error, None)
    assert (answers[2].error_code, answers[2].records, answers[2].more_data) == (
        ErrorCode.none,
        None,
        True,
    )
    assert (answers[3].error_code, answers[3].records, answers[3].more_data) == (
        ErrorCode.none,
        None,
        False,
    )


@pytest.mark.parametrize("isolation", [Isolation.HIGH_WATERMARK, Isolation.LOG_END])
def test_batches_appended_between_the_plan_and_the_read_are_not_sent(logs, fill, isolation) -> None:
    """serve finds the records on a worker thread while its loop (or the follower) goes on
    appending: what the plan's bound covered is sent, never a batch appended after it, which
    the answer's high watermark does not cover (it may yet be truncated). Fails on the
    commit before (the whole region up to the segment's new end was sent). The same after
    a roll: the new segment's batches stay out too."""
    plog = fill(logs, A, batches(0, 2, 100))
    catalog = Catalog(logs, rng=random.Random(0))
    limits = ReadLimits(BIG, isolation, hard_max_bytes_limit=False)
    planned = plan_reads(catalog, [(A, fetch(1))], limits, TransactionTracker(), now_ms=0)
    later = b"".join(batches(2, 2, 100))
    plog.append(later, scan_batches(later).batches, now_ms=0)
    [answer] = planned.read_records()
    assert (offsets_in(answer), answer.high_watermark) == ([1], 2)

    plog.roll_if_idle(now_ms=1 << 60)  # 0..3 in the old segment, which no longer grows
    planned = plan_reads(catalog, [(A, fetch(3))], limits, TransactionTracker(), now_ms=0)
    if isolation is Isolation.HIGH_WATERMARK:
        assert not planned.reads_disk  # its high watermark is still 2: nothing to read
        return
    rolled = b"".join(batches(4, 2, 100))
    plog.append(rolled, scan_batches(rolled).batches, now_ms=0)
    [answer] = planned.read_records()
    assert offsets_in(answer) == [3]


# -- reads that do not wait (log/nowait.py: serve's loop) ------------------------------------


def test_a_read_that_would_wait_changes_nothing_and_is_read_again_whole(logs, fill) -> None:
    """serve tries a read on its loop; the partition whose header is not cached raises
    WouldWait after another partition's records were found (and read: a small read), and
    nothing of the try is kept: the read again (a worker thread) answers as one read does,
    its records and the bytes it read counted once. Fails on the code before: the try set
    the first partition's records and counted its bytes."""
    fill(logs, A, batches(0, 3, 100))
    fill(logs, B, batches(0, 3, 100))
    cached(logs.partitions()[A].active_segment.log_path)
    dropped(logs.partitions()[B].active_segment.log_path)
    catalog = Catalog(logs, rng=random.Random(0))
    limits = ReadLimits(BIG, Isolation.HIGH_WATERMARK, hard_max_bytes_limit=False)
    planned = plan_reads(
        catalog, [(A, fetch(1)), (B, fetch(1))], limits, TransactionTracker(), now_ms=0
    )
    with pytest.raises(WouldWait), not_waiting():
        planned.read_records(bytes_up_to=1 << 16)
    assert [a.records for a in planned.answers] == [None, None]
    assert (planned.records_bytes, planned.bytes_read) == (0, 0)
    answers = planned.read_records(bytes_up_to=1 << 16)
    assert [offsets_in(a) for a in answers] == [[1, 2], [1, 2]]
    assert all(isinstance(a.records, RecordBytes) for a in answers)
    both = sum(a.records_size for a in answers)
    assert (planned.records_bytes, planned.bytes_read) == (both, both)


def test_a_read_of_cached_bytes_reads_them_without_waiting(logs, fill) -> None:
    fill(logs, A, batches(0, 3, 100))
    cached(logs.partitions()[A].active_segment.log_path)
    catalog = Catalog(logs, rng=random.Random(0))
    limits = ReadLimits(BIG, Isolation.HIGH_WATERMARK, hard_max_bytes_limit=False)
    planned = plan_reads(catalog, [(A, fetch(1))], limits, TransactionTracker(), now_ms=0)
    with not_waiting():
        [answer] = planned.read_records(bytes_up_to=1 << 16)
    assert isinstance(answer.records, RecordBytes)
    assert offsets_in(answer) == [1, 2]


def test_a_fold_that_would_wait_stops_whole_and_goes_on_after_its_read_ahead(
    logs, fill, txn
) -> None:
    """A READ_COMMITTED fold on serve's loop stops where its bytes are not cached: the state
    is whole up to where it stopped (FoldWouldWait names it), `read_ahead` (a worker
    thread) reads what comes next into the cache, and the fold then goes on without
    waiting, to the same state a fold that may wait reaches. Before (no such rule) the fold
    read the disk on the loop."""
    plog = fill(
        logs,
        A,
        [
            txn.data(0, [b"aborted"], producer_id=11),
            txn.marker(1, producer_id=11, control_type=ControlType.ABORT),
            txn.data(2, [b"open"], producer_id=12),
        ],
    )
    path = plog.active_segment.log_path
    dropped(path)
    tracker = TransactionTracker()
    with pytest.raises(FoldWouldWait) as stopped, not_waiting():
        tracker.state(A, plog)
    assert (stopped.value.plog, stopped.value.offset) == (plog, 0)
    assert stopped.value.read_ahead() == path.stat().st_size
    cached(path)  # what read_ahead read is in the cache (or: no read here can say so)
    with not_waiting():
        state = tracker.state(A, plog)
    assert state.last_stable_offset(plog.high_watermark) == 2
    assert tuple(state.aborted_overlapping(0, 2)) == (AbortedTransaction(0, 11, 1),)
    fresh = TransactionTracker().state(A, plog)
    assert fresh.last_stable_offset(plog.high_watermark) == 2
