"""When the mirror's shell does one of its mirror-wide chores (sans-I/O: the shell asks,
starts the work when told, reports how it went, and sleeps until the time given here;
time is passed in as `now_ms`). The chores: the destination's metadata, refreshed when a
partition needs it (a leader moved or is not known yet), and the destination's topics,
prepared at start and synced every `topic_sync_interval_ms` after.

Rules:
- A chore is IDLE (nothing to do), DUE (at `due_ms`) or RUNNING (the shell is doing it).
- Asked (`ask`): an idle chore is due at once, or `min_gap_ms` after its last run ended
  if that is later (metadata is asked at most once a back-off, as Kafka's producer
  spaces its metadata requests by `retry.backoff.ms`); a due chore stays due when it was;
  a running one is answered by the run under way (the ask is folded into it).
- Started (`start`): only when due and its time has come; one run at a time.
- A run that succeeded: the chore is idle again, or due `every_ms` later for a periodic
  one; the back-off resets. A run that failed: due again after the back-off (exponential,
  jittered, up to the mirror's reconnect_backoff_max_ms), whoever asked.

Phases and the events that move them are the table TRANSITIONS; any other is a bug of the
caller and raises LocalProtocolError.
"""

from __future__ import annotations

import enum
import random

from replicad.protocol.backoff import Backoff
from replicad.transitions import move


class ChorePhase(enum.Enum):
    IDLE = "idle"
    DUE = "due"
    RUNNING = "running"


class ChoreEvent(enum.Enum):
    ASKED = "asked"
    STARTED = "started"
    SUCCEEDED = "succeeded"
    FAILED = "failed"


TRANSITIONS: dict[tuple[ChorePhase, ChoreEvent], ChorePhase] = {
    (ChorePhase.IDLE, ChoreEvent.ASKED): ChorePhase.DUE,
    (ChorePhase.DUE, ChoreEvent.ASKED): ChorePhase.DUE,
    (ChorePhase.DUE, ChoreEvent.STARTED): ChorePhase.RUNNING,
    # The run under way answers an ask made meanwhile.
    (ChorePhase.RUNNING, ChoreEvent.ASKED): ChorePhase.RUNNING,
    # A periodic chore is then asked again, for `every_ms` later (see Chore.succeeded).
    (ChorePhase.RUNNING, ChoreEvent.SUCCEEDED): ChorePhase.IDLE,
    (ChorePhase.RUNNING, ChoreEvent.FAILED): ChorePhase.DUE,
}


def next_chore_phase(phase: ChorePhase, event: ChoreEvent) -> ChorePhase:
    return move(TRANSITIONS, phase, event, "mirror chore")


class Chore:
    """One chore's schedule. `every_ms`: a periodic chore, due again that long after each
    run that succeeded (0: only when asked); `min_gap_ms`: the least time from a run's end
    to the next run asked for."""

    def __init__(
        self,
        backoff_ms: int,
        backoff_max_ms: int,
        *,
        every_ms: int = 0,
        min_gap_ms: int = 0,
        rng: random.Random | None = None,
    ) -> None:
        self.phase = ChorePhase.IDLE
        self.due_ms = 0
        self.every_ms = every_ms
        self.min_gap_ms = min_gap_ms
        self.failures = 0
        self._ended_ms: int | None = None
        self._backoff = Backoff(backoff_ms, backoff_max_ms, rng=rng or random.Random())

    def ask(self, now_ms: int) -> None:
        """Someone wants the chore done (see the rules for when it then runs)."""
        if self.phase is ChorePhase.IDLE:
            gap_end = self._ended_ms + self.min_gap_ms if self._ended_ms is not None else 0
            self.due_ms = max(now_ms, gap_end)
        self.phase = next_chore_phase(self.phase, ChoreEvent.ASKED)

    def start(self, now_ms: int) -> bool:
        """True when the shell should run the chore now (then `succeeded` or `failed`)."""
        if self.phase is not ChorePhase.DUE or now_ms < self.due_ms:
            return False
        self.phase = next_chore_phase(self.phase, ChoreEvent.STARTED)
        return True

    def succeeded(self, now_ms: int) -> None:
        self.phase = next_chore_phase(self.phase, ChoreEvent.SUCCEEDED)
        self._ended_ms = now_ms
        self.failures = 0
        self._backoff.reset()
        if self.every_ms:
            self.phase = next_chore_phase(self.phase, ChoreEvent.ASKED)
            self.due_ms = now_ms + self.every_ms

    def failed(self, now_ms: int) -> None:
        self.phase = next_chore_phase(self.phase, ChoreEvent.FAILED)
        self._ended_ms = now_ms
        self.failures += 1
        self.due_ms = now_ms + self._backoff.next_delay_ms()

    def next_wakeup_ms(self, now_ms: int) -> int | None:
        """When the chore is next due (at the earliest `now_ms`); None when it is idle or
        running (an ask or the run's end changes that)."""
        if self.phase is not ChorePhase.DUE:
            return None
        return max(now_ms, self.due_ms)
