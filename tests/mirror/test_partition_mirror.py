"""The per-partition mirror core, driven event by event: transactions held until their
marker, aborted data and markers skipped, reconcile after a crash, halts named."""

from __future__ import annotations

import dataclasses
import random
from typing import Any

import pytest

from replicad.errors import LocalProtocolError
from replicad.mirror.offset_map import SyncPoint
from replicad.mirror.partition_mirror import (
    TRANSITIONS,
    Event,
    Failure,
    LogEntry,
    MirrorTiming,
    PartitionMirror,
    Phase,
    Reconciled,
    next_phase,
)
from replicad.mirror.restamp import ProducerStamp
from replicad.records.batch import BatchHeader
from replicad.records.records import ControlType

STAMP = ProducerStamp(9, 0)
TXN, CONTROL = 0x10, 0x20


def entry(
    base: int,
    count: int = 1,
    *,
    pid: int = -1,
    attributes: int = 0,
    marker: ControlType | None = None,
    gap: int = 0,
) -> LogEntry:
    header = BatchHeader(0, base, 100, 0, 2, 0, attributes, count - 1 + gap, 0, 0, pid, 0, 0, count)
    return LogEntry(header, marker, b"x" * 10)


def data(base: int, count: int = 1) -> LogEntry:
    return entry(base, count)


def txn(base: int, pid: int, count: int = 1) -> LogEntry:
    return entry(base, count, pid=pid, attributes=TXN)


def marker(offset: int, pid: int, kind: ControlType) -> LogEntry:
    return entry(offset, pid=pid, attributes=TXN | CONTROL, marker=kind)


NOW = 1_000_000
TIMING = MirrorTiming(produce_timeout_ms=1_000, request_timeout_ms=1_000, max_in_flight=1)


def started(
    position: int = 0, dest_end: int = 0, timing: MirrorTiming = TIMING, **kwargs: Any
) -> PartitionMirror:
    core = PartitionMirror(position=position, timing=timing, rng=random.Random(1), **kwargs)
    assert core.log_end_wanted(NOW)
    assert core.on_log_end(STAMP, dest_end, dest_end, NOW).done
    core.first_progress_saved()
    return core


def reconcile(core: PartitionMirror, dest_end: int, stamp: ProducerStamp = STAMP) -> Reconciled:
    assert core.log_end_wanted(NOW)
    return core.on_log_end(stamp, dest_end, dest_end, NOW)


def drain(core: PartitionMirror, stamp: ProducerStamp = STAMP) -> list[tuple[int, int, int]]:
    """Send and acknowledge everything sendable; (source base, dest base, sequence) each."""
    out = []
    while (send := core.next_send(NOW, stamp)) is not None:
        out.append((send.entry.header.base_offset, send.expected_dest, send.base_sequence))
        core.acked(send, send.expected_dest, NOW)
    return out


def test_plain_batches_keep_their_offsets_and_sequences_run_on() -> None:
    core = started()
    core.feed([data(0, 3), data(3, 2), data(5, 1)])
    assert drain(core) == [(0, 0, 0), (3, 3, 3), (5, 5, 5)]
    assert core.position == core.dest_next == 6
    assert core.offset_map.offsets_kept


def test_committed_transaction_waits_for_its_marker_and_blocks_what_follows() -> None:
    core = started()
    core.feed([data(0, 2), txn(2, pid=7, count=2), data(4, 1)])
    assert drain(core) == [(0, 0, 0)]  # the transaction holds everything after it
    assert core.next_send(NOW, STAMP) is None and core.held_transactions == 1
    core.feed([marker(5, 7, ControlType.COMMIT), data(6, 1)])
    assert drain(core) == [(2, 2, 2), (4, 4, 4), (6, 5, 5)]
    assert core.position == 7
    assert not core.offset_map.offsets_kept
    assert core.offset_map.translate(6) == 5


def test_aborted_transaction_and_markers_are_skipped() -> None:
    core = started()
    core.feed([txn(0, pid=1, count=3), txn(3, pid=2), marker(4, 1, ControlType.ABORT)])
    assert drain(core) == []  # pid 2 still open
    core.feed([marker(5, 2, ControlType.COMMIT), data(6, 2)])
    assert drain(core) == [(3, 0, 0), (6, 1, 1)]
    assert core.batches_skipped == 3  # the aborted batch and two markers
    assert core.position == 8 and core.dest_next == 3


def test_reconcile_after_a_crash_finds_what_reached_the_destination() -> None:
    # Progress saved at source 2 / dest 2, but the destination took two more batches.
    core = PartitionMirror(position=2, dest_next=2, points=[SyncPoint(0, 0)], timing=TIMING)
    core.feed([data(2, 3), marker(5, 1, ControlType.ABORT), data(6, 2), data(8, 1)])
    result = reconcile(core, 7)
    assert result.done and result.batches_found == 2
    assert (core.position, core.dest_next, core.sequence) == (8, 7, 0)
    assert drain(core) == [(8, 7, 0)]


