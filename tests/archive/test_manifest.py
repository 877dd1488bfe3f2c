"""Object keys and the manifest: the layout readers rely on, and a manifest that cannot lie."""

from __future__ import annotations

import pytest

from replicad.archive.manifest import (
    ArchivedSegment,
    Manifest,
    decode_manifest,
    manifest_key,
    normalized_prefix,
    segment_key,
)
from replicad.errors import LogError
from replicad.log.checkpoint import EpochEntry
from replicad.types import TopicPartition

TP = TopicPartition("orders", 3)


@pytest.mark.parametrize(
    ("given", "normal"), [("", ""), ("/", ""), ("a", "a/"), ("/a/b/", "a/b/"), ("a/b", "a/b/")]
)
def test_prefixes_are_normalized(given: str, normal: str) -> None:
    assert normalized_prefix(given) == normal


def test_keys_follow_from_topic_id_partition_and_base_offset() -> None:
    assert manifest_key("r", TP) == "r/orders-3/manifest.json"
    assert segment_key("r/", TP, "AAAA", 42, ".log") == "r/orders-3/AAAA/00000000000000000042.log"
    assert segment_key("", TP, "AAAA", 0, ".index") == "orders-3/AAAA/00000000000000000000.index"


def test_a_manifest_round_trips_and_keeps_only_the_epochs_it_covers() -> None:
    manifest = Manifest("orders", 3, "AAAA")
    assert manifest.end_offset is None
    epochs = [EpochEntry(0, 0), EpochEntry(1, 7), EpochEntry(2, 30)]
    manifest = manifest.with_segment(ArchivedSegment(0, 10, 1000, 5), epochs, 0)
    manifest = manifest.with_segment(ArchivedSegment(10, 20, 900, 9), epochs, 4)
    assert manifest.end_offset == 20
    assert manifest.epochs == (EpochEntry(0, 0), EpochEntry(1, 7))
    assert manifest.log_start_offset == 4
    assert decode_manifest(manifest.encode(), source="m") == manifest


def test_a_segment_below_the_archive_end_is_refused() -> None:
    manifest = Manifest("orders", 3, "AAAA").with_segment(ArchivedSegment(0, 10, 1, -1), [], 0)
    with pytest.raises(LogError, match="starts below the archive's end 10"):
        manifest.with_segment(ArchivedSegment(5, 12, 1, -1), [], 0)
    # A gap (what local retention deleted before the archive was on) is allowed.
    assert manifest.with_segment(ArchivedSegment(50, 60, 1, -1), [], 0).end_offset == 60


@pytest.mark.parametrize(
    ("data", "problem"),
    [
        (b"not json", "not a replicad archive manifest"),
        (b'{"version": 2}', "manifest version 2 is not 1"),
        (b'{"version": 1, "topic": "t"}', "not a replicad archive manifest"),
        (
            b'{"version":1,"topic":"t","partition":0,"topic_id":"A","log_start_offset":0,'
            b'"segments":[[0,10,5,-1],[5,12,5,-1]],"epochs":[]}',
            "segment 5 overlaps the one before",
        ),
    ],
)
def test_a_bad_manifest_is_named(data: bytes, problem: str) -> None:
    with pytest.raises(LogError, match=f"s3://b/m: {problem}"):
        decode_manifest(data, source="s3://b/m")


def test_epochs_below_the_local_history_stay_the_archives() -> None:
    """Local retention truncated the local epoch cache to start at 25 (epoch 1 from 7 seen
    locally as from 25): the archive keeps epoch 0 from 0 and epoch 1 from 7."""
    manifest = Manifest("orders", 3, "AAAA").with_segment(
        ArchivedSegment(0, 20, 1, -1), [EpochEntry(0, 0), EpochEntry(1, 7)], 0
    )
    truncated = [EpochEntry(1, 25), EpochEntry(2, 30)]
    manifest = manifest.with_segment(ArchivedSegment(20, 40, 1, -1), truncated, 0)
    assert manifest.epochs == (EpochEntry(0, 0), EpochEntry(1, 7), EpochEntry(2, 30))
    assert manifest.log_start_offset == 0


def test_deleting_the_oldest_segments_moves_the_start_and_keeps_the_newest() -> None:
    epochs = [EpochEntry(0, 0), EpochEntry(1, 15)]
    manifest = Manifest("orders", 3, "AAAA")
    for base in (0, 10, 20):
        manifest = manifest.with_segment(ArchivedSegment(base, base + 10, 1, -1), epochs, 0)
    kept = manifest.without_first(2)
    assert [s.base_offset for s in kept.segments] == [20]
    assert kept.log_start_offset == 20 and kept.end_offset == 30
    assert kept.epochs == (EpochEntry(1, 20),)
    assert manifest.without_first(1).epochs == (EpochEntry(0, 10), EpochEntry(1, 15))
    with pytest.raises(LogError, match="newest archived segment is kept"):
        manifest.without_first(3)
