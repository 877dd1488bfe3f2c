"""tools/bench/archive.py: the replica it measures is what it says (the size asked for, in
closed segments, committed), so its upload and read rows cover every byte."""

from __future__ import annotations

from pathlib import Path

from replicad.log.config import LogConfig
from replicad.log.manager import LogManager
from tools.bench.archive import MB, TP, write_replica


def test_the_replica_is_the_size_asked_for_and_all_closed(tmp_path: Path) -> None:
    records = write_replica(tmp_path, total_bytes=2 * MB, segment_bytes=MB // 2, value_bytes=200)
    manager = LogManager.open(tmp_path, LogConfig(segment_bytes=MB // 2), now_ms=0)
    log = manager.partitions()[TP]
    assert log.size_in_bytes >= 2 * MB
    assert log.log_end_offset == records == log.high_watermark
    assert log.active_segment.is_empty and len(log.segments) >= 5
    manager.close()