def test_reconcile_asks_for_more_of_the_log() -> None:
    core = PartitionMirror(position=0, dest_next=0, timing=TIMING)
    core.feed([data(0, 2)])
    result = reconcile(core, 4)
    assert not result.done and result.need_more
    assert core.wants_more(budget_bytes=0)
    core.feed([data(2, 2)])  # the reconcile goes on with what was fed
    assert core.phase is Phase.MIRRORING
    assert core.position == 4


@pytest.mark.parametrize(
    ("dest_end", "reason"), [(1, "below the mirrored end"), (3, "inside the batch")]
)
def test_reconcile_refuses_a_destination_it_cannot_explain(dest_end: int, reason: str) -> None:
    core = PartitionMirror(position=0, dest_next=2, points=[SyncPoint(0, 0)], timing=TIMING)
    core.feed([data(0, 2), data(2, 2)])
    result = reconcile(core, dest_end)
    assert not result.done
    assert core.phase is Phase.HALTED and reason in (core.error or "")
    assert core.next_send(NOW, STAMP) is None


def test_first_start_on_a_non_empty_destination_maps_offsets() -> None:
    core = started(position=0, dest_end=40)
    core.feed([data(0, 5)])
    assert drain(core) == [(0, 40, 0)]
    assert core.offset_map.translate(3) == 43


def test_retry_resends_the_same_sequence_and_a_lost_session_reconciles() -> None:
    core = started()
    core.feed([data(0, 2), data(2, 2)])
    first = core.next_send(NOW, STAMP)
    assert first is not None
    assert not core.failed(first, Failure.RETRY, NOW).stale
    # Backing off: nothing until the back-off ends, and the core says when that is.
    assert core.next_send(NOW, STAMP) is None
    wake = core.next_wakeup_ms(NOW)
    assert wake is not None and NOW < wake <= NOW + 200
    again = core.next_send(wake, STAMP)
    assert again is not None and again.base_sequence == first.base_sequence
    assert core.acked(again, 0, wake).batches_done == 1
    lost = core.next_send(wake, STAMP)
    assert lost is not None
    assert core.failed(lost, Failure.SESSION, wake).new_session
    # Nothing in flight any more: the partition reconciles at once under a new session.
    assert core.phase is Phase.RECONCILING and core.next_send(wake, STAMP) is None
    # The lost send did land: the new session finds it and starts at sequence 0.
    assert reconcile(core, 4, ProducerStamp(10, 0)).done
    assert core.position == 4 and core.sequence == 0


def test_a_batch_thinned_by_compaction_takes_as_many_offsets_as_it_has_records() -> None:
    core = started()
    core.feed([entry(0, 2, gap=1), data(3, 1)])  # records at 0 and 2 of 0..2
    assert drain(core) == [(0, 0, 0), (3, 2, 2)]
    assert core.position == 4 and core.dest_next == 3
    assert core.offset_map.translate(3) == 2


def test_an_unproducible_batch_halts_the_partition_with_its_offset() -> None:
    core = started()
    core.feed([entry(0, 2, attributes=0)])
    core.feed([LogEntry(entry(2).header._replace(magic=1))])
    drain(core)
    assert core.next_send(NOW, STAMP) is None
    assert core.phase is Phase.HALTED and "source offset 2" in (core.error or "")


def test_skip_to_counts_a_gap_the_local_retention_made() -> None:
    core = started(position=0)
    assert core.skip_to(50) == 50
    assert core.position == core.scanned_to == 50 and core.gap_offsets == 50


def test_a_local_log_start_past_what_was_read_is_a_gap_once_nothing_is_pending() -> None:
    core = started(position=0)
    core.feed([data(0, 10)])
    assert core.local_log_starts_at(5) == 0  # below what was read
    assert core.local_log_starts_at(30) == 0  # batch 0 still pending: sent first
    (send,) = sends(core)
    assert core.local_log_starts_at(30) == 0  # in flight
    core.acked(send, -1, NOW)
    assert core.local_log_starts_at(30) == 20
    assert core.position == core.scanned_to == 30 and core.gap_offsets == 20


def test_feeding_backwards_is_a_bug() -> None:
    core = started()
    core.feed([data(0, 5)])
    with pytest.raises(LocalProtocolError):
        core.feed([data(3, 1)])


