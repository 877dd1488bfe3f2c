"""Splits: which byte ranges of which segments a read covers (pure: no file is touched here).

Rules:
- A segment `<base>.log` holds offsets [base, next segment's base); the last one up to the
  log end. For an offset range [start, end) a segment is kept only if its range meets it:
  segments entirely below `start` or at/above `end` are pruned from their names alone.
- Within a kept segment, the offset index (`replicad.log.index.OffsetIndex`) narrows the
  bytes: reading starts at the indexed batch at or before `start` (Kafka's lookup), and
  ends before the batch that follows the first indexed batch reaching `end` -- every batch
  from there on starts at or above `end`. Without a bound inside the segment, the index is
  not even loaded (unless the segment needs cutting).
- A range larger than `max_split_bytes` is cut at indexed batch starts, about every
  `max_split_bytes`, so one large segment is read by several tasks. Every cut is a batch
  boundary, since index entries only point at batch starts.
- An index is used only as far as it is sane: trailing zero entries (an active segment's
  preallocated file), entries past the segment's size, or entries that stop increasing
  end it. A shorter index only means coarser splits, never wrong ones. So an index is read
  in pieces, up to the first all-zero entry past its first (`holds_end_of_index`), not
  the whole of an active segment's preallocated 10 MiB for every micro-batch.
- Each split carries the partition's log end at planning (last segment and its size): the
  read never goes past it, however much a running replicad appends meanwhile.
- Small splits are packed (`pack`), in order, into groups of up to `pack_bytes`, each
  group one Spark task: a Python task costs far more than reading a few hundred records
  (a stream's micro-batch of 400 records over 4 partitions: reads of 2 to 100 ms in tasks
  seconds apart, two waves on two cores). A split of `pack_bytes` or more stays alone.
"""

from __future__ import annotations

import bisect
import itertools
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from replicad.log.index import (
    OFFSET_ENTRY_SIZE,
    TIME_ENTRY_SIZE,
    OffsetIndex,
    OffsetPosition,
    TimeIndex,
)
from replicad.log.layout import LOG_SUFFIX, segment_file_name
from replicad.records.batch import NO_TIMESTAMP
from replicad.types import TopicPartition

_OFFSET_DTYPE = np.dtype([("rel", ">i4"), ("pos", ">i4")])
_TIME_DTYPE = np.dtype([("ts", ">i8"), ("rel", ">i4")])


def join(directory: str, name: str) -> str:
    """`directory/name` for a local path and a bucket URL alike (Path would fold `s3://`)."""
    return f"{directory.rstrip('/')}/{name}"


@dataclass(frozen=True, slots=True)
class SegmentFile:
    base_offset: int
    size: int  # bytes of the .log when the directory was listed


@dataclass(frozen=True, slots=True)
class PartitionFiles:
    topic: str
    partition: int
    directory: str  # a local path or a bucket URL (s3://bucket/prefix/...)
    segments: tuple[SegmentFile, ...]  # ascending base offsets

    @property
    def topic_partition(self) -> TopicPartition:
        return TopicPartition(self.topic, self.partition)

    def log_path(self, base_offset: int) -> str:
        return join(self.directory, segment_file_name(base_offset, LOG_SUFFIX))

    def next_base(self, i: int) -> int | None:
        """Base offset of the segment after segment number `i`, None for the last one."""
        return self.segments[i + 1].base_offset if i + 1 < len(self.segments) else None


@dataclass(frozen=True, slots=True)
class LogEnd:
    """The partition's last segment and its size, as planned: no read goes past it."""

    segment: int
    size: int


@dataclass(frozen=True, slots=True)
class Split:
    """Bytes [start_position, end_position) of one segment, and the offsets wanted from them."""

    topic: str
    partition: int
    directory: str
    segment: int  # base offset of the segment
    start_position: int  # a batch boundary
    end_position: int  # a batch boundary, or the segment's size when planned
    start_offset: int  # records below it are skipped
    end_offset: int | None  # exclusive; None: to the end of the range
    log_end: LogEnd

    @property
    def path(self) -> str:
        return join(self.directory, segment_file_name(self.segment, LOG_SUFFIX))

    @property
    def last_segment(self) -> bool:
        """Whether this is the partition's last segment: only there may a writer be appending."""
        return self.segment == self.log_end.segment

    @property
    def size(self) -> int:
        return self.end_position - self.start_position


