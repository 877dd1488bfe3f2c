"""What the uploader does next: which rolled segments to upload, and when to try again.

Rules (sans-I/O: segments and times in, decisions out):
- A segment is uploaded once it is closed (a later segment exists), non-empty, and wholly
  below the high watermark (no follower truncation can take it back any more), and it
  starts at or past the archive's end: segments are uploaded in offset order, one at a
  time per partition, each followed by the manifest that names it.
- Local retention may delete only what is archived: the hold (`retention_floor`) is the
  archive's end, or 0 (keep everything) while nothing is archived yet.
- Remote retention (`archive.retention_ms` / `retention_bytes`, Kafka's retention.ms and
  retention.bytes of tiered data, -1 off) deletes archived segments from the oldest, by
  the local log's rules (log/policy.py: by largest timestamp, or while the rest still holds
  `retention_bytes`), never the newest archived one: it keeps the archive's end, from which
  uploads go on. The manifest naming fewer segments is written first, then their objects
  are deleted (a reader never sees a manifest naming a deleted object; a crash in between
  leaves objects below the archive's log start, deleted by the next round).
- A failed upload is tried again after a backoff that doubles from `backoff_ms` to
  `backoff_max_ms`; a success resets it. A segment is never given up on (a bucket that is
  down only delays the archive; retention waits for it).
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace

from replicad.log.config import LogConfig
from replicad.log.policy import SegmentSummary, plan_retention
from replicad.transitions import move


@dataclass(frozen=True, slots=True)
class LocalSegment:
    base_offset: int
    next_offset: int
    size: int
    max_timestamp: int


def to_upload(
    archive_end: int | None, segments: Iterable[LocalSegment], high_watermark: int
) -> list[LocalSegment]:
    """The closed segments still to upload, oldest first (`segments`: all of the
    partition's, ascending, the active one last)."""
    listed = list(segments)
    closed = listed[:-1]
    return [
        s
        for s in closed
        if s.size > 0
        and s.next_offset <= high_watermark
        and (archive_end is None or s.base_offset >= archive_end)
    ]


def remote_expired(
    segments: Sequence[LocalSegment], retention_ms: int, retention_bytes: int, now_ms: int
) -> int:
    """How many of the archived `segments` (oldest first) remote retention deletes."""
    if retention_ms < 0 and retention_bytes < 0:
        return 0
    rules = replace(LogConfig(), retention_ms=retention_ms, retention_bytes=retention_bytes)
    summaries = [SegmentSummary(s.base_offset, s.size, s.max_timestamp) for s in segments]
    return len(plan_retention(summaries, rules, now_ms).delete)


def retention_floor(archive_end: int | None) -> int:
    """The offset from which local retention must keep segments."""
    return 0 if archive_end is None else archive_end


class State(enum.Enum):
    READY = "ready"
    BACKING_OFF = "backing_off"


class Event(enum.Enum):
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    WAITED = "waited"  # the backoff's time came


TRANSITIONS: dict[tuple[State, Event], State] = {
    (State.READY, Event.SUCCEEDED): State.READY,
    (State.READY, Event.FAILED): State.BACKING_OFF,
    (State.BACKING_OFF, Event.WAITED): State.READY,
}


@dataclass(slots=True)
class Backoff:
    """One partition's retry state."""

    backoff_ms: int
    backoff_max_ms: int
    state: State = State.READY
    failures: int = 0  # consecutive
    retry_at_ms: int = 0

    def _step(self, event: Event) -> None:
        self.state = move(TRANSITIONS, self.state, event, "archive uploads")

    def ready(self, now_ms: int) -> bool:
        if self.state is State.BACKING_OFF and now_ms >= self.retry_at_ms:
            self._step(Event.WAITED)
        return self.state is State.READY

    def succeeded(self) -> None:
        self._step(Event.SUCCEEDED)
        self.failures = 0

    def failed(self, now_ms: int) -> int:
        """Records a failure; the time to try again."""
        self._step(Event.FAILED)
        delay = min(self.backoff_ms * 2 ** min(self.failures, 30), self.backoff_max_ms)
        self.failures += 1
        self.retry_at_ms = now_ms + delay
        return self.retry_at_ms
