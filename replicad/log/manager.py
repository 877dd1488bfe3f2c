"""The data directory: its lock, its partitions and its three checkpoint files.

Rules:
- One process per data directory: `open` takes an exclusive flock on `<data_dir>/.lock`
  (released by `close` or by the process dying) and fails with LogDirLockedError naming the
  holder's pid when another process has it.
- Startup: the clean-shutdown marker is read and removed first (so a crash from now on is
  unclean), the checkpoints are read, every `<topic>-<partition>` directory is loaded and
  recovered (see partition.py). An unreadable checkpoint file is reported and ignored: a bad
  recovery-point file means full recovery, a bad log-start file means the first segment's
  base, a bad high-watermark file means the log start (the leader's high watermark
  overrides it on the next fetch) -- each costs time, never data.
- `checkpoint(high_watermarks)` flushes every partition written since the last checkpoint,
  then writes the three files atomically (checkpoint.write_atomically), so a recovery point
  never names unsynced data.
- An idle partition costs a checkpoint one read of its mark (`PartitionLog.checkpoint_mark`:
  log end, truncations, segments, log start, high watermark, holds), not a flush, its locks
  and a retention plan (at 10,000 partitions every interval held the GIL for about a third
  of the daemon's samples, session 13's soak). The mark is read when a checkpoint starts,
  before its flushes: a partition whose mark is still the one the last checkpoint read (the
  same object) had nothing written since that checkpoint's flush began, which synced all of
  it, so it is not flushed again; its recovery point is read as it is (a truncation racing
  this checkpoint can only have lowered it). A file whose entries are those last written is
  not written again; a checkpoint that finds no mark changed writes nothing.
  `maybe_flush` passes over the partitions the last checkpoint left unchanged (nothing
  unflushed), and `enforce_retention` over those whose mark is the one of their last pass
  until time retention is next due there (policy.next_retention_ms).
- `write_high_watermarks()` writes `replication-offset-checkpoint` alone, without a flush,
  and only when a high watermark moved since the file was last written: a reader that
  streams from the replica (Spark) sees new records without waiting for the next full
  checkpoint. Kafka's broker writes its own high-watermark file this way, apart from its
  flushes. Records below such a high watermark may not be fsynced yet: after a machine
  crash, loading clamps each high watermark to the recovered log end and the follower
  fetches the lost tail again -- the same records at the same offsets, committed at the
  source -- so a reader only ever waits, it never sees other records at those offsets.
- Threads: `checkpoint`, `maybe_flush`, `enforce_retention` and `close` may run on another
  thread than the one appending (the follower runs them on its durability thread while the
  event loop appends and truncates). Each works on a snapshot of the partitions taken when
  it starts (a dict copy, atomic under the GIL): a partition created meanwhile is in the
  next checkpoint. Partition state is read and changed under each partition's lock, and
  the recovery points written are read after every flush: each was raised only by a flush
  whose fsyncs covered it (partition.py), so the files never claim more than the disk holds.
  Checkpoints are serialized by a lock, so files written by two threads never interleave.
- A high watermark never moves back through a checkpoint or a restart: the one loaded at
  start is the floor, a given one only raises it (clamped to the log end), and only a
  truncation of the log itself lowers it. A partition whose leader is down after a restart
  keeps serving everything it served before (Kafka's follower raises its high watermark
  the same way, `maybeUpdateHighWatermark`).
- `close` flushes, checkpoints, closes every partition (indexes trimmed), writes the
  clean-shutdown marker and unlocks.
- `flush_later`, when set, is where every partition's `flush.messages` flushes go instead
  of running on the appending thread (partition.py); `disk_later`, where their
  leader-epoch files and unlinks go (partition.py's epoch-file rules); set both before
  appending.
- A checkpoint marks each partition's recovery point as about to be named before writing
  the file (`recovery_point_to_checkpoint`), and as named after: from the first mark on,
  an epoch entry below it is written at once (partition.py, epoch rule 3).
- Open files: every partition's segment files share one FileHandles cache of at most
  `config.max_open_files` descriptors (handles.py), so 10,000 partitions fit any sane
  RLIMIT_NOFILE; idle partitions' files are closed and reopened on demand.
"""

