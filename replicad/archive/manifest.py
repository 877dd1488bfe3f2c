"""Where archived segments live in a bucket, and the manifest that says which are there.

Layout under the configured prefix (`p/`, or nothing):

    p/<topic>-<partition>/manifest.json
    p/<topic>-<partition>/<topic id>/<base offset, 20 digits>.log|.index|.timeindex
    p/<topic>-<partition>/<topic id>/manifest-<base offset, 20 digits>.json   (sealed runs)

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
- The manifest stays small however many segments the archive holds (it is rewritten for
  every segment): once it lists more than `CHUNK_SEGMENTS` segments of its own, its oldest
  `CHUNK_SEGMENTS` are sealed into a chunk object (`manifest-<base>.json`, named by its
  first segment's base offset) that is written once, before the manifest naming it, and
  never rewritten; the manifest then names the chunk (its offsets and segment count)
  instead of those segments. A reader reads the manifest, then the chunks it names. A
  crash between the chunk and the manifest leaves a chunk nothing names yet, written again
  with the same key and bytes by the next run. Remote retention drops a chunk from the
  manifest once none of its segments is kept, then deletes it with them; the manifest says
  which segment is its first (`first_segment`), so a chunk partly expired is read from there.
- Version 1 manifests (every segment in the manifest, no chunks) are read as before.
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Callable
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
MANIFEST_VERSION = 2
READ_VERSIONS = (1, 2)
# Segments sealed into one chunk object (see the module rules): at 1 GiB segments a chunk
# covers 256 GiB, and the manifest stays under CHUNK_SEGMENTS * ~50 bytes of segments.
CHUNK_SEGMENTS = 256
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


def chunk_name(topic_id: str, base: int) -> str:
    """A chunk object's key relative to its partition's prefix."""
    return f"{topic_id}/manifest-{base:020d}.json"


@dataclass(frozen=True, slots=True)
class Chunk:
    """A sealed run of segments, in an object of its own (see the module rules)."""

    base_offset: int  # its first segment's
    next_offset: int  # one past its last segment's last offset
    count: int  # segments in it


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
    chunks: tuple[Chunk, ...] = ()  # sealed runs, oldest first; their segments are in `segments`

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
        added = replace(
            self,
            segments=(*self.segments, segment),
            epochs=kept,
            log_start_offset=min(start, segment.next_offset),
        )
        own = added.own_segments
        if len(own) <= CHUNK_SEGMENTS:
            return added
        sealed = own[:CHUNK_SEGMENTS]
        chunk = Chunk(sealed[0].base_offset, sealed[-1].next_offset, len(sealed))
        return replace(added, chunks=(*added.chunks, chunk))

    @property
    def own_segments(self) -> tuple[ArchivedSegment, ...]:
        """The segments the manifest lists itself (those of no chunk)."""
        if not self.chunks:
            return self.segments
        sealed_end = self.chunks[-1].next_offset
        return tuple(s for s in self.segments if s.base_offset >= sealed_end)

    def chunk_segments(self, chunk: Chunk) -> tuple[ArchivedSegment, ...]:
        """The segments of `chunk` still archived."""
        return tuple(
            s for s in self.segments if chunk.base_offset <= s.base_offset < chunk.next_offset
        )

    def encode_chunk(self, chunk: Chunk) -> bytes:
        """The chunk object's bytes (written when it is sealed, when all its segments are
        archived)."""
        segments = self.chunk_segments(chunk)
        if len(segments) != chunk.count:
            raise LogError(f"{self.topic_partition}: chunk {chunk.base_offset} is not whole")
        body = {
            "version": MANIFEST_VERSION,
            "topic_id": self.topic_id,
            "segments": [[s.base_offset, s.next_offset, s.size, s.max_timestamp] for s in segments],
        }
        return json.dumps(body, separators=(",", ":")).encode()

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
            chunks=tuple(c for c in self.chunks if c.next_offset > kept[0].base_offset),
        )

    def encode(self) -> bytes:
        """The manifest object's bytes (its chunks are objects of their own)."""
        body = {
            "version": MANIFEST_VERSION,
            "topic": self.topic,
            "partition": self.partition,
            "topic_id": self.topic_id,
            "log_start_offset": self.log_start_offset,
            "first_segment": self.segments[0].base_offset if self.segments else None,
            "chunks": [[c.base_offset, c.next_offset, c.count] for c in self.chunks],
            "segments": [
                [s.base_offset, s.next_offset, s.size, s.max_timestamp] for s in self.own_segments
            ],
            "epochs": [[e.epoch, e.start_offset] for e in self.epochs],
        }
        return json.dumps(body, separators=(",", ":")).encode()


