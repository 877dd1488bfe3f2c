"""Where archived segments live in a bucket, and the manifest that says which are there.

Layout under the configured prefix (`p/`, or nothing):

    p/<topic>-<partition>/manifest.json
    p/<topic>-<partition>/<topic id>/<base offset, 20 digits>.log|.index|.timeindex

Rules:
- An object's key follows from topic id, partition and base offset alone: an upload
  repeated after a crash writes the same keys with the same bytes, never a second copy
  under another name. The topic id keeps a topic deleted and created again under the same
  name from mixing with the old one's objects.
- The manifest is written after every object it names (a reader that sees a manifest sees
  its objects); it is the only object ever overwritten, and only by the partition's one
  uploader. Segments are listed in ascending base offset order; a later segment never
  starts below the end of an earlier one (gaps are allowed: what local retention deleted
  before the archive was turned on).
- The manifest carries the leader-epoch entries up to its end (Kafka's leader-epoch
  checkpoint, for the segments' history) and the archive's log start offset. The entries
  below the local history's start stay the archive's (local retention truncates the local
  cache from its start; the archive's history does not follow it).
- Planning a read needs the manifest only: the segment sizes are in it, no object is listed.
"""

from __future__ import annotations

import itertools
import json
from dataclasses import dataclass, replace

from replicad.errors import LogError
from replicad.log.checkpoint import EpochEntry
from replicad.log.layout import (
    INDEX_SUFFIX,
    LOG_SUFFIX,
    TIME_INDEX_SUFFIX,
    partition_dir_name,
    segment_file_name,
)
from replicad.types import TopicPartition

MANIFEST_NAME = "manifest.json"
MANIFEST_VERSION = 1
# The files of a segment, in upload order: the .log first, so that its indexes never
# exist without it.
SEGMENT_SUFFIXES = (LOG_SUFFIX, INDEX_SUFFIX, TIME_INDEX_SUFFIX)


def normalized_prefix(prefix: str) -> str:
    """`"a/b"`, `"/a/b/"` -> `"a/b/"`; `""` stays `""`."""
    prefix = prefix.strip("/")
    return f"{prefix}/" if prefix else ""


def partition_prefix(prefix: str, tp: TopicPartition) -> str:
    return f"{normalized_prefix(prefix)}{partition_dir_name(tp)}/"


def manifest_key(prefix: str, tp: TopicPartition) -> str:
    return partition_prefix(prefix, tp) + MANIFEST_NAME


def segments_prefix(prefix: str, tp: TopicPartition, topic_id: str) -> str:
    """The "directory" of a partition's segment objects."""
    return f"{partition_prefix(prefix, tp)}{topic_id}/"


def segment_key(prefix: str, tp: TopicPartition, topic_id: str, base: int, suffix: str) -> str:
    return segments_prefix(prefix, tp, topic_id) + segment_file_name(base, suffix)


@dataclass(frozen=True, slots=True)
class ArchivedSegment:
    base_offset: int
    next_offset: int  # one past its last offset
    size: int  # bytes of the .log
    max_timestamp: int  # -1 when it has none


@dataclass(frozen=True, slots=True)
class Manifest:
    topic: str
    partition: int
    topic_id: str  # Kafka's base64 form, as in partition.metadata
    segments: tuple[ArchivedSegment, ...] = ()
    epochs: tuple[EpochEntry, ...] = ()
    log_start_offset: int = 0

    @property
    def topic_partition(self) -> TopicPartition:
        return TopicPartition(self.topic, self.partition)

    @property
    def end_offset(self) -> int | None:
        """One past the last archived offset; None when nothing is archived yet."""
        return self.segments[-1].next_offset if self.segments else None

    def with_segment(
        self, segment: ArchivedSegment, epochs: list[EpochEntry], log_start_offset: int
    ) -> Manifest:
        end = self.end_offset
        if end is not None and segment.base_offset < end:
            raise LogError(
                f"{self.topic_partition}: segment {segment.base_offset} starts below the "
                f"archive's end {end}"
            )
        kept = merged_epochs(
            self.epochs, tuple(e for e in epochs if e.start_offset < segment.next_offset)
        )
        start = max(log_start_offset, self.segments[0].base_offset if self.segments else 0)
        return replace(
            self,
            segments=(*self.segments, segment),
            epochs=kept,
            log_start_offset=min(start, segment.next_offset),
        )

    def without_first(self, count: int) -> Manifest:
        """The manifest once its `count` oldest segments are deleted (remote retention):
        the log start moves to the first one kept."""
        if count >= len(self.segments):
            raise LogError(f"{self.topic_partition}: the newest archived segment is kept")
        kept = self.segments[count:]
        start = max(self.log_start_offset, kept[0].base_offset)
        return replace(
            self,
            segments=kept,
            epochs=_epochs_from(self.epochs, start),
            log_start_offset=start,
        )

    def encode(self) -> bytes:
        body = {
            "version": MANIFEST_VERSION,
            "topic": self.topic,
            "partition": self.partition,
            "topic_id": self.topic_id,
            "log_start_offset": self.log_start_offset,
            "segments": [
                [s.base_offset, s.next_offset, s.size, s.max_timestamp] for s in self.segments
            ],
            "epochs": [[e.epoch, e.start_offset] for e in self.epochs],
        }
        return json.dumps(body, separators=(",", ":")).encode()


def merged_epochs(
    archived: tuple[EpochEntry, ...], local: tuple[EpochEntry, ...]
) -> tuple[EpochEntry, ...]:
    """The archive's epoch history followed by the local one: local retention truncates the
    local leader-epoch cache from its start (its first entry then starts at the local log
    start), so the entries below the local history's start are the archive's own."""
    if not local:
        return archived
    older = [e for e in archived if e.start_offset < local[0].start_offset]
    if older and older[-1].epoch == local[0].epoch:
        return (*older, *local[1:])  # the same epoch, cut at its start locally
    return (*older, *local)


def _epochs_from(epochs: tuple[EpochEntry, ...], start: int) -> tuple[EpochEntry, ...]:
    """The entries still needed from offset `start` on: the one in force at `start` (moved
    to start there, as Kafka's LeaderEpochFileCache.truncateFromStart does) and later ones."""
    before = [e for e in epochs if e.start_offset <= start]
    after = tuple(e for e in epochs if e.start_offset > start)
    return ((EpochEntry(before[-1].epoch, start),) if before else ()) + after


def decode_manifest(data: bytes, *, source: str) -> Manifest:
    """A manifest's bytes; LogError naming `source` when they are not one."""
    try:
        body = json.loads(data)
        if body.get("version") != MANIFEST_VERSION:
            raise LogError(f"{source}: manifest version {body.get('version')!r} is not 1")
        segments = tuple(ArchivedSegment(*map(int, s)) for s in body["segments"])
        epochs = tuple(EpochEntry(int(e), int(o)) for e, o in body["epochs"])
        manifest = Manifest(
            str(body["topic"]),
            int(body["partition"]),
            str(body["topic_id"]),
            segments,
            epochs,
            int(body["log_start_offset"]),
        )
    except LogError:
        raise
    except (ValueError, KeyError, TypeError, AttributeError) as error:
        raise LogError(f"{source}: not a replicad archive manifest ({error})") from None
    for before, after in itertools.pairwise(segments):
        if after.base_offset < before.next_offset:
            raise LogError(f"{source}: segment {after.base_offset} overlaps the one before")
    return manifest
