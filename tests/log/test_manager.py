"""The data directory: lock, checkpoints, clean and unclean restarts, recovery from damage."""

from __future__ import annotations

import os
import uuid
from pathlib import Path

import pytest

from replicad.errors import LogDirLockedError
from replicad.log.config import LogConfig
from replicad.log.layout import (
    CLEAN_SHUTDOWN_FILE,
    LEADER_EPOCH_CHECKPOINT,
    LOG_START_OFFSET_CHECKPOINT,
    RECOVERY_POINT_CHECKPOINT,
    REPLICATION_OFFSET_CHECKPOINT,
)
from replicad.log.manager import LogManager
from replicad.records.batch import scan_batches
from replicad.types import TopicPartition
from tools.logdata.batches import batch_stream

CONFIG = LogConfig(segment_bytes=16 * 1024, index_interval_bytes=1024, segment_index_bytes=2048)
A = TopicPartition("orders", 0)
B = TopicPartition("pay-ments.v2", 11)


def _fill(manager: LogManager, tp: TopicPartition, batches: list[bytes]) -> None:
    log = manager.get_or_create(tp)
    for raw in batches:
        log.append(raw, scan_batches(raw).batches, now_ms=0)


def _dir_bytes(data_dir: Path, tp: TopicPartition) -> bytes:
    d = data_dir / f"{tp.topic}-{tp.partition}"
    return b"".join(p.read_bytes() for p in sorted(d.glob("*.log")))


@pytest.fixture
def filled(tmp_path: Path) -> tuple[Path, dict[TopicPartition, list[bytes]]]:
    streams = {A: batch_stream(1, 100), B: batch_stream(2, 40)}
    manager = LogManager.open(tmp_path, CONFIG, now_ms=0)
    for tp, batches in streams.items():
        _fill(manager, tp, batches)
    manager.checkpoint({A: 50, B: 10**9})
    manager.close()
    return tmp_path, streams


def _crashed(data_dir: Path) -> None:
    """What a kill leaves: no clean-shutdown marker."""
    (data_dir / CLEAN_SHUTDOWN_FILE).unlink()


def test_second_open_is_refused_with_a_clear_error(tmp_path: Path) -> None:
    manager = LogManager.open(tmp_path, CONFIG, now_ms=0)
    with pytest.raises(LogDirLockedError, match=rf"{tmp_path}.*pid {os.getpid()}"):
        LogManager.open(tmp_path, CONFIG, now_ms=0)
    manager.close()
    LogManager.open(tmp_path, CONFIG, now_ms=0).close()


def test_checkpoint_files_and_clean_reopen(filled: tuple[Path, dict]) -> None:
    data_dir, streams = filled
    leo_a = scan_batches(streams[A][-1]).batches[0].next_offset
    assert (data_dir / RECOVERY_POINT_CHECKPOINT).read_text().splitlines()[2:] == [
        f"orders 0 {leo_a}",
        f"pay-ments.v2 11 {scan_batches(streams[B][-1]).batches[0].next_offset}",
    ]
    hw_lines = (data_dir / REPLICATION_OFFSET_CHECKPOINT).read_text().splitlines()
    assert hw_lines[2] == "orders 0 50"  # high watermark as given
    assert hw_lines[3].startswith("pay-ments.v2 11 ")  # clamped to the log end
    assert (data_dir / LOG_START_OFFSET_CHECKPOINT).exists()
    manager = LogManager.open(data_dir, CONFIG, now_ms=0)
    assert not (data_dir / CLEAN_SHUTDOWN_FILE).exists()
    parts = manager.partitions()
    assert parts[A].log_end_offset == leo_a and parts[A].high_watermark == 50
    assert all(r.recovered_segments == () and r.clean for r in manager.recoveries)
    for tp, batches in streams.items():
        assert _dir_bytes(data_dir, tp) == b"".join(batches)
    manager.close()


def test_unclean_restart_scans_from_the_recovery_point(filled: tuple[Path, dict]) -> None:
    data_dir, _ = filled
    _crashed(data_dir)
    manager = LogManager.open(data_dir, CONFIG, now_ms=0)
    report = next(r for r in manager.recoveries if r.topic_partition == A)
    segments = manager.partitions()[A].segments
    assert report.recovered_segments == (segments[-1].base_offset,)
    assert report.clean
    manager.close()


def test_torn_tail_is_truncated_and_reported(filled: tuple[Path, dict]) -> None:
    data_dir, streams = filled
    _crashed(data_dir)
    last_log = sorted((data_dir / "orders-0").glob("*.log"))[-1]
    with open(last_log, "ab") as f:
        f.write(batch_stream(9, 1, first_offset=10**6)[0][:-7])  # a torn batch
    manager = LogManager.open(data_dir, CONFIG, now_ms=0)
    report = next(r for r in manager.recoveries if r.topic_partition == A)
    assert report.truncated_bytes > 0 and "torn batch" in report.problems[0]
    assert _dir_bytes(data_dir, A) == b"".join(streams[A])
    manager.close()


