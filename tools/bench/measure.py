"""Measure one child process: wall time, CPU time and peak RSS from the kernel, and the
moments it passed each tenth of its work (for a steady-state rate that leaves start-up
and the last stragglers out).

Progress comes either from the parent polling the child's output (bytes on disk, for
replicad, kcat and the socket-to-file copy) or from the child itself (a marks file of
`<percent> <time.monotonic()>` lines, for the Python consumers: nothing outside them
counts records). CLOCK_MONOTONIC is one clock for every process of the machine, so the
child's marks and the parent's start time compare.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

POLL_S = 0.02
MARK_PERCENTS = tuple(range(10, 101, 10))
STEADY_FROM, STEADY_TO = 10, 90
# A steady window shorter than this is not a rate: a consumer that hands back a whole
# small topic in one poll() passes 10% and 90% in the same microsecond.
MIN_STEADY_S = 0.25


@dataclass(frozen=True, slots=True)
class Measured:
    """One run of a child process."""

    wall_s: float
    cpu_s: float
    peak_rss_mib: float
    # percent of the work -> seconds since the start, for the tenths that were seen
    marks: Mapping[int, float] = field(default_factory=dict)

    @property
    def steady_s(self) -> float | None:
        """Seconds between 10% and 90% of the work, if both were seen and far enough
        apart to measure a rate (MIN_STEADY_S)."""
        if STEADY_FROM in self.marks and STEADY_TO in self.marks:
            window = self.marks[STEADY_TO] - self.marks[STEADY_FROM]
            return window if window >= MIN_STEADY_S else None
        return None


def hwm_mib(pid: int) -> float | None:
    """The process's own peak RSS (VmHWM); it restarts at exec, unlike ru_maxrss, which
    also counts the forked parent's pages before exec."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    except OSError:
        return None
    return None


def read_marks(path: Path, started: float) -> dict[int, float]:
    """A marks file written by the child: percent -> seconds since `started`."""
    marks: dict[int, float] = {}
    if path.exists():
        for line in path.read_text().splitlines():
            percent, at = line.split()
            marks[int(percent)] = float(at) - started
    return marks


def run_measured(
    argv: list[str],
    *,
    until: Callable[[], bool] | None = None,
    progress: Callable[[], float] | None = None,
    marks_file: Path | None = None,
    env: Mapping[str, str] | None = None,
    stdout: IO[bytes] | None = None,
) -> Measured:
    """Run a child to its end and measure it.

    `until`: the child is a daemon, SIGTERMed once this holds (its wall time ends there).
    Otherwise it must exit 0. `progress()` (0..1, polled) or the child's own `marks_file`
    give the moments each tenth of the work was done.
    """
    started = time.monotonic()
    proc = subprocess.Popen(
        argv,
        env={**os.environ, **(env or {})},
        stdout=stdout or subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    peak = 0.0
    elapsed = None
    marks: dict[int, float] = {}
    pending = list(MARK_PERCENTS)
    while True:
        # wait4, not Popen.poll: poll would reap the child and lose its rusage.
        pid, status, usage = os.wait4(proc.pid, os.WNOHANG)
        if pid:
            break
        now = time.monotonic()
        if progress is not None and pending:
            done = progress()
            while pending and done * 100 >= pending[0]:
                marks[pending.pop(0)] = now - started
        peak = max(peak, hwm_mib(proc.pid) or 0.0)
        if until is not None and until():
            elapsed = time.monotonic() - started
            peak = max(peak, hwm_mib(proc.pid) or 0.0)
            proc.send_signal(signal.SIGTERM)
            _, status, usage = os.wait4(proc.pid, 0)
            break
        time.sleep(POLL_S)
    proc.returncode = os.waitstatus_to_exitcode(status)
    if elapsed is None:
        elapsed = time.monotonic() - started
        if status != 0:
            raise RuntimeError(f"{argv[:4]} exited with status {proc.returncode}")
    if marks_file is not None:
        marks = read_marks(marks_file, started)
    return Measured(elapsed, usage.ru_utime + usage.ru_stime, peak, marks)
