"""CPU seconds of Spark's process trees over one read, counting the processes that end
during it: what tools.bench.spark and tools.bench.spark_stream_cost meter each read with.

Why not two readings of the trees' CPU (live processes with the children each reaped, as
`tools.bench.measure.tree_cpu_seconds` adds them): PySpark's daemon, whose forks are the
executors' Python workers, ignores SIGCHLD, so the kernel reaps a worker that ends and its
CPU is added to no one. A worker that exits during a read (PySpark ends a worker idle for a
minute; a task can end its worker) takes all its CPU out of the second reading, the part
spent before the read too: once, a read's total came out negative.

Rules:
- /proc is polled every `every_s` on a thread of ours (`sample()` takes one poll now); each
  process is known by its pid and start time (a pid used again is another process) and its
  CPU is split into its own (utime + stime) and its reaped children's (cutime + cstime).
- A process still there at the end counts its CPU at the end less its CPU at the start (all
  of it if it started during the read).
- A process gone by the end: if its parent, when last seen, was in the trees and did not
  ignore SIGCHLD, the parent reaped it and counts all its CPU as reaped, so the process
  itself counts only minus what it had at the start. Otherwise (a parent that ignores
  SIGCHLD, or a parent gone or outside the trees) its CPU went nowhere: it counts what it
  had when last seen less what it had at the start. Missed: what such a process spends
  after its last poll, and all of one that starts and ends between two polls.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

_TICKS_PER_S = os.sysconf("SC_CLK_TCK")
SIGCHLD_BIT = 1 << (17 - 1)  # SIGCHLD is 17 on Linux; /proc's SigIgn has bit N-1 for signal N


@dataclass(frozen=True, slots=True)
class Seen:
    """A process of the trees at one poll."""

    pid: int
    ppid: int
    own: float  # CPU seconds of its threads
    reaped: float  # CPU seconds of the children it reaped
    ignores_children: bool  # SIGCHLD ignored: the kernel reaps its children, unaccounted
    cmdline: bytes


@dataclass(frozen=True, slots=True)
class Spent:
    """What one process of the trees spent over a read (either part may be negative: the
    CPU a gone process had at the start, now counted by the parent that reaped it)."""

    pid: int
    cmdline: bytes
    own: float
    reaped: float
    started: bool = False  # during the read
    ended: bool = False  # during the read

    @property
    def total(self) -> float:
        return self.own + self.reaped


Key = tuple[int, int]  # (pid, start time in clock ticks)


def snapshot(roots: Iterable[int]) -> dict[Key, Seen]:
    """Every live process of the trees under `roots` (the roots too)."""
    found: dict[Key, Seen] = {}
    todo = list(roots)
    while todo:
        pid = todo.pop()
        proc = Path(f"/proc/{pid}")
        try:
            stat = (proc / "stat").read_text()
            status = (proc / "status").read_text()
            cmdline = (proc / "cmdline").read_bytes()[:300]
        except OSError:
            continue  # ended meanwhile
        fields = stat[stat.rindex(")") + 2 :].split()
        ignored = next(line for line in status.splitlines() if line.startswith("SigIgn:"))
        key = (pid, int(fields[19]))
        found[key] = Seen(
            pid=pid,
            ppid=int(fields[1]),
            own=(int(fields[11]) + int(fields[12])) / _TICKS_PER_S,
            reaped=(int(fields[13]) + int(fields[14])) / _TICKS_PER_S,
            ignores_children=bool(int(ignored.split()[1], 16) & SIGCHLD_BIT),
            cmdline=cmdline,
        )
        try:
            tasks = list(proc.glob("task/*/children"))
        except OSError:
            continue  # ended between its stat and the listing of its threads
        for task in tasks:
            try:
                todo.extend(int(child) for child in task.read_text().split())
            except (OSError, ValueError):
                continue
    return found


def spent(first: dict[Key, Seen], last: dict[Key, Seen], end: dict[Key, Seen]) -> list[Spent]:
    """Each process's CPU over a read: `first` the poll at its start, `end` the poll at its
    end, `last` each process as last seen by any poll (the module's rules)."""
    out = []
    in_trees = {seen.pid: seen for seen in end.values()}
    for key, seen in last.items():
        before = first.get(key)
        own0, reaped0 = (before.own, before.reaped) if before else (0.0, 0.0)
        started, ended = before is None, key not in end
        if ended:
            parent = in_trees.get(seen.ppid)
            if parent is not None and not parent.ignores_children:
                # Reaped: counted by the parent.
                out.append(Spent(seen.pid, seen.cmdline, -own0, -reaped0, started, ended))
                continue
        now = end.get(key, seen)
        own, reaped = now.own - own0, now.reaped - reaped0
        out.append(Spent(seen.pid, seen.cmdline, own, reaped, started, ended))
    return out


class TreeCpu:
    """The CPU the trees under `roots()` spend from construction to `stop()`. `roots` is
    asked at each poll: a root may start during the read (the forkserver, say)."""

    def __init__(self, roots: Callable[[], Iterable[int]], every_s: float = 0.1) -> None:
        self._roots = roots
        self.every_s = every_s
        self._lock = threading.Lock()
        self.first = snapshot(roots())
        self.last = dict(self.first)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(self.every_s):
            self.sample()

    def sample(self) -> dict[Key, Seen]:
        now = snapshot(self._roots())
        with self._lock:
            self.last.update(now)
        return now

    def stop(self) -> list[Spent]:
        self._stop.set()
        self._thread.join()
        end = self.sample()
        return spent(self.first, self.last, end)