def usable_offset_index(base_offset: int, data: bytes, segment_size: int) -> OffsetIndex:
    """The sane prefix of an `.index` file's bytes (see the module rules). Checked with
    numpy, all entries at once: a stream plans every micro-batch, and the full index of a
    1 GiB segment (262,144 entries) took 238 ms a partition in a Python loop."""
    data = data[: _rounded_up(_unzeroed_length(data), OFFSET_ENTRY_SIZE)]
    whole = len(data) - len(data) % OFFSET_ENTRY_SIZE
    entries = np.frombuffer(data, dtype=_OFFSET_DTYPE, count=whole // OFFSET_ENTRY_SIZE)
    rel, pos = entries["rel"].astype(np.int64), entries["pos"].astype(np.int64)
    bad = (rel < 0) | (pos < 0) | (pos >= segment_size)
    bad[1:] |= (rel[1:] <= rel[:-1]) | (pos[1:] <= pos[:-1])
    size = _first_bad(bad) * OFFSET_ENTRY_SIZE
    return OffsetIndex(base_offset, max(size, OFFSET_ENTRY_SIZE), data[:size])


def usable_time_index(base_offset: int, data: bytes) -> TimeIndex:
    """The sane prefix of a `.timeindex` file's bytes (see the module rules)."""
    data = data[: _rounded_up(_unzeroed_length(data), TIME_ENTRY_SIZE)]
    whole = len(data) - len(data) % TIME_ENTRY_SIZE
    entries = np.frombuffer(data, dtype=_TIME_DTYPE, count=whole // TIME_ENTRY_SIZE)
    ts, rel = entries["ts"].astype(np.int64), entries["rel"].astype(np.int64)
    bad = (ts <= NO_TIMESTAMP) | (rel < 0)
    bad[1:] |= (ts[1:] <= ts[:-1]) | (rel[1:] < rel[:-1])
    size = _first_bad(bad) * TIME_ENTRY_SIZE
    return TimeIndex(base_offset, max(size, TIME_ENTRY_SIZE), data[:size])


def holds_end_of_index(piece: bytes, at: int, entry_size: int) -> bool:
    """Whether `piece`, read at byte `at` (a multiple of `entry_size`) of an index file,
    holds an all-zero entry other than the file's first: the sane prefix ends before it
    (an entry that does not increase), so nothing after it need be read."""
    whole = len(piece) - len(piece) % entry_size
    rows = np.frombuffer(piece, dtype=np.uint8, count=whole).reshape(-1, entry_size)
    zero = ~rows.any(axis=1)
    if at == 0 and len(zero):
        zero[0] = False
    return bool(zero.any())


def _unzeroed_length(data: bytes) -> int:
    """len(data.rstrip(b"\\0")), found 8 bytes at a time: an active segment's index is
    preallocated to 10 MiB of zeros, which rstrip took 41 ms to walk back over."""
    words = np.frombuffer(data, dtype=np.uint64, count=len(data) // 8)
    if data[len(words) * 8 :].strip(b"\0"):
        return len(data.rstrip(b"\0"))  # a non-zero byte in the last, partial word
    nonzero = np.flatnonzero(words)
    if not len(nonzero):
        return 0
    end = (int(nonzero[-1]) + 1) * 8
    return len(data[end - 8 : end].rstrip(b"\0")) + end - 8


def _first_bad(bad: np.ndarray) -> int:
    """How many entries come before the first bad one."""
    return int(bad.argmax()) if bad.any() else len(bad)


def _rounded_up(n: int, multiple: int) -> int:
    return -(-n // multiple) * multiple


class _Entries(Sequence[OffsetPosition]):
    """An OffsetIndex as a sequence, for bisect."""

    def __init__(self, index: OffsetIndex) -> None:
        self._index = index

    def __len__(self) -> int:
        return self._index.entries

    def __getitem__(self, slot: int) -> OffsetPosition:  # type: ignore[override]
        return self._index.entry_at(slot)


def segments_in_range(files: PartitionFiles, start: int, end: int | None) -> list[int]:
    """Numbers of the segments that may hold offsets in [start, end), from names alone."""
    kept = []
    for i, segment in enumerate(files.segments):
        next_base = files.next_base(i)
        if next_base is not None and next_base <= start:
            continue
        if end is not None and segment.base_offset >= end:
            break
        if segment.size > 0:
            kept.append(i)
    return kept


def byte_range(
    index: OffsetIndex | None, segment: SegmentFile, start: int, end: int | None
) -> tuple[int, int]:
    """[first, last) bytes of `segment` that can hold offsets in [start, end)."""
    if index is None:
        return 0, segment.size
    first = index.lookup(start).position if start > segment.base_offset else 0
    last = segment.size
    if end is not None:
        entries = _Entries(index)
        slot = bisect.bisect_left(entries, end, key=lambda e: e.offset)
        if slot + 1 < len(entries):
            last = entries[slot + 1].position
    return first, last


def offset_after_position(
    index: OffsetIndex, segment: SegmentFile, position: int, after: int
) -> int | None:
    """An offset above `after` from the offset index, to end a byte-limited read near byte
    `position`: the offset of the last entry at or before `position` when it is above
    `after`, else of the first entry above `after`; the segment's base offset when no
    entry is above `after` but the segment starts above it; else None (the segment's end
    is the caller's).

    An entry names the LAST offset of the batch that starts at its position (Kafka's
    offset index does the same), not a batch start. As an exclusive end, that offset stops
    one record before its batch ends: the batch's records below it are read now, its last
    record by the next read, which decodes the batch again (the rows are right)."""
    entries = _Entries(index)
    chosen = None
    slot = bisect.bisect_right(entries, position, key=lambda e: e.position)
    if slot > 0 and entries[slot - 1].offset > after:
        chosen = entries[slot - 1].offset
    else:
        first_above = bisect.bisect_right(entries, after, key=lambda e: e.offset)
        if first_above < len(entries):
            chosen = entries[first_above].offset
    if chosen is None and segment.base_offset > after:
        return segment.base_offset
    return chosen


def cut_points(index: OffsetIndex | None, first: int, last: int, max_split_bytes: int) -> list[int]:
    """Positions strictly inside (first, last) where the range is cut into splits."""
    if index is None or last - first <= max_split_bytes:
        return []
    entries = _Entries(index)
    cuts: list[int] = []
    at = first
    while True:
        slot = bisect.bisect_left(entries, at + max_split_bytes, key=lambda e: e.position)
        if slot >= len(entries):
            break
        position = entries[slot].position
        if position >= last:
            break
        cuts.append(position)
        at = position
    return cuts


def plan_partition(
    files: PartitionFiles,
    start: int,
    end: int | None,
    max_split_bytes: int,
    load_index: Callable[[SegmentFile], OffsetIndex],
) -> list[Split]:
    """The splits reading offsets [start, end) of one partition; `load_index` is called only
    for segments where a bound falls inside or that need cutting."""
    if not files.segments or (end is not None and end <= start):
        return []
    last = files.segments[-1]
    log_end = LogEnd(last.base_offset, last.size)
    splits: list[Split] = []
    for i in segments_in_range(files, start, end):
        segment = files.segments[i]
        next_base = files.next_base(i)
        bound_inside = start > segment.base_offset or (
            end is not None and (next_base is None or end < next_base)
        )
        index = None
        if bound_inside or segment.size > max_split_bytes:
            index = load_index(segment)
        first, stop = byte_range(index, segment, start, end)
        if first >= stop:
            continue
        edges = [first, *cut_points(index, first, stop, max_split_bytes), stop]
        for lo, hi in itertools.pairwise(edges):
            splits.append(
                Split(
                    files.topic,
                    files.partition,
                    files.directory,
                    segment.base_offset,
                    lo,
                    hi,
                    start,
                    end,
                    log_end,
                )
            )
    return splits


def pack(splits: Sequence[Split], pack_bytes: int) -> list[tuple[Split, ...]]:
    """`splits` in order, in groups of at most `pack_bytes` (a larger split alone)."""
    groups: list[tuple[Split, ...]] = []
    group: list[Split] = []
    size = 0
    for split in splits:
        if group and size + split.size > pack_bytes:
            groups.append(tuple(group))
            group, size = [], 0
        group.append(split)
        size += split.size
    if group:
        groups.append(tuple(group))
    return groups
