"""Offset and time indexes of a segment: Kafka's `.index` and `.timeindex`.

Rules (Kafka's OffsetIndex, TimeIndex and LogSegment, as of Kafka 4):
- `.index` entries are 8 bytes, `relative offset: int32, position: int32`, big-endian; the
  offset is the *last* offset of the batch that starts at `position` (Kafka's
  DumpLogSegments checks exactly that). Offsets increase strictly.
- `.timeindex` entries are 12 bytes, `timestamp: int64, relative offset: int32`: the largest
  batch max-timestamp seen so far in the segment and the last offset of the batch that
  carried it. A new entry is added only when the timestamp grew (strictly increasing).
- An entry pair is added for a batch when more than `index_interval_bytes` were written since
  the position of the last indexed batch (the first batch of a segment is never indexed).
  Appending and recovery use the same `IndexBuilder`, so an index rebuilt by recovery is
  byte-identical to the one written while appending.
- When a segment stops being active, its max timestamp so far is appended to the time index
  if not there yet (Kafka's onBecomeInactiveSegment), and both files are trimmed to their
  entries. The active segment's files are preallocated (sparse) to `segment_index_bytes`;
  a full index rolls the segment.
- Lookups: the offset index gives the entry with the largest offset <= target, else
  (base offset, position 0); the time index gives the entry with the largest timestamp <=
  target, else (-1, base offset).

`OffsetIndex`/`TimeIndex` and `IndexBuilder` are pure (bytes in memory); `IndexFile` is the
thin file shell that mirrors appends with pwrite, through a FileHandle (handles.py).
"""

from __future__ import annotations

import functools
import os
import struct
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from replicad.log.handles import FileHandle, FileHandles, StrPath
from replicad.records.batch import LOG_OVERHEAD, NO_TIMESTAMP, BatchHeader, BatchRun

OFFSET_ENTRY = struct.Struct(">ii")
TIME_ENTRY = struct.Struct(">qi")
OFFSET_ENTRY_SIZE = OFFSET_ENTRY.size  # 8
TIME_ENTRY_SIZE = TIME_ENTRY.size  # 12
MAX_RELATIVE_OFFSET = 2**31 - 1


@dataclass(frozen=True, slots=True)
class OffsetPosition:
    offset: int
    position: int


@dataclass(frozen=True, slots=True)
class TimestampOffset:
    timestamp: int
    offset: int


def fits_relative(base_offset: int, offset: int) -> bool:
    """Whether `offset` can be stored relative to `base_offset` (an int32 >= 0)."""
    return 0 <= offset - base_offset <= MAX_RELATIVE_OFFSET


class _Entries:
    """Fixed-size big-endian entries in a bytearray, searched by binary search."""

    __slots__ = ("_data", "base_offset", "max_entries")

    entry: struct.Struct

    def __init__(self, base_offset: int, max_bytes: int, data: bytes = b"") -> None:
        size = self.entry.size
        self.base_offset = base_offset
        self.max_entries = _max_entries(max_bytes, size)
        self._data = bytearray(data[: len(data) - len(data) % size])

    @property
    def entries(self) -> int:
        return len(self._data) // self.entry.size

    @property
    def is_full(self) -> bool:
        return self.entries >= self.max_entries

    @property
    def valid_bytes(self) -> int:
        return len(self._data)

    def raw(self) -> bytes:
        return bytes(self._data)

    def _field(self, slot: int, which: int) -> int:
        return self.entry.unpack_from(self._data, slot * self.entry.size)[which]

    def _largest_slot_at_most(self, target: int, which: int) -> int:
        """Slot of the last entry whose field `which` is <= target, -1 if none."""
        lo, hi = 0, self.entries - 1
        found = -1
        while lo <= hi:
            mid = (lo + hi) // 2
            if self._field(mid, which) <= target:
                found = mid
                lo = mid + 1
            else:
                hi = mid - 1
        return found

    def extend_raw(self, raw: bytes | bytearray) -> None:
        """Add entries already checked and encoded (IndexBuilder.index_run)."""
        self._data += raw

    def cut(self, entries: int) -> None:
        """Keep the first `entries` entries."""
        del self._data[entries * self.entry.size :]

    def reset(self) -> None:
        self._data.clear()


