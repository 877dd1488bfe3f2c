"""Transaction state folded from batch headers: open/closed transactions, the last stable
offset at a high watermark, the aborted transactions a READ_COMMITTED answer lists."""

from __future__ import annotations

import pytest

from replicad.errors import LocalProtocolError
from replicad.leader.transactions import AbortedTransaction, TransactionState
from replicad.records.batch import (
    CONTROL_FLAG_MASK,
    MAGIC_V1,
    TRANSACTIONAL_FLAG_MASK,
    BatchHeader,
)
from replicad.records.records import ControlType


def batch(
    base: int, count: int = 1, *, pid: int = -1, txn: bool = False, control: bool = False
) -> BatchHeader:
    attributes = (TRANSACTIONAL_FLAG_MASK if txn else 0) | (CONTROL_FLAG_MASK if control else 0)
    return BatchHeader(
        position=0,
        base_offset=base,
        batch_length=100,
        partition_leader_epoch=0,
        magic=2,
        crc=0,
        attributes=attributes,
        last_offset_delta=count - 1,
        base_timestamp=0,
        max_timestamp=0,
        producer_id=pid,
        producer_epoch=0,
        base_sequence=0,
        record_count=count,
    )


def data(base: int, count: int, pid: int) -> BatchHeader:
    return batch(base, count, pid=pid, txn=True)


def marker(offset: int, pid: int) -> BatchHeader:
    return batch(offset, pid=pid, txn=True, control=True)


def test_no_transactions_means_the_lso_is_the_high_watermark() -> None:
    state = TransactionState()
    state.fold(batch(0, 10))
    assert state.last_stable_offset(10) == 10
    assert state.aborted_overlapping(0, 10) == []


def test_an_open_transaction_holds_the_lso_at_its_first_offset() -> None:
    state = TransactionState()
    state.fold(batch(0, 5))
    state.fold(data(5, 3, pid=7))
    state.fold(batch(8, 2))
    state.fold(data(10, 1, pid=7))  # same transaction: the first offset stays 5
    assert state.last_stable_offset(11) == 5
    assert state.last_stable_offset(4) == 4  # not begun below the high watermark


def test_a_commit_closes_and_releases_the_lso_once_the_high_watermark_passes_it() -> None:
    state = TransactionState()
    state.fold(data(0, 3, pid=7))
    state.fold(marker(3, pid=7), ControlType.COMMIT)
    state.fold(batch(4, 1))
    assert state.last_stable_offset(3) == 0  # the marker is not below the HW yet
    assert state.last_stable_offset(5) == 5
    assert state.aborted_overlapping(0, 5) == []


def test_aborted_transactions_are_listed_where_they_overlap_the_fetch() -> None:
    state = TransactionState()
    state.fold(data(0, 3, pid=1))
    state.fold(data(3, 2, pid=2))
    state.fold(marker(5, pid=1), ControlType.ABORT)
    state.fold(data(6, 2, pid=3))
    state.fold(marker(8, pid=2), ControlType.COMMIT)
    state.fold(marker(9, pid=3), ControlType.ABORT)
    assert state.last_stable_offset(10) == 10
    first, second = AbortedTransaction(0, 1, 5), AbortedTransaction(6, 3, 9)
    assert state.aborted_overlapping(0, 10) == [first, second]
    assert state.aborted_overlapping(6, 10) == [second]  # the first ended at 5
    assert state.aborted_overlapping(0, 6) == [first]  # the second begins at 6
    state.forget_below(6)
    assert state.aborted_overlapping(0, 10) == [second]


def test_markers_without_an_open_transaction_and_other_control_types_close_nothing() -> None:
    state = TransactionState()
    state.fold(marker(0, pid=4), ControlType.ABORT)  # its data is below the log start
    state.fold(data(1, 1, pid=5))
    state.fold(marker(2, pid=5), ControlType.LEADER_CHANGE)
    assert state.aborted_overlapping(0, 3) == []
    assert state.last_stable_offset(3) == 1


def test_legacy_and_non_transactional_batches_are_only_skipped_over() -> None:
    state = TransactionState()
    legacy = batch(0, 1, pid=9, txn=True)._replace(magic=MAGIC_V1)
    state.fold(legacy)
    state.fold(batch(1, 1, pid=9))
    assert state.folded_to == 2
    assert state.last_stable_offset(2) == 2


def test_folding_backwards_is_a_local_error() -> None:
    state = TransactionState()
    state.fold(batch(10, 5))
    with pytest.raises(LocalProtocolError):
        state.fold(batch(12, 1))
