"""tools/bench/measure.py: a child's wall and CPU time, peak RSS and progress marks."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from tools.bench.measure import (
    MIN_STEADY_S,
    Measured,
    burn_then_sleep,
    chunks_polled,
    cpu_seconds,
    read_marks,
    run_measured,
    tree_cpu_seconds,
)

# What these children take is printed by `python -m tools.bench.measure`, beside what they
# do; the tests assert what a busy machine cannot change.


def test_cpu_is_the_childs_own_and_wall_is_the_clock_from_start_to_exit():
    readings = iter([100.0])  # the start; every later reading is 107.5

    m = burn_then_sleep(0.3, 0.1, clock=lambda: next(readings, 107.5))
    assert m.wall_s == 7.5
    # CPU seconds from the child's rusage: at least what it burnt (a busy machine does not
    # shrink them; the parent, polling, burns far less).
    assert m.cpu_s >= 0.3
    assert m.peak_rss_mib > 1


def test_a_failing_child_raises():
    with pytest.raises(RuntimeError, match="status 3"):
        run_measured([sys.executable, "-c", "raise SystemExit(3)"])


def test_progress_polled_by_the_parent_marks_every_tenth_in_order(tmp_path: Path):
    m = chunks_polled(tmp_path / "out")
    assert sorted(m.marks) == list(range(10, 101, 10))
    assert list(m.marks.values()) == sorted(m.marks.values())
    # The steady window is the marks' own difference (when long enough to be a rate);
    # how close it comes to the child's 0.8 s is printed by `python -m tools.bench.measure`.
    window = m.marks[90] - m.marks[10]
    long_enough = window >= MIN_STEADY_S
    assert m.steady_s == (window if long_enough else None)
    # The child's CPU at each mark it was polled alive for, never going back.
    assert set(m.cpu_marks) <= set(m.marks)
    assert 10 in m.cpu_marks
    cpu = [m.cpu_marks[p] for p in sorted(m.cpu_marks)]
    assert cpu == sorted(cpu) and cpu[-1] <= m.cpu_s


def test_a_daemon_is_stopped_when_until_holds(tmp_path: Path):
    flag = tmp_path / "flag"
    # It would sleep for an hour: run_measured returns only because it stopped the child.
    code = f"import pathlib, time\npathlib.Path({str(flag)!r}).touch()\ntime.sleep(3600)"
    m = run_measured([sys.executable, "-c", code], until=flag.exists)
    assert flag.exists()
    assert m.peak_rss_mib > 1


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


# A parent that runs a CPU-bound grandchild to its end (reaped: counted in the parent's
# cutime), then starts a second that burns until killed (live: counted as a descendant).
_TREE = """
import subprocess, sys
burn = "import time\\nt = time.process_time()\\nwhile time.process_time() - t < 0.3: pass"
subprocess.run([sys.executable, "-c", burn], check=True)
live = subprocess.Popen([sys.executable, "-c", burn + "\\nprint(1, flush=True)\\ninput()"],
                        stdout=subprocess.PIPE, stdin=subprocess.PIPE)
live.stdout.readline()
print(live.pid, flush=True)
sys.stdin.readline()
"""


def test_tree_cpu_counts_reaped_and_live_descendants_the_process_alone_does_not():
    import subprocess

    parent = subprocess.Popen(
        [sys.executable, "-c", _TREE], stdout=subprocess.PIPE, stdin=subprocess.PIPE, text=True
    )
    try:
        assert parent.stdout is not None
        live = int(parent.stdout.readline())  # both grandchildren have burnt 0.3 CPU-s
        own_cpu = cpu_seconds(parent.pid)
        assert own_cpu is not None
        descendants_cpu = tree_cpu_seconds(parent.pid) - own_cpu
        live_cpu = tree_cpu_seconds(live)
        assert descendants_cpu >= 0.55  # both burnt 0.3 CPU-s, read in ticks of 10 ms
        assert live_cpu >= 0.28
    finally:
        parent.kill()
        parent.wait()


def test_cpu_seconds_are_the_process_own_user_and_system_time() -> None:
    """The table's daemon CPU seconds: /proc/<pid>/stat's utime + stime, as os.times gives
    them for this process (both read in clock ticks)."""
    sum(i * i for i in range(200_000))  # some CPU of our own to count
    before = sum(os.times()[:2])
    read = cpu_seconds(os.getpid())
    after = sum(os.times()[:2])
    tick = 1 / os.sysconf("SC_CLK_TCK")
    # timing-ok: two readings of one CPU counter compared, not how long anything took
    assert before - tick <= read <= after + tick
    assert read > 0
