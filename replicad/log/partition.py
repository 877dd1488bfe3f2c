"""The log of one partition: its segments, offsets, leader-epoch cache and recovery.

Rules:
- Offsets: `log_start_offset` <= `high_watermark` <= `log_end_offset` after every step;
  `recovery_point` (everything below it was fsynced) <= `log_end_offset`. The log end is
  the next offset after the last batch, or an offset truncation or a start move set beyond
  it (a gap: the next append may start anywhere at or above it).
- Append takes whole, validated batches as bytes and writes them unchanged; the first batch
  must start at or after the log end (gaps allowed, overlap is a LogError). Batches are
  split over segments by policy.plan_append.
  An append that fails for lack of space leaves only whole batches (those written before
  the failure stay; the log end says up to where) and raises DiskFullError; a later append
  works once there is space.
- A roll (plan_append's split, `roll_if_idle`) makes the next segment at once, and the
  segment it leaves (its final time index entry and trimmed indexes written) and the
  directory (the new name) are fsynced: above the checkpointed recovery point with a
  `disk_later`, by the durability thread's job (`_settle_rolls`: the event loop appends,
  and waits on no fsync); else before the roll returns. Why late is safe: a flush fsyncs
  every file written since its last sync, the segments rolls left included, and the
  directory while a roll's name may not be durable (`dir_dirty`), before it raises the
  recovery point; so no checkpoint names an offset of a segment left unsynced or of a new
  segment whose name may be lost. A crash before the job: the segment left lies at or
  after the segment holding the checkpointed recovery point (its base is above it), so
  loading scans it and cuts a torn tail, as it always did the active segment's; the new
  segment's name lost, the log ends where the segment left ends, at or above every
  recovery point named; a lost index trim is a malformed index, rebuilt on first use
  (segment.py). At or below that point (a checkpoint file stale after a truncation below
  it), loading would not scan the segment left: hence at once (tools/sim/log_run.py). An
  empty active segment (rolled only for an offset that does not fit it) is replaced at
  once.
- Truncation removes whole batches: truncating to an offset inside a batch removes that
  batch and the log end becomes its base offset. When that batch held the log start too
  (a log may start inside its first batch: a crash's log start checkpoint, DeleteRecords),
  nothing at or above the log start is left: the log is emptied and starts at the offset
  (as Kafka's log start never passes its end; found by tools/sim, seed 80478). A
  filesystem may lose a shorter length that was not synced, and the removed batches would
  come back after a crash; below the recovery point the checkpoint file names -- stale
  until the next checkpoint -- loading trusts them, claiming them durable (found by
  tools/sim/log_run.py). So a truncation below the recovery point the last checkpoint
  named (`checkpointed_recovery_point`), or with no `disk_later`, does its disk work before
  it returns: the removed segments deleted, the shortened one fsynced, then the epoch file,
  then the directory (Kafka's fsyncs nothing and rewrites its recovery-point file instead).
  A truncation at or above it -- a follower's divergent tail, the usual case -- changes the
  files (renames removed segments to `.deleted`, shortens the last, or for a truncation
  across segments only in memory: below) and hands the rest to
  `disk_later` (the durability thread; one job a partition, however many truncations
  before it runs): fsync the directory, then flush (the shortened segment, then the epoch
  file), then unlink. The event loop waits on no fsync at a failover. A crash before that
  job may bring removed batches back, but only above that recovery point, where loading
  scans every batch and claims nothing (and rebuilds the epochs: epoch rule 3).
  A truncation across segments cuts the segment left only once the removed segments'
  renames are durable (the directory fsynced): a filesystem may make the shorter length
  durable before names it has not synced (btrfs's fsync log tree does not order the two
  across files; Kafka does not flush the directory after these renames), and the removed
  segments would come back after a crash beyond a gap, or overlapping batches appended since
  (tools/sim/log_run.py, seeds 21 and 33, whose crashes lose unsynced names). At once
  (below the checkpointed recovery point): rename, fsync the directory, cut, on the calling
  thread. At or above it, nothing waits on the disk: the segment left is cut in memory only
  (reads and the log end see the shorter log at once; a segment left with no batch is
  renamed away too) and a new segment made at the new log end (or the emptied one's base)
  takes the appends, so nothing written before the directory fsync lands in a file whose
  content depends on the renames; the job then fsyncs the directory, cuts the segment
  left's files (the roll's final time index entry and trimmed indexes with them), flushes
  and unlinks. A flush before that job makes the cut first (directory fsync, cut), and no
  recovery point passes a segment whose file still holds more than the log. A crash before
  the cut is durable leaves the segment left whole: with the names lost, the old log (the
  new segment gone, the removed ones back); with the names kept, the new segment after
  batches at or past its base -- loading cuts a segment's batches at or past the next
  segment's base (only a lost cut leaves such batches: segments are made at the log end),
  for the segment holding the recovery point and those after it, and the one before them.
  The new segment stays, a small one until retention takes it, each time a truncation
  crosses a segment start this way. Not avoided: appending into the segment left before
  the directory fsync, a crash that loses the names brings the removed segments back after
  the new batches (cut at their base by loading: two lineages in one log, an older epoch
  after a newer one). Not merged back yet: once the job has cut the segment left, an empty
  new segment could be renamed away and the segment left made active again, and one
  holding batches copied into it before the job's flush (no recovery point is past its
  base then); each needs its own planted defects in the log simulation.
- A full truncation (`truncate_fully_and_start_at`, the follower's StartAt) deletes the
  segments, writes the epoch file empty and fsyncs the directory before it returns, unless
  the log's files hold no batch, the new start is at or above the log end and the
  checkpointed recovery point, and the epoch file is empty already (a partition the
  follower has fetched nothing into: thousands at a start). Then it renames the old
  segment, makes the new one and hands the rest to `disk_later` (the truncation's job:
  the directory fsync, a flush, the unlinks); the recovery point stays where it was
  (below the new start) and every flush fsyncs the directory before it raises it while
  a deferred truncation's names are not durable, so no checkpoint names the new start or
  anything appended there before the new segment's name is on disk. A crash before that
  leaves the old empty segment, the new one, or both: nothing lost, nothing back
  (tools/sim/log_run.py, with crashes that lose a directory's names).
- Reads: a region from the batch holding the offset asked (or the first after it), within
  one segment. A segment whose batches all end below that offset is passed for the next; a
  damaged one never is: where a batch must start (the index's position, or the end of the
  batch before) and the segment's bytes are no batch header, or a header that runs past the
  segment's end, the read raises DamagedLogError, counted (`damaged_reads`) and logged, as
  Kafka's reads raise CorruptRecordException (serve answers CORRUPT_MESSAGE, verify reports
  the replica unreadable there). Passing over it would serve later batches as if the
  damaged ones were not there, and make verify call them missing.
- A read holds the partition lock only to check the offset and take the facts and the
  segments it may read (a copy of the list); the headers are read from disk without it, so
  serve's reads and verify's thread never make an append (the event loop) wait on a pread.
  What changes under such a read (an append past the region, a truncation, retention
  renaming a segment) can only make it fail (a header that no longer parses, a file gone,
  an index cut) or return a region that was right when it was found, as any region is
  once the lock is released; a read that fails for any reason, or finds nothing below the
  log end it took (a truncation cut it, or an append rolled past the list it took), is
  done again under the lock, where nothing changes, and only what fails there is the
  caller's error (damage counted once). A segment whose index is not loaded yet (loading
  may rebuild it, a write) is read under the lock, and is loaded from then on; so is, for
  a search by timestamp, one whose largest timestamp is not in memory yet (working it out
  sets the state appends index by).
- A read keeps the offset it was asked and the batch it found (`_ReadMemo`), and a read of
  the same offset while the log has been truncated as many times takes that batch again
  with no index lookup and no header read (a long-poll's next round, consumers of
  several groups at the same place, the same Fetch asked again). A batch's bytes and
  place never change but by a truncation (appends go after it; retention removes only
  segments below the log start, which the offset check refuses), so the count says
  whether it is still there; a memo made by a read that a truncation raced carries the
  count from before it, and is never used.
- Inside nowait.py's `not_waiting()` (serve's event loop) a read whose header bytes are not
  in the page cache, or whose segment's offset index is not loaded, raises
  nowait.WouldWait: never read again under the lock (it is no race), the caller reads
  where it may wait.
- Recovery (at load): segments from the one holding the recovery point on, and any segment
  whose index is missing or malformed, are scanned; the first invalid or torn entry ends the
  log there and every later segment is deleted. Batches at or past the next segment's base
  (a lost cut of a truncation across segments, above) are cut, and so are bytes that are no
  whole batch before it (that stale tail torn: its segment may be one a deferred roll left
  unsynced, cut in memory by a truncation at the checkpointed recovery point, and then it is
  the one segment loading does not scan that may hold unsynced bytes). A scanned segment
  that ends at or above the recovery point, below the next segment's base, may have lost a
  tail at a batch boundary (a deferred roll's segment: its tail and the next segments'
  bytes reach the disk in any order), which no scan sees: the log ends there too, and the
  later segments (above the recovery point: fetched again) are deleted. A gap that holds
  the recovery point is the log's own (an append that rolled past a gap), kept. Stray files
  are removed.
  What was done is logged and returned as a PartitionRecovery.
- `flush.messages`: an append that brings the unsynced records to `config.flush_messages`
  flushes -- itself, or, when the log store has a `flush_later` (the follower's durability
  thread), by handing the flush to it, once until that flush starts, so the appending
  thread (the event loop) never waits on the fsyncs.
- Retention deletes in two phases, as Kafka does: under the partition lock (the append
  path) it only renames the segments' files to `*.deleted`; it unlinks them after releasing
  it, so appends never wait on the unlinks of large files, nor on the leader-epoch file,
  which it writes after the lock too. A log start moved by the leader
  (`maybe_increment_log_start_offset`, on the event loop) renames the same way and hands
  the unlinks to `disk_later` when the log store has one. A crash in between leaves
  `*.deleted` files: loading removes them.
- The leader-epoch file (`leader-epoch-checkpoint`). The cache changes in memory under the
  lock; `save_epochs` writes the file from any thread: it stages and fsyncs the new text
  outside the lock, renames it under the lock only if no newer text was renamed meanwhile
  (so an older cache never replaces a newer one), then fsyncs the directory. An append that
  starts a new epoch and a move of the log start do not write it themselves when the log
  store has a `disk_later` (the follower's durability thread): they hand the write there,
  so the event loop waits on no fsync when thousands of partitions change leader at once,
  and many changes before the write starts are one write (the thread's queue coalesces
  them, follower/disk_queue.py). Why writing it late is safe:
    1. `flush` writes the file before it raises the recovery point, and a checkpoint file
       names only recovery points raised by flushes (manager.py): every epoch of the data
       below a checkpointed recovery point is in the file on disk before the checkpoint
       names that data.
    2. Above the checkpointed recovery point, loading after a crash rescans the batches
       and adds their epochs (recovery): an entry the file lacks there is rebuilt.
    3. What a rescan cannot repair is written at once: an entry starting below the
       recovery point the last checkpoint file named (`checkpointed_recovery_point`: only
       after a truncation below it), and a truncation below it. A truncation at or above it
       is written late like an append (on the durability thread, after the truncation is
       durable): loading drops the file's entries from the first segment it rescans on and
       takes the epochs of its batches instead, so an entry of removed batches that the
       late file still held does not outlive them (a rescan alone only adds epochs above
       the latest).
    4. A late file whose first entry starts below the log start is harmless: loading
       moves it up to the log start.
- Thread use: every method takes the partition lock; `flush` holds it only to pick what to
  sync and fsyncs duplicated descriptors outside it, so a flush on a worker thread (the
  follower's durability thread) does not stall appends on the event loop.
- A flush never moves the recovery point past what its fsyncs covered: it picks the log end
  and the files written up to it, fsyncs them, then raises the recovery point to that log
  end (or the log end now, if lower). A truncation while it fsyncs ends that claim: the
  offsets between the truncation point and the old end may have been written again since,
  into files this flush never picked, so the recovery point stays where the truncation put
  it and the next flush covers them.
- Descriptors come from the FileHandles shared by the log store (handles.py); `flush` syncs
  every file written since its last sync, whether its descriptor is open or was evicted.
  After an unclean stop, segment files found at or after the recovery point count as
  unsynced (the process that wrote them may have left them in the page cache only).
"""

