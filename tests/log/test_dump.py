"""dump_log over segments we wrote, and over damaged ones."""

from __future__ import annotations

import io
import re
from pathlib import Path

from replicad.log.config import LogConfig
from replicad.log.dump import dump_log
from replicad.log.manager import LogManager
from replicad.records.batch import scan_batches
from replicad.types import TopicPartition
from tools.logdata.batches import batch_stream, legacy_message_set

CONFIG = LogConfig(segment_bytes=32 * 1024, index_interval_bytes=2048, segment_index_bytes=4096)
TP = TopicPartition("dump", 0)


def _write(tmp_path: Path, batches: list[bytes]) -> Path:
    manager = LogManager.open(tmp_path, CONFIG, now_ms=0)
    log = manager.get_or_create(TP)
    for raw in batches:
        log.append(raw, scan_batches(raw).batches, now_ms=0)
    manager.close()
    return tmp_path / "dump-0"


def test_dump_segment_deep(tmp_path: Path) -> None:
    batches = [
        legacy_message_set(0, [b"old", b"older"], magic=1),
        *batch_stream(3, 10, first_offset=2),
    ]
    part = _write(tmp_path, batches)
    out = io.StringIO()
    assert dump_log(part / "00000000000000000000.log", deep=True, out=out) == 0
    text = out.getvalue()
    assert "Log starting offset: 0" in text
    assert text.count("isvalid: true") == sum(len(scan_batches(b).batches) for b in batches)
    records = re.findall(r"^\| offset: (\d+)", text, re.M)
    assert [int(r) for r in records] == list(range(len(records)))
    assert "compresscodec: zstd" in text and "magic: 1" in text
    assert "00000000000000000000.index: ok" in text


def test_dump_reports_crc_failure_and_trailing_bytes(tmp_path: Path) -> None:
    part = _write(tmp_path, batch_stream(4, 5))
    log_file = part / "00000000000000000000.log"
    data = bytearray(log_file.read_bytes())
    data[100] ^= 0xFF
    log_file.write_bytes(bytes(data) + b"\x00" * 10)
    out = io.StringIO()
    assert dump_log(log_file, deep=False, out=out) == 1
    text = out.getvalue()
    assert "isvalid: false" in text
    assert "Found 10 invalid bytes at the end" in text
    assert "PROBLEM" in text


def test_dump_index_file_and_directory(tmp_path: Path) -> None:
    part = _write(tmp_path, batch_stream(5, 60))
    out = io.StringIO()
    index = sorted(part.glob("*.index"))[0]
    assert dump_log(index, deep=False, out=out) == 0
    assert re.search(r"^offset: \d+ position: \d+$", out.getvalue(), re.M)
    out = io.StringIO()
    assert dump_log(part, deep=False, out=out) == 0
    assert out.getvalue().count("Dumping") == len(list(part.glob("*.log")))


def test_dump_of_a_directory_marks_a_truncations_tail_not_cut_yet(tmp_path: Path) -> None:
    """What a reader of the raw files sees in a deferred truncation's window (before the
    durability thread's job): the segment left keeps the removed batches in its file, and
    the new segment at the cut holds the batches appended since, from lower offsets. The dump
    marks the old ones as not in the log; after the job they are gone from the file. Fails on
    the old code (the removed batches were dumped as the log's, with no mark)."""
    manager = LogManager.open(tmp_path, CONFIG, now_ms=0)
    log = manager.get_or_create(TP)
    jobs: list = []
    log.disk_later = lambda job, what, key: jobs.append(job)
    for raw in batch_stream(5, 60):
        log.append(raw, scan_batches(raw).batches, now_ms=0)
    for job in jobs:
        job()  # the rolls' fsyncs
    jobs.clear()
    log.flush()
    left = log.segments[1]
    cut = left.headers()[2]
    log.truncate_to(cut.base_offset)  # across segments: the file of `left` is cut later
    after = batch_stream(6, 3, first_offset=cut.base_offset)
    for raw in after:
        log.append(raw, scan_batches(raw).batches, now_ms=0)
    out = io.StringIO()
    dump_log(log.directory, deep=False, out=out)  # the active segment's preallocated index:
    text = out.getvalue()  # zero entries, problems to the dump (as before)
    assert f"PROBLEM {left.log_path.stem}" not in text  # nothing of the segment left
    dumped = [int(o) for o in re.findall(r"^baseOffset: (\d+)", text, re.M)]
    back = next(i for i in range(1, len(dumped)) if dumped[i] <= dumped[i - 1])
    assert dumped[back] == cut.base_offset  # the new segment's first batch, after the old tail
    mark = f"Batches from position {cut.position} on hold offsets at or past {cut.base_offset}"
    assert mark in text and text.index(mark) < text.index(f"Dumping {log.active_segment.log_path}")
    for job in jobs:
        job()  # the truncation's: the directory fsynced, the file cut
    out = io.StringIO()
    dump_log(log.directory, deep=False, out=out)
    dumped = [int(o) for o in re.findall(r"^baseOffset: (\d+)", out.getvalue(), re.M)]
    assert dumped == sorted(set(dumped)) and "not in the log" not in out.getvalue()
    manager.close()
