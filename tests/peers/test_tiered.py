"""tools/peers/tiered.py: reading the batches of remote and local segment files (the broker
with tiered storage itself is tested through tests/follower/test_tiered_kafka.py)."""

from __future__ import annotations

from pathlib import Path

from tools.logdata.batches import producer_batch
from tools.peers.tiered import batches_by_offset, batches_of


def test_a_segments_batches_by_base_offset_and_a_torn_tail_left_out() -> None:
    first, second = producer_batch(0, [b"a", b"b"]), producer_batch(2, [b"c"])
    assert batches_of(first + second + second[:20]) == {0: first, 2: second}


def test_where_two_files_hold_a_batch_the_first_files_copy_counts(tmp_path: Path) -> None:
    remote, local = tmp_path / "remote.log", tmp_path / "local.log"
    remote.write_bytes(producer_batch(0, [b"r0"]) + producer_batch(1, [b"r1"]))
    local.write_bytes(producer_batch(1, [b"l1"]) + producer_batch(2, [b"l2"]))
    found = batches_by_offset([remote, local])
    assert found == {
        0: producer_batch(0, [b"r0"]),
        1: producer_batch(1, [b"r1"]),
        2: producer_batch(2, [b"l2"]),
    }
