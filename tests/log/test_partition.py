"""A partition's log: rolls, reads across segments, truncation, start moves, disk full."""

from __future__ import annotations

import contextlib
import dataclasses
import itertools
import os
import queue
import subprocess
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from replicad.errors import DamagedLogError, DiskFullError, LogError, OffsetOutOfRangeError
from replicad.log.config import LogConfig
from replicad.log.epoch import EpochEndOffset
from replicad.log.handles import FileHandle, FileHandles
from replicad.log.layout import LEADER_EPOCH_CHECKPOINT, PARTITION_METADATA
from replicad.log.partition import PartitionLog
from replicad.log.segment import LogSegment
from replicad.records.batch import BatchHeader, scan_batches
from replicad.records.records import decode_batch
from replicad.types import TopicPartition
from tools.logdata.batches import batch_stream, producer_batch

TP = TopicPartition("orders", 3)
SMALL = LogConfig(segment_bytes=16 * 1024, index_interval_bytes=1024, segment_index_bytes=2048)
# SMALL, keeping three segments' bytes.
RETAINS_THREE = dataclasses.replace(SMALL, retention_bytes=3 * SMALL.segment_bytes)
# SMALL, keeping one segment's bytes.
RETAINING = dataclasses.replace(SMALL, retention_bytes=SMALL.segment_bytes)


@pytest.fixture(autouse=True)
def _close_every_log() -> Iterator[None]:
    """Every PartitionLog a test creates or loads is closed after it: most tests drop their
    logs unclosed, and a log's descriptors (its own file cache, about 40 a log here) outlive
    it, about 700 per process over this file. Patched by hand, not with `monkeypatch`: the
    test's own patches (a failing fsync) are undone before this teardown closes the logs."""
    opened: list[PartitionLog] = []
    create, load = PartitionLog.__dict__["create"], PartitionLog.__dict__["load"]

    def tracking(real: classmethod) -> classmethod:
        def made(cls: type[PartitionLog], *args: object, **kwargs: object) -> PartitionLog:
            log = real.__func__(cls, *args, **kwargs)
            opened.append(log)
            return log

        return classmethod(made)

    PartitionLog.create, PartitionLog.load = tracking(create), tracking(load)  # type: ignore[method-assign]
    try:
        yield
    finally:
        PartitionLog.create, PartitionLog.load = create, load  # type: ignore[method-assign]
        for log in opened:
            # A log the test closed, damaged or left on a full disk: closing is only cleanup.
            with contextlib.suppress(Exception):
                log.close()


def _append_all(log: PartitionLog, batches: list[bytes], now_ms: int = 0) -> None:
    for raw in batches:
        log.append(raw, scan_batches(raw).batches, now_ms=now_ms)


def _partition(
    tmp_path: Path, count: int = 120, config: LogConfig = SMALL
) -> tuple[PartitionLog, list[bytes]]:
    log = PartitionLog.create(tmp_path / "orders-3", TP, config, now_ms=0)
    batches = batch_stream(11, count, epoch_every=40)
    _append_all(log, batches)
    return log, batches


def _headers(batches: list[bytes]) -> list[BatchHeader]:
    return [scan_batches(b).batches[0] for b in batches]


def test_rolls_and_keeps_bytes_and_offsets(tmp_path: Path) -> None:
    log, batches = _partition(tmp_path)
    segments = log.segments
    assert len(segments) > 3
    assert b"".join(s.log_path.read_bytes() for s in segments) == b"".join(batches)
    headers = _headers(batches)
    assert log.log_end_offset == headers[-1].next_offset
    bases = {h.base_offset for h in headers}
    assert all(s.base_offset in bases for s in segments)  # named after their first batch
    for s in segments[:-1]:
        assert s.size <= SMALL.segment_bytes
        # Inactive segments have trimmed index files.
        assert s.index_path.stat().st_size == s.offset_index.entries * 8


