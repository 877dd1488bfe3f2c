"""log/nowait.py: inside `not_waiting()` the log's reads take bytes from the page cache or
raise WouldWait; outside it (and on other threads) they are os.pread."""

from __future__ import annotations

import errno
import os
import threading
from pathlib import Path

import pytest

from replicad.log import nowait
from replicad.log.config import LogConfig
from replicad.log.nowait import WouldWait, not_waiting, pread, pread_cached, waiting_allowed
from replicad.log.partition import PartitionLog
from replicad.records.batch import scan_batches
from replicad.types import TopicPartition
from tests.page_cache import cached, dropped
from tools.logdata.batches import batch_stream

TP = TopicPartition("orders", 3)
SMALL = LogConfig(segment_bytes=16 * 1024, index_interval_bytes=1024, segment_index_bytes=2048)


def written(path: Path, data: bytes) -> Path:
    path.write_bytes(data)
    return path


def test_outside_the_block_pread_reads_what_is_not_cached(tmp_path: Path) -> None:
    data = os.urandom(3 * 4096)
    path = written(tmp_path / "f", data)
    dropped(path)
    fd = os.open(path, os.O_RDONLY)
    try:
        assert waiting_allowed()
        assert pread(fd, 100, 5000) == data[5000:5100]
        assert pread(fd, 100, len(data) - 10) == data[-10:]  # a short read is os.pread's
    finally:
        os.close(fd)


def test_inside_the_block_cached_bytes_are_read(tmp_path: Path) -> None:
    data = os.urandom(3 * 4096)
    path = written(tmp_path / "f", data)
    cached(path)
    fd = os.open(path, os.O_RDONLY)
    try:
        with not_waiting():
            assert not waiting_allowed()
            assert pread(fd, 100, 5000) == data[5000:5100]
        assert waiting_allowed()
    finally:
        os.close(fd)


def test_inside_the_block_bytes_not_cached_would_wait(tmp_path: Path) -> None:
    """On ext4 the dropped page answers EAGAIN; on tmpfs (nothing dropped) RWF_NOWAIT is
    refused (EOPNOTSUPP): WouldWait both, never an OSError a caller would take for a
    failing disk. The block ends with the exception."""
    path = written(tmp_path / "f", os.urandom(3 * 4096))
    dropped(path)
    fd = os.open(path, os.O_RDONLY)
    try:
        with pytest.raises(WouldWait), not_waiting():
            pread(fd, 100, 5000)
        assert waiting_allowed()
        assert not issubclass(WouldWait, OSError)
    finally:
        os.close(fd)


def test_a_short_read_would_wait(tmp_path: Path) -> None:
    """RWF_NOWAIT stops where the cached bytes do: fewer bytes than asked are not an end of
    file to the caller (a read where waiting is allowed finds out)."""
    data = os.urandom(4096)
    path = written(tmp_path / "f", data)
    cached(path)
    fd = os.open(path, os.O_RDONLY)
    try:
        with pytest.raises(WouldWait, match="10 of 100 bytes"):
            pread_cached(fd, 100, len(data) - 10)
    finally:
        os.close(fd)