def test_read_ahead_stops_at_the_budget_unless_a_transaction_waits() -> None:
    core = started()
    core.feed([data(0)])
    assert not core.wants_more(budget_bytes=10)
    core = started()
    core.feed([txn(0, pid=3)])
    assert core.wants_more(budget_bytes=10)


# -- the phase table -----------------------------------------------------------------------


def test_every_phase_has_a_way_to_halt_and_an_illegal_transition_raises() -> None:
    for phase in Phase:
        assert next_phase(phase, Event.HALT) is Phase.HALTED
    assert (Phase.MIRRORING, Event.DRAINED) not in TRANSITIONS
    with pytest.raises(LocalProtocolError, match="no transition from mirroring on drained"):
        next_phase(Phase.MIRRORING, Event.DRAINED)
    with pytest.raises(LocalProtocolError):
        next_phase(Phase.HALTED, Event.RECONCILED)


def test_a_halted_partition_keeps_its_first_reason() -> None:
    core = started()
    core.halt("first")
    core.halt("second")
    assert core.phase is Phase.HALTED and core.error == "first"


# -- time -----------------------------------------------------------------------------------


def test_a_new_partition_sends_nothing_until_its_first_progress_is_saved() -> None:
    core = PartitionMirror(position=0, timing=TIMING)
    core.feed([data(0, 1)])
    assert reconcile(core, 7).done and core.dest_next == 7
    assert core.first_save_wanted and core.next_send(NOW, STAMP) is None
    assert core.first_save_due(NOW) and not core.first_save_due(NOW)  # one at a time
    core.first_progress_saved()
    assert not core.first_save_due(NOW)
    assert drain(core) == [(0, 7, 0)]


def test_a_failed_first_save_is_tried_again_after_a_backoff_and_nothing_is_sent_meanwhile():
    core = PartitionMirror(position=0, timing=TIMING, rng=random.Random(1))
    core.feed([data(0, 1)])
    assert reconcile(core, 7).done
    assert core.first_save_due(NOW)
    core.first_save_failed(NOW)
    again = core.next_wakeup_ms(NOW)
    assert again is not None and again > NOW
    assert not core.first_save_due(again - 1) and core.next_send(again - 1, STAMP) is None
    assert core.first_save_due(again)
    core.first_save_failed(again)
    assert core.next_wakeup_ms(again) - again > again - NOW  # the back-off grows
    assert core.first_save_due(core.next_wakeup_ms(again))
    core.first_progress_saved()
    assert drain(core) == [(0, 7, 0)]


def test_an_unsettled_log_end_is_asked_again_until_it_settles() -> None:
    core = PartitionMirror(position=0, dest_next=0, timing=TIMING)
    core.feed([data(0, 2), data(2, 2)])
    assert core.log_end_wanted(NOW)
    assert not core.log_end_wanted(NOW)  # one question at a time
    waiting = core.on_log_end(STAMP, 4, 2, NOW)  # a write between append and acknowledgement
    assert waiting.wait and core.phase is Phase.RECONCILING
    again = core.next_wakeup_ms(NOW)
    assert again is not None and again > NOW
    assert not core.log_end_wanted(again - 1)
    assert core.log_end_wanted(again)
    assert core.on_log_end(STAMP, 4, 2, again).wait
    # However long it takes: a tail not replicated yet is neither counted nor sent again.
    late = NOW + 3_600_000
    assert core.log_end_wanted(late)
    assert core.on_log_end(STAMP, 4, 2, late).wait
    # Replicated at last: the batches are there and are not sent again.
    assert core.log_end_wanted(late + 100)
    assert core.on_log_end(STAMP, 4, 4, late + 100).done and core.position == 4


def test_a_failed_log_end_is_asked_again_after_a_back_off() -> None:
    core = PartitionMirror(position=0, timing=TIMING)
    assert core.log_end_wanted(NOW)
    core.log_end_failed(NOW)
    wake = core.next_wakeup_ms(NOW)
    assert wake is not None and wake > NOW
    assert not core.log_end_wanted(wake - 1) and core.log_end_wanted(wake)


def test_an_unanswered_send_is_resent_after_its_deadline() -> None:
    core = started()
    core.feed([data(0, 1)])
    send = core.next_send(NOW, STAMP)
    assert send is not None and core.next_wakeup_ms(NOW) == send.deadline_ms
    core.expire(send.deadline_ms - 1)
    assert core.current(send)
    core.expire(send.deadline_ms)
    assert not core.current(send) and core.batches_resent == 1
    later = send.deadline_ms + 10_000
    again = core.next_send(later, STAMP)
    assert again is not None and again.base_sequence == send.base_sequence
    # The first send's answer comes after all: stale, ignored; the resend counts.
    assert core.acked(send, 0, later).stale
    assert core.acked(again, 0, later).batches_done == 1 and core.position == 1


