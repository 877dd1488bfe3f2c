"""The per-partition mirror core, driven event by event: transactions held until their
marker, aborted data and markers skipped, reconcile after a crash, halts named."""

from __future__ import annotations

import dataclasses

import pytest

from replicad.errors import LocalProtocolError
from replicad.mirror.offset_map import SyncPoint
from replicad.mirror.partition_mirror import LogEntry, PartitionMirror, Phase
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


def started(position: int = 0, dest_end: int = 0) -> PartitionMirror:
    core = PartitionMirror(position=position)
    assert core.reconcile(STAMP, dest_end).done
    return core


def drain(core: PartitionMirror) -> list[tuple[int, int, int]]:
    """Send and acknowledge everything sendable; (source base, dest base, sequence) each."""
    out = []
    while (send := core.next_send()) is not None:
        out.append((send.entry.header.base_offset, send.expected_dest, send.base_sequence))
        core.acked(send.expected_dest)
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
    assert core.next_send() is None and core.held_transactions == 1
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
    core = PartitionMirror(position=2, dest_next=2, points=[SyncPoint(0, 0)])
    core.feed([data(2, 3), marker(5, 1, ControlType.ABORT), data(6, 2), data(8, 1)])
    result = core.reconcile(STAMP, 7)
    assert result.done and result.batches_found == 2
    assert (core.position, core.dest_next, core.sequence) == (8, 7, 0)
    assert drain(core) == [(8, 7, 0)]


def test_reconcile_asks_for_more_of_the_log() -> None:
    core = PartitionMirror(position=0, dest_next=0)
    core.feed([data(0, 2)])
    result = core.reconcile(STAMP, 4)
    assert not result.done and result.need_more
    core.feed([data(2, 2)])
    assert core.reconcile(STAMP, 4).done
    assert core.position == 4


@pytest.mark.parametrize(
    ("dest_end", "reason"), [(1, "below the mirrored end"), (3, "inside the batch")]
)
def test_reconcile_refuses_a_destination_it_cannot_explain(dest_end: int, reason: str) -> None:
    core = PartitionMirror(position=0, dest_next=2, points=[SyncPoint(0, 0)])
    core.feed([data(0, 2), data(2, 2)])
    result = core.reconcile(STAMP, dest_end)
    assert not result.done
    assert core.phase is Phase.HALTED and reason in (core.error or "")
    assert core.next_send() is None


def test_first_start_on_a_non_empty_destination_maps_offsets() -> None:
    core = started(position=0, dest_end=40)
    core.feed([data(0, 5)])
    assert drain(core) == [(0, 40, 0)]
    assert core.offset_map.translate(3) == 43


def test_retry_resends_the_same_sequence_and_a_lost_session_reconciles() -> None:
    core = started()
    core.feed([data(0, 2), data(2, 2)])
    first = core.next_send()
    assert first is not None
    core.retry()
    again = core.next_send()
    assert again is not None and again.base_sequence == first.base_sequence
    core.acked(0)
    core.next_send()
    core.lost_session()
    assert core.phase is Phase.RECONCILING and core.next_send() is None
    # The lost send did land: the new session finds it and starts at sequence 0.
    assert core.reconcile(ProducerStamp(10, 0), 4).done
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
    core.feed([LogEntry(dataclasses.replace(entry(2).header, magic=1))])
    drain(core)
    assert core.phase is Phase.HALTED and "source offset 2" in (core.error or "")


def test_skip_to_counts_a_gap_the_local_retention_made() -> None:
    core = started(position=0)
    assert core.skip_to(50) == 50
    assert core.position == core.scanned_to == 50 and core.gap_offsets == 50


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