from __future__ import annotations

import bisect
import contextlib
import errno
import operator
import os
import threading
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

import structlog

from replicad.clock import monotonic_ms
from replicad.errors import DamagedLogError, DiskFullError, LogError, OffsetOutOfRangeError
from replicad.log import nowait
from replicad.log.checkpoint import (
    EpochEntry,
    format_epochs,
    format_partition_metadata,
    fsync_dir,
    parse_epochs,
    parse_partition_metadata,
    read_text,
    stage_file,
    write_atomically,
)
from replicad.log.config import LogConfig
from replicad.log.epoch import EpochEndOffset, LeaderEpochCache
from replicad.log.handles import FileHandle, FileHandles
from replicad.log.index import TimestampOffset
from replicad.log.layout import (
    LEADER_EPOCH_CHECKPOINT,
    PARTITION_METADATA,
    classify_partition_files,
)
from replicad.log.nowait import WouldWait
from replicad.log.policy import (
    ActiveSegmentState,
    RollReason,
    SegmentSummary,
    next_retention_ms,
    plan_append,
    plan_retention,
    should_flush_messages,
    should_flush_time,
)
from replicad.log.segment import BatchLocation, FileRegion, LogSegment, SegmentTruncation
from replicad.ratelimit import RateLimitedLog
from replicad.records.batch import MAGIC_V2, BatchHeader, BatchRun
from replicad.types import TopicPartition

log = structlog.get_logger("replicad.log")

# Where checkpoint_mark holds the log start (the log store writes its file when one moved).
MARK_LOG_START = 3

# The key of a partition's truncation job on the durability thread (disk_queue.py: one
# waiting job per key; it reads the partition's state when it runs, so it covers them all).
TRUNCATION = "truncation"
# The key of a partition's roll job there (one job covers every roll before it runs).
ROLL = "roll"
NO_SPACE = (errno.ENOSPC, errno.EDQUOT)  # a full disk (or quota): DiskFullError, a pause
_BASE_OFFSET = operator.attrgetter("base_offset")

# A damaged partition is read again and again (every fetch of it): one line a minute each.
_DAMAGE_SAID = RateLimitedLog(interval_ms=60_000)
_DAMAGE_SAID_LOCK = threading.Lock()  # reads of several threads find damage


@dataclass(frozen=True, slots=True)
class AppendResult:
    first_offset: int
    last_offset: int
    log_end_offset: int
    appended_bytes: int
    # Base offsets of the segments this append rolled to.
    rolled_segments: tuple[int, ...] = ()


@dataclass(slots=True)
class ReadResult:
    """What a reader asked for at `offset`: a file region (None at the log end)."""

    offset: int
    region: FileRegion | None
    log_start_offset: int
    log_end_offset: int
    high_watermark: int


@dataclass(frozen=True, slots=True)
class PartitionRecovery:
    """What loading a partition found and did."""

    topic_partition: TopicPartition
    segments: int
    recovered_segments: tuple[int, ...]  # base offsets scanned
    truncated_bytes: int
    deleted_segments: tuple[int, ...]
    removed_files: tuple[str, ...]
    rebuilt_indexes: tuple[int, ...]
    problems: tuple[str, ...]
    log_end_offset: int

    @property
    def clean(self) -> bool:
        return not (self.truncated_bytes or self.deleted_segments or self.problems)