# -- pipelining -----------------------------------------------------------------------------

# Five in flight from the first send (the rule of one alone until the destination holds
# the producer's state has its own test).
PIPELINED = dataclasses.replace(TIMING, max_in_flight=5, first_batch_alone=False)


def sends(core: PartitionMirror, now: int = NOW, stamp: ProducerStamp = STAMP) -> list[Any]:
    out = []
    while (send := core.next_send(now, stamp)) is not None:
        out.append(send)
    return out


def test_up_to_five_batches_in_flight_with_consecutive_sequences() -> None:
    core = started(timing=PIPELINED)
    core.feed([data(i * 2, 2) for i in range(7)])
    window = sends(core)
    assert [s.base_sequence for s in window] == [0, 2, 4, 6, 8]
    assert [s.expected_dest for s in window] == [0, 2, 4, 6, 8]
    assert core.in_flight == 5
    # Answers out of order: progress moves only from the oldest batch.
    assert core.acked(window[1], 2, NOW).batches_done == 0 and core.position == 0
    assert core.acked(window[0], 0, NOW).batches_done == 2 and core.position == 4
    more = sends(core)
    assert [s.base_sequence for s in more] == [10, 12]


def test_a_retriable_failure_resends_it_and_everything_after_it() -> None:
    core = started(timing=PIPELINED)
    core.feed([data(i, 1) for i in range(4)])
    window = sends(core)
    core.acked(window[0], 0, NOW)
    assert not core.failed(window[1], Failure.RETRY, NOW).stale
    # The batches after it got OUT_OF_ORDER_SEQUENCE_NUMBER (a gap): stale, ignored.
    for later in window[2:]:
        assert core.failed(later, Failure.OUT_OF_ORDER, NOW).stale
    assert core.phase is Phase.MIRRORING
    wake = core.next_wakeup_ms(NOW)
    assert wake is not None
    again = sends(core, wake)
    assert [(s.entry.header.base_offset, s.base_sequence) for s in again] == [
        (1, 1),
        (2, 2),
        (3, 3),
    ]
    for s in again:
        core.acked(s, s.expected_dest, wake)
    assert core.position == core.dest_next == 4 and core.batches_mirrored == 4


def test_out_of_order_behind_an_unresolved_batch_is_a_resend_not_a_lost_session() -> None:
    core = started(timing=PIPELINED)
    core.feed([data(i, 1) for i in range(3)])
    window = sends(core)
    # Batch 1's answer comes first (another connection after a leader change).
    assert not core.failed(window[1], Failure.OUT_OF_ORDER, NOW).new_session
    assert core.phase is Phase.MIRRORING
    # The oldest batch refused as out of order: the destination disagrees, a new session.
    assert core.failed(window[0], Failure.OUT_OF_ORDER, NOW).new_session
    # Batch 2 was written and is not answered yet: it could still land.
    assert core.phase is Phase.DRAINING
    assert core.failed(window[2], Failure.OUT_OF_ORDER, NOW).stale
    assert core.phase is Phase.RECONCILING


def test_a_lost_session_waits_for_every_answer_before_reconciling() -> None:
    core = started(timing=PIPELINED)
    core.feed([data(i, 1) for i in range(3)])
    window = sends(core)
    assert core.failed(window[0], Failure.SESSION, NOW).new_session
    # Batches 1 and 2 were written under the old session and may still land.
    assert core.phase is Phase.DRAINING and not core.log_end_wanted(NOW)
    core.failed(window[1], Failure.OUT_OF_ORDER, NOW)
    assert core.phase is Phase.DRAINING
    core.expire(window[2].deadline_ms)
    assert core.phase is Phase.RECONCILING
    assert reconcile(core, 0, ProducerStamp(10, 0)).done
    resent = sends(core, stamp=ProducerStamp(10, 0))
    assert [(s.base_sequence, s.stamp.producer_id) for s in resent] == [(0, 10), (1, 10), (2, 10)]


def test_a_session_renewed_elsewhere_drains_and_reconciles_this_partition() -> None:
    core = started(timing=PIPELINED)
    core.feed([data(i, 1) for i in range(2)])
    window = sends(core)
    renewed = ProducerStamp(11, 0)
    assert core.next_send(NOW, renewed) is None and core.phase is Phase.DRAINING
    # An answer under the old session still counts: the batch is at the destination.
    core.acked(window[0], 0, NOW)
    core.acked(window[1], 1, NOW)
    assert core.phase is Phase.RECONCILING and core.position == 2
    assert reconcile(core, 2, renewed).done and core.sequence == 0


