"""Object keys and the manifest: the layout readers rely on, and a manifest that cannot lie."""

from __future__ import annotations

import itertools

import pytest

from replicad.archive.manifest import (
    CHUNK_SEGMENTS,
    ArchivedSegment,
    Manifest,
    chunk_writes,
    decode_manifest,
    dropped_chunks,
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
        (b'{"version": 3}', "manifest version 3 is not one of"),
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


def grown(count: int) -> list[Manifest]:
    """The manifests written one segment (10 offsets, 1,000 bytes) at a time."""
    manifests = [Manifest("orders", 3, "AAAA")]
    for i in range(count):
        segment = ArchivedSegment(i * 10, i * 10 + 10, 1000, i)
        manifests.append(manifests[-1].with_segment(segment, [EpochEntry(0, 0)], 0))
    return manifests


def test_the_manifest_stays_bounded_its_oldest_segments_sealed_in_chunks() -> None:
    """Each write is bounded whatever the archive's length: past CHUNK_SEGMENTS segments
    of its own, the oldest are sealed in a chunk object, written once before the manifest
    naming it; readers see every segment."""
    count = 3 * CHUNK_SEGMENTS + 10
    manifests = grown(count)
    objects: dict[str, bytes] = {}
    sizes = []
    for before, after in itertools.pairwise(manifests):
        writes = chunk_writes(before, after)
        assert len(writes) <= 1
        objects.update(writes)
        sizes.append(len(after.encode()))
    assert len(objects) == 3
    # No growth with the archive's length: the last write is no larger than the first chunk's.
    assert sizes[-1] < max(sizes[:CHUNK_SEGMENTS]) < 20_000
    last = manifests[-1]
    assert len(last.own_segments) == 10 and len(last.segments) == count
    read = decode_manifest(last.encode(), source="m", read=objects.get)
    assert read == last
    # A manifest naming a chunk that is missing is refused, naming it.
    with pytest.raises(LogError, match=r"manifest-00000000000000000000\.json, which is missing"):
        decode_manifest(last.encode(), source="m", read=lambda name: None)


def test_remote_retention_drops_a_chunk_once_none_of_its_segments_is_kept() -> None:
    manifests = grown(2 * CHUNK_SEGMENTS + 5)
    objects: dict[str, bytes] = {}
    for before, after in itertools.pairwise(manifests):
        objects.update(chunk_writes(before, after))
    last = manifests[-1]
    partly = last.without_first(10)  # the first chunk keeps most of its segments
    assert dropped_chunks(last, partly) == [] and partly.chunks == last.chunks
    read = decode_manifest(partly.encode(), source="m", read=objects.get)
    assert read.segments == partly.segments and read.segments[0].base_offset == 100
    wholly = last.without_first(CHUNK_SEGMENTS)
    assert dropped_chunks(last, wholly) == ["AAAA/manifest-00000000000000000000.json"]
    assert decode_manifest(wholly.encode(), source="m", read=objects.get) == wholly
    # More segments after it: still each chunk written once.
    more = wholly.with_segment(ArchivedSegment(10**6, 10**6 + 5, 1, -1), [], 0)
    assert chunk_writes(wholly, more) == []