@dataclass(slots=True)
class _Flushing:
    unflushed_messages: int = 0
    first_unflushed_ms: int | None = None
    # The directory holds names a deferred truncation changed: the next flush fsyncs it.
    dir_dirty: bool = False


@dataclass(slots=True)
class _Settling:
    unlinks: list[Path]
    # Segments cut in memory whose files wait for the directory fsync (truncate_to).
    cuts: list[LogSegment]


class PartitionLog:
    # Thousands of these live at once (one per replicated partition): no __dict__.
    __slots__ = (
        "_directory",
        "_epoch_writes",
        "_epochs",
        "_epochs_saved",
        "_flush_queued",
        "_flushing",
        "_handles",
        "_last_now_ms",
        "_lock",
        "_log_end_offset",
        "_read_memo",
        "_segments",
        "_settling",
        "_truncations",
        "archive_floor",
        "checkpointed_mark",
        "checkpointed_recovery_point",
        "config",
        "damaged_offset",
        "damaged_reads",
        "disk_later",
        "flush_later",
        "high_watermark",
        "last_recovery",
        "log_start_offset",
        "recovery_point",
        "retained_mark",
        "retention_due_ms",
        "retention_floor",
        "topic_id",
        "topic_partition",
    )

    def __init__(
        self,
        directory: Path,
        topic_partition: TopicPartition,
        config: LogConfig,
        segments: list[LogSegment],
        epochs: LeaderEpochCache,
        *,
        log_start_offset: int,
        recovery_point: int,
        high_watermark: int,
        topic_id: uuid.UUID | None,
        handles: FileHandles,
    ) -> None:
        # Kept as the str its Path holds (shared with the segments' file handles); a
        # pathlib.Path per partition was about 300 bytes more, for a few rare uses.
        self._directory = os.fspath(directory)
        self._handles = handles
        self.topic_partition = topic_partition
        self.config = config
        self._segments = segments
        self._epochs = epochs
        self._epochs_saved = epochs.version
        self._log_end_offset = segments[-1].next_offset
        self.log_start_offset = min(
            max(log_start_offset, segments[0].base_offset), self._log_end_offset
        )
        self.recovery_point = min(recovery_point, self._log_end_offset)
        self.high_watermark = min(max(high_watermark, self.log_start_offset), self._log_end_offset)
        self.topic_id = topic_id
        self._lock = threading.RLock()
        self._flushing = _Flushing()
        # Where a due flush goes instead of running here (see the module rules).
        self.flush_later: Callable[[PartitionLog], None] | None = None
        self._flush_queued = False
        # Where disk work goes that the appending thread need not wait for (the
        # leader-epoch file, unlinks): `disk_later(job, what, key)`; see the module rules.
        self.disk_later: Callable[[Callable[[], object], str, object], None] | None = None
        self._epoch_writes = 0
        # The recovery point the last checkpoint file named (rule 3 of the epoch file).
        self.checkpointed_recovery_point = recovery_point
        # Truncations so far: a flush that saw another count when it started claims nothing.
        self._truncations = 0
        # The last read's offset and the batch it began at (see the module rules: reads).
        self._read_memo: _ReadMemo | None = None
        # Deferred truncations' disk work for the durability thread: files renamed to
        # `.deleted` to unlink, segments to cut once the renames are durable (None while
        # there is none: most partitions, most of the time).
        self._settling: _Settling | None = None
        # The latest time a caller passed in; used where an API takes no time argument.
        self._last_now_ms = 0
        self.last_recovery: PartitionRecovery | None = None
        # Reads that found damage and raised DamagedLogError (see the module rules).
        self.damaged_reads = 0
        self.damaged_offset: int | None = None  # where the last read found damage
        # Retention deletes no segment holding this offset or a later one (None: no hold).
        # The mirror sets it to what it has not mirrored yet (replicad/mirror/shell.py).
        self.retention_floor: int | None = None
        # The same for the archive: what is not uploaded yet (replicad/archive/uploader.py).
        self.archive_floor: int | None = None
        # When time retention could first delete more than the last pass did, while nothing
        # changes the segments (policy.next_retention_ms; 0: no pass yet).
        self.retention_due_ms: float = 0
        # Its checkpoint_mark when the log store's last checkpoint that flushed it began, and
        # when its last retention pass began (None: none yet): manager.py's to keep.
        self.checkpointed_mark: tuple[object, ...] | None = None
        self.retained_mark: tuple[object, ...] | None = None

    @property
    def directory(self) -> Path:
        """The partition's directory (made for each use: see __init__)."""
        return Path(self._directory)

    # -- creation and loading --------------------------------------------------------------

    @classmethod
    def create(
        cls,
        directory: Path,
        tp: TopicPartition,
        config: LogConfig,
        *,
        now_ms: int,
        topic_id: uuid.UUID | None = None,
        start_offset: int = 0,
        handles: FileHandles | None = None,
    ) -> PartitionLog:
        """A new partition log; without `handles` (LogManager's), it gets a cache of its own."""
        handles = handles or FileHandles(config.max_open_files)
        try:
            directory.mkdir(parents=True, exist_ok=True)
            segment = LogSegment.create(
                directory, start_offset, config, now_ms=now_ms, handles=handles
            )
            if topic_id is not None:
                write_atomically(
                    directory / PARTITION_METADATA, format_partition_metadata(topic_id)
                )
            fsync_dir(directory)
            fsync_dir(directory.parent)
        except OSError as exc:
            # A full disk while a partition's files are made is a pause, not a broken log:
            # creating it again once there is space finds what this try left and goes on.
            if exc.errno in NO_SPACE:
                raise DiskFullError(f"{tp}: no space left creating its log: {exc}") from exc
            raise
        partition = cls(
            directory,
            tp,
            config,
            [segment],
            LeaderEpochCache(),
            log_start_offset=start_offset,
            recovery_point=start_offset,
            high_watermark=start_offset,
            topic_id=topic_id,
            handles=handles,
        )
        try:
            partition._persist_epochs(force=True)
        except OSError as exc:
            # The epoch file is the first of the log's files that takes bytes: a full disk
            # shows here more often than at the segment's empty files (session 14's
            # 10,000-partition soak). The half-made log is let go, made again later.
            with contextlib.suppress(OSError):
                partition.close()
            if exc.errno in NO_SPACE:
                raise DiskFullError(f"{tp}: no space left creating its log: {exc}") from exc
            raise
        return partition

    @classmethod
    def load(
        cls,
        directory: Path,
        tp: TopicPartition,
        config: LogConfig,
        *,
        now_ms: int,
        recovery_point: int,
        log_start_offset: int | None,
        high_watermark: int,
        clean_shutdown: bool,
        handles: FileHandles | None = None,
    ) -> PartitionLog:
        handles = handles or FileHandles(config.max_open_files)
        listing = classify_partition_files(sorted(os.listdir(directory)))
        problems: list[str] = []
        for name in listing.strays:
            (directory / name).unlink(missing_ok=True)
        start = log_start_offset if log_start_offset is not None else 0
        if not listing.segments:
            segments = [LogSegment.create(directory, start, config, now_ms=now_ms, handles=handles)]
        else:
            segments = [
                LogSegment.open(directory, base, config, now_ms=now_ms, handles=handles)
                for base in listing.segments
            ]
            if not clean_shutdown:
                # Written by a process that stopped uncleanly, maybe never synced: the next
                # flush syncs them before the recovery point may pass them.
                bases = [s.base_offset for s in segments]
                for segment in segments[max(bisect.bisect_right(bases, recovery_point) - 1, 0) :]:
                    segment.mark_unsynced()
        loaded = _load_epochs(directory)
        epochs, epoch_problem = loaded.cache, loaded.problem
        in_file = epochs.entries
        rebuild_epochs = loaded.missing or epoch_problem is not None
        if epoch_problem:
            problems.append(epoch_problem)

        missing = set(listing.missing_index) | set(listing.missing_time_index)
        first_to_scan = len(segments)
        if not clean_shutdown:
            bases = [s.base_offset for s in segments]
            first_to_scan = max(bisect.bisect_right(bases, recovery_point) - 1, 0)
        recovered: list[int] = []
        rebuilt: list[int] = []
        deleted: list[int] = []
        truncated = 0
        i = 0
        while i < len(segments):
            segment = segments[i]
            if i >= max(first_to_scan, 1):
                cut = _cut_at_next_base(segments[i - 1], segment, epochs)
                if cut is not None:
                    truncated += cut.bytes_removed
                    problems.append(
                        f"segment {segments[i - 1].base_offset}: {cut.bytes_removed} bytes at "
                        f"or past {segment.base_offset}, where segment {segment.base_offset} "
                        "starts, cut"
                    )
            reason = None
            if i >= first_to_scan:
                reason = "after the recovery point"
            elif segment.base_offset in missing:
                reason = "index file missing"
            elif i == len(segments) - 1 and (problem := segment.index_problem()):
                reason = problem
            if reason is None:
                if rebuild_epochs:
                    # No usable epoch file: read the epochs from the headers, in offset order.
                    for header in segment.headers():
                        if header.magic >= MAGIC_V2:
                            epochs.maybe_assign_from_batch(
                                header.partition_leader_epoch, header.base_offset
                            )
                i += 1
                continue
            if reason != "after the recovery point":
                problems.append(f"segment {segment.base_offset}: {reason}")
                rebuilt.append(segment.base_offset)
            elif i == first_to_scan:
                _forget_epochs_from(epochs, segment.base_offset)
            result = segment.recover(epochs)
            recovered.append(segment.base_offset)
            if result.problem is not None and result.truncated_bytes:
                problems.append(f"segment {segment.base_offset}: {result.problem}")
            truncated += result.truncated_bytes
            lost = i + 1 < len(segments) and _lost_tail(segment, segments[i + 1], recovery_point)
            if lost:
                problems.append(
                    f"segment {segment.base_offset} ends at {segment.next_offset}, at or above "
                    f"the recovery point and below {segments[i + 1].base_offset}, where the "
                    "next segment starts: a tail lost in the crash may have been there"
                )
            if (result.truncated_bytes or lost) and i + 1 < len(segments):
                for later in segments[i + 1 :]:
                    deleted.append(later.base_offset)
                    later.delete()
                segments = segments[: i + 1]
            i += 1
        segments[-1].make_active()
        topic_id = None
        metadata = read_text(directory / PARTITION_METADATA)
        if metadata is not None:
            try:
                topic_id = parse_partition_metadata(
                    metadata, source=str(directory / PARTITION_METADATA)
                )
            except LogError as exc:
                problems.append(str(exc))
        partition = cls(
            directory,
            tp,
            config,
            segments,
            epochs,
            log_start_offset=start if log_start_offset is not None else segments[0].base_offset,
            recovery_point=recovery_point,
            high_watermark=high_watermark,
            topic_id=topic_id,
            handles=handles,
        )
        partition._epochs.truncate_from_end(partition.log_end_offset)
        partition._epochs.truncate_from_start(partition.log_start_offset)
        # Recovery may have added epochs the file lacked (written late, then a crash: epoch
        # rule 2): the file catches up now, before a checkpoint names their data.
        partition._persist_epochs(force=bool(epoch_problem) or epochs.entries != in_file)
        report = PartitionRecovery(
            tp,
            len(segments),
            tuple(recovered),
            truncated,
            tuple(deleted),
            tuple(listing.strays),
            tuple(rebuilt),
            tuple(problems),
            partition.log_end_offset,
        )
        partition.last_recovery = report
        level = log.info if report.clean else log.warning
        level(
            "partition loaded",
            partition=str(tp),
            segments=report.segments,
            log_start_offset=partition.log_start_offset,
            log_end_offset=partition.log_end_offset,
            recovery_point=recovery_point,
            clean_shutdown=clean_shutdown,
            recovered_segments=list(report.recovered_segments),
            truncated_bytes=truncated,
            deleted_segments=list(deleted),
            removed_files=list(listing.strays),
            rebuilt_indexes=list(rebuilt),
            problems=list(problems),
        )
        return partition

    # -- facts -----------------------------------------------------------------------------

    @property
    def log_end_offset(self) -> int:
        return self._log_end_offset

    @property
    def segments(self) -> list[LogSegment]:
        with self._lock:
            return list(self._segments)

    @property
    def size_in_bytes(self) -> int:
        with self._lock:
            return sum(s.size for s in self._segments)

    @property
    def active_segment(self) -> LogSegment:
        return self._segments[-1]

    def latest_epoch(self) -> int | None:
        with self._lock:
            return self._epochs.latest_epoch()

    def epoch_entries(self) -> list[EpochEntry]:
        with self._lock:
            return self._epochs.entries

    def end_offset_for_epoch(self, epoch: int) -> EpochEndOffset:
        with self._lock:
            return self._epochs.end_offset_for(epoch, self._log_end_offset)

    # -- append ----------------------------------------------------------------------------

    def append(
        self,
        data: bytes | bytearray | memoryview,
        batches: BatchRun | Sequence[BatchHeader],
        *,
        now_ms: int,
    ) -> AppendResult:
        """Write whole `batches`, whose bytes are `data` (exactly theirs, or a buffer their
        positions index). A `BatchRun` (the follower's) is written with no object made per
        batch; a list of headers is made one first."""
        if not batches:
            raise LogError(f"{self.topic_partition}: append of no batches")
        mv = memoryview(data).cast("B") if not isinstance(data, memoryview) else data
        try:
            run = BatchRun.of(batches)
        except ValueError as exc:
            raise LogError(f"{self.topic_partition}: {exc}") from None
        if len(mv) == run.size:
            shift = run.start
        elif len(mv) >= run.end:
            shift = 0
        else:
            raise LogError(
                f"{self.topic_partition}: {len(mv)} bytes of data do not hold the batches "
                f"({run.size} bytes from position {run.start})"
            )
        first_offset = run.base_offset
        with self._lock:
            if first_offset < self._log_end_offset:
                raise LogError(
                    f"{self.topic_partition}: batch at offset {first_offset} overlaps the "
                    f"log ending at {self._log_end_offset}"
                )
            overlap = run.first_overlap()
            if overlap is not None:
                raise LogError(
                    f"{self.topic_partition}: offsets go back from "
                    f"{run[overlap - 1].last_offset} to {run[overlap].base_offset} within one "
                    "append"
                )
            self._last_now_ms = now_ms
            # Records counted only for `flush.messages` (unset by default: one pass over the
            # batches' fields fewer an append, about 1% of the hot path's CPU).
            count_messages = self.config.flush_messages is not None
            runs = plan_append(self._active_state(), run, self.config, now_ms)
            rolled: list[int] = []
            appended = 0
            for segment_run in runs:
                part = run[segment_run.start : segment_run.end] if len(runs) > 1 else run
                lo = part.start - shift
                hi = part.end - shift
                try:
                    if segment_run.roll is not None:
                        self._roll(part.base_offset, segment_run.roll, now_ms)
                        rolled.append(part.base_offset)
                    self.active_segment.append(mv[lo:hi], part)
                except OSError as exc:
                    self._append_failed(exc, part.base_offset)
                appended += hi - lo
                latest = self._epochs.latest_epoch()
                for epoch, offset in part.epoch_starts(-1 if latest is None else latest):
                    self._epochs.maybe_assign_from_batch(epoch, offset)
                if count_messages:
                    self._flushing.unflushed_messages += part.record_count
                self._log_end_offset = part.next_offset
            if self._flushing.first_unflushed_ms is None:
                self._flushing.first_unflushed_ms = now_ms
            try:
                self._epochs_changed(first_offset)
            except OSError as exc:
                self._append_failed(exc, first_offset)
            flush_now = should_flush_messages(self._flushing.unflushed_messages, self.config)
        if flush_now:
            if self.flush_later is None:
                self.flush()
            elif not self._flush_queued:
                self._flush_queued = True
                self.flush_later(self)
        return AppendResult(
            first_offset, run.last_offset, self._log_end_offset, appended, tuple(rolled)
        )

    def _append_failed(self, exc: OSError, offset: int) -> None:
        active = self.active_segment
        # A roll may have failed after the old segment was trimmed: make it writable again.
        active.make_active()
        self._log_end_offset = max(self._log_end_offset, active.next_offset)
        # If this fails too, the cache stays unsaved and its next change writes it.
        with contextlib.suppress(OSError):
            self._epochs_changed(offset)
        if exc.errno in NO_SPACE:
            raise DiskFullError(
                f"{self.topic_partition}: no space left appending at offset {offset}; the log "
                f"ends at {self._log_end_offset} with whole batches only"
            ) from exc
        raise LogError(f"{self.topic_partition}: append failed: {exc}") from exc

    def _active_state(self) -> ActiveSegmentState:
        active = self.active_segment
        return ActiveSegmentState(
            active.base_offset,
            active.size,
            active.offset_index.entries,
            active.time_index.entries,
            active.builder.bytes_since_last_entry,
            active.rolling_timestamp,
            active.created_ms,
        )

    def roll_if_idle(self, now_ms: int) -> bool:
        """Roll a non-empty active segment created more than `segment_ms` ago, though
        nothing is being appended. Kafka rolls only on an append, so a quiet partition's
        last records would stay in the active segment forever; the archive uploads closed
        segments only, and calls this so that it trails the log by about `segment_ms`."""
        with self._lock:
            active = self.active_segment
            if active.is_empty or now_ms - active.created_ms <= self.config.segment_ms:
                return False
            self._roll(self._log_end_offset, RollReason.SEGMENT_MS, now_ms)
            return True

    def _roll(self, base_offset: int, reason: RollReason, now_ms: int) -> None:
        """Under the lock: a new active segment at `base_offset` (see the module rules: a
        roll). Above the checkpointed recovery point, with a `disk_later`, nothing waits on
        the disk: the durability thread's job (`_settle_rolls`) fsyncs the segment left and
        the directory; else both are fsynced before it returns."""
        old = self.active_segment
        # An empty active segment is replaced rather than kept behind the new one: at once
        # (only an offset that does not fit it rolls an empty segment, a gap of 2**31).
        later = (
            self.disk_later is not None
            and base_offset > self.checkpointed_recovery_point
            and not old.is_empty
        )
        if old.is_empty:
            old.delete()
            self._segments.pop()
        else:
            old.on_become_inactive()
            if not later:
                old.flush()
        segment = LogSegment.create(
            self._directory, base_offset, self.config, now_ms=now_ms, handles=self._handles
        )
        self._segments.append(segment)
        if later:
            self._flushing.dir_dirty = True  # no recovery point past it before the fsync
            assert self.disk_later is not None
            self.disk_later(self._settle_rolls, f"roll of {self.topic_partition}", (self, ROLL))
        else:
            fsync_dir(self.directory)
        log.info(
            "segment rolled",
            partition=str(self.topic_partition),
            base_offset=base_offset,
            reason=reason.value,
        )

    # -- truncation and start moves --------------------------------------------------------

    def truncate_to(self, offset: int) -> None:
        """Remove everything at and above `offset` (whole batches; see module rules)."""
        with self._lock:
            if offset >= self._log_end_offset:
                return
            if offset < self.log_start_offset:
                self.truncate_fully_and_start_at(offset)
                return
            # What goes, found before anything changes: the segments from `keep` on whole,
            # and in the segment left the batches from `location` on.
            keep = len(self._segments)
            while keep > 1 and self._segments[keep - 1].base_offset >= offset:
                keep -= 1
            left = self._segments[keep - 1]
            location = left.translate_offset(offset)
            new_end = offset
            for segment in self._segments[keep:]:
                if not segment.is_empty:
                    new_end = min(new_end, segment.base_offset)
            if location is not None:
                new_end = min(new_end, location.header.base_offset)
            else:
                new_end = max(new_end, left.next_offset)  # a gap past its last batch
            if new_end < self.log_start_offset:
                # The removed batch held the log start: see the module rules.
                self.truncate_fully_and_start_at(offset)
                return
            later = self.disk_later is not None and new_end >= self.checkpointed_recovery_point
            if later and keep < len(self._segments):
                self._truncate_across_later(offset, keep, location, new_end)
                return
            removed = self._segments[keep:]
            del self._segments[keep:]
            renamed: list[Path] = []
            for segment in removed:
                renamed.extend(segment.rename_for_deletion())
            if removed:
                # Below the checkpointed recovery point (at once): the removed segments'
                # names gone on disk before the shorter segment can be (see the module
                # rules: a truncation across segments).
                fsync_dir(self.directory)
            active = self.active_segment
            truncation = active.truncate_to(offset)
            active.make_active()
            self._truncated(new_end)
            if later:
                # Inside the active segment, nothing a checkpoint named cut: the disk work
                # waits for the durability thread (see the module rules).
                self.disk_later(
                    self._settle_truncation,
                    f"truncation of {self.topic_partition}",
                    (self, TRUNCATION),
                )
                return
            for path in renamed:
                path.unlink(missing_ok=True)
            # The shorter length durable (see the module rules), before the epoch file; after
            # the state above, so a failed fsync does not leave a recovery point or log end
            # above what the files now hold.
            if truncation.first_removed_offset is not None:
                active.flush()
            self._persist_epochs()
            fsync_dir(self.directory)

    def _truncated(self, new_end: int) -> None:
        """Under the lock: the offsets and the epochs after a truncation to `new_end`."""
        self._truncations += 1
        self._log_end_offset = new_end
        self.recovery_point = min(self.recovery_point, new_end)
        self.high_watermark = min(self.high_watermark, new_end)
        self._epochs.truncate_from_end(new_end)
        log.info("log truncated", partition=str(self.topic_partition), log_end_offset=new_end)

    def _truncate_across_later(
        self, offset: int, keep: int, location: BatchLocation | None, new_end: int
    ) -> None:
        """Under the lock: a truncation across segments at or above the checkpointed
        recovery point, waiting on no disk (see the module rules). The removed segments are
        renamed; the segment left is cut in memory only and rolled from: a new segment takes
        the appends, so no byte written before the directory fsync depends on the renames.
        The durability thread fsyncs the directory, then cuts the segment left's files."""
        left = self._segments[keep - 1]
        if (location is not None and location.header.position == 0) or left.is_empty:
            # Nothing of it stays: it goes too, and the new segment takes its name (a new
            # file: a crash that loses the names brings the old one back).
            keep -= 1
            base = left.base_offset
        else:
            base = new_end
            left.truncate_to(offset, files=False)
            left.become_inactive_in_memory()
        removed = self._segments[keep:]
        del self._segments[keep:]
        settling = self._settling_now()
        for segment in removed:
            settling.unlinks.extend(segment.rename_for_deletion())
        if keep and all(cut is not left for cut in settling.cuts):
            # Its files are cut once the renames are durable (even with nothing cut: the
            # roll's final time index entry and trimmed indexes).
            settling.cuts.append(left)
        self._segments.append(
            LogSegment.create(
                self._directory, base, self.config, now_ms=self._last_now_ms, handles=self._handles
            )
        )
        self._flushing.dir_dirty = True
        self._truncated(new_end)
        assert self.disk_later is not None
        self.disk_later(
            self._settle_truncation,
            f"truncation of {self.topic_partition}",
            (self, TRUNCATION),
        )

    def _settling_now(self) -> _Settling:
        """Under the lock: the deferred truncations' disk work, made when first needed."""
        if self._settling is None:
            self._settling = _Settling([], [])
        return self._settling

    def _settle_names(self) -> None:
        """The directory fsynced, then the cuts truncations across segments left for after
        it (see the module rules). A truncation meanwhile may have renamed more than the
        fsync covered: then nothing is cut now (its own job, next, does it)."""
        with self._lock:
            truncations, active = self._truncations, self._segments[-1]
        fsync_dir(self.directory)
        with self._lock:
            if self._truncations != truncations:
                return
            if self._segments[-1] is active:  # no roll since: every name changed is durable
                self._flushing.dir_dirty = False
            settling = self._settling
            if settling is None or not settling.cuts:
                return
            cuts, settling.cuts = settling.cuts, []
            for segment in cuts:
                if any(segment is kept for kept in self._segments):  # not removed since
                    segment.cut_files()

    def _settle_truncation(self) -> None:
        """The durability thread's half of a truncation at or above the checkpointed recovery
        point: the renames durable, then the cuts left for after them, then the shorter
        segments and the leader-epoch file (a flush: fsyncs, then the epoch file, then the
        recovery point), then the unlinks."""
        if not os.path.isdir(self._directory):
            return  # the partition was removed (LogManager.remove) since
        self._settle_names()
        self.flush()
        with self._lock:
            settling = self._settling
            unlink = settling.unlinks if settling is not None else []
            if settling is not None:
                settling.unlinks = []
                if not settling.cuts:
                    self._settling = None
        if unlink:
            self._unlink(unlink)

    def _settle_rolls(self) -> None:
        """The durability thread's half of the rolls above the checkpointed recovery point
        (one job covers every roll before it runs): the segments left behind fsynced, then
        the directory, so the new segments' names are durable. It claims nothing: a flush
        still moves the recovery point (it fsyncs the same files and the directory first)."""
        if not os.path.isdir(self._directory):
            return  # the partition was removed (LogManager.remove) since
        with self._lock:
            files = [f for segment in self._segments[:-1] for f in segment.files if f.dirty]
        self._sync_files(files)
        with self._lock:
            truncations, active = self._truncations, self._segments[-1]
        fsync_dir(self.directory)
        with self._lock:
            # Names changed since the fsync began (a roll, a truncation's renames) stay for
            # the next fsync of the directory (a flush's, a truncation's job).
            if self._truncations == truncations and self._segments[-1] is active:
                self._flushing.dir_dirty = False

    def truncate_fully_and_start_at(self, offset: int) -> None:
        """An empty log starting at `offset` (the follower's StartAt). Its disk work (the
        directory fsync, the unlinks) waits for the durability thread only when a crash
        before that job can neither lose nor bring back anything (see the module rules:
        a full truncation); else it is done before this returns."""
        with self._lock:
            later = self._may_start_later(offset)
            for segment in self._segments:
                if later:
                    self._settling_now().unlinks.extend(segment.rename_for_deletion())
                else:
                    segment.delete()
            segment = LogSegment.create(
                self._directory,
                offset,
                self.config,
                now_ms=self._last_now_ms,
                handles=self._handles,
            )
            self._segments = [segment]
            if self._settling is not None:
                self._settling.cuts = []  # every segment they named is gone
            self._truncations += 1
            self._log_end_offset = offset
            self.log_start_offset = offset
            self.high_watermark = offset
            self._epochs.truncate_from_end(-1)
            self._flushing = _Flushing()
            if later:
                # Nothing below `offset` was ever claimed by this log's files: the recovery
                # point stays where it was (below `offset`) until the job's flush has synced
                # the directory, so no checkpoint names `offset` before the new segment's
                # name is durable.
                self.recovery_point = min(self.recovery_point, offset)
                self._flushing.dir_dirty = True
                assert self.disk_later is not None
                self.disk_later(
                    self._settle_truncation,
                    f"truncation of {self.topic_partition}",
                    (self, TRUNCATION),
                )
            else:
                self.recovery_point = offset
                self._persist_epochs(force=True)
                fsync_dir(self.directory)
            log.info("log truncated fully", partition=str(self.topic_partition), start=offset)

    def _may_start_later(self, offset: int) -> bool:
        """Whether a full truncation to `offset` may leave its disk work to `disk_later`:
        the log's files hold no batch (nothing to lose, nothing a crash could bring back:
        a log start moved to the end may leave batches below it), the new start is at or
        above its end and the checkpointed recovery point, and the leader-epoch file on
        disk is already empty (nothing in it to go stale: the epoch file's rules hold)."""
        return (
            self.disk_later is not None
            and all(segment.is_empty for segment in self._segments)
            and offset >= self._log_end_offset
            and offset >= self.checkpointed_recovery_point
            and not self._epochs.entries
            and self._epochs_saved == self._epochs.version
        )

    def maybe_increment_log_start_offset(self, offset: int) -> None:
        """Move the log start up (never down) and delete the segments wholly below it."""
        unlink: list[Path] = []
        with self._lock:
            if offset <= self.log_start_offset:
                return
            if offset > self._log_end_offset:
                raise LogError(
                    f"{self.topic_partition}: log start {offset} would pass the log end "
                    f"{self._log_end_offset}; truncate fully and start there instead"
                )
            self.log_start_offset = offset
            self.high_watermark = max(self.high_watermark, offset)
            self._delete_below(offset, unlink_later=unlink)
            self._epochs.truncate_from_start(offset)
            self._epochs_changed(None)
        if unlink:
            if self.disk_later is None:
                self._unlink(unlink)
            else:
                self.disk_later(
                    lambda: self._unlink(unlink), f"unlinks in {self.topic_partition}", None
                )

    def _delete_below(self, offset: int, *, unlink_later: list[Path] | None = None) -> list[int]:
        """Remove the segments wholly below `offset`. With `unlink_later`, only rename them
        to `.deleted` (under the lock) and add their paths there for the caller to unlink
        after releasing it (Kafka's two-phase delete)."""
        deleted = []
        while len(self._segments) > 1 and self._segments[1].base_offset <= offset:
            segment = self._segments.pop(0)
            deleted.append(segment.base_offset)
            if unlink_later is None:
                segment.delete()
            else:
                unlink_later.extend(segment.rename_for_deletion())
        if deleted and unlink_later is None:
            fsync_dir(self.directory)
        return deleted

    def enforce_retention(self, now_ms: int) -> list[int]:
        """Delete inactive segments past retention.ms / retention.bytes; their base offsets.
        A segment holding `retention_floor` or `archive_floor` or a later offset is kept
        (a hold). The
        partition's lock (its append path) is held only to choose and rename the segments;
        their files are unlinked after (see the module rules)."""
        unlink: list[Path] = []
        deleted = self._retain(now_ms, unlink)
        if unlink:
            self._unlink(unlink)
            self.save_epochs()
        return deleted

    def _unlink(self, paths: list[Path]) -> None:
        """The second phase of a delete: outside the partition lock."""
        for path in paths:
            path.unlink(missing_ok=True)
        fsync_dir(self.directory)

    def _retain(self, now_ms: int, unlink: list[Path]) -> list[int]:
        with self._lock:
            summaries = [
                SegmentSummary(s.base_offset, s.size, s.max_timestamp.timestamp)
                for s in self._segments
            ]
            plan = plan_retention(summaries, self.config, now_ms)
            self.retention_due_ms = next_retention_ms(summaries, self.config, now_ms)
            delete = len(plan.delete)
            holds = [f for f in (self.retention_floor, self.archive_floor) if f is not None]
            floor = min(holds) if holds else None
            while floor is not None and delete > 0 and self._segments[delete].base_offset > floor:
                delete -= 1  # that segment still holds offsets at or past the floor
            if not delete:
                return []
            new_start = self._segments[delete].base_offset
            self.log_start_offset = max(self.log_start_offset, new_start)
            self.high_watermark = max(self.high_watermark, self.log_start_offset)
            deleted = self._delete_below(new_start, unlink_later=unlink)
            # Written by enforce_retention once the lock is released (module rules, 4).
            self._epochs.truncate_from_start(self.log_start_offset)
            log.info(
                "retention deleted segments",
                partition=str(self.topic_partition),
                reason=plan.reason.value if plan.reason else None,
                segments=deleted,
                log_start_offset=self.log_start_offset,
            )
            return deleted

    # -- reading ---------------------------------------------------------------------------

    def read(self, offset: int, max_bytes: int) -> ReadResult:
        """A region from the batch holding `offset` (see the module rules: reads). The lock
        is held only to take the facts and the segments; the headers are read from disk
        without it, so serve's and verify's reads never make an append wait on a pread."""
        with self._lock:
            self._check_readable(offset)
            facts = (self.log_start_offset, self._log_end_offset, self.high_watermark)
            truncations = self._truncations
            memo = self._read_memo
            if memo is not None and memo.offset == offset and memo.truncations == truncations:
                return ReadResult(offset, memo.segment.region_from(memo.header, max_bytes), *facts)
            segments = self._segments[self._segment_at(offset) :]
        if all(segment.index_loaded for segment in segments):
            try:
                found = _first_batch(segments, offset)
            except WouldWait:  # nowait.py: not a race; read again where waiting is allowed
                raise
            except Exception:  # anything racing writers caused: read again under the lock
                return self._read_locked(offset, max_bytes)
            if found is not None:
                region = self._remember(truncations, offset, found, max_bytes)
                return ReadResult(offset, region, *facts)
            # Nothing found below the log end: maybe cut, or rolled past the list taken.
            if offset >= facts[1]:
                return ReadResult(offset, None, *facts)
        return self._read_locked(offset, max_bytes)

    def _remember(
        self, truncations: int, offset: int, found: tuple[LogSegment, BatchHeader], max_bytes: int
    ) -> FileRegion:
        """The region of the batch a read found, the batch kept for the next read of the same
        offset (`truncations`: the count when the read took its segments)."""
        segment, header = found
        self._read_memo = _ReadMemo(truncations, offset, segment, header)
        return segment.region_from(header, max_bytes)

    def _segment_at(self, offset: int) -> int:
        """Under the lock: the index of the segment holding `offset` (the first if none).
        Searched by the segments' base offsets themselves: a list of them a partition was
        88 bytes more, thousands of partitions at once."""
        return max(bisect.bisect_right(self._segments, offset, key=_BASE_OFFSET) - 1, 0)

    def _read_locked(self, offset: int, max_bytes: int) -> ReadResult:
        """The read with nothing changing under it: what the unlocked read falls back to."""
        with self._lock:
            self._check_readable(offset)
            try:
                found = _first_batch(self._segments[self._segment_at(offset) :], offset)
            except DamagedLogError as exc:
                self._damaged(offset, exc)
                raise
            region = (
                self._remember(self._truncations, offset, found, max_bytes)
                if found is not None
                else None
            )
            return ReadResult(
                offset, region, self.log_start_offset, self._log_end_offset, self.high_watermark
            )

    def _check_readable(self, offset: int) -> None:
        if offset < self.log_start_offset or offset > self._log_end_offset:
            raise OffsetOutOfRangeError(
                f"{self.topic_partition}: offset {offset} is outside "
                f"[{self.log_start_offset}, {self._log_end_offset}]"
            )

    def _damaged(self, offset: int, exc: DamagedLogError) -> None:
        """A read found damage: counted, and logged (once a minute a partition)."""
        self.damaged_reads += 1
        self.damaged_offset = offset
        with _DAMAGE_SAID_LOCK:
            emit = _DAMAGE_SAID.should_emit(self.topic_partition, monotonic_ms())
        if emit.emit:
            log.error(
                "damaged log: a read found no batch where one must start",
                partition=str(self.topic_partition),
                offset=offset,
                error=str(exc),
                damaged_reads=self.damaged_reads,
                repeats_suppressed=emit.suppressed,
            )

    def offset_for_timestamp(self, timestamp: int) -> TimestampOffset | None:
        """The first record at or past the log start with a timestamp >= `timestamp`. As a
        read (see the module rules: reads): the lock is held only to take the segments and
        the log start; the time index and the batches are read from disk without it, so an
        append never waits on those preads. A search that fails, or that a truncation
        overlapped (the offset it found may have been cut and written again), is done again
        under the lock; so is one over a segment whose index is not loaded yet."""
        with self._lock:
            segments = list(self._segments)
            start = self.log_start_offset
            truncations = self._truncations
        if all(segment.timestamps_loaded for segment in segments):
            try:
                found = _first_at_or_after(segments, timestamp, start, locked=False)
            except Exception:  # anything racing writers caused: again under the lock
                found = None
            else:
                with self._lock:
                    if self._truncations == truncations:
                        return found
        with self._lock:
            return _first_at_or_after(self._segments, timestamp, self.log_start_offset, locked=True)

    def largest_timestamp(self) -> int | None:
        """The largest timestamp of any record in the log (None when it is empty). Under the
        lock: a segment's is in memory, or read from its tail once (and kept), which only
        the lock may do (see `offset_for_timestamp`)."""
        with self._lock:
            return max(
                (s.max_timestamp.timestamp for s in self._segments if not s.is_empty),
                default=None,
            )

    def segment_timestamps(self) -> list[tuple[int, int]]:
        """(base offset, largest timestamp) of each segment holding batches, oldest first:
        what ListOffsets v0 answers from. Under the lock, as `largest_timestamp`."""
        with self._lock:
            return [
                (s.base_offset, s.max_timestamp.timestamp) for s in self._segments if not s.is_empty
            ]

    # -- durability ------------------------------------------------------------------------

    def flush(self) -> None:
        """fsync everything appended so far and move the recovery point to the log end."""
        if self._settling is not None and self._settling.cuts:
            # A segment's cut waits for the directory (see the module rules); the recovery
            # point passes no segment whose file still holds more than the log.
            self._settle_names()
        with self._lock:
            self._flush_queued = False  # appends from now on may ask for another
            target = self._log_end_offset
            truncations = self._truncations
            active = self._segments[-1]
            files = [f for segment in self._segments for f in segment.files if f.dirty]
            messages = self._flushing.unflushed_messages
            dir_dirty = self._flushing.dir_dirty
        self._sync_files(files)
        if dir_dirty:
            # Names a truncation or a roll changed and left to the durability thread
            # (renames, a new segment): durable before a recovery point past them may be
            # claimed.
            fsync_dir(self.directory)
        # Before the recovery point moves: a checkpoint may name it next (epoch rule 1).
        self.save_epochs()
        with self._lock:
            if self._truncations != truncations:
                return  # see the module rules: the next flush covers what was rewritten
            if self._settling is not None and self._settling.cuts:
                return  # a truncation meanwhile left a cut: the next flush makes it
            if dir_dirty and self._segments[-1] is active:  # no roll since the fsync
                self._flushing.dir_dirty = False
            self.recovery_point = max(self.recovery_point, min(target, self._log_end_offset))
            if self._log_end_offset == target:
                self._flushing.unflushed_messages -= messages
                self._flushing.first_unflushed_ms = None

    def _sync_files(self, files: list[FileHandle]) -> None:
        """fsync `files` outside the lock, one descriptor at a time (so a flush adds at
        most one to the open-file count)."""
        for handle in files:
            with self._lock:
                ticket = self._handles.sync_ticket(handle)
            if ticket is None:
                continue  # synced meanwhile, or its segment was deleted
            try:
                os.fsync(ticket.fd)
            finally:
                os.close(ticket.fd)
            self._handles.synced(handle, ticket.generation)

    def checkpoint_mark(self) -> tuple[object, ...]:
        """What a checkpoint and a retention pass of this partition depend on, read without
        the lock (manager.py: a partition whose mark is the one it had when the last
        checkpoint started has nothing to flush, no offset to write and no retention plan
        other than its last). Every write moves the log end or counts a truncation, and only
        a flush after a write or a truncation moves the recovery point; a roll or a delete
        changes the segments; the other offsets and the holds are the rest."""
        return (  # the log start at MARK_LOG_START
            self._log_end_offset,
            self._truncations,
            len(self._segments),
            self.log_start_offset,
            self.high_watermark,
            self.retention_floor,
            self.archive_floor,
        )

    def recovery_point_to_checkpoint(self) -> int:
        """The recovery point a checkpoint file is about to name. From now on, an epoch
        entry starting below it is written at once (epoch rule 3), even before the file
        lands: an entry handed to the durability thread might be written after it."""
        with self._lock:
            point = self.recovery_point
            self.checkpointed_recovery_point = max(self.checkpointed_recovery_point, point)
            return point

    def recovery_point_checkpointed(self, point: int) -> None:
        """The checkpoint file naming `point` is on disk."""
        with self._lock:
            self.checkpointed_recovery_point = point

    def maybe_flush(self, now_ms: int) -> None:
        with self._lock:
            due = should_flush_time(self._flushing.first_unflushed_ms, now_ms, self.config)
        if due:
            self.flush()

    def set_topic_id(self, topic_id: uuid.UUID) -> None:
        with self._lock:
            if self.topic_id is not None and self.topic_id != topic_id:
                raise LogError(
                    f"{self.topic_partition}: topic id {topic_id} differs from the stored "
                    f"{self.topic_id} (the topic was recreated upstream?)"
                )
            if self.topic_id is None:
                write_atomically(
                    self.directory / PARTITION_METADATA, format_partition_metadata(topic_id)
                )
                self.topic_id = topic_id

    def _persist_epochs(self, *, force: bool = False) -> None:
        """The leader-epoch file written now, on the calling thread."""
        with self._lock:
            if force:
                self._epochs_saved = min(self._epochs_saved, self._epochs.version - 1)
            self.save_epochs()

    def _epochs_changed(self, start: int | None) -> None:
        """Under the lock, after the cache changed at offset `start` or above (None: the log
        start moved): the file is written now, or later through `disk_later` (the epoch
        file's rules 1-4)."""
        if self._epochs.version == self._epochs_saved:
            return
        at_once = start is not None and start < self.checkpointed_recovery_point
        if self.disk_later is None or at_once:
            self.save_epochs()
        else:
            # One key per partition: the durability thread's queue makes many asks one write.
            self.disk_later(self.save_epochs, f"epochs of {self.topic_partition}", self)

    def save_epochs(self) -> None:
        """Write the leader-epoch file if the cache changed since it was last written; from
        any thread (see the module rules: staged outside the lock, never older text over
        newer)."""
        with self._lock:
            version = self._epochs.version
            if version <= self._epochs_saved:
                return
            text = format_epochs(self._epochs.entries)
            self._epoch_writes += 1
            tag = f".{self._epoch_writes}"
        path = self.directory / LEADER_EPOCH_CHECKPOINT
        staged = stage_file(path, text, tag=tag)
        with self._lock:
            if version > self._epochs_saved:
                os.replace(staged, path)
                self._epochs_saved = version
            else:
                staged.unlink()  # a newer cache was written meanwhile
        # Even when another thread renamed: it may not have synced the directory yet.
        fsync_dir(self.directory)

    def close(self) -> None:
        """Final time index entry and trimmed indexes for the active segment, synced; close.
        Cuts a deferred truncation left are made (after the directory fsync) and synced, and
        so are the segments deferred rolls left, and the directory."""
        if self._settling is not None and self._settling.cuts:
            cuts = list(self._settling.cuts)
            self._settle_names()
            for segment in cuts:
                if any(segment is kept for kept in self._segments):
                    segment.flush()
        if self._flushing.dir_dirty or any(
            f.dirty for segment in self._segments[:-1] for f in segment.files
        ):
            self._settle_rolls()
        with self._lock:
            active = self.active_segment
            active.on_become_inactive()
            active.flush()
            for segment in self._segments:
                segment.close()