def test_a_send_never_written_is_not_waited_for() -> None:
    core = started(timing=PIPELINED)
    core.feed([data(i, 1) for i in range(2)])
    window = sends(core)
    core.failed(window[0], Failure.RETRY, NOW)
    assert not core.current(window[1])
    core.failed(window[0], Failure.SESSION, NOW)  # stale: changes nothing
    assert core.phase is Phase.MIRRORING
    core.unsent(window[1])
    assert core.next_wakeup_ms(NOW) is not None  # only the back-off is left
    assert all(core.next_wakeup_ms(NOW) != s.deadline_ms for s in window)


def test_a_fatal_answer_halts_with_its_reason() -> None:
    core = started(timing=PIPELINED)
    core.feed([data(0, 1)])
    (send,) = sends(core)
    assert core.failed(send, Failure.FATAL, NOW, reason="RECORD_LIST_TOO_LARGE").halted
    assert core.phase is Phase.HALTED and "RECORD_LIST_TOO_LARGE" in (core.error or "")


# -- coalescing ---------------------------------------------------------------------------

COALESCING = dataclasses.replace(
    TIMING, max_in_flight=5, coalesce_bytes=25, first_batch_alone=False
)


def test_small_batches_are_sent_as_one_run_and_map_each_to_its_offsets() -> None:
    core = started(timing=COALESCING)
    core.feed([data(0, 1), data(1, 2), data(3, 1), data(4, 1)])  # 10 bytes each
    first = core.next_send(NOW, STAMP)
    assert first is not None and [e.header.base_offset for e in first.entries] == [0, 1]
    assert first.record_count == 3 and first.base_sequence == 0
    second = core.next_send(NOW, STAMP)
    assert second is not None and [e.header.base_offset for e in second.entries] == [3, 4]
    assert (second.base_sequence, second.expected_dest) == (3, 3)
    core.acked(first, 100, NOW)
    core.acked(second, 103, NOW)
    assert core.position == 5 and core.dest_next == 105
    assert core.offset_map.translate(1) == 101 and core.offset_map.translate(4) == 104


def test_a_run_settles_whole_and_a_gap_between_its_batches_is_a_sync_point() -> None:
    """An acknowledged run becomes progress in one step: its batches landed one after the
    other, so a run without offsets missing between its batches adds no sync point past its
    first, and one whose source offsets jump (records compacted away between two batches)
    adds one where they jump; a run settles only once every run before it did."""
    core = started(timing=dataclasses.replace(COALESCING, coalesce_bytes=1000))
    core.feed([data(0), data(1), data(2), data(7), data(8)])  # 3..6 compacted away
    whole = core.next_send(NOW, STAMP)
    assert whole is not None and len(whole.entries) == 5 and whole.record_count == 5
    assert core.acked(whole, -1, NOW).batches_done == 5
    assert (core.position, core.dest_next, core.records_mirrored) == (9, 5, 5)
    assert core.batches_mirrored == 5
    assert core.offset_map.points == [SyncPoint(0, 0), SyncPoint(7, 3)]
    assert [core.offset_map.translate(o) for o in (2, 5, 7, 8)] == [2, 3, 3, 4]
    core = started(timing=dataclasses.replace(COALESCING, coalesce_bytes=1000, coalesce_records=2))
    core.feed([data(i) for i in range(6)])
    first, second, third = sends(core)
    assert core.acked(third, -1, NOW).batches_done == 0  # behind two runs not settled
    assert core.acked(first, -1, NOW).batches_done == 2
    assert core.acked(second, -1, NOW).batches_done == 4
    assert (core.position, core.dest_next, core.buffered_bytes) == (6, 6, 0)
    assert core.offset_map.points == [SyncPoint(0, 0)]


def test_an_empty_batch_among_small_ones_ends_the_run_and_halts_at_its_own_send() -> None:
    """A batch of no records cannot be produced: it is not joined to a run (the run before
    it goes), and the partition halts naming it when it would be sent."""
    core = started(timing=dataclasses.replace(COALESCING, coalesce_bytes=1000))
    core.feed([data(0), data(1), entry(2, count=0), data(3)])
    run = core.next_send(NOW, STAMP)
    assert run is not None and [e.header.base_offset for e in run.entries] == [0, 1]
    assert core.next_send(NOW, STAMP) is None
    assert core.phase is Phase.HALTED and "source offset 2" in (core.error or "")


def test_a_resent_run_is_the_same_batch() -> None:
    core = started(timing=COALESCING)
    core.feed([data(0, 1), data(1, 1)])
    first = core.next_send(NOW, STAMP)
    assert first is not None and len(first.entries) == 2
    core.failed(first, Failure.RETRY, NOW)
    core.feed([data(2, 1)])  # a third batch now fits, but the resend repeats the run
    wake = core.next_wakeup_ms(NOW)
    assert wake is not None
    again = core.next_send(wake, STAMP)
    assert again is not None and [e.header.base_offset for e in again.entries] == [0, 1]
    assert again.base_sequence == first.base_sequence
    third = core.next_send(wake, STAMP)
    assert third is not None and third.base_sequence == 2


