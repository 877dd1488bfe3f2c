"""Measure one child process: wall time, CPU time and peak RSS from the kernel, and the
moments it passed each tenth of its work (for a steady-state rate that leaves start-up
and the last stragglers out).

Progress comes either from the parent polling the child's output (bytes on disk, for
replicad, kcat and the socket-to-file copy) or from the child itself (a marks file of
`<percent> <time.monotonic()>` lines, for the Python consumers: nothing outside them
counts records). CLOCK_MONOTONIC is one clock for every process of the machine, so the
child's marks and the parent's start time compare.

`python -m tools.bench.measure` checks the measure itself on children whose timing is known
(a CPU burn then a sleep; ten writes 0.1 s apart, 0.8 s from the first to the ninth) and
prints what it measured beside what the child did; the suite (tests/bench/test_measure.py)
asserts only what a busy machine cannot change.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

from tools.peers.process import proc_status

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
    # percent of the work -> the child's CPU seconds by then (from /proc, polled children
    # only): what the work costs once start-up is behind it
    cpu_marks: Mapping[int, float] = field(default_factory=dict)

    @property
    def steady_s(self) -> float | None:
        """Seconds between 10% and 90% of the work, if both were seen and far enough
        apart to measure a rate (MIN_STEADY_S)."""
        if STEADY_FROM in self.marks and STEADY_TO in self.marks:
            window = self.marks[STEADY_TO] - self.marks[STEADY_FROM]
            return window if window >= MIN_STEADY_S else None
        return None

    @property
    def steady_cpu_s(self) -> float | None:
        """CPU seconds between 10% and 90% of the work (start-up and the end left out),
        when both were polled and the window is a rate (`steady_s`)."""
        if self.steady_s is None:
            return None
        if STEADY_FROM in self.cpu_marks and STEADY_TO in self.cpu_marks:
            return self.cpu_marks[STEADY_TO] - self.cpu_marks[STEADY_FROM]
        return None


def installed_env(*checkouts: Path) -> dict[str, str]:
    """The environment for a replicad child that starts as an installed one does: its
    modules' bytecode compiled beforehand (pip compiles at install), next to them.

    Run from a checkout under PYTHONDONTWRITEBYTECODE (this project's development shells
    set it), every start compiled about 70 modules from source: measured at 0.8 CPU s of a
    1 GiB run's 2 on a loaded machine, a cost no installed replicad pays. The bytecode
    goes into the checkout's own `__pycache__` (ignored by git), not a cache directory of
    its own: under PYTHONPYCACHEPREFIX the interpreter also ignores the bytecode its
    installer wrote for the standard library and the venv's packages, so a reader's first
    pass compiled about 150 of those (1.0 of its 2.8 CPU s at 1 GiB, issue 32) and its
    second did not."""
    env = {"PYTHONDONTWRITEBYTECODE": ""}
    for checkout in checkouts:
        subprocess.run(
            [sys.executable, "-m", "compileall", "-q", str(checkout / "replicad")],
            env={**os.environ, **env},
            check=True,
            stdout=subprocess.DEVNULL,
        )
    return env


def hwm_mib(pid: int) -> float | None:
    """The process's own peak RSS (VmHWM); it restarts at exec, unlike ru_maxrss, which
    also counts the forked parent's pages before exec."""
    try:
        hwm = proc_status(pid).get("VmHWM")
    except OSError:
        return None
    return None if hwm is None else hwm / 1024