def _forget_epochs_from(epochs: LeaderEpochCache, offset: int) -> None:
    """Loading, at the first segment it rescans: from here on the batches say which epoch
    began where. An entry the file holds at or past `offset` may be one of batches a
    truncation removed, the file written before it (epoch rule 3), so it goes, and the
    scan adds what the batches hold."""
    epochs.truncate_from_end(offset)


def _cut_at_next_base(
    before: LogSegment, after: LogSegment, epochs: LeaderEpochCache
) -> SegmentTruncation | None:
    """Loading: the batches of `before` at or past `after`'s base cut, as the truncation
    across segments whose cut a crash lost did (the segment after holds the log from there
    on: see the module rules), and the epochs from there forgotten (its scan adds its own);
    None when `before` ends at or below that base (always, but after such a crash)."""
    cut = before.cut_from(after.base_offset)
    if cut is None:
        return None
    epochs.truncate_from_end(after.base_offset)
    return cut


def _lost_tail(segment: LogSegment, after: LogSegment, recovery_point: int) -> bool:
    """Loading, a scanned segment followed by another: whether the crash may have lost its
    tail at a batch boundary, which no scan can see. Only above the recovery point, where
    a segment that rolls left unsynced (see the module rules: a roll) may end: when it ends
    there below the next segment's base, the batches between are gone or never were (an
    append that rolled past a gap), and the later segments, unsynced above the recovery
    point too, go as after a torn batch (a follower fetches them again)."""
    end = segment.next_offset
    return recovery_point <= end < after.base_offset


