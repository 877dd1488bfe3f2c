"""Aborted transactions of a range of batches without a transaction index: folded from the
range, and the markers of those still open found further on."""

from __future__ import annotations

from replicad.archive.txn_fold import Ended, first_markers, transactions_in
from replicad.records.records import ControlType
from tests.leader.conftest import control_batch, transactional_batch
from tools.logdata.batches import producer_batch

ABORT, COMMIT = ControlType.ABORT, ControlType.COMMIT


def test_a_range_says_which_transactions_ended_how_and_which_are_still_open() -> None:
    data = b"".join(
        [
            control_batch(0, producer_id=5, control_type=COMMIT),  # opened before the range
            transactional_batch(1, [b"a"], producer_id=7),
            producer_batch(2, [b"plain"]),
            transactional_batch(3, [b"b"], producer_id=8),
            control_batch(4, producer_id=7, control_type=ABORT),
            transactional_batch(5, [b"c"], producer_id=7),  # a second transaction of 7
            control_batch(6, producer_id=7, control_type=COMMIT),
            transactional_batch(7, [b"d"], producer_id=9),
        ]
    )
    found = transactions_in(data)
    assert found.ended == [Ended(1, 7, 4, True), Ended(5, 7, 6, False)]
    assert found.still_open == {8: 3, 9: 7}


def test_markers_further_on_are_the_first_of_each_producer() -> None:
    blocks = [
        producer_batch(10, [b"x"]) + control_batch(11, producer_id=8, control_type=COMMIT),
        control_batch(12, producer_id=9, control_type=ABORT)
        + control_batch(13, producer_id=8, control_type=ABORT),
    ]
    assert first_markers(blocks, {8, 9}) == {8: (11, False), 9: (12, True)}
    assert first_markers(blocks[:1], {8, 9}) == {8: (11, False)}
