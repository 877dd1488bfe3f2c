"""One log segment: `<base>.log` with its `.index` and `.timeindex` (the file shell).

What it keeps (index math lives in index.py, roll decisions in policy.py):
- `.log` holds whole batches only, written with pwrite at the current size; a failed write
  (ENOSPC, EIO) is undone by truncating back to the size before it, so the file never
  keeps a torn batch of ours.
- Indexes are kept in memory and mirrored to their files as entries are added. An inactive
  segment's indexes are read lazily, on first use; one that turns out malformed then is
  rebuilt from the log, and the rebuild is logged.
- Recovery scans the whole `.log` (length, magic, CRC, offsets increasing and fitting the
  segment), truncates at the first entry that is not valid, and rebuilds both indexes with
  the same IndexBuilder appends use.
- Reads return file regions for sendfile; a region starts at the first batch holding an
  offset >= the one asked for and ends within this segment.
- Descriptors: the three files are FileHandles of the log store's bounded cache (handles.py),
  opened for each operation and closed when the cache needs room; the mmap of a recovery
  scan lives only within that scan. `flush` syncs the files written since their last sync.
"""

from __future__ import annotations

import mmap
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import structlog

from replicad.errors import DamagedLogError, LogError
from replicad.log import nowait
from replicad.log.config import LogConfig
from replicad.log.epoch import LeaderEpochCache
from replicad.log.handles import FileHandle, FileHandles, StrPath
from replicad.log.index import (
    IndexBuilder,
    IndexFile,
    OffsetIndex,
    TimeIndex,
    TimestampOffset,
    fits_relative,
)
from replicad.log.layout import (
    DELETED_SUFFIX,
    INDEX_SUFFIX,
    LOG_SUFFIX,
    TIME_INDEX_SUFFIX,
    segment_file_name,
)
from replicad.records.batch import (
    MAGIC_V2,
    RECORD_BATCH_OVERHEAD,
    BatchHeader,
    BatchRun,
    ScanStop,
    header_at,
    scan_batches,
)
from replicad.records.run import MAX_TIMESTAMP

log = structlog.get_logger("replicad.log.segment")


@dataclass(slots=True)
class FileRegion:
    """Bytes [position, position + size) of `path`, ready for sendfile."""

    path: Path
    position: int
    size: int

    def read_bytes(self) -> bytes:
        with open(self.path, "rb") as f:
            return os.pread(f.fileno(), self.size, self.position)


@dataclass(frozen=True, slots=True)
class BatchLocation:
    """The first batch holding an offset >= the one looked up."""

    header: BatchHeader  # header.position is the batch's position in the .log file


@dataclass(frozen=True, slots=True)
class SegmentTruncation:
    bytes_removed: int
    # Base offset of the first batch removed; below the truncation offset when that batch
    # straddled it (batches are removed whole).
    first_removed_offset: int | None


@dataclass(frozen=True, slots=True)
class SegmentRecovery:
    base_offset: int
    valid_bytes: int
    truncated_bytes: int
    batches: int
    next_offset: int
    # Why the scan stopped before the end of the file (corrupt or torn entry), if it did.
    problem: str | None


