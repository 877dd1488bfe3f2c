"""Planning a read on the driver: list the data directory, resolve bounds, cut splits.

What it touches, so that pruning stays true:
- Directory listings and stat() for the partitions and segment sizes (no file opened).
- `.index` files only of segments where an offset bound falls or that need cutting
  (plan.py decides), `.timeindex` files for timestamp bounds, and the `.log` of the one
  segment per partition where a timestamp bound lands (Kafka's offsetsForTimes: the first
  segment whose largest timestamp reaches it, then its time index, offset index and batches).
- `log-start-offset-checkpoint`: "earliest" is the partition's log start, as for a Kafka
  consumer; records below it are logically deleted even if a segment still holds them.
- An archive bucket (`s3://bucket/prefix`, replicad/archive) is planned from its manifests
  alone: one LIST of the partitions' prefixes, one GET of each selected partition's
  manifest (segments, sizes, log start); indexes are then ranged like local files.

Every open goes through the FileOpener (files.py), the observable hook.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

from replicad.archive.manifest import (
    decode_manifest,
    manifest_key,
    normalized_prefix,
    segments_prefix,
)
from replicad.archive.store import is_bucket_url, parse_bucket_url
from replicad.errors import LogError
from replicad.log.checkpoint import parse_offsets
from replicad.log.index import OFFSET_ENTRY_SIZE, TIME_ENTRY_SIZE, OffsetIndex, TimeIndex
from replicad.log.layout import (
    INDEX_SUFFIX,
    LOG_START_OFFSET_CHECKPOINT,
    TIME_INDEX_SUFFIX,
    classify_partition_files,
    parse_partition_dir,
    segment_file_name,
)
from replicad.records.batch import ScanStop
from replicad.spark.files import FileOpener, Purpose
from replicad.spark.options import EARLIEST, LATEST, ReadOptions
from replicad.spark.plan import (
    PartitionFiles,
    SegmentFile,
    Split,
    byte_range,
    holds_end_of_index,
    join,
    offset_after_position,
    plan_partition,
    usable_offset_index,
    usable_time_index,
)
from replicad.spark.walk import Walk
from replicad.types import TopicPartition

# Pieces an index file is read in: whole entries of both kinds (8 and 12 bytes).
INDEX_PIECE_BYTES = 24 * 4096


def list_partitions(options: ReadOptions) -> list[PartitionFiles]:
    """The selected partitions of the data directory and their segments, sorted by name."""
    if is_bucket_url(options.data_dir):
        return [files for files, _ in archived_partitions(options)]
    data_dir = Path(options.data_dir)
    if not data_dir.is_dir():
        raise LogError(f"{data_dir}: not a replicad data directory (no such directory)")
    found = []
    for name in sorted(os.listdir(data_dir)):
        tp = parse_partition_dir(name)
        directory = data_dir / name
        if tp is None or not options.selects(tp) or not directory.is_dir():
            continue
        segments = []
        for base in classify_partition_files(sorted(os.listdir(directory))).segments:
            try:
                size = (directory / segment_file_name(base, ".log")).stat().st_size
            except FileNotFoundError:  # deleted by retention since the listing
                continue
            segments.append(SegmentFile(base, size))
        found.append(PartitionFiles(tp.topic, tp.partition, str(directory), tuple(segments)))
    found.sort(key=lambda f: (f.topic, f.partition))
    return found


def archived_partitions(options: ReadOptions) -> list[tuple[PartitionFiles, int]]:
    """The selected partitions of an archive bucket, from their manifests (one LIST of the
    partitions' prefixes, one GET of each selected manifest: no segment is listed), each
    with its log start offset."""
    return [(files, start) for files, start, _ in archived_with_ends(options)]


def archived_with_ends(options: ReadOptions) -> list[tuple[PartitionFiles, int, int]]:
    """archived_partitions, each with its end too: one past the last archived offset (every
    archived segment was wholly below the high watermark when it went up: what a stream
    over the bucket may read)."""
    opener = opener_for(options)
    store, prefix = opener.store(options.data_dir)
    bucket, _ = parse_bucket_url(options.data_dir)
    found = []
    for partition_prefix in store.list_dirs(normalized_prefix(prefix)):
        tp = parse_partition_dir(partition_prefix.rstrip("/").rsplit("/", 1)[-1])
        if tp is None or not options.selects(tp):
            continue
        key = manifest_key(prefix, tp)
        data = opener.read_all(f"s3://{bucket}/{key}", Purpose.INDEX)
        if data is None:  # a partition whose first upload has not finished
            continue
        directory = f"s3://{bucket}/{partition_prefix}"  # the listed one: the partition's
        manifest = decode_manifest(
            data,
            source=f"s3://{bucket}/{key}",
            read=lambda name, d=directory: opener.read_all(d + name, Purpose.INDEX),
        )
        directory = f"s3://{bucket}/{segments_prefix(prefix, tp, manifest.topic_id)}".rstrip("/")
        segments = tuple(SegmentFile(s.base_offset, s.size) for s in manifest.segments)
        files = PartitionFiles(tp.topic, tp.partition, directory, segments)
        end = manifest.end_offset
        found.append(
            (files, manifest.log_start_offset, manifest.log_start_offset if end is None else end)
        )
    found.sort(key=lambda row: (row[0].topic, row[0].partition))
    return found


def opener_for(options: ReadOptions) -> FileOpener:
    return FileOpener(options.trace_file_opens, options.s3_endpoint, options.s3_region)


def log_start_offsets(data_dir: str) -> dict[TopicPartition, int]:
    """The checkpointed log start offsets; none when the file is missing or unreadable."""
    path = Path(data_dir) / LOG_START_OFFSET_CHECKPOINT
    try:
        return parse_offsets(path.read_text(encoding="utf-8"), source=str(path))
    except (OSError, LogError, UnicodeDecodeError):
        return {}


@dataclass
class Planner:
    """Plans reads. With `remember_bytes`, the offset indexes it reads are kept (up to that
    many bytes of entries) until `forget()`: a stream's micro-batch reads the same indexes
    when it chooses its end (byte limits, read_committed) and when it plans its splits, from
    one look at the directory (stream.py forgets at each look). Keyed by the segment and
    its size at that look."""

    options: ReadOptions
    opener: FileOpener | None = None  # default: traced as the options say
    remember_bytes: int = 0
    _indexes: dict[tuple[str, int, int], OffsetIndex] = field(
        default_factory=dict, init=False, repr=False
    )
    _remembered_bytes: int = field(default=0, init=False, repr=False)

    def __post_init__(self) -> None:
        if self.opener is None:
            self.opener = opener_for(self.options)

    def forget(self) -> None:
        """Drop the indexes kept since the last look (remember_bytes)."""
        self._indexes.clear()
        self._remembered_bytes = 0

    @property
    def _opener(self) -> FileOpener:
        assert self.opener is not None
        return self.opener

    def plan(self) -> list[Split]:
        if is_bucket_url(self.options.data_dir):
            listed = archived_partitions(self.options)
            starts = {files.topic_partition: start for files, start in listed}
            partitions = [files for files, _ in listed]
        else:
            starts = log_start_offsets(self.options.data_dir)
            partitions = list_partitions(self.options)
        splits: list[Split] = []
        for files in partitions:
            if not files.segments:
                continue
            log_start = max(files.segments[0].base_offset, starts.get(files.topic_partition, 0))
            start = self._start(files, log_start)
            if start is None:
                continue
            end = self._end(files, log_start)
            splits += plan_partition(
                files,
                start,
                end,
                self.options.max_split_bytes,
                lambda segment, f=files: self.offset_index(f, segment),
            )
        return splits

    def _start(self, files: PartitionFiles, log_start: int) -> int | None:
        """First offset to read; None when nothing is (a timestamp after the last record)."""
        if self.options.starting_timestamp is not None:
            return self.offset_for_timestamp(files, self.options.starting_timestamp, log_start)
        wanted = self.options.starting_offsets.for_partition(files.topic_partition)
        return log_start if wanted == EARLIEST else max(wanted, log_start)

    def _end(self, files: PartitionFiles, log_start: int) -> int | None:
        """Offset to stop before; None for the log end."""
        if self.options.ending_timestamp is not None:
            return self.offset_for_timestamp(files, self.options.ending_timestamp, log_start)
        wanted = self.options.ending_offsets.for_partition(files.topic_partition)
        return None if wanted == LATEST else wanted

    def splits(self, files: PartitionFiles, start: int, end: int | None) -> list[Split]:
        """The splits of offsets [start, end) of one partition."""
        return plan_partition(
            files,
            start,
            end,
            self.options.max_split_bytes,
            lambda segment: self.offset_index(files, segment),
        )

    def bytes_between(self, files: PartitionFiles, start: int, end: int) -> int:
        """About how many bytes of the log hold offsets [start, end) (index granularity)."""
        return sum(split.size for split in self.splits(files, start, end))

    def offset_after_bytes(self, files: PartitionFiles, start: int, budget: int) -> int | None:
        """An offset above `start` about `budget` bytes of the log further: one the offset
        index names (plan.offset_after_position), which is the last offset of the batch at
        that entry, so a read ending there stops one record short of that batch's end; or
        the next segment's base offset. None when the log ends before the budget does."""
        remaining = budget
        for i, segment in enumerate(files.segments):
            next_base = files.next_base(i)
            if (next_base is not None and next_base <= start) or segment.size == 0:
                continue
            index = self.offset_index(files, segment)
            first, last = byte_range(index, segment, start, None)
            if last - first <= remaining:
                remaining -= last - first
                continue
            found = offset_after_position(index, segment, first + remaining, start)
            return found if found is not None else next_base
        return None

    def offset_index(self, files: PartitionFiles, segment: SegmentFile) -> OffsetIndex:
        key = (files.directory, segment.base_offset, segment.size)
        index = self._indexes.get(key)
        if index is not None:
            return index
        path = join(files.directory, segment_file_name(segment.base_offset, INDEX_SUFFIX))
        data = self._index_bytes(path, OFFSET_ENTRY_SIZE)
        index = usable_offset_index(segment.base_offset, data, segment.size)
        size = index.entries * OFFSET_ENTRY_SIZE
        if self._remembered_bytes + size <= self.remember_bytes:
            self._indexes[key] = index
            self._remembered_bytes += size
        return index

    def time_index(self, files: PartitionFiles, segment: SegmentFile) -> TimeIndex:
        path = join(files.directory, segment_file_name(segment.base_offset, TIME_INDEX_SUFFIX))
        data = self._index_bytes(path, TIME_ENTRY_SIZE)
        return usable_time_index(segment.base_offset, data)

    def _index_bytes(self, path: str, entry_size: int) -> bytes:
        """An index file as far as its sane prefix can go (plan.py's rules): a local file in
        pieces up to its first all-zero entry past the first; a bucket's whole (its
        segments are closed, their indexes trimmed)."""
        if is_bucket_url(path):
            return self._opener.read_all(path, Purpose.INDEX) or b""
        pieces: list[bytes] = []
        at = 0
        try:
            with self._opener.open(path, Purpose.INDEX) as file:
                size = file.size
                while at < size:
                    piece = file.pread(min(INDEX_PIECE_BYTES, size - at), at)
                    if not piece:
                        break
                    pieces.append(piece)
                    if holds_end_of_index(piece, at, entry_size):
                        break
                    at += len(piece)
        except FileNotFoundError:
            return b""
        return b"".join(pieces)

    def offset_for_timestamp(
        self, files: PartitionFiles, timestamp: int, starting_offset: int = 0
    ) -> int | None:
        """Offset of the first record at or past `starting_offset` (the log start) with a
        timestamp >= `timestamp` (Kafka's rule, log.segment.find_offset_by_timestamp's), or
        None."""
        last = len(files.segments) - 1
        for i, segment in enumerate(files.segments):
            if segment.size == 0:
                continue
            time_index = self.time_index(files, segment)
            # A rolled segment's time index ends with its largest timestamp; the active one's
            # may not have it yet, and an empty one says nothing.
            if i < last and time_index.entries and time_index.last_entry().timestamp < timestamp:
                continue
            next_base = files.next_base(i)
            if next_base is not None and next_base <= starting_offset:
                continue
            found = self._first_at_or_after(files, segment, time_index, timestamp, starting_offset)
            if found is not None:
                return found
        return None

    def _first_at_or_after(
        self,
        files: PartitionFiles,
        segment: SegmentFile,
        time_index: TimeIndex,
        timestamp: int,
        starting_offset: int,
    ) -> int | None:
        # Decoding records is needed only here: imported here, so that the processes that
        # only plan (a stream's source process on the driver) do not load the decoders.
        from replicad.records.records import decode_batch

        entry = time_index.lookup(timestamp)
        start = max(entry.offset, starting_offset)
        position = self.offset_index(files, segment).lookup(start).position
        with self._opener.open(files.log_path(segment.base_offset), Purpose.PLAN) as fd:
            walk = Walk(fd, position, segment.size, verify_crc=False)
            for chunk in walk:
                for header in chunk.batches:
                    if header.max_timestamp < timestamp or header.last_offset < starting_offset:
                        continue
                    for record in decode_batch(chunk.data, header).records:
                        if record.timestamp >= timestamp and record.offset >= starting_offset:
                            return record.offset
            if walk.tail is not None and walk.tail.stop is ScanStop.CORRUPT:
                raise LogError(
                    f"{files.log_path(segment.base_offset)}: {walk.tail.error} "
                    f"(at position {walk.tail.position})"
                )
        return None
