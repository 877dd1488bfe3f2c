"""One segment on disk: append, read, truncate, recover, rebuild."""

from __future__ import annotations

import errno
import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from replicad.log.config import LogConfig
from replicad.log.index import TimestampOffset
from replicad.log.segment import LogSegment
from replicad.records.batch import TimestampType, scan_batches
from replicad.records.records import Record, decode_batch
from tools.logdata.batches import batch_stream, log_append_time, producer_batch

CONFIG = LogConfig(index_interval_bytes=1024, segment_index_bytes=4096)
# The segments each test made, closed after it (see _no_descriptor_left).
_MADE: list[LogSegment] = []


def _descriptors_into(directory: Path) -> list[str]:
    """This process's open descriptors of files under `directory`."""
    found = []
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue  # closed meanwhile (the listing's own descriptor)
        if target.startswith(f"{directory}/"):
            found.append(target)
    return found


@pytest.fixture(autouse=True)
def _no_descriptor_left(tmp_path: Path) -> Iterator[None]:
    """Every segment a test made is closed after it, and no descriptor of its files stays
    open (the file left about 33 open, one set for each segment it made)."""
    yield
    made = list(_MADE)
    _MADE.clear()
    for segment in made:
        segment.close()
    assert _descriptors_into(tmp_path) == []


def _create(tmp_path: Path) -> LogSegment:
    segment = LogSegment.create(tmp_path, 0, CONFIG, now_ms=0)
    _MADE.append(segment)
    return segment


def _filled(tmp_path: Path, count: int = 60, seed: int = 7) -> tuple[LogSegment, bytes]:
    data = b"".join(batch_stream(seed, count))
    segment = _create(tmp_path)
    headers = scan_batches(data).batches
    # In several appends of varying size, as a follower's fetches would come.
    i = 0
    step = 1
    while i < len(headers):
        chunk = headers[i : i + step]
        segment.append(memoryview(data)[chunk[0].position : chunk[-1].end_position], chunk)
        i += step
        step = step % 5 + 1
    return segment, data


def test_append_writes_bytes_unchanged_and_indexes_batches(tmp_path: Path) -> None:
    segment, data = _filled(tmp_path)
    assert segment.log_path.read_bytes() == data
    headers = scan_batches(data).batches
    assert segment.next_offset == headers[-1].next_offset
    index = segment.offset_index
    assert index.entries > 5
    for slot in range(index.entries):
        entry = index.entry_at(slot)
        batch = next(h for h in headers if h.position == entry.position)
        assert batch.last_offset == entry.offset


def test_rebuilt_indexes_equal_the_appended_ones(tmp_path: Path) -> None:
    segment, _ = _filled(tmp_path)
    segment.on_become_inactive()
    written = (segment.index_path.read_bytes(), segment.time_index_path.read_bytes())
    segment.recover(None)
    segment.on_become_inactive()
    assert (segment.index_path.read_bytes(), segment.time_index_path.read_bytes()) == written


def test_translate_and_read_every_offset(tmp_path: Path) -> None:
    segment, data = _filled(tmp_path, count=30)
    headers = scan_batches(data).batches
    for h in headers:
        for offset in (h.base_offset, h.last_offset):
            location = segment.translate_offset(offset)
            assert location is not None and location.header.position == h.position
    assert segment.translate_offset(headers[-1].next_offset) is None
    region = segment.read(headers[3].base_offset + 1, max_bytes=1)
    assert region is not None
    # KIP-74: the first batch comes whole even when it is larger than max_bytes.
    assert (region.position, region.size) == (headers[3].position, headers[3].size)
    region = segment.read(headers[3].base_offset, max_bytes=10**9)
    assert region is not None and region.read_bytes() == data[headers[3].position :]


def _records(data: bytes) -> list[Record]:
    """Every record of `data` in file order, decoded independently of the segment."""
    return [r for h in scan_batches(data).batches for r in decode_batch(data, h).records]


def _first_record_at_or_after(
    records: list[Record], timestamp: int, starting_offset: int = 0
) -> TimestampOffset | None:
    for r in records:
        if r.timestamp >= timestamp and r.offset >= starting_offset:
            return TimestampOffset(r.timestamp, r.offset)
    return None


def test_find_offset_by_timestamp_answers_the_first_record_not_its_batch(tmp_path: Path) -> None:
    segment, data = _filled(tmp_path)
    records = _records(data)
    headers = scan_batches(data).batches
    # Records inside a batch: a batch reaching the target may start with older records.
    inside = [r for h in headers[5:] if h.record_count > 2 for r in decode_batch(data, h).records]
    assert inside[1].offset > headers[5].base_offset
    targets = {r.timestamp for r in records[::7]} | {r.timestamp for r in inside[1:40]}
    targets |= {records[0].timestamp - 1, min(r.timestamp for r in records)}
    mid_batch = 0
    for target in sorted(targets):
        found = segment.find_offset_by_timestamp(target)
        assert found == _first_record_at_or_after(records, target), target
        assert found is not None
        mid_batch += not any(h.base_offset == found.offset for h in headers)
    assert mid_batch > 10  # the case the batch-level answer got wrong
    assert segment.find_offset_by_timestamp(max(r.timestamp for r in records) + 1) is None


