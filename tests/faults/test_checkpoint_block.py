"""tools/chaos/checkpoint_block.py, small: the measurement runs on the slow-disk shim and
sees a checkpoint that does not hold the loop (docs/reliability.md has the 10,000-partition
figures, before and after)."""

from __future__ import annotations

import argparse
from pathlib import Path

from tools.chaos.checkpoint_block import REPO, _run


def test_a_small_checkpoint_on_the_slow_disk_is_measured_off_the_loop(tmp_path: Path) -> None:
    # Seconds of fsyncs, so that the bound below leaves room for a loaded machine's own
    # scheduling stalls (the tool's "same, no checkpoint" column: up to ~0.4 s seen here).
    args = argparse.Namespace(partitions=60, sync_us=8000, write_us=100, idle_max_s=0.5)
    row = _run("this", REPO, args, tmp_path)
    # Three unsynced files per partition (.log, .index, .timeindex), each fsync delayed.
    assert row["delayed_calls"] >= 180
    checkpoint_ms = float(row["checkpoint_s"]) * 1000  # type: ignore[arg-type]
    assert checkpoint_ms >= 180 * 8
    assert float(row["longest_block_ms"]) < checkpoint_ms / 3  # type: ignore[arg-type]
