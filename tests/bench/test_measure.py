"""tools/bench/measure.py: a child's wall and CPU time, peak RSS and progress marks."""

from __future__ import annotations

import sys
import time
from pathlib import Path

import pytest

from tools.bench.measure import Measured, read_marks, run_measured

# Burns about 0.3 s of CPU, then sleeps 0.6 s: CPU well under wall.
BURN_THEN_SLEEP = (
    "import time\n"
    "end = time.process_time() + 0.3\n"
    "while time.process_time() < end: pass\n"
    "time.sleep(0.6)\n"
)


def test_cpu_and_wall_are_the_childs_own():
    m = run_measured([sys.executable, "-c", BURN_THEN_SLEEP])
    assert 0.3 <= m.cpu_s < m.wall_s
    assert m.wall_s >= 0.9
    assert m.peak_rss_mib > 1


def test_a_failing_child_raises():
    with pytest.raises(RuntimeError, match="status 3"):
        run_measured([sys.executable, "-c", "raise SystemExit(3)"])


def test_progress_polled_by_the_parent_gives_steady_state(tmp_path: Path):
    # The child writes 10 chunks of a file, 0.1 s apart; the parent polls its size.
    out = tmp_path / "out"
    code = (
        f"import time\nf = open({str(out)!r}, 'wb', buffering=0)\n"
        "for _ in range(10):\n    f.write(b'x' * 100)\n    time.sleep(0.1)\n"
    )

    def progress() -> float:
        return out.stat().st_size / 1000 if out.exists() else 0.0

    m = run_measured([sys.executable, "-c", code], progress=progress)
    assert sorted(m.marks) == list(range(10, 101, 10))
    assert list(m.marks.values()) == sorted(m.marks.values())
    # 10% at the first write, 90% at the ninth: 8 sleeps of 0.1 s apart.
    assert m.steady_s is not None
    assert 0.7 <= m.steady_s <= 1.5


def test_a_daemon_is_stopped_when_until_holds(tmp_path: Path):
    flag = tmp_path / "flag"
    code = (
        f"import pathlib, time\ntime.sleep(0.3)\npathlib.Path({str(flag)!r}).touch()\n"
        "time.sleep(60)"
    )
    started = time.monotonic()
    m = run_measured([sys.executable, "-c", code], until=flag.exists)
    assert time.monotonic() - started < 30
    assert 0.3 <= m.wall_s < 30


def test_marks_written_by_the_child_are_relative_to_the_start(tmp_path: Path):
    marks = tmp_path / "marks"
    marks.write_text("10 101.5\n90 103.5\n")
    got = read_marks(marks, started=100.0)
    assert got == {10: 1.5, 90: 3.5}
    assert Measured(4.0, 1.0, 10.0, got).steady_s == 2.0
    assert Measured(4.0, 1.0, 10.0, {10: 1.0}).steady_s is None


def test_a_window_too_short_to_time_has_no_steady_rate():
    # One poll() that returned the whole topic: 10% and 90% in the same instant.
    assert Measured(1.0, 0.5, 10.0, {10: 0.5, 90: 0.5 + 1e-6}).steady_s is None
    assert Measured(1.0, 0.5, 10.0, {10: 0.2, 90: 0.8}).steady_s == pytest.approx(0.6)