@functools.lru_cache(maxsize=16)
def _max_entries(max_bytes: int, entry_size: int) -> int:
    """One int object for every index of the same size (1,310,720 is no cached small int:
    32 bytes an index, two a segment, thousands of segments)."""
    return max(max_bytes // entry_size, 1)


class OffsetIndex(_Entries):
    __slots__ = ()
    entry = OFFSET_ENTRY

    def entry_at(self, slot: int) -> OffsetPosition:
        rel, pos = OFFSET_ENTRY.unpack_from(self._data, slot * OFFSET_ENTRY_SIZE)
        return OffsetPosition(self.base_offset + rel, pos)

    def last_entry(self) -> OffsetPosition:
        if self.entries == 0:
            return OffsetPosition(self.base_offset, 0)
        return self.entry_at(self.entries - 1)

    def lookup(self, offset: int) -> OffsetPosition:
        slot = self._largest_slot_at_most(offset - self.base_offset, 0)
        if slot < 0:
            return OffsetPosition(self.base_offset, 0)
        return self.entry_at(slot)

    def position_for(self, offset: int) -> int:
        """`lookup(offset).position` without the OffsetPosition (a read's: one a partition
        per Fetch)."""
        if not self.entries:
            return 0
        slot = self._largest_slot_at_most(offset - self.base_offset, 0)
        if slot < 0:
            return 0
        return OFFSET_ENTRY.unpack_from(self._data, slot * OFFSET_ENTRY_SIZE)[1]

    def append(self, offset: int, position: int) -> bytes:
        """Add an entry; returns its bytes for the file shell."""
        if self.is_full:
            raise ValueError(f"offset index of segment {self.base_offset} is full")
        if self.entries and offset <= self.last_entry().offset:
            raise ValueError(f"index offset {offset} not above {self.last_entry().offset}")
        if not fits_relative(self.base_offset, offset):
            raise ValueError(f"offset {offset} does not fit segment {self.base_offset}")
        raw = OFFSET_ENTRY.pack(offset - self.base_offset, position)
        self._data += raw
        return raw

    def truncate_to(self, offset: int) -> None:
        """Remove entries for offsets >= `offset`."""
        self.cut(self._largest_slot_at_most(offset - self.base_offset - 1, 0) + 1)

    def sanity_error(self, file_bytes: int) -> str | None:
        """Kafka's OffsetIndex.sanityCheck, plus strictly increasing entries."""
        if file_bytes % OFFSET_ENTRY_SIZE:
            return f"index file size {file_bytes} is not a multiple of {OFFSET_ENTRY_SIZE}"
        last_rel, last_pos = -1, -1
        for slot in range(self.entries):
            rel, pos = OFFSET_ENTRY.unpack_from(self._data, slot * OFFSET_ENTRY_SIZE)
            if rel <= last_rel or pos <= last_pos or rel < 0:
                return f"index entry {slot} ({rel}, {pos}) does not increase"
            last_rel, last_pos = rel, pos
        return None


class TimeIndex(_Entries):
    __slots__ = ()
    entry = TIME_ENTRY

    def entry_at(self, slot: int) -> TimestampOffset:
        ts, rel = TIME_ENTRY.unpack_from(self._data, slot * TIME_ENTRY_SIZE)
        return TimestampOffset(ts, self.base_offset + rel)

    def last_entry(self) -> TimestampOffset:
        if self.entries == 0:
            return TimestampOffset(NO_TIMESTAMP, self.base_offset)
        return self.entry_at(self.entries - 1)

    def lookup(self, timestamp: int) -> TimestampOffset:
        slot = self._largest_slot_at_most(timestamp, 0)
        if slot < 0:
            return TimestampOffset(NO_TIMESTAMP, self.base_offset)
        return self.entry_at(slot)

    def maybe_append(self, timestamp: int, offset: int, *, skip_full_check: bool = False) -> bytes:
        """Add (timestamp, offset) if the timestamp grew; returns the bytes added (or b"")."""
        if not skip_full_check and self.is_full:
            raise ValueError(f"time index of segment {self.base_offset} is full")
        last = self.last_entry()
        if self.entries and offset < last.offset:
            raise ValueError(f"time index offset {offset} below {last.offset}")
        if timestamp <= last.timestamp:
            return b""
        raw = TIME_ENTRY.pack(timestamp, offset - self.base_offset)
        self._data += raw
        return raw

    def truncate_to(self, offset: int) -> None:
        """Remove entries for offsets >= `offset` (entries are in offset order too)."""
        keep = 0
        for slot in range(self.entries):
            if self.entry_at(slot).offset >= offset:
                break
            keep = slot + 1
        self.cut(keep)

    def sanity_error(self, file_bytes: int) -> str | None:
        """Kafka's TimeIndex.sanityCheck, plus strictly increasing entries."""
        if file_bytes % TIME_ENTRY_SIZE:
            return f"time index file size {file_bytes} is not a multiple of {TIME_ENTRY_SIZE}"
        last_ts, last_rel = NO_TIMESTAMP, -1
        for slot in range(self.entries):
            ts, rel = TIME_ENTRY.unpack_from(self._data, slot * TIME_ENTRY_SIZE)
            if ts <= last_ts or rel < last_rel or rel < 0:
                return f"time index entry {slot} ({ts}, {rel}) does not increase"
            last_ts, last_rel = ts, rel
        return None


@dataclass(frozen=True, slots=True)
class IndexEntries:
    """What to add to the indexes for one batch."""

    offset_entry: OffsetPosition
    time_entry: TimestampOffset


class IndexBuilder:
    """Decides, batch by batch, when a segment's indexes get an entry (see module rules)."""

    __slots__ = ("bytes_since_last_entry", "index_interval_bytes", "max_timestamp")

    def __init__(
        self, index_interval_bytes: int, max_timestamp: TimestampOffset, bytes_since_last: int = 0
    ) -> None:
        self.index_interval_bytes = index_interval_bytes
        self.max_timestamp = max_timestamp
        self.bytes_since_last_entry = bytes_since_last

    def observe(self, batch: BatchHeader, position: int) -> IndexEntries | None:
        if batch.max_timestamp > self.max_timestamp.timestamp:
            self.max_timestamp = TimestampOffset(batch.max_timestamp, batch.last_offset)
        entries = None
        if self.bytes_since_last_entry > self.index_interval_bytes:
            entries = IndexEntries(OffsetPosition(batch.last_offset, position), self.max_timestamp)
            self.bytes_since_last_entry = 0
        self.bytes_since_last_entry += batch.batch_length + LOG_OVERHEAD
        return entries

    def index_run(
        self,
        batches: BatchRun | Sequence[BatchHeader],
        start: int,
        offset_index: OffsetIndex,
        time_index: TimeIndex,
    ) -> tuple[bytes, bytes]:
        """`observe` and the indexes' appends for a run of batches written at file position
        `start` (the run's first batch there, the others at their distance from it), in one
        pass over the run's tuples with no object per batch: the same entries, checked by
        the same rules. Returns the bytes added to the offset index and to the time index
        (for their files, one write each)."""
        run = BatchRun.of(batches)
        interval = self.index_interval_bytes
        since = self.bytes_since_last_entry
        ts, ts_offset = self.max_timestamp.timestamp, self.max_timestamp.offset
        base = offset_index.base_offset
        time_base = time_index.base_offset
        n_offsets, n_times = offset_index.entries, time_index.entries
        max_offsets, max_times = offset_index.max_entries, time_index.max_entries
        last_offset = offset_index.last_entry().offset if n_offsets else None
        # An entry's offset must be above the last entry's and fit the segment: one chained
        # compare a batch (`above < offset <= top`); what broke is told by _offset_refused.
        above = base - 1 if last_offset is None else max(last_offset, base - 1)
        top = base + MAX_RELATIVE_OFFSET
        last_time = time_index.last_entry()
        last_ts, last_ts_offset = last_time.timestamp, last_time.offset
        offset_raw = bytearray()
        time_raw = bytearray()
        pack_offset, pack_time = OFFSET_ENTRY.pack, TIME_ENTRY.pack
        position = start
        overhead = LOG_OVERHEAD
        # The fields of each entry, as run.py orders them (BatchHeader's, after position).
        for base_offset, length, _, _, _, _, delta, _, max_ts, _, _, _, _ in run.fields:
            if max_ts > ts:
                ts, ts_offset = max_ts, base_offset + delta
            if since > interval:
                offset = base_offset + delta
                if n_offsets >= max_offsets or not above < offset <= top:
                    raise _offset_refused(
                        offset_index, n_offsets, last_offset if above < base else above, offset
                    )
                offset_raw += pack_offset(offset - base, position)
                n_offsets += 1
                above = offset
                if n_times >= max_times:
                    raise ValueError(f"time index of segment {time_base} is full")
                if n_times and ts_offset < last_ts_offset:
                    raise ValueError(f"time index offset {ts_offset} below {last_ts_offset}")
                if ts > last_ts:
                    time_raw += pack_time(ts, ts_offset - time_base)
                    n_times += 1
                    last_ts, last_ts_offset = ts, ts_offset
                since = 0
            size = length + overhead
            since += size
            position += size
        if ts != self.max_timestamp.timestamp:
            self.max_timestamp = TimestampOffset(ts, ts_offset)
        self.bytes_since_last_entry = since
        offset_index.extend_raw(offset_raw)
        time_index.extend_raw(time_raw)
        return bytes(offset_raw), bytes(time_raw)


def _offset_refused(
    index: OffsetIndex, entries: int, last_offset: int | None, offset: int
) -> ValueError:
    """Why `offset` may not be the next entry of `index` holding `entries` entries, the
    last at `last_offset`: the rules in OffsetIndex.append's order."""
    if entries >= index.max_entries:
        return ValueError(f"offset index of segment {index.base_offset} is full")
    if last_offset is not None and offset <= last_offset:
        return ValueError(f"index offset {offset} not above {last_offset}")
    return ValueError(f"offset {offset} does not fit segment {index.base_offset}")


class IndexFile:
    """The file behind an OffsetIndex or TimeIndex: loaded lazily, appends mirrored by pwrite.

    Its descriptor comes from the log store's FileHandles (handles.py) for each operation;
    its path lives there too (one str per file, a Path made only when asked for)."""

    __slots__ = ("_base_offset", "_file", "_index", "_kind", "_max_bytes")

    def __init__(
        self,
        directory: StrPath,
        name: str,
        kind: type[OffsetIndex] | type[TimeIndex],
        base_offset: int,
        max_bytes: int,
        *,
        fresh: bool,
        handles: FileHandles,
    ) -> None:
        """`fresh`: the file is new (or to be replaced), so nothing is read from it."""
        self._kind = kind
        self._base_offset = base_offset
        self._max_bytes = max_bytes
        self._index: OffsetIndex | TimeIndex | None = None
        if fresh:
            self._file = handles.create(directory, name)
            self._index = kind(base_offset, max_bytes)
        else:
            # A missing index file is created empty, found empty, and rebuilt by recovery.
            self._file = handles.handle(directory, name, create=True)

    @property
    def path(self) -> Path:
        return self._file.path

    @property
    def file(self) -> FileHandle:
        return self._file

    @property
    def is_loaded(self) -> bool:
        return self._index is not None

    def load(self) -> str | None:
        """Read the entries in; returns why the file is unusable, or None when it is fine."""
        with self._file.pinned() as fd:
            size = os.fstat(fd).st_size
            data = os.pread(fd, size, 0) if size else b""
        self._index = self._kind(self._base_offset, self._max_bytes, data)
        return self._index.sanity_error(size)

    @property
    def index(self) -> OffsetIndex | TimeIndex:
        if self._index is None:
            self.load()
        assert self._index is not None
        return self._index

    def write_entry(self, raw: bytes) -> None:
        if raw:
            self._file.write_all(raw, self.index.valid_bytes - len(raw))

    def preallocate(self) -> None:
        """Extend (sparse) to the maximum size, as Kafka's index files are while active."""
        target = self.index.max_entries * self.index.entry.size
        with self._file.pinned() as fd:
            if os.fstat(fd).st_size == target:
                return
        self._file.truncate(target)

    def trim(self) -> None:
        self._file.truncate(self.index.valid_bytes)

    def rewrite(self) -> None:
        """Write the entries held in memory and cut the file to them."""
        self._file.truncate(0)
        data = self.index.raw()
        if data:
            self._file.write_all(data, 0)

    def replace(self, entries: OffsetIndex | TimeIndex) -> None:
        self._index = entries
        self.rewrite()

    def flush(self) -> None:
        self._file.sync()

    def close(self) -> None:
        self._file.close()