class LogSegment:
    # One per segment of every partition, thousands at once: no __dict__, and the file
    # paths live once, in the FileHandles (the directory not even there: see FileHandle).
    __slots__ = (
        "_builder",
        "_log",
        "_next_offset",
        "_offset_file",
        "_time_file",
        "base_offset",
        "config",
        "created_ms",
        "rolling_timestamp",
        "size",
    )

    def __init__(
        self,
        directory: StrPath,
        base_offset: int,
        config: LogConfig,
        log_file: FileHandle,
        size: int,
        created_ms: int,
        *,
        fresh_indexes: bool,
        handles: FileHandles,
    ) -> None:
        self.base_offset = base_offset
        self.config = config
        self._log = log_file
        self.size = size
        self.created_ms = created_ms
        self._offset_file = IndexFile(
            directory,
            segment_file_name(base_offset, INDEX_SUFFIX),
            OffsetIndex,
            base_offset,
            config.segment_index_bytes,
            fresh=fresh_indexes,
            handles=handles,
        )
        self._time_file = IndexFile(
            directory,
            segment_file_name(base_offset, TIME_INDEX_SUFFIX),
            TimeIndex,
            base_offset,
            config.segment_index_bytes,
            fresh=fresh_indexes,
            handles=handles,
        )
        self._builder: IndexBuilder | None = None
        self._next_offset: int | None = base_offset if size == 0 else None
        self.rolling_timestamp: int | None = None

    # -- opening ---------------------------------------------------------------------------

    @classmethod
    def create(
        cls,
        directory: StrPath,
        base_offset: int,
        config: LogConfig,
        *,
        now_ms: int,
        handles: FileHandles | None = None,
    ) -> LogSegment:
        """A new, empty active segment. Without `handles`, it gets a cache of its own."""
        handles = handles or FileHandles(config.max_open_files)
        log_file = handles.create(directory, segment_file_name(base_offset, LOG_SUFFIX))
        segment = cls(
            directory, base_offset, config, log_file, 0, now_ms, fresh_indexes=True, handles=handles
        )
        segment._builder = IndexBuilder(
            config.index_interval_bytes, TimestampOffset(-1, base_offset)
        )
        segment.make_active()
        return segment

    @classmethod
    def open(
        cls,
        directory: StrPath,
        base_offset: int,
        config: LogConfig,
        *,
        now_ms: int,
        handles: FileHandles | None = None,
    ) -> LogSegment:
        """An existing segment; no file is opened until it is used."""
        handles = handles or FileHandles(config.max_open_files)
        name = segment_file_name(base_offset, LOG_SUFFIX)
        size = os.stat(os.path.join(directory, name)).st_size
        return cls(
            directory,
            base_offset,
            config,
            handles.handle(directory, name),
            size,
            now_ms,
            fresh_indexes=False,
            handles=handles,
        )

    @property
    def log_path(self) -> Path:
        return self._log.path

    @property
    def index_path(self) -> Path:
        return self._offset_file.path

    @property
    def time_index_path(self) -> Path:
        return self._time_file.path

    @property
    def offset_index(self) -> OffsetIndex:
        return self._loaded(self._offset_file)  # type: ignore[return-value]

    @property
    def time_index(self) -> TimeIndex:
        return self._loaded(self._time_file)  # type: ignore[return-value]

    def _loaded(self, f: IndexFile) -> OffsetIndex | TimeIndex:
        if not f.is_loaded:
            problem = f.load()
            if problem is not None:
                log.warning(
                    "index malformed, rebuilding", segment=str(self.log_path), problem=problem
                )
                self.rebuild_indexes()
        return f.index

    @property
    def index_loaded(self) -> bool:
        """Both indexes are in memory (a lookup writes nothing, not even a rebuild)."""
        return self._offset_file.is_loaded and self._time_file.is_loaded

    @property
    def offset_index_loaded(self) -> bool:
        """The offset index is in memory: `read` reads no index file (log/nowait.py)."""
        return self._offset_file.is_loaded

    def index_problem(self) -> str | None:
        """Why an index of this segment cannot be used as is (missing, malformed), if so."""
        for f in (self._offset_file, self._time_file):
            if not f.path.exists():
                return f"{f.path.name} is missing"
            if not f.is_loaded:
                problem = f.load()
                if problem is not None:
                    return f"{f.path.name}: {problem}"
        last = self._offset_file.index.last_entry()
        if last.position > self.size or (last.position == self.size and self.size > 0):
            return f"{self._offset_file.path.name} points past the end of the log"
        return None

    @property
    def builder(self) -> IndexBuilder:
        if self._builder is None:
            self._builder = self._builder_from_tail()
        return self._builder

    def _builder_from_tail(self) -> IndexBuilder:
        """Index state for further appends, from the last index entry and the batches after it."""
        last_entry = self.offset_index.last_entry()
        max_ts = self.time_index.last_entry()
        builder = IndexBuilder(self.config.index_interval_bytes, max_ts, 0)
        builder.bytes_since_last_entry = self.size - last_entry.position
        for header in self._headers_from(last_entry.position):
            if header.max_timestamp > builder.max_timestamp.timestamp:
                builder.max_timestamp = TimestampOffset(header.max_timestamp, header.last_offset)
        return builder

    def make_active(self) -> None:
        """Preallocate the index files, as Kafka does for the segment being written."""
        self.offset_index  # noqa: B018 -- loads the entries before the file grows
        self.time_index  # noqa: B018
        self._offset_file.preallocate()
        self._time_file.preallocate()
        if self.rolling_timestamp is None and self.size > 0:
            first = self._header_at(0)
            self.rolling_timestamp = first.max_timestamp if first else None

    # -- facts -----------------------------------------------------------------------------

    @property
    def next_offset(self) -> int:
        """The offset after the last batch (the base offset when empty)."""
        if self._next_offset is None:
            start = self.offset_index.last_entry().position
            last = None
            for header in self._headers_from(start):
                last = header
            self._next_offset = last.next_offset if last else self.base_offset
        return self._next_offset

    @property
    def max_timestamp(self) -> TimestampOffset:
        return self.builder.max_timestamp

    @property
    def timestamps_loaded(self) -> bool:
        """Both indexes and the largest timestamp are in memory (`known_max_timestamp`)."""
        return self._builder is not None and self.index_loaded

    def known_max_timestamp(self) -> TimestampOffset:
        """`max_timestamp` if it is in memory; LookupError if it is not. Never works it out
        from the segment's tail: that sets the index state appends use (`builder`), which
        a reader without the partition lock must not (a truncation may have just reset it:
        the state set from the bytes before the cut would then index the next appends)."""
        builder = self._builder
        if builder is None:
            raise LookupError(f"{self.log_path}: largest timestamp not loaded")
        return builder.max_timestamp

    @property
    def is_empty(self) -> bool:
        return self.size == 0

    # -- reading headers -------------------------------------------------------------------

    def _header_at(self, position: int, fd: int | None = None) -> BatchHeader | None:
        """The header of the batch at `position`; `fd`: the log's, pinned by the caller."""
        if position >= self.size:
            return None
        if fd is None:
            head = self._log.pread(RECORD_BATCH_OVERHEAD, position)
        else:
            head = nowait.pread(fd, RECORD_BATCH_OVERHEAD, position)  # serve's loop: nowait.py
        header = header_at(head, position)
        if isinstance(header, str) or header.end_position > self.size:
            return None
        return header

    def headers(self) -> list[BatchHeader]:
        """Headers of the batches in the file (read one by one, no CRC check)."""
        return self._headers_from(0)

    def _headers_from(self, position: int) -> list[BatchHeader]:
        headers = []
        with self._log.pinned() as fd:
            while (header := self._header_at(position, fd)) is not None:
                headers.append(header)
                position = header.end_position
        return headers

    def translate_offset(
        self, offset: int, start_position: int = 0, *, damage_raises: bool = False
    ) -> BatchLocation | None:
        """The first batch holding an offset >= `offset` (None: none in this segment).
        `damage_raises`: a position before the segment's end where no batch header parses
        raises DamagedLogError, instead of ending the search as the segment's end does."""
        header = self._first_header(offset, start_position, damage_raises)
        return None if header is None else BatchLocation(header)

    def _first_header(
        self, offset: int, start_position: int, damage_raises: bool
    ) -> BatchHeader | None:
        """translate_offset's search, the batch's header itself."""
        position = max(self.offset_index.position_for(offset), start_position)
        # Most lookups end at the first header the index points to (serve's Fetch: one per
        # partition): one pread under the handle cache's lock, no pin and unpin for it.
        header = self._header_at(position)
        if header is not None:
            if header.last_offset >= offset:
                return header
            position = header.end_position
        with self._log.pinned() as fd:
            while (header := self._header_at(position, fd)) is not None:
                if header.last_offset >= offset:
                    return header
                position = header.end_position
            if damage_raises and position < self.size:
                self._raise_damage(position, fd)
        return None

    def _raise_damage(self, position: int, fd: int) -> None:
        head = os.pread(fd, RECORD_BATCH_OVERHEAD, position)
        found = header_at(head, position)
        why = (
            found
            if isinstance(found, str)
            else (
                f"a batch of {found.size} bytes at position {position} runs past the end "
                f"({self.size} bytes)"
            )
        )
        raise DamagedLogError(f"{self.log_path}: {why}")

    def read(self, offset: int, max_bytes: int) -> FileRegion | None:
        """From the batch holding `offset`: max_bytes at most, but the first batch whole.
        A damaged entry before the batch raises DamagedLogError (see translate_offset)."""
        header = self.first_batch(offset)
        return self.region_from(header, max_bytes) if header is not None else None

    def first_batch(self, offset: int) -> BatchHeader | None:
        """The header of the batch holding `offset` (or the first after it); None when every
        batch here ends below it. Damage raises as `read` says."""
        return self._first_header(offset, 0, True)

    def region_from(self, header: BatchHeader, max_bytes: int) -> FileRegion:
        """The region `read` gives from the batch of `header`: max_bytes at most, but that
        batch whole."""
        start = header.position
        size = min(self.size - start, max(max_bytes, header.size))
        return FileRegion(self.log_path, start, size)

    def find_offset_by_timestamp(
        self, timestamp: int, starting_offset: int = 0
    ) -> TimestampOffset | None:
        """The first *record* at or past `starting_offset` whose timestamp is >= `timestamp`:
        (that record's timestamp, its offset); None when no record here qualifies.

        Kafka's LogSegment.findOffsetByTimestamp: the time index gives where to start, batch
        max timestamps which batches to open, and inside a batch the records decide -- a batch
        reaching the target may begin with older records. A LOG_APPEND_TIME batch's records
        all carry the batch's max timestamp (records.decode_batch applies that rule).
        """
        # Records are decoded here only (serve's ListOffsets by time): a follower does not
        # import the record decoder and its codecs (cramjam) to start (issue 32).
        from replicad.records.records import first_record_at

        entry = self.time_index.lookup(timestamp)
        position = self.offset_index.lookup(max(entry.offset, starting_offset)).position
        with self._log.pinned() as fd:
            while (header := self._header_at(position, fd)) is not None:
                if header.max_timestamp >= timestamp and header.last_offset >= starting_offset:
                    entry_bytes = os.pread(fd, header.size, header.position)
                    record = first_record_at(entry_bytes, header, timestamp, starting_offset)
                    if record is not None:
                        return TimestampOffset(record.timestamp, record.offset)
                position = header.end_position
        return None

    # -- writing ---------------------------------------------------------------------------

    def append(self, data: memoryview, batches: BatchRun | Sequence[BatchHeader]) -> None:
        """Write whole `batches` (their bytes are `data`, positions relative to batches[0])."""
        run = BatchRun.of(batches)
        if not run.fields:
            return
        first_offset = run.base_offset
        if first_offset < self.next_offset and not self.is_empty:
            raise LogError(
                f"batch at offset {first_offset} overlaps segment {self.base_offset} "
                f"ending at {self.next_offset}"
            )
        start = self.size
        offset_index, time_index = self.offset_index, self.time_index
        saved = (offset_index.entries, time_index.entries, self._builder_state())
        try:
            self._log.write_all(data, start)
            # One pass over the run for both indexes, one write per index file: the new
            # entries are contiguous, and write_entry puts bytes where the index's valid
            # part now ends.
            offset_raw, time_raw = self.builder.index_run(run, start, offset_index, time_index)
            if offset_raw:
                self._offset_file.write_entry(offset_raw)
                self._time_file.write_entry(time_raw)
        except OSError:
            self._log.truncate(start)
            offset_index.cut(saved[0])
            time_index.cut(saved[1])
            self._restore_builder_state(saved[2])
            raise
        if self.size == 0:
            self.rolling_timestamp = run.fields[0][MAX_TIMESTAMP]
        self.size = start + len(data)
        self._next_offset = run.next_offset

    def _builder_state(self) -> tuple[TimestampOffset, int]:
        return self.builder.max_timestamp, self.builder.bytes_since_last_entry

    def _restore_builder_state(self, state: tuple[TimestampOffset, int]) -> None:
        self.builder.max_timestamp, self.builder.bytes_since_last_entry = state

    def truncate_to(self, offset: int, *, files: bool = True) -> SegmentTruncation:
        """Drop every batch whose last offset is >= `offset`. Not `files`: in memory only
        (the size, the indexes, the index state: reads and appends see the shorter segment
        at once), the files are cut by `cut_files` later (log/partition.py: a truncation
        across segments cuts the segment left only once the removed ones' names are
        durable)."""
        location = self.translate_offset(offset)
        if location is None:
            return SegmentTruncation(0, None)
        # A batch holding `offset` is removed whole: batches are never split.
        position = location.header.position
        removed = self.size - position
        if files:
            self._log.truncate(position)
        self.size = position
        # Index entries name a batch's last offset, so these cuts drop exactly the entries of
        # the removed batches.
        self.offset_index.truncate_to(offset)
        self.time_index.truncate_to(location.header.base_offset)
        if files:
            self._offset_file.rewrite()
            self._time_file.rewrite()
        self._builder = None
        self._next_offset = None
        if self.size == 0:
            self.rolling_timestamp = None
        return SegmentTruncation(removed, location.header.base_offset)

    def cut_from(self, offset: int) -> SegmentTruncation | None:
        """Loading, for a segment followed by one starting at `offset` (log/partition.py):
        the file cut from its first batch holding `offset` or more, or from the first bytes
        that are no whole batch before it (a stale tail a crash tore), files and indexes;
        None when it ends at a batch below `offset` already. The offset index is trusted
        only below `offset` (an entry of a stale tail may point into the torn bytes)."""
        position = self.offset_index.position_for(offset - 1)
        first_removed = None
        with self._log.pinned() as fd:
            while (header := self._header_at(position, fd)) is not None:
                if header.last_offset >= offset:
                    first_removed = header.base_offset
                    break
                position = header.end_position
        if position >= self.size:
            return None
        removed = self.size - position
        self._log.truncate(position)
        self.size = position
        self.rebuild_indexes()  # rare (after a crash): entries past the cut go too
        self._next_offset = None
        if self.size == 0:
            self.rolling_timestamp = None
        return SegmentTruncation(removed, first_removed)

    def recover(self, epochs: LeaderEpochCache | None) -> SegmentRecovery:
        """Validate every batch, truncate what is not valid, rebuild the indexes."""
        scan_stop_problem: str | None = None
        headers: list[BatchHeader] = []
        valid = 0
        if self.size:
            # The map (and the descriptor mmap keeps for it) ends with this block.
            with self._log.pinned() as fd, mmap.mmap(fd, self.size, access=mmap.ACCESS_READ) as mm:
                view = memoryview(mm)
                try:
                    result = scan_batches(view)
                finally:
                    view.release()
            headers, valid = result.batches, result.valid_bytes
            if result.stop is ScanStop.CORRUPT:
                scan_stop_problem = result.error
            elif result.stop is ScanStop.PARTIAL:
                scan_stop_problem = f"torn batch at position {valid}"
        # Offsets must increase and fit the segment; the first batch that breaks that ends it.
        previous_next = self.base_offset
        for i, header in enumerate(headers):
            bad = header.base_offset < previous_next or not fits_relative(
                self.base_offset, header.last_offset
            )
            if bad:
                scan_stop_problem = (
                    f"batch at position {header.position} has offsets {header.base_offset}.."
                    f"{header.last_offset}, expected >= {previous_next} within the segment"
                )
                headers, valid = headers[:i], header.position
                break
            previous_next = header.next_offset
        if epochs is not None:
            for header in headers:
                if header.magic >= MAGIC_V2:
                    epochs.maybe_assign_from_batch(
                        header.partition_leader_epoch, header.base_offset
                    )
        truncated = self.size - valid
        if truncated:
            self._log.truncate(valid)
            self.size = valid
        self._rebuild_from(headers)
        self._next_offset = headers[-1].next_offset if headers else self.base_offset
        self.rolling_timestamp = headers[0].max_timestamp if headers else None
        return SegmentRecovery(
            self.base_offset, valid, truncated, len(headers), self.next_offset, scan_stop_problem
        )

    def rebuild_indexes(self) -> None:
        """Rebuild both indexes from the log (which is taken as valid)."""
        self._rebuild_from(self._headers_from(0))

    def _rebuild_from(self, headers: Sequence[BatchHeader]) -> None:
        offset_index = OffsetIndex(self.base_offset, self.config.segment_index_bytes)
        time_index = TimeIndex(self.base_offset, self.config.segment_index_bytes)
        builder = IndexBuilder(
            self.config.index_interval_bytes, TimestampOffset(-1, self.base_offset)
        )
        for header in headers:
            entries = builder.observe(header, header.position)
            if entries is not None:
                offset_index.append(entries.offset_entry.offset, entries.offset_entry.position)
                time_index.maybe_append(entries.time_entry.timestamp, entries.time_entry.offset)
        self._offset_file.replace(offset_index)
        self._time_file.replace(time_index)
        self._builder = builder

    def cut_files(self) -> None:
        """The files of a segment truncated in memory only (`truncate_to(files=False)`) and
        left behind by a roll (`become_inactive_in_memory`): the `.log` cut to the size,
        both indexes rewritten to the entries held (which trims them, as a roll does)."""
        self._log.truncate(self.size)
        self._offset_file.rewrite()
        self._time_file.rewrite()

    def become_inactive_in_memory(self) -> None:
        """`on_become_inactive` without the files: the final time index entry in memory
        only; `cut_files` writes it."""
        if self.size:
            ts = self.builder.max_timestamp
            self.time_index.maybe_append(ts.timestamp, ts.offset, skip_full_check=True)

    def on_become_inactive(self) -> None:
        """Final time index entry, then both index files trimmed (Kafka's roll)."""
        if self.size:
            ts = self.builder.max_timestamp
            self._time_file.write_entry(
                self.time_index.maybe_append(ts.timestamp, ts.offset, skip_full_check=True)
            )
        self._offset_file.trim()
        self._time_file.trim()

    def flush(self) -> None:
        """fsync what was written to the three files since their last sync."""
        for handle in self.files:
            handle.sync()

    @property
    def files(self) -> tuple[FileHandle, FileHandle, FileHandle]:
        """The handles of the `.log`, `.index` and `.timeindex` files."""
        return (self._log, self._offset_file.file, self._time_file.file)

    def mark_unsynced(self) -> None:
        """Make the next flush fsync every file (found on disk, maybe never synced)."""
        for handle in self.files:
            handle.mark_unsynced()

    def close(self) -> None:
        for handle in self.files:
            handle.close()

    def delete(self) -> None:
        self.close()
        for path in (self.log_path, self.index_path, self.time_index_path):
            path.unlink(missing_ok=True)

    def rename_for_deletion(self) -> list[Path]:
        """The first step of Kafka's two-phase delete: close, and rename each file to
        `<name>.deleted` (a cheap step, taken under the partition lock); the caller unlinks
        the returned paths later, outside it. A crash in between leaves `.deleted` files,
        which loading removes (layout.py's strays)."""
        self.close()
        renamed = []
        for path in (self.log_path, self.index_path, self.time_index_path):
            target = path.with_name(path.name + DELETED_SUFFIX)
            try:
                path.rename(target)
            except FileNotFoundError:
                continue
            renamed.append(target)
        return renamed
