"""tools/chaos/checkpoint_block.py, small: the measurement runs on the slow-disk shim and
reports every column of its table (docs/reliability.md has the 10,000-partition figures,
before and after). The figures themselves are the tool's to print: whether a checkpoint
leaves the loop free is asserted without a clock in tests/follower/test_durability.py."""

from __future__ import annotations

import argparse
from pathlib import Path

from tools.chaos.checkpoint_block import REPO, _run


def test_a_small_checkpoint_on_the_slow_disk_is_measured(tmp_path: Path) -> None:
    args = argparse.Namespace(partitions=60, sync_us=8000, write_us=100, idle_max_s=0.5)
    row = _run("this", REPO, args, tmp_path)
    # Three unsynced files per partition (.log, .index, .timeindex), each fsync delayed.
    assert row["delayed_calls"] >= 180
    for column in ("checkpoint_s", "longest_block_ms", "idle_block_ms", "longest_gc_ms"):
        assert float(row[column]) >= 0, (column, row)  # type: ignore[arg-type]