def _first_at_or_after(
    segments: Sequence[LogSegment], timestamp: int, start: int, *, locked: bool
) -> TimestampOffset | None:
    """The first record of `segments` at or past offset `start` whose timestamp is >=
    `timestamp` (segments whose largest timestamp is below it are not opened). Not
    `locked`: a segment's largest timestamp is taken only if it is in memory (LookupError
    if not): working it out from the segment's tail sets the segment's index state for
    appends, which a truncation may have just reset, so only the lock may do it."""
    for segment in segments:
        largest = segment.max_timestamp if locked else segment.known_max_timestamp()
        if largest.timestamp >= timestamp:
            found = segment.find_offset_by_timestamp(timestamp, start)
            if found is not None:
                return found
    return None


class _ReadMemo(NamedTuple):
    """A read's offset and the batch it began at, in its segment; good while the log has
    been truncated `truncations` times (see the module rules: reads)."""

    truncations: int
    offset: int
    segment: LogSegment
    header: BatchHeader


def _first_batch(segments: list[LogSegment], offset: int) -> tuple[LogSegment, BatchHeader] | None:
    """The first batch of `segments` at or past `offset`, and its segment. A segment whose
    batches all end below `offset` gives None: the next one holds it. A damaged one raises
    DamagedLogError: never passed over (see the module rules)."""
    for segment in segments:
        if not segment.offset_index_loaded and not nowait.waiting_allowed():
            raise WouldWait(f"{segment.log_path}: its offset index is not loaded")
        header = segment.first_batch(offset)
        if header is not None:
            return segment, header
    return None


@dataclass(frozen=True, slots=True)
class _LoadedEpochs:
    cache: LeaderEpochCache
    missing: bool
    problem: str | None


def _load_epochs(directory: Path) -> _LoadedEpochs:
    path = directory / LEADER_EPOCH_CHECKPOINT
    text = read_text(path)
    if text is None:
        return _LoadedEpochs(LeaderEpochCache(), True, None)
    try:
        return _LoadedEpochs(LeaderEpochCache(parse_epochs(text, source=str(path))), False, None)
    except LogError as exc:
        return _LoadedEpochs(LeaderEpochCache(), False, f"{exc}; rebuilt from the batches")
