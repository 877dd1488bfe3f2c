"""The last stable offset of a replica's partition (stable.py), over segments written by the
log store from real producer batches, transactional batches and markers."""

from __future__ import annotations

from replicad.records.records import ControlType
from replicad.spark.catalog import Planner, list_partitions
from replicad.spark.files import FileOpener
from replicad.spark.options import parse_options
from replicad.spark.stable import last_stable_offset
from replicad.types import TopicPartition


def lso(data_dir, start: int, high_watermark: int) -> int:
    planner = Planner(parse_options({"path": str(data_dir)}))
    (files,) = list_partitions(planner.options)
    splits = planner.splits(files, start, high_watermark)
    return last_stable_offset(splits, start, high_watermark, FileOpener())


def test_the_earliest_open_transaction_bounds_what_read_committed_may_read(
    tmp_path, make_batches, write_partition
):
    b = make_batches
    write_partition(
        tmp_path,
        TopicPartition("t", 0),
        [
            b.data(0, 10),
            b.transactional(10, 5, producer_id=1),  # committed at 20
            b.data(15, 5),
            b.marker(20, 1, ControlType.COMMIT),
            b.transactional(21, 3, producer_id=2),  # never decided
            b.data(24, 6),
        ],
        segment_bytes=2048,
    )
    assert lso(tmp_path, 0, 30) == 21
    # The marker at 20 is at the high watermark: not stable yet, the transaction is open.
    assert lso(tmp_path, 0, 20) == 10
    assert lso(tmp_path, 0, 10) == 10
    # A transaction begun before the stream's position has nothing left to hold back.
    assert lso(tmp_path, 22, 30) == 22
    assert lso(tmp_path, 24, 24) == 24