def test_a_transaction_or_a_marker_ends_a_run() -> None:
    core = started(timing=COALESCING)
    core.feed([data(0, 1), marker(1, 5, ControlType.ABORT), data(2, 1)])
    first = core.next_send(NOW, STAMP)
    assert first is not None and len(first.entries) == 1


def sized(base: int, size: int) -> LogEntry:
    return dataclasses.replace(data(base), data=b"x" * size)


def test_a_cut_run_goes_again_as_its_joined_batches_and_the_cutter_heads_the_next() -> None:
    """The shell could not coalesce a run whole (a batch over what is left of its
    decompressed bound, or not decompressing): nothing of it was written, so its first
    batches go again as one run with the same sequence, and the batch that cut it heads the
    next run -- alone, as stored, when it cuts a run by itself."""
    core = started(timing=dataclasses.replace(COALESCING, coalesce_bytes=1000))
    core.feed([data(i) for i in range(6)])
    first = core.next_send(NOW, STAMP)
    assert first is not None and len(first.entries) == 6
    core.run_cut(first, 2)  # the batch at 2 did not fit what was left
    cut = core.next_send(NOW, STAMP)
    assert cut is not None and [e.header.base_offset for e in cut.entries] == [0, 1]
    assert (cut.base_sequence, cut.expected_dest) == (0, 0)
    rest = core.next_send(NOW, STAMP)
    assert rest is not None and [e.header.base_offset for e in rest.entries] == [2, 3, 4, 5]
    assert (rest.base_sequence, rest.expected_dest) == (2, 2)
    core.run_cut(rest, 0)  # the batch at 2 alone is over the bound: it goes as stored
    alone = core.next_send(NOW, STAMP)
    assert alone is not None and alone.more == () and alone.base_sequence == 2
    after = core.next_send(NOW, STAMP)
    assert after is not None and [e.header.base_offset for e in after.entries] == [3, 4, 5]
    for send in (cut, alone, after):
        assert not core.acked(send, -1, NOW).stale
    assert (core.position, core.dest_next, core.in_flight) == (6, 6, 0)


def test_a_cut_run_takes_the_sends_after_it_back_and_a_stale_cut_is_ignored() -> None:
    """Runs handed out after the cut one were not written either (they follow it on the
    same connection): they go again after it, with their sequences moved up; a cut of a
    send no longer in flight changes nothing."""
    core = started(timing=dataclasses.replace(COALESCING, coalesce_bytes=1000, coalesce_records=3))
    core.feed([data(i) for i in range(6)])
    first, second = core.next_send(NOW, STAMP), core.next_send(NOW, STAMP)
    assert first is not None and second is not None and second.base_sequence == 3
    core.run_cut(first, 1)
    assert not core.current(second)
    core.unsent(second)
    core.run_cut(second, 1)  # stale: ignored
    got = sends(core)
    assert [[e.header.base_offset for e in s.entries] for s in got] == [[0], [1, 2], [3, 4, 5]]
    assert [s.base_sequence for s in got] == [0, 1, 3]


def test_a_run_is_bounded_by_its_stored_bytes_and_its_records() -> None:
    core = started(timing=dataclasses.replace(COALESCING, coalesce_bytes=25))
    core.feed([data(i) for i in range(5)])  # 10 bytes each
    assert [len(s.entries) for s in sends(core)] == [2, 2, 1]
    core = started(timing=dataclasses.replace(COALESCING, coalesce_bytes=1000, coalesce_records=3))
    core.feed([data(i) for i in range(7)])
    assert [len(s.entries) for s in sends(core)] == [3, 3, 1]


def test_held_batch_bytes_count_in_the_read_ahead_budget() -> None:
    core = started(timing=COALESCING)
    core.feed([sized(0, 100), dataclasses.replace(data(1), data=None)])
    assert core.buffered_bytes == 100
    for send in sends(core):
        core.acked(send, -1, NOW)
    assert core.buffered_bytes == 0


def test_only_small_batches_are_coalesced() -> None:
    """A batch of SMALL_BATCH_BYTES or more was batched by its producer: produced as
    stored, whatever room the run has left."""
    timing = dataclasses.replace(COALESCING, coalesce_bytes=256 * 1024)
    core = started(timing=timing)
    core.feed([sized(0, 20_000), sized(1, 100), sized(2, 100), sized(3, 20_000), sized(4, 100)])
    runs = []
    while (send := core.next_send(NOW, STAMP)) is not None:
        runs.append([e.header.base_offset for e in send.entries])
    assert runs == [[0], [1, 2], [3], [4]]