def chunk_writes(before: Manifest, after: Manifest) -> list[tuple[str, bytes]]:
    """The chunk objects `after` names that `before` did not: (name relative to the
    partition's prefix, bytes), to be written before `after` itself."""
    old = set(before.chunks)
    return [
        (chunk_name(after.topic_id, c.base_offset), after.encode_chunk(c))
        for c in after.chunks
        if c not in old
    ]


def dropped_chunks(before: Manifest, after: Manifest) -> list[str]:
    """The chunk objects (names relative to the partition's prefix) `before` named and
    `after` does not: deleted after `after` is written."""
    kept = set(after.chunks)
    return [chunk_name(before.topic_id, c.base_offset) for c in before.chunks if c not in kept]


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


def decode_manifest(
    data: bytes, *, source: str, read: Callable[[str], bytes | None] | None = None
) -> Manifest:
    """A manifest's bytes, with the segments of the chunks it names read by `read` (a name
    relative to the partition's prefix -> the object's bytes, None when missing); LogError
    naming `source` when they are not a manifest, or a chunk is missing or not one."""
    try:
        body = json.loads(data)
        version = body.get("version")
        if version not in READ_VERSIONS:
            raise LogError(f"{source}: manifest version {version!r} is not one of {READ_VERSIONS}")
        own = tuple(ArchivedSegment(*map(int, s)) for s in body["segments"])
        epochs = tuple(EpochEntry(int(e), int(o)) for e, o in body["epochs"])
        chunks = tuple(Chunk(*map(int, c)) for c in body.get("chunks", ()))
        first = body.get("first_segment")
        manifest = Manifest(
            str(body["topic"]),
            int(body["partition"]),
            str(body["topic_id"]),
            own,
            epochs,
            int(body["log_start_offset"]),
            chunks,
        )
    except LogError:
        raise
    except (ValueError, KeyError, TypeError, AttributeError) as error:
        raise LogError(f"{source}: not a replicad archive manifest ({error})") from None
    if chunks:
        if read is None:
            raise LogError(f"{source}: names chunks, and they were not read")
        sealed: list[ArchivedSegment] = []
        for chunk in chunks:
            sealed += _read_chunk(manifest, chunk, read, source)
        floor = int(first) if first is not None else 0
        manifest = replace(
            manifest, segments=tuple(s for s in sealed if s.base_offset >= floor) + own
        )
    for before, after in itertools.pairwise(manifest.segments):
        if after.base_offset < before.next_offset:
            raise LogError(f"{source}: segment {after.base_offset} overlaps the one before")
    return manifest


def _read_chunk(
    manifest: Manifest, chunk: Chunk, read: Callable[[str], bytes | None], source: str
) -> list[ArchivedSegment]:
    name = chunk_name(manifest.topic_id, chunk.base_offset)
    data = read(name)
    if data is None:
        raise LogError(f"{source}: names chunk {name}, which is missing")
    try:
        body = json.loads(data)
        segments = [ArchivedSegment(*map(int, s)) for s in body["segments"]]
    except (ValueError, KeyError, TypeError, AttributeError) as error:
        raise LogError(f"{source}: chunk {name} is not one ({error})") from None
    if (
        len(segments) != chunk.count
        or segments[0].base_offset != chunk.base_offset
        or segments[-1].next_offset != chunk.next_offset
    ):
        raise LogError(f"{source}: chunk {name} does not hold what the manifest says")
    return segments
