"""The mirror's one idempotent producer session at the destination (sans-I/O): which
producer id and epoch every partition's batches carry, when a session lost is asked for
again, and how long to wait after a refusal. The shell asks (InitProducerId) and reports;
time is passed in as `now_ms`.

Rules:
- One session for the whole mirror, granted once at start (STARTING -> ACTIVE).
- A partition that lost the session says which one it lost (`lost`): a renewal starts
  only when that is the current session and none is under way -- the first partition to
  see the loss renews, the others find the new session when they next send (their core
  drains and reconciles under it, partition_mirror.py).
- While a session is asked for (STARTING, RENEWING), no partition sends or reconciles:
  `usable` is None.
- An ask goes at once; a refused or failed ask is asked again after a back-off
  (exponential, jittered, up to the mirror's reconnect_backoff_max_ms), which resets when
  a session is granted.

Phases and the events that move them are the table TRANSITIONS; any other is a bug of the
caller and raises LocalProtocolError.
"""

from __future__ import annotations

import enum
import random

from replicad.errors import LocalProtocolError
from replicad.mirror.restamp import ProducerStamp
from replicad.protocol.backoff import Backoff
from replicad.transitions import move


class SessionPhase(enum.Enum):
    STARTING = "starting"
    ACTIVE = "active"
    RENEWING = "renewing"


class SessionEvent(enum.Enum):
    GRANTED = "granted"
    LOST = "lost"


TRANSITIONS: dict[tuple[SessionPhase, SessionEvent], SessionPhase] = {
    (SessionPhase.STARTING, SessionEvent.GRANTED): SessionPhase.ACTIVE,
    (SessionPhase.ACTIVE, SessionEvent.LOST): SessionPhase.RENEWING,
    (SessionPhase.RENEWING, SessionEvent.GRANTED): SessionPhase.ACTIVE,
}


def next_session_phase(phase: SessionPhase, event: SessionEvent) -> SessionPhase:
    return move(TRANSITIONS, phase, event, "producer session")


class ProducerSession:
    def __init__(
        self, backoff_ms: int, backoff_max_ms: int, *, rng: random.Random | None = None
    ) -> None:
        self.phase = SessionPhase.STARTING
        # The current session (the one lost, while renewing); None before the first.
        self.stamp: ProducerStamp | None = None
        self.renewals = 0
        self._asking = False
        self._ask_at_ms = 0
        self._backoff = Backoff(backoff_ms, backoff_max_ms, rng=rng or random.Random())

    @property
    def usable(self) -> ProducerStamp | None:
        """The session partitions send and reconcile under now (None: being asked for)."""
        return self.stamp if self.phase is SessionPhase.ACTIVE else None

    def lost(self, old: ProducerStamp) -> bool:
        """A partition lost session `old`; True when this starts a renewal (the shell
        then asks for a new one)."""
        if self.phase is not SessionPhase.ACTIVE or old != self.stamp:
            return False  # already renewing, or renewed since
        self.phase = next_session_phase(self.phase, SessionEvent.LOST)
        self._ask_at_ms = 0
        return True

    def ask_wanted(self, now_ms: int) -> bool:
        """Whether the shell should ask for a session now (then `granted` or `refused`)."""
        if self.phase is SessionPhase.ACTIVE or self._asking or now_ms < self._ask_at_ms:
            return False
        self._asking = True
        return True

    def granted(self, stamp: ProducerStamp) -> None:
        if not self._asking:
            raise LocalProtocolError("producer session granted without an ask")
        self._asking = False
        if self.phase is SessionPhase.RENEWING:
            self.renewals += 1
        self.phase = next_session_phase(self.phase, SessionEvent.GRANTED)
        self.stamp = stamp
        self._backoff.reset()

    def refused(self, now_ms: int) -> None:
        """The ask failed (refused, unreachable): asked again after a back-off."""
        if not self._asking:
            raise LocalProtocolError("producer session refused without an ask")
        self._asking = False
        self._ask_at_ms = now_ms + self._backoff.next_delay_ms()

    def next_wakeup_ms(self, now_ms: int) -> int | None:
        """When to ask again (None: nothing to ask, or an ask is out)."""
        if self.phase is SessionPhase.ACTIVE or self._asking:
            return None
        return max(now_ms, self._ask_at_ms)