def test_a_log_append_time_batch_is_not_coalesced() -> None:
    core = started(timing=COALESCING)
    core.feed([data(0), entry(1, attributes=0x08), data(2), data(3)])
    runs = []
    while (send := core.next_send(NOW, STAMP)) is not None:
        runs.append([e.header.base_offset for e in send.entries])
    assert runs == [[0], [1], [2, 3]]


def test_a_run_refused_as_too_large_goes_again_in_smaller_runs_with_its_sequences() -> None:
    core = started(timing=COALESCING)
    core.feed([data(0, 1), data(1, 2), data(3, 1), data(4, 1)])
    first = core.next_send(NOW, STAMP)
    second = core.next_send(NOW, STAMP)
    assert first is not None and second is not None and len(first.entries) == 2
    answered = core.failed(first, Failure.TOO_LARGE, NOW, reason="MESSAGE_TOO_LARGE")
    assert not answered.halted and core.phase is Phase.MIRRORING
    # The later run was refused for the gap (or its answer is now stale): sent again too.
    core.failed(second, Failure.OUT_OF_ORDER, NOW)
    wake = core.next_wakeup_ms(NOW)
    assert wake is not None
    again = []
    while (send := core.next_send(wake, STAMP)) is not None:
        again.append(send)
    assert [[e.header.base_offset for e in s.entries] for s in again] == [[0], [1], [3, 4]]
    assert [s.base_sequence for s in again] == [0, 1, 3]
    for send, dest in zip(again, (100, 101, 103), strict=True):
        core.acked(send, dest, NOW)
    assert core.position == 5 and core.dest_next == 105
    assert core.offset_map.translate(3) == 103


def test_a_stored_batch_refused_as_too_large_halts() -> None:
    core = started(timing=COALESCING)
    core.feed([sized(0, 100)])
    (send,) = sends(core)
    assert core.failed(send, Failure.TOO_LARGE, NOW, reason="MESSAGE_TOO_LARGE").halted
    assert "MESSAGE_TOO_LARGE" in (core.error or "")


def test_after_a_run_too_large_runs_are_kept_to_half_its_bytes() -> None:
    timing = dataclasses.replace(COALESCING, coalesce_bytes=1000)
    core = started(timing=timing)
    core.feed([sized(i, 100) for i in range(8)])
    first = core.next_send(NOW, STAMP)
    assert first is not None and len(first.entries) == 8
    core.failed(first, Failure.TOO_LARGE, NOW, reason="MESSAGE_TOO_LARGE")
    wake = core.next_wakeup_ms(NOW)
    assert wake is not None
    core.feed([sized(i, 100) for i in range(8, 16)])
    runs = []
    while (send := core.next_send(wake, STAMP)) is not None:
        runs.append(len(send.entries))
        core.acked(send, -1, wake)
    # Runs of at most 400 of the refused 800 bytes: its own batches, then the new ones.
    assert runs == [4, 4, 4, 4]
    assert core.position == 16 and core.dest_next == 16


def test_runs_formed_again_after_a_refusal_stop_at_a_run_sent_before() -> None:
    """The runs the refused one is cut into never swallow the next run in flight: that one
    goes again as it was (its head counts its send; joined into another it would be
    counted twice and the window would never drain)."""
    core = started(timing=COALESCING)
    core.feed([sized(0, 10), sized(1, 10), sized(2, 4), sized(3, 4), sized(4, 4)])
    first, second = sends(core)
    assert [len(first.entries), len(second.entries)] == [3, 2]
    core.failed(first, Failure.TOO_LARGE, NOW, reason="MESSAGE_TOO_LARGE")
    core.failed(second, Failure.OUT_OF_ORDER, NOW)  # stale: rewound with the first
    wake = core.next_wakeup_ms(NOW)
    assert wake is not None
    again = sends(core, wake)
    assert [[e.header.base_offset for e in s.entries] for s in again] == [[0], [1], [2], [3, 4]]
    assert [s.base_sequence for s in again] == [0, 1, 2, 3]
    for send in again:
        core.acked(send, -1, wake)
    assert core.in_flight == 0 and core.position == 5 and core.dest_next == 5


def test_one_batch_alone_until_the_destination_acknowledged_one_of_the_session() -> None:
    """A broker with no state for a producer takes its first batch at any sequence: a
    second batch sent beside a first that fails would land without it. So one batch goes
    alone until one is acknowledged; then the window opens; a new session closes it."""
    core = started(timing=dataclasses.replace(TIMING, max_in_flight=5))
    core.feed([data(i) for i in range(8)])
    (first,) = sends(core)
    core.acked(first, -1, NOW)
    assert [s.base_sequence for s in sends(core)] == [1, 2, 3, 4, 5]
    renewed = ProducerStamp(10, 0)
    assert core.next_send(NOW, renewed) is None  # the session is lost: drain, reconcile


