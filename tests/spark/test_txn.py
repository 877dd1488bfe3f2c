"""Transaction outcomes for read_committed, from headers and markers (sans-I/O)."""

from __future__ import annotations

from replicad.records.batch import BatchHeader, scan_batches
from replicad.records.records import ControlType
from replicad.spark.txn import Outcome, TransactionOutcomes

P, Q = 1000, 2000


def header(raw: bytes) -> BatchHeader:
    return scan_batches(raw).batches[0]


def test_commit_and_abort_decide_the_transactions_before_them(make_batches):
    outcomes = TransactionOutcomes()
    for raw, marker in [
        (make_batches.transactional(0, 3, P), None),
        (make_batches.transactional(3, 2, Q), None),
        (make_batches.marker(5, P, ControlType.COMMIT), ControlType.COMMIT),
        (make_batches.transactional(6, 2, P), None),
        (make_batches.marker(8, Q, ControlType.ABORT), ControlType.ABORT),
        (make_batches.marker(9, P, ControlType.ABORT), ControlType.ABORT),
    ]:
        outcomes.observe(header(raw), marker, in_split=True)
    assert not outcomes.needs_more
    assert outcomes.outcome(P, 0) is Outcome.COMMITTED
    assert outcomes.outcome(Q, 3) is Outcome.ABORTED
    assert outcomes.outcome(P, 6) is Outcome.ABORTED  # P's second transaction


def test_a_transaction_open_at_the_split_end_needs_the_markers_after_it(make_batches):
    outcomes = TransactionOutcomes()
    outcomes.observe(header(make_batches.transactional(0, 3, P)), None, in_split=True)
    outcomes.observe(header(make_batches.transactional(3, 3, Q)), None, in_split=True)
    assert outcomes.needs_more
    # After the split: another producer's data and marker do not matter ...
    outcomes.observe(header(make_batches.transactional(6, 1, 3000)), None, in_split=False)
    outcomes.observe(
        header(make_batches.marker(7, 3000, ControlType.COMMIT)), ControlType.COMMIT, in_split=False
    )
    outcomes.observe(
        header(make_batches.marker(8, P, ControlType.ABORT)), ControlType.ABORT, in_split=False
    )
    assert outcomes.needs_more  # Q still waits
    outcomes.observe(
        header(make_batches.marker(9, Q, ControlType.COMMIT)), ControlType.COMMIT, in_split=False
    )
    assert not outcomes.needs_more
    assert outcomes.outcome(P, 0) is Outcome.ABORTED
    assert outcomes.outcome(Q, 3) is Outcome.COMMITTED
    assert outcomes.outcome(3000, 6) is Outcome.UNDECIDED  # never asked about: not kept


def test_no_marker_in_the_log_leaves_the_transaction_undecided(make_batches):
    outcomes = TransactionOutcomes()
    outcomes.observe(header(make_batches.transactional(0, 3, P)), None, in_split=True)
    assert outcomes.needs_more
    assert outcomes.outcome(P, 0) is Outcome.UNDECIDED
    assert outcomes.outcome(Q, 0) is Outcome.UNDECIDED


def test_non_transactional_batches_and_other_markers_change_nothing(make_batches):
    outcomes = TransactionOutcomes()
    outcomes.observe(header(make_batches.data(0, 5)), None, in_split=True)
    assert not outcomes.needs_more
    outcomes.observe(header(make_batches.transactional(5, 1, P)), None, in_split=True)
    outcomes.observe(
        header(make_batches.marker(6, P, ControlType.LEADER_CHANGE)),
        ControlType.LEADER_CHANGE,
        in_split=True,
    )
    assert outcomes.needs_more
    outcomes.observe(
        header(make_batches.marker(7, P, ControlType.COMMIT)), ControlType.COMMIT, in_split=True
    )
    assert outcomes.outcome(P, 5) is Outcome.COMMITTED


def test_a_marker_in_the_split_before_the_data_belongs_to_an_earlier_transaction(make_batches):
    outcomes = TransactionOutcomes()
    # The split starts inside P's first transaction: its data lies before the split.
    outcomes.observe(
        header(make_batches.marker(0, P, ControlType.ABORT)), ControlType.ABORT, in_split=True
    )
    outcomes.observe(header(make_batches.transactional(1, 2, P)), None, in_split=True)
    outcomes.observe(
        header(make_batches.marker(3, P, ControlType.COMMIT)), ControlType.COMMIT, in_split=True
    )
    assert outcomes.outcome(P, 1) is Outcome.COMMITTED
