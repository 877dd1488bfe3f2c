"""Per-partition replication state, as the follower tracks it.

Rules:
- `fetch_offset` is always the local log end: we only ever ask for the next
  offset we do not have, so a restart resumes exactly where the disk ends.
- `high_watermark` is the leader's, as last reported (-1 until it answers); the
  partition log's own high watermark, min(leader's, local log end), only rises from it
  (log/manager.py).
- A partition is fetchable only in FETCHING state and when its backoff (if
  any) has expired; every other state says why it is not.
- Its phase moves only by `move(event)`, through partition_phase.py's table.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from typing import Any

from replicad.follower.partition_phase import PartitionPhase, PhaseEvent, next_phase
from replicad.types import TopicPartition

# The kinds of turn `turns` records (the partition table's `_exchange_ended`).
TURN_KINDS = {
    "f": "failed by the leader",  # no answer in time, or a malformed one (R14)
    "r": "refused whole",  # a top-level error
    "o": "left out of the answer",
    "e": "no partition of the answer served",  # the leader moved on with none (R11)
    "n": "answered without records",  # while the answer served others
    "d": "records not appended",  # corrupt, or out of place
}
TURNS_KEPT = 4


@dataclass(slots=True)
class PartitionState:
    tp: TopicPartition
    topic_id: uuid.UUID | None
    leader_id: int
    leader_epoch: int
    phase: PartitionPhase
    fetch_offset: int = 0
    # The leader's log start and last stable offset, as last reported (-1 until it answers).
    leader_log_start_offset: int = -1
    high_watermark: int = -1
    last_stable_offset: int = -1
    delayed_until_ms: int = 0
    # Errors since start, and since the last successful append (status shows both: a
    # partition failing now has consecutive_failures > 0).
    error_count: int = 0
    last_error: str | None = None
    corrupt_count: int = 0
    bytes_replicated: int = 0
    records_replicated: int = 0
    consecutive_failures: int = 0
    # Leaders below Fetch v12 cannot report divergence in Fetch: after a leader or
    # epoch change, ask OffsetForLeaderEpoch before fetching again.
    epoch_check_pending: bool = False
    # (log end, latest epoch) an OffsetForLeaderEpoch check last found to be the leader's
    # too: below Fetch v9 the leader checks nothing, and a batch of a new epoch may follow
    # our log end only right after such a check (the partition table's R10); the next
    # answer uses it up.
    join_checked: tuple[int, int] | None = None
    # Caches for the fetch loop's hot path: the partition's log, and the last
    # PartitionFetch built (rebuilt when one of its fields no longer matches).
    log: Any = None
    want: Any = None
    # The highest leader epoch of batches validated but not yet appended (a pipelined
    # request's last_fetched_epoch must already count them).
    fetched_epoch: int | None = None
    # When the local log last moved (monotonic ms; creation counts, and so do a new
    # partition's start, found by ListOffsets, a new leader or leader epoch:
    # follower/assignment.py, and an answer that found it caught up: the partition table's
    # R12): with lag, a partition idle for long is stalled (control/stalls.py).
    progress_ms: int = 0
    # Requests that named it and ended since its log last moved, an answer found it caught
    # up, or the disk last refused its answer's records (the one that moved it, or would
    # have, not counted): answered, with or without an error, left out of the answer, or
    # never answered; not an answer that cut it short in a share (partition table, R11).
    # A partition of a leader fetched in shares waits for its turn until it has had two,
    # and is not stalled meanwhile (control/stalls.py).
    answers_since_move: int = 0
    # What each of those (the last TURNS_KEPT) was, oldest first, a letter each
    # (TURN_KINDS): a stall line says what its turns were (session 18's soak at 10,000
    # partitions on Tansu on S3: 103 stalls, and nothing said which answers counted).
    turns: str = ""
    # When an append last failed because the disk is full (monotonic ms; None: never).
    # A partition paused on a full disk is not stalled (control/stalls.py), and status says
    # when the disk last refused it.
    disk_full_ms: int | None = None
    # When it last left such a pause to try again (monotonic ms; None: never): a stall is
    # counted from here once the disk takes appends (control/stalls.py).
    disk_retry_ms: int | None = None
    # Gaps met (the leader's log starting above our end: retention or DeleteRecords
    # upstream outran the replica), and the offsets skipped over them (on_gap=reset).
    gaps: int = 0
    gap_offsets: int = 0

    def move(self, event: PhaseEvent, reason: str | None = None) -> PartitionPhase:
        """The phase `event` leads to (LocalProtocolError if none); `reason`, when given,
        is what status shows as the partition's last error."""
        self.phase = next_phase(self.phase, event)
        if reason is not None:
            self.last_error = reason
        return self.phase

    def fetchable(self, now_ms: int) -> bool:
        return (
            self.phase is PartitionPhase.FETCHING
            and not self.epoch_check_pending
            and now_ms >= self.delayed_until_ms
        )

    def delay(self, now_ms: int, delay_ms: int, reason: str) -> None:
        self.delayed_until_ms = now_ms + delay_ms
        self.error_count += 1
        self.consecutive_failures += 1
        self.last_error = reason

    def succeeded(self) -> None:
        self.consecutive_failures = 0

    @property
    def lag(self) -> int:
        if self.high_watermark < 0:
            return 0
        return max(0, self.high_watermark - self.fetch_offset)