DAY = 24 * 3600 * 1000
WALL = 100 * DAY


def stamped(base: int, age_ms: int) -> LogEntry:
    """A batch whose newest record is `age_ms` old at WALL."""
    e = data(base)
    return dataclasses.replace(e, header=e.header._replace(max_timestamp=WALL - age_ms))


def test_an_expiring_batch_goes_alone_and_so_does_the_one_after_it() -> None:
    """Kafka forgets a producer whose last batch's newest timestamp is a day old: a batch
    of records that old goes alone, and once it is acknowledged the next goes alone too
    (the destination may hold no state for us: it would take any sequence)."""
    core = started(timing=dataclasses.replace(TIMING, max_in_flight=5))
    fresh, old = 0, DAY
    core.feed([stamped(0, fresh), stamped(1, fresh), stamped(2, fresh), stamped(3, old)])
    core.feed([stamped(4, fresh), stamped(5, fresh), stamped(6, fresh)])

    def round_of_sends() -> list[int]:
        out = []
        while (send := core.next_send(NOW, STAMP, WALL)) is not None:
            out.append(send)
        for send in out:
            core.acked(send, -1, NOW)
        return [[e.header.base_offset for e in s.entries] for s in out]

    assert round_of_sends() == [[0]]  # a session's first
    assert round_of_sends() == [[1], [2]]  # the window opens, up to the expiring one
    assert round_of_sends() == [[3]]  # alone
    assert round_of_sends() == [[4]]  # after it, alone again
    assert round_of_sends() == [[5], [6]]
    assert core.position == 7 and core.dest_next == 7


def test_an_expiring_batch_that_failed_is_reconciled_not_resent() -> None:
    """Written or not, the destination may have forgotten us since: a resend could be
    written twice. The session is lost; the log end is read again after a back-off."""
    core = started(timing=dataclasses.replace(TIMING, max_in_flight=5))
    core.feed([stamped(0, DAY), stamped(1, 0)])
    send = core.next_send(NOW, STAMP, WALL)
    assert send is not None and send.expiring
    assert core.next_send(NOW, STAMP, WALL) is None  # alone
    answered = core.failed(send, Failure.RETRY, NOW)
    assert answered.new_session and core.phase is Phase.RECONCILING
    assert not core.log_end_wanted(NOW)  # backing off
    wake = core.next_wakeup_ms(NOW)
    assert wake is not None and wake > NOW
    assert core.log_end_wanted(wake)
    # Never reconciled under the session it lost: sequence 0 could meet its state.
    assert core.on_log_end(STAMP, 1, 1, wake).wait
    renewed = ProducerStamp(10, 0)
    later = wake + 1_000
    assert core.log_end_wanted(later)
    result = core.on_log_end(renewed, 1, 1, later)  # it had landed: found, not resent
    assert result.done and result.batches_found == 1
    (again,) = [s for s in iter(lambda: core.next_send(later, renewed, WALL), None)]
    assert again.entry.header.base_offset == 1 and again.base_sequence == 0


def test_an_unanswered_expiring_batch_loses_the_session_at_its_deadline() -> None:
    core = started(timing=dataclasses.replace(TIMING, max_in_flight=5))
    core.feed([stamped(0, DAY)])
    send = core.next_send(NOW, STAMP, WALL)
    assert send is not None
    assert core.expire(send.deadline_ms - 1) is None
    assert core.expire(send.deadline_ms) == STAMP
    assert core.phase is Phase.RECONCILING


def test_a_partition_idle_past_the_expiry_sends_its_next_batch_alone() -> None:
    """The state dates from our last batch's timestamps: once they are a day old (an idle
    partition), the destination may have forgotten us."""
    core = started(timing=dataclasses.replace(TIMING, max_in_flight=5))
    core.feed([stamped(0, 0)])
    (first,) = [s for s in iter(lambda: core.next_send(NOW, STAMP, WALL), None)]
    core.acked(first, -1, NOW)
    core.feed([stamped(i, -DAY) for i in range(1, 4)])  # records of a day later
    a_day_later = WALL + DAY
    got = [s for s in iter(lambda: core.next_send(NOW, STAMP, a_day_later), None)]
    assert len(got) == 1 and not got[0].expiring
    core.acked(got[0], -1, NOW)
    assert len([s for s in iter(lambda: core.next_send(NOW, STAMP, a_day_later), None)]) == 2