def test_a_roll_fsyncs_the_segment_it_leaves_before_it_returns(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Only the active segment ever holds unsynced data, and loading always scans it: so a
    recovery point the checkpoint file names above a truncation (stale until the next
    checkpoint) never makes loading trust an unsynced write (tools/sim, issue 29)."""
    synced: set[str] = set()
    real_fsync = os.fsync

    def fsync(fd: int) -> None:
        synced.add(os.readlink(f"/proc/self/fd/{fd}"))
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", fsync)
    log = PartitionLog.create(tmp_path / "orders-3", TP, SMALL, now_ms=0)
    for raw in batch_stream(11, 120, epoch_every=40):
        before = [s.log_path for s in log.segments]
        log.append(raw, scan_batches(raw).batches, now_ms=0)
        for left in before[:-1] if len(log.segments) == len(before) else before:
            assert str(left) in synced, f"{left.name} left behind unsynced"
    assert len(log.segments) > 3


def test_a_roll_above_the_checkpointed_recovery_point_leaves_its_fsyncs_to_disk_later(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The follower appends on the event loop: a roll there waits on no fsync. The segment
    it leaves and the directory (the new name) are the durability thread's job, which claims
    nothing; the next flush raises the recovery point. Fails on the old code (the segment
    left and the directory fsynced by the append that rolled)."""
    log = PartitionLog.create(tmp_path / "orders-3", TP, SMALL, now_ms=0)
    later = _Later(log)
    synced = _fsyncs(monkeypatch)
    _append_all(log, batch_stream(11, 120, epoch_every=1000))
    assert len(log.segments) > 3
    assert synced == []
    rolls = [key for what, key in later.asked if what == f"roll of {TP}"]
    assert rolls and all(key == rolls[0] for key in rolls)  # one key: the queue merges them
    assert log.recovery_point == 0 and log._flushing.dir_dirty
    for (what, _), job in zip(later.asked, later.jobs, strict=True):
        if what == f"roll of {TP}":
            job()
            break  # one job covers every roll before it runs
    names = {Path(path).name for path, _ in synced}
    for left in log.segments[:-1]:
        assert {left.log_path.name, left.index_path.name, left.time_index_path.name} <= names
        assert left.index_path.stat().st_size == left.offset_index.entries * 8  # trimmed
    assert log.directory.name in names and log.active_segment.log_path.name not in names
    assert log.recovery_point == 0 and not log._flushing.dir_dirty
    log.flush()
    assert log.recovery_point == log.log_end_offset


def test_an_append_after_a_roll_does_not_wait_on_a_slow_fsync(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An fsync that does not return (a slow disk) on the durability thread: appends roll
    and go on. Fails on the old code, whose roll fsynced on the appending thread (here an
    fsync there raises)."""
    log = PartitionLog.create(tmp_path / "orders-3", TP, SMALL, now_ms=0)
    jobs: queue.Queue = queue.Queue()
    log.disk_later = lambda job, what, key: jobs.put(job)
    release, blocked = threading.Event(), threading.Event()
    appending = threading.current_thread()
    real_fsync = os.fsync

    def slow_fsync(fd: int) -> None:
        if threading.current_thread() is appending:
            raise AssertionError("fsync on the appending thread")
        blocked.set()
        release.wait()
        real_fsync(fd)

    def durability() -> None:
        while (job := jobs.get()) is not None:
            job()

    monkeypatch.setattr(os, "fsync", slow_fsync)
    worker = threading.Thread(target=durability, daemon=True)
    worker.start()
    try:
        batches = batch_stream(11, 120, epoch_every=1000)
        _append_all(log, batches[:40])
        assert blocked.wait(timeout=60)  # timing-ok: a bound on a hang, not a duration
        segments = len(log.segments)
        _append_all(log, batches[40:])  # while the durability thread is stuck in an fsync
        assert len(log.segments) > segments > 1
        assert log.log_end_offset == scan_batches(batches[-1]).batches[0].next_offset
    finally:
        release.set()
        jobs.put(None)
        worker.join()
    monkeypatch.setattr(os, "fsync", real_fsync)
    log.flush()
    assert log.recovery_point == log.log_end_offset


def test_a_roll_at_or_below_the_checkpointed_recovery_point_is_durable_before_it_returns(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """After a truncation below the recovery point a checkpoint file names (stale until
    the next checkpoint), a roll at or below that point fsyncs the segment it leaves and
    the directory before it returns: loading trusts the stale point and would not scan the
    segment left (tools/sim/log_run.py: the roll rule)."""
    log, _ = _partition(tmp_path)
    later = _Later(log)
    log.flush()
    log.recovery_point_checkpointed(log.recovery_point_to_checkpoint())
    checkpointed = log.recovery_point
    third = log.segments[2]
    log.truncate_to(third.headers()[1].base_offset)  # at once: below the checkpointed point
    synced = _fsyncs(monkeypatch)
    for raw in batch_stream(12, 200, first_offset=log.log_end_offset):
        before = log.active_segment
        log.append(raw, scan_batches(raw).batches, now_ms=0)
        if log.active_segment is not before:
            assert log.active_segment.base_offset <= checkpointed
            names = {Path(path).name for path, _ in synced}
            assert before.log_path.name in names and log.directory.name in names
            break
    else:
        raise AssertionError("no roll below the checkpointed recovery point")
    assert not any(what == f"roll of {TP}" for what, _ in later.asked)


def test_a_truncation_fsyncs_the_segment_it_shortened_before_it_returns(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A shorter length not synced may be lost in a crash (POSIX promises it after fsync
    only): the removed batches would come back below the recovery point the checkpoint file
    still names, and loading would trust them as durable (tools/sim/log_run.py, issue 29)."""
    log = PartitionLog.create(tmp_path / "orders-3", TP, SMALL, now_ms=0)
    for raw in batch_stream(12, 60, epoch_every=20):
        log.append(raw, scan_batches(raw).batches, now_ms=0)
    log.flush()
    active = log.active_segment
    headers = list(active.headers())
    assert len(headers) > 2
    synced = _fsyncs(monkeypatch)
    log.truncate_to(headers[-2].base_offset)
    kept = headers[-2].position
    assert (str(active.log_path), kept) in synced, f"{active.log_path.name} not synced at {kept}"


def test_a_truncation_whose_fsync_fails_claims_nothing_above_its_new_end(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The segment is already shortened when its fsync fails (EIO): the log end and the
    recovery point a checkpoint would name follow it down all the same."""
    log = PartitionLog.create(tmp_path / "orders-3", TP, SMALL, now_ms=0)
    for raw in batch_stream(12, 60, epoch_every=20):
        log.append(raw, scan_batches(raw).batches, now_ms=0)
    log.flush()
    headers = list(log.active_segment.headers())
    assert log.recovery_point == log.log_end_offset > headers[-2].base_offset

    def failing_fsync(fd: int) -> None:
        raise OSError(5, "Input/output error")

    monkeypatch.setattr(os, "fsync", failing_fsync)
    with pytest.raises(OSError):
        log.truncate_to(headers[-2].base_offset)
    assert log.log_end_offset == headers[-2].base_offset
    assert log.recovery_point <= log.log_end_offset


def test_reads_at_segment_boundaries(tmp_path: Path) -> None:
    log, batches = _partition(tmp_path)
    headers = _headers(batches)
    segments = log.segments
    for prev, seg in itertools.pairwise(segments):
        last_of_prev = seg.base_offset - 1
        result = log.read(last_of_prev, 1)
        assert result.region is not None and result.region.path == prev.log_path
        batch = next(h for h in headers if h.base_offset <= last_of_prev <= h.last_offset)
        assert result.region.read_bytes() == batches[headers.index(batch)]
        first = log.read(seg.base_offset, 1)
        assert first.region is not None and first.region.path == seg.log_path
        assert first.region.position == 0
    end = log.read(log.log_end_offset, 100)
    assert end.region is None
    with pytest.raises(OffsetOutOfRangeError):
        log.read(log.log_end_offset + 1, 100)


@pytest.mark.parametrize("damage", ["magic", "zeros", "past the end"])
def test_a_read_at_a_damaged_batch_raises_and_never_passes_to_the_next_segment(
    tmp_path: Path, damage: str
) -> None:
    """Where a batch must start and the bytes are no batch header (or one that runs past the
    segment's end), the read raises DamagedLogError, counted: before, it went on to the next
    segment and served its batches as if the damaged ones were not there."""
    log, _ = _partition(tmp_path)
    second = log.segments[1]
    inside = second.headers()  # positions in the segment's file
    victim = inside[2]
    position = victim.position
    with open(second.log_path, "r+b") as f:
        if damage == "magic":
            f.seek(position + 16)
            f.write(b"\x07")
        elif damage == "zeros":
            f.seek(position)
            f.write(bytes(61))
        else:  # a length that runs past the segment's end
            f.seek(position + 8)
            f.write((1 << 30).to_bytes(4, "big"))
    with pytest.raises(DamagedLogError, match=second.log_path.name):
        log.read(victim.base_offset, 1)
    with pytest.raises(DamagedLogError):
        log.read(victim.last_offset, 1 << 20)
    assert log.damaged_reads == 2
    assert log.damaged_offset == victim.last_offset  # where the last one found it (status)
    # Before the damage and in the other segments, reads go on as before.
    assert log.read(inside[1].base_offset, 1).region.position == inside[1].position
    assert log.read(log.segments[2].base_offset, 1).region.position == 0


def test_overlap_rejected_gap_accepted(tmp_path: Path) -> None:
    log, _ = _partition(tmp_path, count=5)
    leo = log.log_end_offset
    overlapping = producer_batch(leo - 1, [b"x"])
    with pytest.raises(LogError, match="overlaps"):
        log.append(overlapping, scan_batches(overlapping).batches, now_ms=0)
    gapped = producer_batch(leo + 50, [b"x", b"y"])
    result = log.append(gapped, scan_batches(gapped).batches, now_ms=0)
    assert (result.first_offset, result.log_end_offset) == (leo + 50, leo + 52)
    assert log.read(leo + 10, 10).region is not None  # the next batch after the gap


def test_append_takes_the_whole_scanned_buffer(tmp_path: Path) -> None:
    log = PartitionLog.create(tmp_path / "orders-3", TP, SMALL, now_ms=0)
    fetched = b"".join(batch_stream(3, 6))
    partial = fetched + fetched[:30]  # a fetch response ending in a partial batch
    scan = scan_batches(partial)
    log.append(partial, scan.batches[2:], now_ms=0)
    assert log.active_segment.log_path.read_bytes() == fetched[scan.batches[2].position :]


def test_truncate_across_segments_and_epochs(tmp_path: Path) -> None:
    log, batches = _partition(tmp_path)
    headers = _headers(batches)
    assert log.latest_epoch() == 2
    target = headers[45]  # epoch 1, a few segments back
    log.truncate_to(target.base_offset)
    assert log.log_end_offset == target.base_offset
    assert b"".join(s.log_path.read_bytes() for s in log.segments) == b"".join(batches[:45])
    assert log.latest_epoch() == 1
    assert log.end_offset_for_epoch(0) == EpochEndOffset(0, headers[40].base_offset)
    assert log.end_offset_for_epoch(1) == EpochEndOffset(1, target.base_offset)
    assert (log.directory / LEADER_EPOCH_CHECKPOINT).read_text().splitlines()[1] == "2"
    # Appending again after the truncation point works and rolls as before.
    _append_all(log, batches[45:])
    assert b"".join(s.log_path.read_bytes() for s in log.segments) == b"".join(batches)


def test_truncate_inside_a_batch_removes_it_whole(tmp_path: Path) -> None:
    log, batches = _partition(tmp_path, count=10)
    headers = _headers(batches)
    h = next(h for h in headers if h.last_offset > h.base_offset)
    log.truncate_to(h.base_offset + 1)
    assert log.log_end_offset == h.base_offset


@pytest.mark.parametrize("to", [1, 2])
def test_truncating_the_batch_that_holds_the_log_start_empties_the_log(
    tmp_path: Path, to: int
) -> None:
    """A log may start inside its first batch; removing that batch leaves nothing at or
    above the log start, so the log starts over at the truncation point (it used to end
    below its start: found by tools/sim, seed 80478)."""
    log = PartitionLog.create(tmp_path / "orders-3", TP, SMALL, now_ms=0)
    _append_all(log, [producer_batch(0, [b"a", b"b", b"c"], leader_epoch=1)])
    log.high_watermark = 3
    log.maybe_increment_log_start_offset(1)
    log.truncate_to(to)
    assert (log.log_start_offset, log.log_end_offset, log.high_watermark) == (to, to, to)
    assert log.latest_epoch() is None
    after = producer_batch(to, [b"d"], leader_epoch=2)
    _append_all(log, [after])
    assert b"".join(s.log_path.read_bytes() for s in log.segments) == after


def test_truncate_fully_and_start_at(tmp_path: Path) -> None:
    log, _ = _partition(tmp_path)
    log.truncate_fully_and_start_at(10_000)
    assert [s.base_offset for s in log.segments] == [10_000]
    assert (log.log_start_offset, log.log_end_offset, log.high_watermark) == (
        10_000,
        10_000,
        10_000,
    )
    assert log.latest_epoch() is None
    _append_all(log, batch_stream(5, 3, first_offset=10_000))
    assert log.log_end_offset > 10_000


def test_log_start_moves_delete_whole_segments_only(tmp_path: Path) -> None:
    log, _ = _partition(tmp_path)
    segments = log.segments
    target = segments[2].base_offset + 3
    log.maybe_increment_log_start_offset(target)
    assert log.log_start_offset == target
    assert [s.base_offset for s in log.segments] == [s.base_offset for s in segments[2:]]
    assert not segments[0].log_path.exists()
    assert log.epoch_entries()[0].start_offset == target
    with pytest.raises(OffsetOutOfRangeError):
        log.read(target - 1, 10)
    log.maybe_increment_log_start_offset(5)  # never backwards
    assert log.log_start_offset == target
    with pytest.raises(LogError, match="would pass the log end"):
        log.maybe_increment_log_start_offset(log.log_end_offset + 1)


def test_offset_for_timestamp_across_segments(tmp_path: Path) -> None:
    log, batches = _partition(tmp_path)
    headers = _headers(batches)
    # Kafka's answer is the first record reaching the timestamp, not the batch holding it.
    records = [r for b in batches for r in decode_batch(b, scan_batches(b).batches[0]).records]
    for i in (0, 37, 80, 119):
        ts = headers[i].max_timestamp
        first = next(r for r in records if r.timestamp >= ts)
        found = log.offset_for_timestamp(ts)
        assert found is not None
        assert (found.timestamp, found.offset) == (first.timestamp, first.offset)


def _held_elsewhere(lock: threading.RLock) -> bool:
    """Whether some thread holds `lock` (asked from another thread: an RLock lets its own
    holder in again)."""
    got: list[bool] = []

    def probe() -> None:
        free = lock.acquire(blocking=False)
        if free:
            lock.release()
        got.append(not free)

    thread = threading.Thread(target=probe)
    thread.start()
    thread.join()
    return got[0]


def test_offset_for_timestamp_reads_the_disk_without_the_partition_lock(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """As a read: the time index and the batches are read without the partition lock (an
    append on the event loop must not wait on those preads; the old search held it
    throughout); a truncation that overlaps the search makes it search again under the
    lock, whose answer is the log's now."""
    log, batches = _partition(tmp_path)
    headers = _headers(batches)
    real_find = LogSegment.find_offset_by_timestamp
    locked_during: list[bool] = []
    race: list[int] = []

    def watched(segment: LogSegment, timestamp: int, starting_offset: int = 0):  # type: ignore[no-untyped-def]
        locked_during.append(_held_elsewhere(log._lock))
        if race:
            log.truncate_to(race.pop())  # a writer cuts the log meanwhile
        return real_find(segment, timestamp, starting_offset)

    monkeypatch.setattr(LogSegment, "find_offset_by_timestamp", watched)
    late = headers[100]
    found = log.offset_for_timestamp(late.max_timestamp)
    assert found is not None and found.offset <= late.last_offset
    assert locked_during and not any(locked_during)
    # Cut below that record while the search runs: searched again, under the lock.
    race.append(headers[90].base_offset)
    assert max(h.max_timestamp for h in headers[:90]) < late.max_timestamp
    again = log.offset_for_timestamp(late.max_timestamp)
    assert log.log_end_offset == headers[90].base_offset
    assert again is None  # no record left reaches it: the log's answer now


def test_a_search_without_the_lock_never_works_out_a_segments_largest_timestamp(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A loaded segment's largest timestamp is worked out from its tail on first use, which
    sets the index state appends go on with: only under the partition lock, or a search on
    serve's worker thread could set it from bytes a truncation had just cut. With the
    indexes loaded but not that state, the search is done under the lock (once: it is in
    memory after). Fails on the old code (worked out by the search without the lock)."""
    log, batches = _partition(tmp_path)
    headers = _headers(batches)
    log.close()
    loaded = PartitionLog.load(
        log.directory,
        TP,
        SMALL,
        now_ms=0,
        recovery_point=log.log_end_offset,
        log_start_offset=0,
        high_watermark=log.log_end_offset,
        clean_shutdown=True,
    )
    assert len(loaded.segments) > 3
    for segment in loaded.segments:
        segment.offset_index, segment.time_index  # noqa: B018 -- the indexes only
    real = LogSegment._builder_from_tail
    locked_when_built: list[bool] = []

    def watched(segment: LogSegment):  # type: ignore[no-untyped-def]
        locked_when_built.append(loaded._lock._is_owned())  # type: ignore[attr-defined]
        return real(segment)

    monkeypatch.setattr(LogSegment, "_builder_from_tail", watched)
    late = headers[100]
    found = loaded.offset_for_timestamp(late.max_timestamp)
    assert found is not None and found.offset <= late.last_offset
    assert locked_when_built and all(locked_when_built)
    built = len(locked_when_built)
    assert loaded.offset_for_timestamp(late.max_timestamp) == found
    assert len(locked_when_built) == built  # in memory from then on
    assert loaded.largest_timestamp() == max(h.max_timestamp for h in headers)


def test_retention_by_bytes_moves_log_start(tmp_path: Path) -> None:
    config = RETAINS_THREE
    log, _ = _partition(tmp_path, config=config)
    deleted = log.enforce_retention(now_ms=0)
    assert deleted
    assert log.size_in_bytes >= config.retention_bytes - SMALL.segment_bytes
    assert log.log_start_offset == log.segments[0].base_offset


def _lock_free(log: PartitionLog) -> bool:
    """Whether another thread (an append on the event loop, say) can take the partition's
    lock right now."""
    taken: list[bool] = []

    def other_thread() -> None:
        got = log._lock.acquire(blocking=False)
        taken.append(got)
        if got:
            log._lock.release()

    thread = threading.Thread(target=other_thread)
    thread.start()
    thread.join()
    return taken == [True]


def test_a_read_reads_the_disk_without_holding_the_append_path(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """serve's reads and verify's thread read headers with pread: each pread happens with
    the partition lock free, so an append (another thread takes the lock then) never waits
    on a read's disk."""
    log, _ = _partition(tmp_path)
    real_pread = os.pread
    lock_free_at_pread: list[bool] = []

    def pread(fd: int, size: int, position: int) -> bytes:
        lock_free_at_pread.append(_lock_free(log))
        return real_pread(fd, size, position)

    monkeypatch.setattr(os, "pread", pread)
    for segment in log.segments[:3]:
        inside = segment.headers()
        lock_free_at_pread.clear()
        read = log.read(inside[-1].last_offset, 1)
        assert read.region is not None and read.region.position == inside[-1].position
        assert lock_free_at_pread and all(lock_free_at_pread)


def test_a_read_that_a_truncation_races_is_read_again_under_the_lock_not_called_damage(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A truncation and new appends under a read that holds no lock can put a batch's body
    where the read expected a header: that is no damage; the read is done again under the
    lock and answers the log as it is then."""
    log, _ = _partition(tmp_path)
    inside = log.active_segment.headers()
    assert len(inside) > 3
    target = inside[-1]
    real_pread, real_handle_pread = os.pread, FileHandle.pread
    raced: list[bool] = []
    big = producer_batch(inside[-3].base_offset, [bytes(4000)])

    def race() -> None:
        if not raced:
            raced.append(True)
            # Cut before the batch asked for and write one large batch over its place (or
            # in a segment it rolls to: then the read finds nothing in the list it took).
            log.truncate_to(inside[-3].base_offset)
            log.append(big, scan_batches(big).batches, now_ms=0)

    # The race comes just before the read's first pread: through a FileHandle (whose
    # pread holds the handle cache's lock, which the truncation needs: so before it takes
    # it), or on a pinned descriptor.
    def handle_pread(handle: FileHandle, size: int, position: int) -> bytes:
        race()
        return real_handle_pread(handle, size, position)

    def pread(fd: int, size: int, position: int) -> bytes:
        race()
        return real_pread(fd, size, position)

    monkeypatch.setattr(FileHandle, "pread", handle_pread)
    monkeypatch.setattr(os, "pread", pread)
    read = log.read(inside[-3].base_offset, 1)
    assert raced
    assert log.damaged_reads == 0
    assert read.region is not None and read.region.read_bytes() == big
    assert read.log_end_offset == inside[-3].base_offset + 1
    with pytest.raises(OffsetOutOfRangeError):
        log.read(target.base_offset, 1)


def test_a_read_of_the_offset_read_last_reads_no_header_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The offset asked again (a long-poll's next round, another group at the same place)
    gets the batch the last read found, without the index or a header's pread: within its
    own max_bytes, to the segment's end as it is now. Another offset is read as before.
    Fails on the code before (a pread a read)."""
    log, _ = _partition(tmp_path)
    inside = log.active_segment.headers()
    target = inside[1]
    first = log.read(target.base_offset, 1)
    real_pread = FileHandle.pread
    preads: list[int] = []

    def pread(handle: FileHandle, size: int, position: int) -> bytes:
        preads.append(position)
        return real_pread(handle, size, position)

    monkeypatch.setattr(FileHandle, "pread", pread)
    again = log.read(target.base_offset, 1)
    more = producer_batch(log.log_end_offset, [b"later"])
    log.append(more, scan_batches(more).batches, now_ms=0)
    wider = log.read(target.base_offset, 1 << 20)
    assert preads == []
    assert again.region == first.region and first.region is not None
    assert first.region.size == target.size
    assert wider.region is not None and wider.region.position == target.position
    assert wider.region.size == log.active_segment.size - target.position
    other = log.read(inside[2].base_offset, 1)
    assert preads != [] and other.region is not None
    assert other.region.position == inside[2].position


def test_a_read_after_a_truncation_finds_the_batch_written_since_not_the_one_it_found(
    tmp_path: Path,
) -> None:
    """A read's batch is kept for the next read of its offset only while the log is not
    truncated: cut and written again with another batch at that offset, the read finds
    that one (fails if the kept batch outlived the truncation: its size was the old one)."""
    log, _ = _partition(tmp_path)
    inside = log.active_segment.headers()
    offset = inside[-2].base_offset
    before = log.read(offset, 1)
    assert before.region is not None and before.region.size == inside[-2].size
    log.truncate_to(offset)
    big = producer_batch(offset, [bytes(4000)])
    log.append(big, scan_batches(big).batches, now_ms=0)
    after = log.read(offset, 1)
    assert after.region is not None and after.region.read_bytes() == big


def test_retention_unlinks_segments_without_holding_the_append_path(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two-phase delete: under the partition lock the segments are only renamed to
    `.deleted`; each unlink happens with the lock free (another thread takes it then), and
    a crash between the phases leaves `.deleted` files that loading removes."""
    config = RETAINS_THREE
    log, _ = _partition(tmp_path, config=config)
    real_unlink = Path.unlink
    lock_free_at_unlink: list[bool] = []

    def unlink(path: Path, missing_ok: bool = False) -> None:
        if path.name.endswith(".deleted"):
            lock_free_at_unlink.append(_lock_free(log))
        real_unlink(path, missing_ok=missing_ok)

    monkeypatch.setattr(Path, "unlink", unlink)
    deleted = log.enforce_retention(now_ms=0)
    assert deleted and len(lock_free_at_unlink) == 3 * len(deleted)
    assert all(lock_free_at_unlink)
    assert not list(log.directory.glob("*.deleted"))
    monkeypatch.setattr(Path, "unlink", real_unlink)
    # A crash after the renames: the .deleted files are removed when the log is loaded.
    base = log.segments[0].base_offset
    log.close()
    stale = log.directory / f"{0:020d}.log.deleted"
    stale.write_bytes(b"old segment")
    loaded = PartitionLog.load(
        log.directory,
        TP,
        config,
        now_ms=0,
        recovery_point=0,
        log_start_offset=base,
        high_watermark=base,
        clean_shutdown=False,
    )
    assert not stale.exists() and loaded.log_start_offset == base
    assert stale.name in loaded.last_recovery.removed_files
    loaded.close()


def test_retention_fsyncs_nothing_while_it_holds_the_append_path(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 29: the two-phase delete left the leader-epoch file (a write and two fsyncs)
    under the partition lock; every fsync of a retention pass now finds the lock free."""
    log, _ = _partition(tmp_path, config=RETAINS_THREE)
    real_fsync = os.fsync
    lock_free_at_fsync: list[bool] = []

    def fsync(fd: int) -> None:
        lock_free_at_fsync.append(_lock_free(log))
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", fsync)
    before = log.epoch_entries()[0]
    assert log.enforce_retention(now_ms=0)
    monkeypatch.undo()
    assert log.epoch_entries()[0].start_offset == log.log_start_offset > before.start_offset
    # the epoch file (staged, synced, its directory synced) and the unlinks' directory
    assert len(lock_free_at_fsync) >= 3 and all(lock_free_at_fsync), lock_free_at_fsync
    now = log.epoch_entries()[0]
    assert _epoch_file(log).splitlines()[2] == f"{now.epoch} {now.start_offset}"


def test_retention_keeps_what_is_at_or_past_the_floor(tmp_path: Path) -> None:
    log, _ = _partition(tmp_path, config=RETAINING)
    assert len(log.segments) > 3
    bases = [segment.base_offset for segment in log.segments]
    floor = bases[1] + 1  # inside the second segment
    log.retention_floor = floor
    # Only the segment wholly below the floor goes, though retention wants more gone.
    assert log.enforce_retention(now_ms=0) == [bases[0]]
    assert log.log_start_offset == bases[1]
    # Lifting the hold lets retention go on.
    log.retention_floor = None
    assert log.enforce_retention(now_ms=0)
    assert log.log_start_offset > floor


def test_the_lower_of_the_mirror_and_archive_floors_holds(tmp_path: Path) -> None:
    log, _ = _partition(tmp_path, config=RETAINING)
    bases = [segment.base_offset for segment in log.segments]
    assert len(bases) > 4
    log.retention_floor = bases[3]
    log.archive_floor = bases[1]  # the archive has uploaded less than the mirror produced
    assert log.enforce_retention(now_ms=0) == [bases[0]]
    log.archive_floor = bases[4]
    assert log.enforce_retention(now_ms=0) == bases[1:3]


def test_an_idle_active_segment_rolls_after_segment_ms(tmp_path: Path) -> None:
    config = LogConfig(segment_ms=1_000)
    log = PartitionLog.create(tmp_path / "orders-3", TP, config, now_ms=0)
    assert not log.roll_if_idle(now_ms=10_000)  # empty: nothing to close
    _append_all(log, batch_stream(2, 3, max_records=10))
    created = log.active_segment.created_ms
    assert not log.roll_if_idle(now_ms=created + 1_000)
    end = log.log_end_offset
    assert log.roll_if_idle(now_ms=created + 1_001)
    assert [s.base_offset for s in log.segments] == [0, end]
    assert log.active_segment.is_empty and log.log_end_offset == end


def test_flush_messages_moves_recovery_point(tmp_path: Path) -> None:
    config = LogConfig(flush_messages=50)
    log = PartitionLog.create(tmp_path / "orders-3", TP, config, now_ms=0)
    batches = batch_stream(2, 20, max_records=10)
    _append_all(log, batches[:1])
    assert log.recovery_point == 0
    _append_all(log, batches[1:])
    assert 0 < log.recovery_point <= log.log_end_offset


def test_topic_id_written_and_checked(tmp_path: Path) -> None:
    topic_id = uuid.uuid4()
    log = PartitionLog.create(tmp_path / "orders-3", TP, SMALL, now_ms=0, topic_id=topic_id)
    assert "topic_id:" in (log.directory / PARTITION_METADATA).read_text()
    log.set_topic_id(topic_id)
    with pytest.raises(LogError, match="recreated"):
        log.set_topic_id(uuid.uuid4())


@pytest.fixture
def fsynced(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The inodes os.fsync is called on, in order."""
    inodes: list[int] = []
    real_fsync = os.fsync

    def recording_fsync(fd: int) -> None:
        inodes.append(os.fstat(fd).st_ino)
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", recording_fsync)
    return inodes


def _inodes(*paths: Path) -> set[int]:
    return {path.stat().st_ino for path in paths}


def _paths(segment: LogSegment) -> tuple[Path, Path, Path]:
    return (segment.log_path, segment.index_path, segment.time_index_path)


def test_flush_syncs_files_whose_descriptors_were_closed(
    tmp_path: Path, fsynced: list[int]
) -> None:
    handles = FileHandles(1)
    log = PartitionLog.create(tmp_path / "orders-3", TP, SMALL, now_ms=0, handles=handles)
    other = handles.create(tmp_path, "other")
    batches = batch_stream(3, 12)
    _append_all(log, batches)
    active = log.active_segment
    other.write_all(b"x", 0)  # the only descriptor now: every file of the log was closed
    assert all(f.fd < 0 and f.dirty for f in active.files)
    fsynced.clear()
    log.flush()
    assert set(fsynced) == _inodes(*_paths(active))
    assert log.recovery_point == log.log_end_offset
    assert not any(f.dirty for f in active.files)
    assert handles.stats().open == 1  # syncing did not take descriptors from the cache
    fsynced.clear()
    log.flush()
    assert fsynced == []  # nothing written since


def test_unclean_load_counts_files_past_the_recovery_point_as_unsynced(
    tmp_path: Path, fsynced: list[int]
) -> None:
    log, _ = _partition(tmp_path)
    log.flush()
    log.close()
    for clean in (True, False):
        loaded = PartitionLog.load(
            log.directory,
            TP,
            SMALL,
            now_ms=0,
            recovery_point=log.segments[2].base_offset + 1,
            log_start_offset=0,
            high_watermark=0,
            clean_shutdown=clean,
        )
        fsynced.clear()
        loaded.flush()
        active = loaded.active_segment
        # Loading preallocates the active segment's indexes again: that much is new.
        expected = _inodes(active.index_path, active.time_index_path)
        if not clean:
            expected |= _inodes(*(p for s in loaded.segments[2:] for p in _paths(s)))
        assert set(fsynced) == expected
        assert not any(f.dirty for s in loaded.segments for f in s.files)
        loaded.close()


@pytest.fixture
def small_fs(tmp_path: Path) -> Iterator[Path]:
    mount = tmp_path / "small"
    mount.mkdir()
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=256k", "tmpfs", str(mount)],
        capture_output=True,
        text=True,
        check=False,
    )
    if done.returncode != 0:
        pytest.skip(f"cannot mount a small tmpfs here: {done.stderr.strip()}")
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=False)


def test_disk_full_leaves_whole_batches_and_resumes(small_fs: Path) -> None:
    config = LogConfig(segment_bytes=64 * 1024, index_interval_bytes=1024, segment_index_bytes=4096)
    ballast = small_fs / "ballast"
    ballast.write_bytes(bytes(96 * 1024))  # another tenant of the disk
    log = PartitionLog.create(small_fs / "orders-3", TP, config, now_ms=0)
    batches = batch_stream(4, 2000, max_value=900, codecs=[0])  # type: ignore[list-item]
    written: list[bytes] = []
    with pytest.raises(DiskFullError, match="whole batches only"):
        for raw in batches:
            log.append(raw, scan_batches(raw).batches, now_ms=0)
            written.append(raw)
    assert 0 < len(written) < len(batches)
    on_disk = b"".join(s.log_path.read_bytes() for s in log.segments)
    assert on_disk == b"".join(written)  # nothing torn kept
    assert scan_batches(on_disk).stop.name == "END"
    assert log.log_end_offset == scan_batches(written[-1]).batches[0].next_offset
    # Space comes back: the append that failed, and more, go through.
    ballast.unlink()
    resumed = batches[len(written) : len(written) + 5]
    _append_all(log, resumed)
    on_disk = b"".join(s.log_path.read_bytes() for s in log.segments)
    assert on_disk == b"".join(written + resumed)


def test_a_full_disk_at_the_first_epoch_file_is_a_disk_full_error_and_the_log_is_made_later(
    small_fs: Path,
) -> None:
    """The segment's files are made empty (no space needed) and the epoch file is the first
    to take bytes: its ENOSPC left `create` as a bare OSError, which failed a leader's whole
    fetch loop (session 14's 10,000-partition cluster soak) instead of pausing the one
    partition as DiskFullError does."""
    config = LogConfig(segment_bytes=64 * 1024, index_interval_bytes=1024, segment_index_bytes=4096)
    ballast = small_fs / "ballast"
    with ballast.open("wb", buffering=0) as out, contextlib.suppress(OSError):
        while True:  # every last block taken
            out.write(bytes(4096))
    with pytest.raises(DiskFullError, match="no space left creating its log"):
        PartitionLog.create(small_fs / "orders-3", TP, config, now_ms=0)
    ballast.unlink()
    log = PartitionLog.create(small_fs / "orders-3", TP, config, now_ms=0)
    batches = batch_stream(2, 3)
    _append_all(log, batches)
    assert b"".join(s.log_path.read_bytes() for s in log.segments) == b"".join(batches)
    log.close()


def _during_first_fsync(monkeypatch: pytest.MonkeyPatch, action: object) -> None:
    """Run `action()` inside the first os.fsync call (another thread's append or truncation
    landing while a flush waits on the disk)."""
    real_fsync = os.fsync
    pending = [action]

    def racing_fsync(fd: int) -> None:
        if pending:
            pending.pop()()  # type: ignore[operator]
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", racing_fsync)


def test_a_flush_claims_the_log_end_it_picked_not_appends_made_while_it_synced(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    log, _ = _partition(tmp_path, count=30)
    picked = log.log_end_offset
    more = batch_stream(12, 10, first_offset=picked)
    _during_first_fsync(monkeypatch, lambda: _append_all(log, more))
    log.flush()
    assert log.log_end_offset > picked
    assert log.recovery_point == picked
    log.flush()
    assert log.recovery_point == log.log_end_offset


def test_a_truncation_while_a_flush_syncs_leaves_the_recovery_point_to_the_next_flush(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    log, batches = _partition(tmp_path, count=30)
    headers = _headers(batches)
    picked = log.log_end_offset
    cut = headers[10].base_offset
    # The truncated offsets are written again, past the old end, before the flush returns:
    # a flush that claimed min(picked, log end) would name bytes it never synced.
    rewritten = batch_stream(13, 30, first_offset=cut)

    def truncate_and_rewrite() -> None:
        log.truncate_to(cut)
        _append_all(log, rewritten)

    _during_first_fsync(monkeypatch, truncate_and_rewrite)
    log.flush()
    assert log.log_end_offset > picked
    assert log.recovery_point <= cut
    log.flush()
    assert log.recovery_point == log.log_end_offset


def test_a_due_flush_goes_to_flush_later_once_until_it_starts(tmp_path: Path) -> None:
    """With a flush_later (the follower's durability thread), an append that makes
    flush.messages due hands the flush over instead of fsyncing itself -- once, however many
    appends follow before that flush starts."""
    config = LogConfig(flush_messages=50)
    log = PartitionLog.create(tmp_path / "orders-3", TP, config, now_ms=0)
    handed: list[PartitionLog] = []
    log.flush_later = handed.append
    batches = batch_stream(2, 40, max_records=10)
    _append_all(log, batches[:30])
    assert handed == [log]
    assert log.recovery_point == 0  # nothing synced on the appending thread
    handed.pop().flush()
    assert log.recovery_point == log.log_end_offset
    # The flush started: the next append that makes one due hands it over again.
    for raw in batches[30:]:
        _append_all(log, [raw])
        if handed:
            break
    assert handed == [log] and log.log_end_offset - log.recovery_point >= 50


# -- the leader-epoch file written late (the module's epoch-file rules) ---------------------


def _epoch_file(log: PartitionLog) -> str:
    return (log.directory / LEADER_EPOCH_CHECKPOINT).read_text()


class _Later:
    """`disk_later` that only records the jobs (a durability thread that never runs)."""

    def __init__(self, log: PartitionLog) -> None:
        self.asked: list[tuple[str, object]] = []
        self.jobs: list = []
        log.disk_later = self

    def __call__(self, job, what: str, key: object) -> None:
        self.asked.append((what, key))
        self.jobs.append(job)


def test_a_new_epoch_is_handed_to_disk_later_and_not_written_by_the_append(
    tmp_path: Path,
) -> None:
    log = PartitionLog.create(tmp_path / "orders-3", TP, SMALL, now_ms=0)
    later = _Later(log)
    before = _epoch_file(log)
    for base, epoch in ((0, 1), (2, 2), (4, 3)):
        _append_all(log, [producer_batch(base, [b"a", b"b"], leader_epoch=epoch)])
    assert _epoch_file(log) == before  # the appending thread wrote nothing
    assert [key for _, key in later.asked] == [log, log, log]  # one key: the queue merges them
    assert log.latest_epoch() == 3
    later.jobs[-1]()
    assert _epoch_file(log) == "0\n3\n1 0\n2 2\n3 4\n"


def test_a_checkpoint_writes_the_epoch_file_before_it_names_data_of_that_epoch(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Rule 1: the epoch job never ran, yet the checkpoint's recovery point past the new
    epoch's data lands only after the file holds that epoch."""
    from replicad.log.layout import RECOVERY_POINT_CHECKPOINT
    from replicad.log.manager import LogManager

    logs = LogManager.open(tmp_path / "data", SMALL, now_ms=0)
    order: list[str] = []
    logs.disk_later = lambda job, what, key: order.append("asked")
    log = logs.get_or_create(TP)
    _append_all(log, [producer_batch(0, [b"a"], leader_epoch=4)])
    _append_all(log, [producer_batch(1, [b"b"], leader_epoch=5)])
    epoch_file = log.directory / LEADER_EPOCH_CHECKPOINT
    real_replace = os.replace

    def replace(src: object, dst: object) -> None:
        target = Path(str(dst))
        if target == epoch_file:
            order.append("epoch file")
        elif target.name == RECOVERY_POINT_CHECKPOINT:
            order.append(f"recovery points {log.recovery_point}")
        real_replace(src, dst)  # type: ignore[arg-type]

    monkeypatch.setattr(os, "replace", replace)
    logs.checkpoint()
    monkeypatch.undo()
    assert order == ["asked", "asked", "epoch file", "recovery points 2"]
    assert epoch_file.read_text() == "0\n2\n4 0\n5 1\n"
    logs.close()


def test_an_epoch_below_the_checkpointed_recovery_point_is_written_at_once(
    tmp_path: Path,
) -> None:
    """Rule 3: after a truncation below what the checkpoint file names, a late entry could
    be lost with the file claiming its data: it is written by the append itself."""
    from replicad.log.manager import LogManager

    logs = LogManager.open(tmp_path / "data", SMALL, now_ms=0)
    asked: list[str] = []
    logs.disk_later = lambda job, what, key: asked.append(what)
    log = logs.get_or_create(TP)
    _append_all(log, [producer_batch(b, [b"x"], leader_epoch=1) for b in range(6)])
    logs.checkpoint()
    assert log.checkpointed_recovery_point == 6
    asked.clear()
    log.truncate_to(3)  # a truncation writes at once (rule 3)
    assert _epoch_file(log) == "0\n1\n1 0\n"
    _append_all(log, [producer_batch(3, [b"y"], leader_epoch=2)])
    assert asked == []
    assert _epoch_file(log) == "0\n2\n1 0\n2 3\n"
    _append_all(log, [producer_batch(4, [b"z"], leader_epoch=3)])  # still below 6
    assert asked == [] and _epoch_file(log).endswith("3 4\n")
    logs.checkpoint()  # names 5 now: an epoch from 5 on may be written late again
    _append_all(log, [producer_batch(5, [b"w"], leader_epoch=4)])
    assert asked == [f"epochs of {TP}"]
    logs.close()


def test_an_older_epoch_file_never_replaces_a_newer_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two writers (the loop, the durability thread): the one that read the older cache
    stages its file while the other writes the newer one; the older is dropped."""
    import replicad.log.partition as partition_module

    log = PartitionLog.create(tmp_path / "orders-3", TP, SMALL, now_ms=0)
    _Later(log)
    _append_all(log, [producer_batch(0, [b"a"], leader_epoch=1)])
    real_stage = partition_module.stage_file
    stages: list[str] = []

    def stage(path: Path, text: str, *, tag: str = "") -> Path:
        stages.append(text)
        if len(stages) == 1:  # meanwhile, on the other thread: a newer epoch, written
            log.disk_later = None
            _append_all(log, [producer_batch(1, [b"b"], leader_epoch=2)])
        return real_stage(path, text, tag=tag)

    monkeypatch.setattr(partition_module, "stage_file", stage)
    log.save_epochs()
    assert stages == ["0\n1\n1 0\n", "0\n2\n1 0\n2 1\n"]
    assert _epoch_file(log) == "0\n2\n1 0\n2 1\n"
    assert [p.name for p in log.directory.iterdir() if p.name.endswith(".tmp")] == []


def test_a_late_epoch_file_is_rebuilt_from_the_batches_after_a_crash(tmp_path: Path) -> None:
    """Rule 2: the epoch job never ran and the process died; loading scans the batches
    above the recovery point, finds the epochs the file lacks and writes them."""
    log = PartitionLog.create(tmp_path / "orders-3", TP, SMALL, now_ms=0)
    _Later(log)
    _append_all(log, [producer_batch(0, [b"a"], leader_epoch=1)])
    _append_all(log, [producer_batch(1, [b"b"], leader_epoch=7)])
    assert _epoch_file(log) == "0\n0\n"
    reloaded = PartitionLog.load(
        log.directory,
        TP,
        SMALL,
        now_ms=0,
        recovery_point=0,
        log_start_offset=0,
        high_watermark=0,
        clean_shutdown=False,
    )
    assert [(e.epoch, e.start_offset) for e in reloaded.epoch_entries()] == [(1, 0), (7, 1)]
    # And the file catches up at once: a checkpoint may name that data next (found by
    # tools/sim: the rebuilt entries were taken as written, and the next checkpoint named
    # data whose epoch no file held).
    assert _epoch_file(reloaded) == "0\n2\n1 0\n7 1\n"


def test_a_moved_log_start_hands_its_unlinks_and_epoch_file_to_disk_later(
    tmp_path: Path,
) -> None:
    log, _ = _partition(tmp_path)
    later = _Later(log)
    bases = [s.base_offset for s in log.segments]
    log.maybe_increment_log_start_offset(bases[2])
    deleted = {p.name.split(".")[0] for p in log.directory.glob("*.deleted")}
    assert deleted == {f"{bases[0]:020d}", f"{bases[1]:020d}"}
    assert [what for what, _ in later.asked] == [f"epochs of {TP}", f"unlinks in {TP}"]
    for job in later.jobs:
        job()
    assert list(log.directory.glob("*.deleted")) == []
    assert _epoch_file(log).splitlines()[2].endswith(f" {bases[2]}")


def _fsyncs(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, int]]:
    """Every fsync from now on: (the file's path, its size then)."""
    synced: list[tuple[str, int]] = []
    real_fsync = os.fsync

    def fsync(fd: int) -> None:
        synced.append((os.readlink(f"/proc/self/fd/{fd}"), os.fstat(fd).st_size))
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", fsync)
    return synced


def test_a_truncation_above_the_checkpointed_recovery_point_leaves_its_fsyncs_to_disk_later(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A follower's divergent tail, after a failover: the event loop waits on no fsync. The
    truncation only renames and shortens; one job on the durability thread makes it durable
    (the renames, then the shorter segment, then the epoch file) and unlinks (issue 29)."""
    log, _ = _partition(tmp_path)
    later = _Later(log)
    log.flush()
    assert log.checkpointed_recovery_point == 0  # no checkpoint named anything yet
    third = log.segments[2]
    cut = third.headers()[2]
    epochs_before = _epoch_file(log)
    synced = _fsyncs(monkeypatch)
    log.truncate_to(cut.base_offset)
    # Whole segments removed, and still nothing waited on the disk: the segment left is cut
    # in memory only (its files once the renames are durable: see the next test), and a new
    # segment at the cut takes the appends. Session 15's code fsynced the directory here.
    assert synced == []
    assert log.log_end_offset == cut.base_offset
    assert [s.base_offset for s in log.segments[2:]] == [third.base_offset, cut.base_offset]
    assert third.size == cut.position and third.log_path.stat().st_size > cut.position
    assert [what for what, _ in later.asked] == [f"truncation of {TP}"]
    assert {p.name for p in log.directory.glob("*.deleted")}  # renamed, not yet unlinked
    assert _epoch_file(log) == epochs_before
    log.truncate_to(cut.base_offset - 1)  # asked again: the same key, one job waits
    assert synced == []
    assert len({key for _, key in later.asked}) == 1
    for job in later.jobs:
        job()
    names = [Path(path).name for path, _ in synced]
    assert names[0] == log.directory.name  # the renames durable first
    assert third.log_path.stat().st_size == third.size < cut.position  # cut at last
    assert (str(third.log_path), third.size) in synced  # the shorter length
    epoch_writes = [i for i, name in enumerate(names) if name.startswith(LEADER_EPOCH_CHECKPOINT)]
    assert all(i > names.index(third.log_path.name) for i in epoch_writes)
    assert list(log.directory.glob("*.deleted")) == []
    assert log.recovery_point == log.log_end_offset


@pytest.mark.parametrize("checkpointed", [False, True], ids=["deferred", "at-once"])
def test_a_truncation_across_segments_syncs_their_removal_before_it_shortens_the_last(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, checkpointed: bool
) -> None:
    """A truncation that removes whole segments: their names are gone and the directory
    fsynced before the segment left is cut (ftruncate). A filesystem may make the shorter
    length durable before names it has not synced, and the removed segments would come back
    after a crash beyond a gap (tools/sim/log_run.py, whose crashes lose unsynced names:
    seed 21, "batch at 26 follows one ending at 18"). Fails on the old code: deferred, no
    directory fsync at all; at once, the directory fsync came after the cut."""
    log, _ = _partition(tmp_path)
    later = _Later(log)
    log.flush()
    if checkpointed:
        log.recovery_point_checkpointed(log.recovery_point_to_checkpoint())
    third = log.segments[2]
    removed = {s.log_path.name for s in log.segments[3:]}
    cut = third.headers()[2]
    events: list[tuple[str, str]] = []
    real_fsync, real_ftruncate = os.fsync, os.ftruncate

    def fsync(fd: int) -> None:
        path = os.readlink(f"/proc/self/fd/{fd}")
        if Path(path) == log.directory:
            names = set(os.listdir(path))
            events.append(("directory", "removed gone" if not names & removed else "not yet"))
        real_fsync(fd)

    def ftruncate(fd: int, size: int) -> None:
        events.append(("cut", Path(os.readlink(f"/proc/self/fd/{fd}")).name))
        real_ftruncate(fd, size)

    monkeypatch.setattr(os, "fsync", fsync)
    monkeypatch.setattr(os, "ftruncate", ftruncate)
    log.truncate_to(cut.base_offset)
    assert log.log_end_offset == cut.base_offset
    if not checkpointed:
        # Deferred: the calling thread cut no file and fsynced nothing; the job does both.
        assert not any(kind == "directory" for kind, _ in events), events
        assert ("cut", third.log_path.name) not in events, events
        for job in later.jobs:
            job()
    cut_at = events.index(("cut", third.log_path.name))
    assert ("directory", "removed gone") in events[:cut_at], events
    assert third.log_path.stat().st_size == cut.position


def test_a_deferred_truncation_across_segments_reads_and_appends_the_shorter_log_at_once(
    tmp_path: Path,
) -> None:
    """Before its job runs, the truncated log is what reads, appends and a reload after the
    job see; the segment left keeps its old bytes on disk until then, and no append lands
    in it (a new segment at the cut takes them)."""
    log, batches = _partition(tmp_path)
    later = _Later(log)
    log.flush()
    third = log.segments[2]
    cut = third.headers()[2]
    log.truncate_to(cut.base_offset)
    with pytest.raises(OffsetOutOfRangeError):
        log.read(cut.base_offset + 1, 1 << 20)
    region = log.read(third.base_offset, 1 << 20).region
    assert region is not None and region.position + region.size == cut.position
    assert log.read(cut.base_offset, 1 << 20).region is None  # the log end
    after = batch_stream(13, 5, first_offset=cut.base_offset)
    _append_all(log, after)
    assert log.active_segment.base_offset == cut.base_offset
    assert log.active_segment.log_path.read_bytes() == b"".join(after)
    assert third.log_path.stat().st_size > cut.position  # not cut yet: the job does it
    for job in later.jobs:
        job()
    expected = b"".join(batches)[: sum(s.size for s in log.segments[:2]) + cut.position]
    log.close()
    loaded = PartitionLog.load(
        log.directory,
        TP,
        SMALL,
        now_ms=0,
        recovery_point=0,
        log_start_offset=0,
        high_watermark=0,
        clean_shutdown=True,
    )
    assert loaded.last_recovery is not None and loaded.last_recovery.clean
    data = b"".join(s.log_path.read_bytes() for s in loaded.segments)
    assert data == expected + b"".join(after)
    loaded.close()


def test_loading_cuts_batches_at_or_past_the_next_segments_base(tmp_path: Path) -> None:
    """A crash after a deferred truncation across segments made its new segment's name
    durable but not the cut of the segment left (the job had not run, or the shorter length
    was lost): loading cuts that segment where the next begins, as the truncation did.
    Without that rule in loading (checked), the loaded log held the old batches, then the new
    segment's from an offset below their end."""
    log, _ = _partition(tmp_path)
    later = _Later(log)
    log.flush()
    third = log.segments[2]
    cut = third.headers()[2]
    kept = (
        b"".join(s.log_path.read_bytes() for s in log.segments[:2])
        + (third.log_path.read_bytes()[: cut.position])
    )
    log.truncate_to(cut.base_offset)
    after = batch_stream(13, 5, first_offset=cut.base_offset)
    _append_all(log, after)
    for segment in log.segments:
        segment.flush()  # the appends durable; the job (the cut) never ran
    assert later.jobs and third.log_path.stat().st_size > cut.position
    for path in log.directory.glob("*.deleted"):
        path.unlink()
    loaded = PartitionLog.load(
        log.directory,
        TP,
        SMALL,
        now_ms=0,
        recovery_point=third.base_offset,
        log_start_offset=0,
        high_watermark=0,
        clean_shutdown=False,
        handles=FileHandles(64),
    )
    data = b"".join(s.log_path.read_bytes() for s in loaded.segments)
    assert data == kept + b"".join(after)
    assert loaded.log_end_offset == scan_batches(after[-1]).batches[0].next_offset
    report = loaded.last_recovery
    assert report is not None
    assert any(f"where segment {cut.base_offset} starts" in p for p in report.problems)
    loaded.close()


def _load_unclean(log: PartitionLog, recovery_point: int) -> PartitionLog:
    return PartitionLog.load(
        log.directory,
        TP,
        SMALL,
        now_ms=0,
        recovery_point=recovery_point,
        log_start_offset=0,
        high_watermark=0,
        clean_shutdown=False,
        handles=FileHandles(64),
    )


def test_loading_cuts_a_torn_tail_of_the_segment_before_the_first_it_scans(
    tmp_path: Path,
) -> None:
    """A deferred roll leaves its segment unsynced; a deferred truncation across segments
    at the checkpointed recovery point then cuts it in memory and makes the next segment
    there; a crash tears the old tail past the cut. Loading scans from that next segment
    on, and cuts the segment before it where the next begins -- torn bytes too (a header
    that does not parse, or a batch that runs past the end). Fails on the old code, which
    cut whole batches only (tools/sim/log_run.py, seed 51: "does not scan to its end")."""
    log, _ = _partition(tmp_path)
    log.close()
    left, after = log.segments[1], log.segments[2]
    kept = b"".join(s.log_path.read_bytes() for s in log.segments)
    torn = after.log_path.read_bytes()[:40]  # the first 40 bytes of a batch at its base
    with open(left.log_path, "ab") as f:
        f.write(torn)
    loaded = _load_unclean(log, after.base_offset)
    assert loaded.last_recovery is not None
    assert loaded.last_recovery.recovered_segments[0] == after.base_offset  # left unscanned
    assert b"".join(s.log_path.read_bytes() for s in loaded.segments) == kept
    assert loaded.segments[1].size == left.size
    assert any(
        f"where segment {after.base_offset} starts" in p for p in loaded.last_recovery.problems
    )
    loaded.close()


@pytest.mark.parametrize("where", ["at the tail", "below the gap"])
def test_loading_ends_the_log_where_a_scanned_segment_lost_its_tail(
    tmp_path: Path, where: str
) -> None:
    """A segment a deferred roll left unsynced may lose its tail at a batch boundary in a
    crash, which no scan sees, while the next segments' bytes reached the disk: the log
    would go on past a hole. Loading ends the log where a scanned segment ends at or above
    the recovery point below the next segment's base (those later segments are unsynced
    too, above it: a follower fetches them again). A gap the recovery point lies in is the
    log's own (an append past a gap rolled): kept. Fails on the old code ("at the tail":
    the loaded log went on past the hole; tools/sim/log_run.py, seed 97)."""
    log, _ = _partition(tmp_path)
    segment, following = log.segments[1], log.segments[2:]
    headers = segment.headers()
    log.close()
    last = headers[-1]
    os.truncate(segment.log_path, last.position)  # its last batch lost
    # At the tail: below the segment's new end. Below the gap: inside it (the log's own).
    assert last.base_offset < last.last_offset
    recovery_point = headers[-2].base_offset if where == "at the tail" else last.last_offset
    loaded = _load_unclean(log, recovery_point)
    report = loaded.last_recovery
    assert report is not None
    if where == "at the tail":
        assert loaded.log_end_offset == last.base_offset
        assert [s.base_offset for s in loaded.segments] == [s.base_offset for s in log.segments[:2]]
        assert report.deleted_segments == tuple(s.base_offset for s in following)
        assert any("a tail lost in the crash" in p for p in report.problems)
    else:
        assert [s.base_offset for s in loaded.segments] == [s.base_offset for s in log.segments]
        assert loaded.log_end_offset == log.log_end_offset
        assert report.deleted_segments == ()
    loaded.close()


def test_a_truncation_inside_the_active_segment_waits_on_no_fsync(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A divergent tail inside the active segment (the usual case) renames nothing: its disk
    work is all the durability thread's."""
    log, _ = _partition(tmp_path)
    later = _Later(log)
    log.flush()
    cut = log.active_segment.headers()[-2]
    synced = _fsyncs(monkeypatch)
    log.truncate_to(cut.base_offset)
    assert synced == []
    assert [what for what, _ in later.asked] == [f"truncation of {TP}"]
    assert log.log_end_offset == cut.base_offset


def test_a_truncation_below_the_checkpointed_recovery_point_is_durable_before_it_returns(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Below what a checkpoint file names, a lost truncation would come back claimed
    durable (tools/sim/log_run.py): that one still waits for its fsyncs."""
    log, _ = _partition(tmp_path)
    later = _Later(log)
    log.flush()
    log.recovery_point_checkpointed(log.recovery_point_to_checkpoint())
    active = log.active_segment
    cut = active.headers()[-2]
    synced = _fsyncs(monkeypatch)
    log.truncate_to(cut.base_offset)
    assert later.asked == []
    assert (str(active.log_path), cut.position) in synced
    assert list(log.directory.glob("*.deleted")) == []


def test_a_full_truncation_of_an_empty_log_leaves_its_fsyncs_to_disk_later(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The follower's StartAt of a partition it has fetched nothing into (thousands at a
    start): no fsync and no unlink on the event loop. The old segment is renamed, the new
    one made; the recovery point stays below the new start until the job's flush has
    synced the directory (the new segment's name). Fails on the old code (three fsyncs
    before it returned: the epoch file, its directory, the directory)."""
    log = PartitionLog.create(tmp_path / "orders-3", TP, SMALL, now_ms=0)
    later = _Later(log)
    old = log.active_segment
    synced = _fsyncs(monkeypatch)
    log.truncate_fully_and_start_at(10_000)
    assert synced == []
    assert (log.log_start_offset, log.log_end_offset, log.high_watermark) == (10_000,) * 3
    assert [s.base_offset for s in log.segments] == [10_000] and log.latest_epoch() is None
    assert [what for what, _ in later.asked] == [f"truncation of {TP}"]
    assert old.log_path.with_name(old.log_path.name + ".deleted").exists()
    assert log.recovery_point == 0
    # Appended and flushed before the job runs (a checkpoint's flush): the directory is
    # synced before the recovery point reaches the new start.
    _append_all(log, batch_stream(5, 3, first_offset=10_000))
    log.flush()
    names = [Path(path).name for path, _ in synced]
    assert log.directory.name in names
    assert log.recovery_point == log.log_end_offset > 10_000
    synced.clear()
    for job in later.jobs:
        job()
    assert next(Path(path).name for path, _ in synced) == log.directory.name
    assert list(log.directory.glob("*.deleted")) == []


def test_a_full_truncation_of_a_log_with_batches_is_durable_before_it_returns(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Batches (even all below the log start) or an epoch file to empty: a crash before a
    job could bring them back, so the old segments go and the directory is synced at once."""
    log, _ = _partition(tmp_path)
    later = _Later(log)
    log.maybe_increment_log_start_offset(log.log_end_offset)  # batches below the start
    later.jobs.clear()
    later.asked.clear()
    renamed_before = set(log.directory.glob("*.deleted"))  # the start move's, not run
    synced = _fsyncs(monkeypatch)
    log.truncate_fully_and_start_at(log.log_end_offset + 5)
    assert later.asked == []
    assert log.directory.name in [Path(path).name for path, _ in synced]
    assert set(log.directory.glob("*.deleted")) == renamed_before
    assert log.recovery_point == log.log_end_offset


def test_a_partitions_files_share_one_directory_str_and_names_are_interned(tmp_path: Path) -> None:
    """At 10,000 partitions every byte a partition keeps is 10 KB: its segments' file
    handles keep the partition directory's one str (no full path each, no Path), and the
    first segment's file names are the same objects in every partition."""
    handles = FileHandles(16)
    logs = [
        PartitionLog.create(
            tmp_path / f"orders-{p}", TopicPartition("orders", p), SMALL, now_ms=0, handles=handles
        )
        for p in (1, 2)
    ]
    files = []
    for log in logs:
        (segment,) = log.segments
        mine = list(segment.files)
        assert all(f._directory is log._directory for f in mine)
        assert log.directory == tmp_path / f"orders-{log.topic_partition.partition}"
        assert [f.path for f in mine] == [segment.log_path, segment.index_path,
                                          segment.time_index_path]  # fmt: skip
        files.append(mine)
    assert all(a._name is b._name for a, b in zip(*files, strict=True))
    for log in logs:
        log.close()