from __future__ import annotations

import fcntl
import os
import threading
import uuid
from collections.abc import Callable, Mapping
from pathlib import Path

import structlog

from replicad.errors import LogDirLockedError, LogError
from replicad.log.checkpoint import (
    format_offsets,
    fsync_dir,
    parse_offsets,
    read_text,
    write_atomically,
)
from replicad.log.config import LogConfig
from replicad.log.handles import FileHandles
from replicad.log.layout import (
    CLEAN_SHUTDOWN_FILE,
    LOCK_FILE,
    LOG_START_OFFSET_CHECKPOINT,
    RECOVERY_POINT_CHECKPOINT,
    REPLICATION_OFFSET_CHECKPOINT,
    TEMP_SUFFIX,
    parse_partition_dir,
    partition_dir_name,
)
from replicad.log.partition import MARK_LOG_START, PartitionLog, PartitionRecovery
from replicad.types import TopicPartition

log = structlog.get_logger("replicad.log")


class LogManager:
    def __init__(self, data_dir: Path, config: LogConfig, lock_fd: int) -> None:
        self.data_dir = data_dir
        self.config = config
        self._lock_fd = lock_fd
        self.handles = FileHandles(config.max_open_files)
        self._partitions: dict[TopicPartition, PartitionLog] = {}
        self._checkpoint_lock = threading.Lock()
        self._written_high_watermarks: dict[TopicPartition, int] | None = None
        self._last_now_ms = 0
        self.recoveries: list[PartitionRecovery] = []
        self._flush_later: Callable[[PartitionLog], None] | None = None
        self._disk_later: Callable[[Callable[[], object], str, object], None] | None = None
        # The recovery points the checkpoint file on disk names (a partition created again
        # under a name it names starts with that one: partition.py, epoch rule 3).
        self._checkpointed: dict[TopicPartition, int] = {}
        self.checkpoint_problems: list[str] = []
        # This process has written the three files (each partition keeps its marks itself:
        # PartitionLog.checkpointed_mark, retained_mark).
        self._files_written = False
        # Set by `hold_for_archive`: every partition, new ones too, starts with a retention
        # hold at 0 until the archive's uploader moves it (nothing unarchived is deleted).
        self.archive_holds = False

    @classmethod
    def open(cls, data_dir: Path, config: LogConfig, *, now_ms: int) -> LogManager:
        data_dir = Path(data_dir)
        data_dir.mkdir(parents=True, exist_ok=True)
        lock_fd = _lock(data_dir)
        try:
            manager = cls(data_dir, config, lock_fd)
            manager._last_now_ms = now_ms
            manager._load(now_ms)
        except BaseException:
            os.close(lock_fd)
            raise
        return manager

    def _read_checkpoint(self, name: str) -> dict[TopicPartition, int] | None:
        path = self.data_dir / name
        try:
            text = read_text(path)
            return None if text is None else parse_offsets(text, source=str(path))
        except LogError as exc:
            self.checkpoint_problems.append(str(exc))
            log.warning("checkpoint file unreadable, ignored", file=str(path), error=str(exc))
            return None

    def _load(self, now_ms: int) -> None:
        marker = self.data_dir / CLEAN_SHUTDOWN_FILE
        clean = marker.exists()
        for name in os.listdir(self.data_dir):
            if name.endswith(TEMP_SUFFIX):
                (self.data_dir / name).unlink(missing_ok=True)
        recovery_points = self._read_checkpoint(RECOVERY_POINT_CHECKPOINT)
        if recovery_points is None:
            clean = False  # without recovery points, every partition is scanned
        log_starts = self._read_checkpoint(LOG_START_OFFSET_CHECKPOINT) or {}
        high_watermarks = self._read_checkpoint(REPLICATION_OFFSET_CHECKPOINT) or {}
        self._checkpointed = dict(recovery_points or {})
        if clean:
            marker.unlink()
            fsync_dir(self.data_dir)
        for name in sorted(os.listdir(self.data_dir)):
            tp = parse_partition_dir(name)
            if tp is None or not (self.data_dir / name).is_dir():
                continue
            partition = PartitionLog.load(
                self.data_dir / name,
                tp,
                self.config,
                now_ms=now_ms,
                recovery_point=(recovery_points or {}).get(tp, 0),
                log_start_offset=log_starts.get(tp),
                high_watermark=high_watermarks.get(tp, 0),
                clean_shutdown=clean and tp in (recovery_points or {}),
                handles=self.handles,
            )
            self._partitions[tp] = partition
            if partition.last_recovery is not None:
                self.recoveries.append(partition.last_recovery)
        # A data directory with nothing in it yet had no shutdown at all, clean or not.
        first_start = recovery_points is None and not self._partitions
        log.info(
            "data directory opened",
            data_dir=str(self.data_dir),
            partitions=len(self._partitions),
            **({"first_start": True} if first_start else {"clean_shutdown": clean}),
        )

    @property
    def flush_later(self) -> Callable[[PartitionLog], None] | None:
        return self._flush_later

    @flush_later.setter
    def flush_later(self, schedule: Callable[[PartitionLog], None] | None) -> None:
        self._flush_later = schedule
        for partition in self._partitions.values():
            partition.flush_later = schedule

    @property
    def disk_later(self) -> Callable[[Callable[[], object], str, object], None] | None:
        return self._disk_later

    @disk_later.setter
    def disk_later(
        self, schedule: Callable[[Callable[[], object], str, object], None] | None
    ) -> None:
        self._disk_later = schedule
        for partition in self._partitions.values():
            partition.disk_later = schedule

    def hold_for_archive(self) -> None:
        """Local retention deletes nothing the archive has not uploaded: every partition
        holds from offset 0 until its uploader raises the hold (`archive_floor`)."""
        self.archive_holds = True
        for partition in self._partitions.values():
            if partition.archive_floor is None:
                partition.archive_floor = 0

    def partitions(self) -> Mapping[TopicPartition, PartitionLog]:
        return dict(self._partitions)

    def get(self, tp: TopicPartition) -> PartitionLog | None:
        """The partition's open log, or None; O(1), no copy."""
        return self._partitions.get(tp)

    def get_or_create(
        self, tp: TopicPartition, *, topic_id: uuid.UUID | None = None
    ) -> PartitionLog:
        partition = self._partitions.get(tp)
        if partition is None:
            partition = PartitionLog.create(
                self.data_dir / partition_dir_name(tp),
                tp,
                self.config,
                now_ms=self._last_now_ms,
                topic_id=topic_id,
                handles=self.handles,
            )
            partition.flush_later = self._flush_later
            partition.disk_later = self._disk_later
            partition.checkpointed_recovery_point = self._checkpointed.get(tp, 0)
            if self.archive_holds:
                partition.archive_floor = 0
            self._partitions[tp] = partition
        elif topic_id is not None:
            partition.set_topic_id(topic_id)
        return partition

    def remove(self, tp: TopicPartition) -> None:
        """Delete a partition's directory (the topic is no longer replicated)."""
        partition = self._partitions.pop(tp, None)
        if partition is None:
            return
        partition.close()
        for path in sorted(partition.directory.iterdir()):
            path.unlink()
        partition.directory.rmdir()
        fsync_dir(self.data_dir)

    def checkpoint(self, high_watermarks: Mapping[TopicPartition, int] | None = None) -> None:
        """Flush every partition, then write the three checkpoint files. A high watermark
        given here only raises the partition's (see the rules above)."""
        partitions = self._partitions.copy()
        for tp, hw in (high_watermarks or {}).items():
            partition = partitions.get(tp)
            if partition is not None:
                partition.high_watermark = max(
                    partition.high_watermark,
                    partition.log_start_offset,
                    min(hw, partition.log_end_offset),
                )
        with self._checkpoint_lock:
            changed: dict[TopicPartition, tuple[object, ...]] = {}
            starts_moved = False
            for tp, partition in partitions.items():
                mark = partition.checkpoint_mark()
                seen = partition.checkpointed_mark
                if mark != seen:
                    changed[tp] = mark
                    # A new partition, or its log start moved.
                    starts_moved = (
                        starts_moved or seen is None or seen[MARK_LOG_START] != mark[MARK_LOG_START]
                    )
            first = not self._files_written
            gone = len(partitions) != len(self._checkpointed)
            if not (changed or first or gone):
                return  # nothing written since the last checkpoint: its files still hold
            for tp in changed:
                partitions[tp].flush()
            # After every flush (see the rules above); an unchanged partition as it is.
            recovery_points = {
                tp: p.recovery_point_to_checkpoint() if tp in changed else p.recovery_point
                for tp, p in partitions.items()
            }
            checkpointed = self._checkpointed
            if first or recovery_points != checkpointed:
                write_atomically(
                    self.data_dir / RECOVERY_POINT_CHECKPOINT, format_offsets(recovery_points)
                )
            self._checkpointed = recovery_points
            for tp, point in recovery_points.items():
                if tp in changed or checkpointed.get(tp) != point:
                    partitions[tp].recovery_point_checkpointed(point)
            if first or gone or starts_moved:
                write_atomically(
                    self.data_dir / LOG_START_OFFSET_CHECKPOINT,
                    format_offsets({tp: p.log_start_offset for tp, p in partitions.items()}),
                )
            self._write_high_watermarks(partitions, only_if_moved=True)
            self._files_written = True
            for tp, mark in changed.items():
                partitions[tp].checkpointed_mark = mark

    def write_high_watermarks(self) -> bool:
        """`replication-offset-checkpoint` alone, unflushed (see the rules above), if a high
        watermark moved since it was last written; whether it was written."""
        partitions = self._partitions.copy()
        with self._checkpoint_lock:
            return self._write_high_watermarks(partitions, only_if_moved=True)

    def _write_high_watermarks(
        self, partitions: Mapping[TopicPartition, PartitionLog], *, only_if_moved: bool = False
    ) -> bool:
        high_watermarks = {tp: p.high_watermark for tp, p in partitions.items()}
        if only_if_moved and high_watermarks == self._written_high_watermarks:
            return False
        write_atomically(
            self.data_dir / REPLICATION_OFFSET_CHECKPOINT, format_offsets(high_watermarks)
        )
        self._written_high_watermarks = high_watermarks
        return True

    def maybe_flush(self, now_ms: int) -> None:
        """Time-based flushes (`log.flush_ms`) of the partitions written since the last
        checkpoint's flush of them (the others have nothing unflushed)."""
        self._last_now_ms = now_ms
        for partition in self._partitions.copy().values():
            seen = partition.checkpointed_mark
            if seen is None or seen != partition.checkpoint_mark():
                partition.maybe_flush(now_ms)

    def enforce_retention(self, now_ms: int) -> None:
        """A retention pass over the partitions whose plan may differ from their last one:
        something changed them, or time retention is due (see the rules above)."""
        self._last_now_ms = now_ms
        for partition in self._partitions.copy().values():
            mark = partition.checkpoint_mark()
            if mark == partition.retained_mark and now_ms < partition.retention_due_ms:
                continue
            partition.enforce_retention(now_ms)
            # One tuple for both marks when they are equal: 10,000 partitions hold them.
            checkpointed = partition.checkpointed_mark
            partition.retained_mark = checkpointed if checkpointed == mark else mark

    def close(self) -> None:
        if self._lock_fd < 0:
            return
        self.checkpoint()
        for partition in self._partitions.values():
            partition.close()
        marker = self.data_dir / CLEAN_SHUTDOWN_FILE
        write_atomically(marker, "")
        fcntl.flock(self._lock_fd, fcntl.LOCK_UN)
        os.close(self._lock_fd)
        self._lock_fd = -1
        log.info("data directory closed", data_dir=str(self.data_dir))


def _lock(data_dir: Path) -> int:
    path = data_dir / LOCK_FILE
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = os.pread(fd, 32, 0).decode(errors="replace").strip() or "unknown"
        os.close(fd)
        raise LogDirLockedError(
            f"data directory {data_dir} is in use by another replicad process (pid {holder}); "
            f"stop it, or point this one at another --data-dir"
        ) from None
    os.ftruncate(fd, 0)
    os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
    return fd