def test_without_rwf_nowait_every_read_in_the_block_would_wait(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A platform without the flag: the caller reads where it may wait, as before."""
    path = written(tmp_path / "f", os.urandom(4096))
    monkeypatch.setattr(nowait, "RWF_NOWAIT", 0)
    fd = os.open(path, os.O_RDONLY)
    try:
        with pytest.raises(WouldWait, match="no RWF_NOWAIT") as raised, not_waiting():
            pread(fd, 10, 0)
        assert raised.value.cannot_tell
    finally:
        os.close(fd)


@pytest.mark.parametrize(
    ("code", "would_wait", "cannot_tell"),
    [(errno.EAGAIN, True, False), (errno.EOPNOTSUPP, True, True), (errno.EIO, False, False)],
)
def test_only_not_cached_and_not_supported_would_wait(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, code: int, would_wait: bool, cannot_tell: bool
) -> None:
    """A failing disk (EIO) stays an OSError: serve answers KAFKA_STORAGE_ERROR for it. A
    file system that refuses the flag (tmpfs) cannot tell: a caller may read there as before
    (serve's transaction fold does: reading it ahead on a worker would not help)."""
    path = written(tmp_path / "f", os.urandom(4096))

    def preadv(fd: int, buffers: object, position: int, flags: int = 0) -> int:
        assert flags == nowait.RWF_NOWAIT
        raise OSError(code, os.strerror(code))

    monkeypatch.setattr(nowait, "RWF_NOWAIT", 8)  # whatever the platform has
    monkeypatch.setattr(os, "preadv", preadv)
    fd = os.open(path, os.O_RDONLY)
    try:
        with pytest.raises(WouldWait if would_wait else OSError) as raised:
            pread_cached(fd, 10, 0)
        assert isinstance(raised.value, OSError) is not would_wait
        assert getattr(raised.value, "cannot_tell", False) is cannot_tell
    finally:
        os.close(fd)


def test_the_block_is_the_threads_own(tmp_path: Path) -> None:
    """Another thread (a worker reading for serve, the follower) reads as ever meanwhile."""
    data = os.urandom(3 * 4096)
    path = written(tmp_path / "f", data)
    dropped(path)
    got: list[bytes] = []
    fd = os.open(path, os.O_RDONLY)
    try:
        with not_waiting():
            other = threading.Thread(target=lambda: got.append(pread(fd, 100, 5000)))
            other.start()
            other.join()
    finally:
        os.close(fd)
    assert got == [data[5000:5100]]


# -- the partition's read ----------------------------------------------------------------------


def _partition(tmp_path: Path) -> PartitionLog:
    log = PartitionLog.create(tmp_path / "orders-3", TP, SMALL, now_ms=0)
    for raw in batch_stream(11, 60, epoch_every=40):
        log.append(raw, scan_batches(raw).batches, now_ms=0)
    return log


def test_a_partition_read_of_cached_headers_finds_its_region(tmp_path: Path) -> None:
    log = _partition(tmp_path)
    try:
        segment = log.segments[1]
        cached(segment.log_path)
        offset = segment.base_offset + 1
        expected = log.read(offset, 100).region
        with not_waiting():
            assert log.read(offset, 100).region == expected
    finally:
        log.close()


def test_a_partition_read_of_a_header_not_cached_would_wait_and_is_not_read_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Not a race with a writer: not read again under the partition lock (that read would
    wait the same way, with the lock held against appends)."""
    log = _partition(tmp_path)
    try:
        segment = log.segments[1]
        dropped(segment.log_path)
        locked: list[int] = []
        real = PartitionLog._read_locked

        def read_locked(plog: PartitionLog, offset: int, max_bytes: int) -> object:
            locked.append(offset)
            return real(plog, offset, max_bytes)

        monkeypatch.setattr(PartitionLog, "_read_locked", read_locked)
        with pytest.raises(WouldWait), not_waiting():
            log.read(segment.base_offset + 1, 100)
        assert locked == []
        assert log.read(segment.base_offset + 1, 100).region is not None  # waiting allowed
    finally:
        log.close()


def test_a_partition_read_of_a_segment_whose_index_is_not_loaded_would_wait(
    tmp_path: Path,
) -> None:
    """After a start a segment's offset index is loaded by its first read, which reads the
    index file: that read would wait; the reads after it do not."""
    log = _partition(tmp_path)
    end = log.log_end_offset
    log.close()
    loaded = PartitionLog.load(
        log.directory,
        TP,
        SMALL,
        now_ms=0,
        recovery_point=end,
        log_start_offset=0,
        high_watermark=end,
        clean_shutdown=True,
    )
    try:
        segment = loaded.segments[0]
        assert not segment.offset_index_loaded
        with pytest.raises(WouldWait, match="offset index is not loaded"), not_waiting():
            loaded.read(1, 100)
        assert not segment.offset_index_loaded
        expected = loaded.read(1, 100).region
        assert segment.offset_index_loaded
        cached(segment.log_path)
        with not_waiting():
            assert loaded.read(1, 100).region == expected
    finally:
        loaded.close()


def test_all_cached_answers_for_each_range_on_every_thread(tmp_path: Path) -> None:
    """cachestat's arguments are made once per thread and reused: each call answers for its
    own file and range, whichever thread asked before it."""
    if not nowait.can_tell_cached():
        pytest.skip("no cachestat here: all_cached cannot tell")
    warm = written(tmp_path / "warm", os.urandom(8 * 4096))
    cold = written(tmp_path / "cold", os.urandom(8 * 4096))
    cached(warm)
    dropped(cold)
    answers: dict[str, list[bool]] = {}

    def ask(name: str) -> None:
        seen = []
        for path in (warm, cold, warm):
            fd = os.open(path, os.O_RDONLY)
            try:
                seen.append(nowait.all_cached(fd, 4096, 3 * 4096))
            finally:
                os.close(fd)
        answers[name] = seen

    ask("main")
    if answers["main"][1]:
        pytest.skip(f"pages not dropped on {tmp_path} (tmpfs)")
    other = threading.Thread(target=ask, args=("thread",))
    other.start()
    other.join()
    assert answers == {"main": [True, False, True], "thread": [True, False, True]}
