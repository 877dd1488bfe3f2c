"""A log writer SIGKILLed 80 times at seeded random points; every recovery must keep a valid
prefix.

The driver and the writer are tools/logdata/crash.py; the long runs are its own
(`python -m tools.logdata --cycles 5000 --dir /tmp/crash`). Each kill costs a writer
process's start (about a quarter of a second), so the suite runs 80, not the 200 it ran
until 2026-11-26.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tools.logdata.crash import run

pytestmark = pytest.mark.slow

KILLS = 80
SEED = 20261122


def test_kill_nine_never_loses_checkpointed_data_nor_keeps_torn_batches(tmp_path: Path) -> None:
    report = run(tmp_path, seed=SEED, cycles=KILLS, max_delay_s=0.12)
    assert report.violations == []
    assert report.kills == KILLS
    # The kills hit writers that had written: recovery had segments to scan.
    assert report.recovered_segments >= KILLS // 2
