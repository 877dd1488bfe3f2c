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
