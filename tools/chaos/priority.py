"""The soak's scheduling priority, given to every process it starts.

On a shared machine the long soak runs with its session's autogroup at a higher priority
(`echo -10 > /proc/$$/autogroup` before it starts). Linux schedules by autogroup, one per
session, and the soak's peers (Kafka nodes, Tansu) and its replicad each start in a
session of their own (`start_new_session`, so that a signal to one is not a signal to the
soak): each gets an autogroup at nice 0, and the priority stays with the soak's own
process, which mostly waits. Session 13 found it: the 10,000-partition runs' JVMs and
daemon ran at nice 0 beside a load of 30-40, and the cluster's controller timed out its
brokers' heartbeats ("controller event queue overloaded").

`PriorityKeeper` looks at the soak's descendants every `interval_s` and gives each
autogroup that is not at the soak's nice the soak's nice (a node started again after a
SIGKILL is a new process in a new session). Raising a priority needs root (or
CAP_SYS_NICE); without it nothing is changed and `refused` says how often.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator, Mapping
from pathlib import Path

PROC = Path("/proc")
DEFAULT_INTERVAL_S = 5.0


def autogroup_nice(text: str) -> int | None:
    """The nice of a /proc/PID/autogroup line (`/autogroup-114 nice 0`); None if not one."""
    words = text.split()
    if len(words) == 3 and words[1] == "nice":
        try:
            return int(words[2])
        except ValueError:
            return None
    return None


def descendants(parents: Mapping[int, int], root: int) -> list[int]:
    """Every process below `root` in a {pid: parent pid} map, parents before children."""
    children: dict[int, list[int]] = {}
    for pid, parent in parents.items():
        children.setdefault(parent, []).append(pid)
    found: list[int] = []
    todo = list(children.get(root, ()))
    while todo:
        pid = todo.pop(0)
        found.append(pid)
        todo.extend(children.get(pid, ()))
    return found


def _parents(proc: Path = PROC) -> dict[int, int]:
    """{pid: parent pid} of every process (from /proc/PID/stat)."""
    found: dict[int, int] = {}
    for entry in _pids(proc):
        try:
            stat = (proc / str(entry) / "stat").read_text()
        except OSError:
            continue  # gone meanwhile
        # The command name is in parentheses and may hold spaces: the fields after it.
        fields = stat[stat.rfind(")") + 2 :].split()
        if len(fields) > 1 and fields[1].isdigit():
            found[entry] = int(fields[1])
    return found


def _pids(proc: Path) -> Iterator[int]:
    for name in os.listdir(proc):
        if name.isdigit():
            yield int(name)


def read_nice(pid: int, proc: Path = PROC) -> int | None:
    try:
        return autogroup_nice((proc / str(pid) / "autogroup").read_text())
    except OSError:
        return None


class PriorityKeeper:
    """A thread giving `root`'s descendants `root`'s autogroup nice (see the module doc)."""

    def __init__(self, root: int | None = None, *, interval_s: float = DEFAULT_INTERVAL_S):
        self.root = os.getpid() if root is None else root
        self.interval_s = interval_s
        self.nice = read_nice(self.root)
        self.given = 0  # autogroups changed
        self.refused = 0  # changes the kernel refused (no privilege)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="soak-priority", daemon=True)

    def describe(self) -> str:
        if self.nice is None:
            return "no autogroup here: the peers and replicad keep their own priority"
        return f"autogroup nice {self.nice}, given to the peers and replicad"

    def once(self) -> None:
        """One look at the descendants."""
        if self.nice is None:
            return
        for pid in descendants(_parents(), self.root):
            current = read_nice(pid)
            if current is None or current == self.nice:
                continue
            try:
                (PROC / str(pid) / "autogroup").write_text(f"{self.nice}\n")
                self.given += 1
            except PermissionError:
                self.refused += 1
            except OSError:
                continue  # gone meanwhile

    def __enter__(self) -> PriorityKeeper:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join(timeout=self.interval_s * 2)

    def _run(self) -> None:
        while True:
            self.once()
            if self._stop.wait(self.interval_s):
                return
