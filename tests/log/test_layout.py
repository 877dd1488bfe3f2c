"""File and directory names of a data directory, and sorting out a partition's files."""

from __future__ import annotations

from replicad.log.layout import (
    classify_partition_files,
    parse_partition_dir,
    partition_dir_name,
    segment_file_name,
)
from replicad.types import TopicPartition


def test_segment_names_have_twenty_digits() -> None:
    assert segment_file_name(0, ".log") == "00000000000000000000.log"
    assert segment_file_name(12345678901234, ".timeindex") == "00000012345678901234.timeindex"


def test_partition_dir_round_trip_with_dashes_and_dots_in_topic() -> None:
    for tp in (TopicPartition("orders", 0), TopicPartition("a-b.c-d", 17)):
        assert parse_partition_dir(partition_dir_name(tp)) == tp


def test_non_partition_dirs_are_ignored() -> None:
    for name in ("orders-0.abc123-delete", "orders-0.abc-future", "lost+found", "orders", "x-y"):
        assert parse_partition_dir(name) is None


def test_classify_finds_strays_orphans_and_missing_indexes() -> None:
    names = [
        "00000000000000000000.log",
        "00000000000000000000.index",
        "00000000000000000000.timeindex",
        "00000000000000000100.log",
        "00000000000000000100.timeindex",
        "00000000000000000200.index",  # orphan: its .log is gone
        "00000000000000000050.log.swap",
        "00000000000000000050.index.cleaned",
        "00000000000000000000.log.deleted",
        "leader-epoch-checkpoint.tmp",
        "leader-epoch-checkpoint",
        "partition.metadata",
    ]
    listing = classify_partition_files(names)
    assert listing.segments == [0, 100]
    assert listing.missing_index == [100]
    assert listing.missing_time_index == []
    assert set(listing.strays) == {
        "00000000000000000200.index",
        "00000000000000000050.log.swap",
        "00000000000000000050.index.cleaned",
        "00000000000000000000.log.deleted",
        "leader-epoch-checkpoint.tmp",
    }