def test_find_offset_by_timestamp_skips_records_below_the_starting_offset(tmp_path: Path) -> None:
    segment, data = _filled(tmp_path)
    records = _records(data)
    for start_record in (records[3], records[len(records) // 2], records[-2]):
        start = start_record.offset
        for target in (records[0].timestamp, start_record.timestamp - 100, start_record.timestamp):
            found = segment.find_offset_by_timestamp(target, start)
            assert found == _first_record_at_or_after(records, target, start), (start, target)
            assert found is not None and found.offset >= start


def test_find_offset_by_timestamp_in_log_append_time_batches(tmp_path: Path) -> None:
    ts = 1_700_000_000_000
    values = [b"v"] * 5
    raw = [
        producer_batch(0, values, timestamp_ms=ts),
        # Created at ts + 10.., appended at ts + 5000: every record's timestamp is ts + 5000.
        log_append_time(producer_batch(5, values, timestamp_ms=ts + 10), ts + 5000),
        producer_batch(10, values, timestamp_ms=ts + 6000),
    ]
    data = b"".join(raw)
    headers = scan_batches(data).batches
    assert headers[1].timestamp_type == TimestampType.LOG_APPEND_TIME
    segment = _create(tmp_path)
    segment.append(memoryview(data), headers)
    # The create times inside the batch (ts + 10..14) do not count: ts + 12 lands on offset 5.
    assert segment.find_offset_by_timestamp(ts + 12) == TimestampOffset(ts + 5000, 5)
    assert segment.find_offset_by_timestamp(ts + 5000) == TimestampOffset(ts + 5000, 5)
    assert segment.find_offset_by_timestamp(ts + 5000, 7) == TimestampOffset(ts + 5000, 7)
    assert segment.find_offset_by_timestamp(ts + 5001) == TimestampOffset(ts + 6000, 10)
    assert segment.find_offset_by_timestamp(ts + 3) == TimestampOffset(ts + 3, 3)


def test_truncate_removes_whole_batches(tmp_path: Path) -> None:
    segment, data = _filled(tmp_path)
    headers = scan_batches(data).batches
    victim = next(h for h in headers[10:] if h.last_offset > h.base_offset)
    result = segment.truncate_to(victim.base_offset + 1)
    assert result.first_removed_offset == victim.base_offset
    assert segment.size == victim.position
    assert segment.next_offset == victim.base_offset
    assert segment.log_path.read_bytes() == data[: victim.position]
    assert all(
        segment.offset_index.entry_at(s).position < victim.position
        for s in range(segment.offset_index.entries)
    )
    assert segment.translate_offset(victim.base_offset) is None


@pytest.mark.parametrize("damage", ["torn", "zeros", "flip"])
def test_recover_truncates_at_first_invalid_batch(tmp_path: Path, damage: str) -> None:
    segment, data = _filled(tmp_path)
    headers = scan_batches(data).batches
    bad = headers[25]
    fd = os.open(segment.log_path, os.O_RDWR)
    if damage == "torn":
        os.ftruncate(fd, bad.position + bad.size // 2)
        keep = bad.position
    elif damage == "zeros":
        os.pwrite(fd, bytes(4096), len(data))
        keep = len(data)
    else:
        os.pwrite(fd, bytes([data[bad.position + 70] ^ 0x40]), bad.position + 70)
        keep = bad.position
    os.close(fd)
    segment.size = os.path.getsize(segment.log_path)
    result = segment.recover(None)
    assert result.valid_bytes == keep
    assert result.problem is not None
    assert segment.log_path.read_bytes() == data[:keep]
    assert segment.next_offset == (headers[-1] if damage == "zeros" else headers[24]).next_offset


def test_failed_write_leaves_only_whole_batches(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    segment, data = _filled(tmp_path, count=10)
    extra = b"".join(batch_stream(8, 3, first_offset=segment.next_offset))
    headers = scan_batches(extra).batches
    real_pwrite = os.pwrite

    def half_then_enospc(fd: int, buf: bytes, pos: int) -> int:
        if len(buf) > 100:
            return real_pwrite(fd, bytes(buf)[: len(buf) // 2], pos)
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "pwrite", half_then_enospc)
    with pytest.raises(OSError):
        segment.append(memoryview(extra), headers)
    monkeypatch.undo()
    assert segment.log_path.read_bytes() == data
    segment.append(memoryview(extra), headers)
    assert segment.log_path.read_bytes() == data + extra
