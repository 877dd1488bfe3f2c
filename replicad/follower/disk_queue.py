"""The durability thread's queue: which disk job runs next (sans-I/O).

Rules:
- Jobs run one at a time, in the order they were first asked (first in, first out): a
  checkpoint asked after a flush runs after it, so the files it writes name what that
  flush synced (durability.py, log/manager.py).
- A job asked with a key that is already waiting (asked, not started) is not queued again:
  the waiting one will read the state when it runs, so it covers the new ask too. A
  partition whose leader epoch changes many times during a failover writes its
  leader-epoch file once per run of the thread, not once per change (log/partition.py).
- Once a keyed job has started, asking again queues it anew: the running job may have read
  the state before the change that asked.
- A job without a key (a checkpoint somebody awaits, a list of unlinks) is never merged.
- The queue decides and runs nothing: the thread (durability.py) takes `next()` and runs it,
  and the simulation (tools/sim) does the same in simulated time, without a thread.

A key's moves, as a table (`MOVES`): a move not in it raises `LocalProtocolError`.
"""

from __future__ import annotations

import enum
from collections import deque
from collections.abc import Callable, Hashable
from dataclasses import dataclass

from replicad import transitions


class KeyState(enum.Enum):
    ABSENT = "absent"  # no job of this key waits (none asked, or the last one started)
    WAITING = "waiting"


class KeyEvent(enum.Enum):
    ASK = "ask"
    START = "start"


# (state, event) -> (next state, whether the ask adds a job to the queue)
MOVES: dict[tuple[KeyState, KeyEvent], tuple[KeyState, bool]] = {
    (KeyState.ABSENT, KeyEvent.ASK): (KeyState.WAITING, True),
    (KeyState.WAITING, KeyEvent.ASK): (KeyState.WAITING, False),  # merged into the waiting one
    (KeyState.WAITING, KeyEvent.START): (KeyState.ABSENT, False),
}


def move(state: KeyState, event: KeyEvent) -> tuple[KeyState, bool]:
    return transitions.move(MOVES, state, event, "disk job key")


@dataclass(frozen=True, slots=True)
class DiskJob:
    run: Callable[[], object]
    what: str
    key: Hashable | None = None


@dataclass(frozen=True, slots=True)
class Asked:
    """What an ask did: `queued` (a job more to run) or merged into a waiting one."""

    queued: bool


class DiskQueue:
    def __init__(self) -> None:
        self._jobs: deque[DiskJob] = deque()
        self._waiting: set[Hashable] = set()
        # How many asks were merged into a waiting job (shown in the thread's stats).
        self.merged = 0

    def ask(self, run: Callable[[], object], what: str, key: Hashable | None = None) -> Asked:
        if key is not None:
            state = KeyState.WAITING if key in self._waiting else KeyState.ABSENT
            state, queue = move(state, KeyEvent.ASK)
            if not queue:
                self.merged += 1
                return Asked(False)
            self._waiting.add(key)
        self._jobs.append(DiskJob(run, what, key))
        return Asked(True)

    def next(self) -> DiskJob | None:
        """The job to run now (it has started: an ask of its key from now on queues anew)."""
        if not self._jobs:
            return None
        job = self._jobs.popleft()
        if job.key is not None:
            move(KeyState.WAITING, KeyEvent.START)
            self._waiting.discard(job.key)
        return job

    def discard(self) -> list[DiskJob]:
        """Every job not started (a crash in the simulation loses them)."""
        jobs = list(self._jobs)
        self._jobs.clear()
        self._waiting.clear()
        return jobs

    def __len__(self) -> int:
        return len(self._jobs)