_TICKS_PER_S = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int) -> float | None:
    """A live process's user and system CPU seconds so far (all its threads; its children
    not), in the kernel's ticks (10 ms)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    # The command name may hold spaces: the fields are counted after its closing ")".
    fields = stat[stat.rindex(")") + 2 :].split()
    return (int(fields[11]) + int(fields[12])) / _TICKS_PER_S


def _descendants(pid: int) -> list[int]:
    found, todo = [], [pid]
    while todo:
        parent = todo.pop()
        found.append(parent)
        for task in Path(f"/proc/{parent}/task").glob("*/children"):
            try:
                todo.extend(int(child) for child in task.read_text().split())
            except (OSError, ValueError):
                continue  # gone meanwhile
    return found


def tree_cpu_seconds(pid: int) -> float:
    """CPU seconds of a live process and every live descendant, with the children each has
    reaped (a JVM's forked Python workers, say), so the difference of two calls is what
    the whole tree spent between them; children exited but not yet reaped are missed."""
    total = 0.0
    for member in _descendants(pid):
        try:
            stat = Path(f"/proc/{member}/stat").read_text()
        except OSError:
            continue
        fields = stat[stat.rindex(")") + 2 :].split()
        total += sum(int(f) for f in fields[11:15]) / _TICKS_PER_S
    return total


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
    clock: Callable[[], float] = time.monotonic,
    cwd: Path | None = None,
) -> Measured:
    """Run a child to its end and measure it.

    `until`: the child is a daemon, SIGTERMed once this holds (its wall time ends there).
    Otherwise it must exit 0. `progress()` (0..1, polled) or the child's own `marks_file`
    give the moments each tenth of the work was done. `clock` is the wall clock (CLOCK_MONOTONIC;
    the marks file's times must be of the same clock). `cwd`: where the child runs (a
    Python child imports from its current directory first).
    """
    started = clock()
    proc = subprocess.Popen(
        argv,
        env={**os.environ, **(env or {})},
        stdout=stdout or subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        cwd=cwd,
    )
    peak = 0.0
    elapsed = None
    marks: dict[int, float] = {}
    cpu_marks: dict[int, float] = {}
    pending = list(MARK_PERCENTS)

    def poll_progress(now: float, *, alive: bool = True) -> None:
        if progress is not None and pending:
            done = progress()
            cpu = cpu_seconds(proc.pid) if alive else None
            while pending and done * 100 >= pending[0]:
                percent = pending.pop(0)
                marks[percent] = now - started
                if cpu is not None:
                    cpu_marks[percent] = cpu

    while True:
        # wait4, not Popen.poll: poll would reap the child and lose its rusage.
        pid, status, usage = os.wait4(proc.pid, os.WNOHANG)
        if pid:
            # What it did since the last poll was done by its exit (a busy machine may
            # not have polled in between). Its CPU is no longer in /proc.
            poll_progress(clock(), alive=False)
            break
        poll_progress(clock())
        peak = max(peak, hwm_mib(proc.pid) or 0.0)
        if until is not None and until():
            elapsed = clock() - started
            peak = max(peak, hwm_mib(proc.pid) or 0.0)
            proc.send_signal(signal.SIGTERM)
            _, status, usage = os.wait4(proc.pid, 0)
            break
        time.sleep(POLL_S)
    proc.returncode = os.waitstatus_to_exitcode(status)
    if elapsed is None:
        elapsed = clock() - started
        if status != 0:
            raise RuntimeError(f"{argv[:4]} exited with status {proc.returncode}")
    if marks_file is not None:
        marks = read_marks(marks_file, started)
    return Measured(elapsed, usage.ru_utime + usage.ru_stime, peak, marks, cpu_marks)


# -- checking the measure on children of known timing ------------------------------------------

# Burns `burn` s of CPU, then sleeps `sleep` s.
BURN_THEN_SLEEP = (
    "import sys, time\n"
    "end = time.process_time() + float(sys.argv[1])\n"
    "while time.process_time() < end: pass\n"
    "time.sleep(float(sys.argv[2]))\n"
)
# Writes `chunks` chunks of 100 bytes to argv[1], `gap` s apart.
CHUNKS = (
    "import sys, time\n"
    "f = open(sys.argv[1], 'wb', buffering=0)\n"
    "for _ in range(int(sys.argv[2])):\n"
    "    f.write(b'x' * 100)\n"
    "    time.sleep(float(sys.argv[3]))\n"
)


def burn_then_sleep(
    burn_s: float, sleep_s: float, *, clock: Callable[[], float] = time.monotonic
) -> Measured:
    argv = [sys.executable, "-c", BURN_THEN_SLEEP, str(burn_s), str(sleep_s)]
    return run_measured(argv, clock=clock)


def chunks_polled(out: Path, chunks: int = 10, gap_s: float = 0.1) -> Measured:
    """A child writing `chunks` chunks `gap_s` apart, its progress polled from the file's size."""

    def progress() -> float:
        return out.stat().st_size / (100 * chunks) if out.exists() else 0.0

    argv = [sys.executable, "-c", CHUNKS, str(out), str(chunks), str(gap_s)]
    return run_measured(argv, progress=progress)


def main() -> int:
    burn, sleep = 0.3, 0.6
    m = burn_then_sleep(burn, sleep)
    print(f"burn {burn} s CPU then sleep {sleep} s: cpu {m.cpu_s:.3f} s, wall {m.wall_s:.3f} s")
    with tempfile.TemporaryDirectory() as work:
        m = chunks_polled(Path(work) / "out")
    steady = "none" if m.steady_s is None else f"{m.steady_s:.3f} s"
    print(f"10 writes 0.1 s apart (0.8 s from 10% to 90%): steady {steady}, wall {m.wall_s:.3f} s")
    print(f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
