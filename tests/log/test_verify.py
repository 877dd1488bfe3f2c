"""verify_data_dir: one line per partition, non-zero exit on any problem."""

from __future__ import annotations

import io
import struct
from pathlib import Path

from replicad.log.config import LogConfig
from replicad.log.manager import LogManager
from replicad.log.verify import PartitionReport, verify_data_dir
from replicad.records.batch import scan_batches
from replicad.types import TopicPartition
from tools.logdata.batches import batch_stream

CONFIG = LogConfig(segment_bytes=32 * 1024, index_interval_bytes=2048, segment_index_bytes=4096)


def _write(tmp_path: Path) -> None:
    manager = LogManager.open(tmp_path, CONFIG, now_ms=0)
    for i, tp in enumerate([TopicPartition("a", 0), TopicPartition("b", 1)]):
        log = manager.get_or_create(tp)
        for raw in batch_stream(i, 80, gap_every=25):
            log.append(raw, scan_batches(raw).batches, now_ms=0)
    manager.close()


def test_clean_directory_passes(tmp_path: Path) -> None:
    _write(tmp_path)
    out = io.StringIO()
    assert verify_data_dir(tmp_path, out) == 0
    lines = out.getvalue().splitlines()
    assert lines[0].startswith("a-0: ok (") and "3 gaps" in lines[0]
    assert lines[1].startswith("b-1: ok (")
    assert lines[-1] == "2 partitions, all ok"


def test_damage_is_found_and_named(tmp_path: Path) -> None:
    _write(tmp_path)
    segments = sorted((tmp_path / "a-0").glob("*.log"))
    data = bytearray(segments[1].read_bytes())
    data[200] ^= 0x10
    segments[1].write_bytes(bytes(data))
    index = sorted((tmp_path / "b-1").glob("*.index"))[0]
    entries = bytearray(index.read_bytes())
    struct.pack_into(">i", entries, 4, 12345)  # first entry now points into a batch
    index.write_bytes(bytes(entries))
    (tmp_path / "b-1" / "00000000000000000009.log.swap").write_bytes(b"x")
    out = io.StringIO()
    assert verify_data_dir(tmp_path, out) == 1
    text = out.getvalue()
    assert "a-0: FAILED" in text and "CRC32C mismatch" in text and segments[1].name in text
    assert "b-1: FAILED" in text and "is not a batch start" in text and "stray file" in text
    assert text.splitlines()[-1] == "2 partitions, problems found"


def test_malformed_checkpoint_fails(tmp_path: Path) -> None:
    _write(tmp_path)
    (tmp_path / "replication-offset-checkpoint").write_text("0\n5\n")
    out = io.StringIO()
    assert verify_data_dir(tmp_path, out) == 1
    assert "replication-offset-checkpoint: FAILED" in out.getvalue()


def test_the_report_counts_holes_as_gaps_and_returns_an_overlap() -> None:
    report = PartitionReport("a-0")
    assert report.advance(10, 20) is None  # the first span
    assert report.advance(20, 25) is None  # follows on
    assert report.advance(30, 31) is None and report.gaps == 1  # a hole: 25..29
    assert report.advance(28, 40) == 30  # overlaps the span that ended at 30
    assert (report.first_offset, report.next_offset, report.gaps) == (10, 40, 1)