def test_zeroed_tail_is_truncated(filled: tuple[Path, dict]) -> None:
    data_dir, streams = filled
    _crashed(data_dir)
    last_log = sorted((data_dir / "orders-0").glob("*.log"))[-1]
    with open(last_log, "ab") as f:
        f.write(bytes(8192))  # blocks allocated, data never written (power loss)
    manager = LogManager.open(data_dir, CONFIG, now_ms=0)
    report = next(r for r in manager.recoveries if r.topic_partition == A)
    assert report.truncated_bytes == 8192
    assert _dir_bytes(data_dir, A) == b"".join(streams[A])
    manager.close()


def test_flipped_byte_mid_log_truncates_there_and_drops_later_segments(
    filled: tuple[Path, dict],
) -> None:
    data_dir, streams = filled
    _crashed(data_dir)
    (data_dir / RECOVERY_POINT_CHECKPOINT).unlink()  # nothing known flushed: scan everything
    logs = sorted((data_dir / "orders-0").glob("*.log"))
    victim = logs[1]
    data = victim.read_bytes()
    headers = scan_batches(data).batches
    bad = headers[len(headers) // 2]
    with open(victim, "r+b") as f:
        f.seek(bad.position + 80)
        f.write(bytes([data[bad.position + 80] ^ 0x01]))
    manager = LogManager.open(data_dir, CONFIG, now_ms=0)
    report = next(r for r in manager.recoveries if r.topic_partition == A)
    assert "CRC32C mismatch" in " ".join(report.problems)
    assert report.deleted_segments == tuple(int(p.name[:20]) for p in logs[2:])
    kept = _dir_bytes(data_dir, A)
    assert b"".join(streams[A]).startswith(kept)
    assert len(kept) == len(logs[0].read_bytes()) + bad.position
    part = manager.partitions()[A]
    assert part.log_end_offset == bad.base_offset
    # The epoch cache does not name offsets that are gone.
    assert all(e.start_offset < part.log_end_offset for e in part.epoch_entries())
    manager.close()


def test_deleted_index_is_rebuilt_identically(filled: tuple[Path, dict]) -> None:
    data_dir, _ = filled
    index = sorted((data_dir / "orders-0").glob("*.index"))[1]
    timeindex = index.with_suffix(".timeindex")
    before = (index.read_bytes(), timeindex.read_bytes())
    index.unlink()
    timeindex.unlink()
    manager = LogManager.open(data_dir, CONFIG, now_ms=0)  # even after a clean shutdown
    report = next(r for r in manager.recoveries if r.topic_partition == A)
    assert report.rebuilt_indexes == (int(index.name[:20]),)
    assert "missing" in report.problems[0]
    assert (index.read_bytes(), timeindex.read_bytes()) == before
    manager.close()


def test_stray_files_are_removed(filled: tuple[Path, dict]) -> None:
    data_dir, _ = filled
    part_dir = data_dir / "orders-0"
    strays = [
        "00000000000000000007.log.swap",
        "00000000000000000000.log.deleted",
        "00000000000000000000.index.cleaned",
        "leader-epoch-checkpoint.tmp",
    ]
    for name in strays:
        (part_dir / name).write_bytes(b"junk")
    (data_dir / "replication-offset-checkpoint.tmp").write_text("junk")
    manager = LogManager.open(data_dir, CONFIG, now_ms=0)
    report = next(r for r in manager.recoveries if r.topic_partition == A)
    assert sorted(report.removed_files) == sorted(strays)
    assert not any((part_dir / n).exists() for n in strays)
    assert not (data_dir / "replication-offset-checkpoint.tmp").exists()
    manager.close()


def test_malformed_checkpoints_cost_time_not_data(filled: tuple[Path, dict]) -> None:
    data_dir, streams = filled
    (data_dir / RECOVERY_POINT_CHECKPOINT).write_text("0\n3\norders 0 5\n")
    (data_dir / REPLICATION_OFFSET_CHECKPOINT).write_text("garbage")
    (data_dir / "orders-0" / LEADER_EPOCH_CHECKPOINT).write_text("0\n1\nnot numbers\n")
    manager = LogManager.open(data_dir, CONFIG, now_ms=0)
    assert len(manager.checkpoint_problems) == 2
    assert "expected 3 entries" in manager.checkpoint_problems[0]
    part = manager.partitions()[A]
    report = part.last_recovery
    assert report is not None and len(report.recovered_segments) == len(part.segments)
    assert part.latest_epoch() == 1  # rebuilt from the batches (epoch_every=50)
    assert _dir_bytes(data_dir, A) == b"".join(streams[A])
    manager.close()


def test_topic_id_and_remove(tmp_path: Path) -> None:
    manager = LogManager.open(tmp_path, CONFIG, now_ms=0)
    topic_id = uuid.uuid4()
    manager.get_or_create(A, topic_id=topic_id)
    manager.close()
    manager = LogManager.open(tmp_path, CONFIG, now_ms=0)
    assert manager.partitions()[A].topic_id == topic_id
    manager.remove(A)
    assert not (tmp_path / "orders-0").exists()
    manager.close()
