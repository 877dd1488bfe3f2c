"""A follower partition's phase: its states, the events that move it, and the table of moves.

Rules:
- A partition is in one phase: NEEDS_OFFSET (no local data: ask the leader where to start),
  FETCHING, TRUNCATING (out of range: ListOffsets decides how to reconcile), HALTED (an
  operator must decide) or PAUSED_DISK_FULL. Its first phase is chosen when it is created
  (`initial_phase`); after that it moves only by an event, through `TRANSITIONS`.
- The moves, by event:
  START_FOUND: NEEDS_OFFSET -> FETCHING (ListOffsets answered; start_from chose the offset).
  OUT_OF_RANGE: FETCHING -> TRUNCATING (the leader answered OFFSET_OUT_OF_RANGE).
  RECONCILED: TRUNCATING -> FETCHING (truncated, gap skipped, or transient: backed off).
  GAP_HALT: TRUNCATING -> HALTED (the leader starts above our end and on_gap=halt).
  ANOTHER_LINEAGE: FETCHING -> HALTED (the leader's batch holding our log end starts below
  it: its log is of another lineage; the partition table's R8).
  DISK_FULL: FETCHING -> PAUSED_DISK_FULL; PAUSED_DISK_FULL stays paused.
  DISK_RETRY (its pause is over) and DISK_BACK (space is back): PAUSED_DISK_FULL -> FETCHING.
  LOG_UNUSABLE (its log cannot be opened, or its topic id not stored) and TOPIC_RECREATED
  (the source's topic id is not the one on disk): any phase -> HALTED.
- HALTED is final for the process: no event takes a partition out of it (the local data
  is kept as it is; a restart, after the operator's decision, starts it again).
- A move not in the table is replicad's bug, never the leader's: `next_phase` raises
  `LocalProtocolError`. A caller whose answer may be stale (asked before the partition
  moved) checks the phase before it acts, as the fetch-answer path does.
- Pure: no I/O, no clock.
"""

from __future__ import annotations

from collections.abc import Mapping
from enum import Enum

from replicad.transitions import move


class PartitionPhase(Enum):
    NEEDS_OFFSET = "needs-offset"  # no local data yet: ask the leader where to start
    FETCHING = "fetching"
    TRUNCATING = "truncating"  # out of range or diverged: reconcile with the leader first
    # on_gap=halt hit a gap, another lineage at our log end, or the log is unusable: an
    # operator must decide.
    HALTED = "halted"
    PAUSED_DISK_FULL = "paused-disk-full"


class PhaseEvent(Enum):
    START_FOUND = "start-found"
    OUT_OF_RANGE = "out-of-range"
    RECONCILED = "reconciled"
    GAP_HALT = "gap-halt"
    ANOTHER_LINEAGE = "another-lineage"
    DISK_FULL = "disk-full"
    DISK_RETRY = "disk-retry"
    DISK_BACK = "disk-back"
    LOG_UNUSABLE = "log-unusable"
    TOPIC_RECREATED = "topic-recreated"


# (phase, event) -> the next phase; a pair not here raises LocalProtocolError.
TRANSITIONS: Mapping[tuple[PartitionPhase, PhaseEvent], PartitionPhase] = {
    (PartitionPhase.NEEDS_OFFSET, PhaseEvent.START_FOUND): PartitionPhase.FETCHING,
    (PartitionPhase.FETCHING, PhaseEvent.OUT_OF_RANGE): PartitionPhase.TRUNCATING,
    (PartitionPhase.TRUNCATING, PhaseEvent.RECONCILED): PartitionPhase.FETCHING,
    (PartitionPhase.TRUNCATING, PhaseEvent.GAP_HALT): PartitionPhase.HALTED,
    (PartitionPhase.FETCHING, PhaseEvent.ANOTHER_LINEAGE): PartitionPhase.HALTED,
    (PartitionPhase.FETCHING, PhaseEvent.DISK_FULL): PartitionPhase.PAUSED_DISK_FULL,
    (PartitionPhase.PAUSED_DISK_FULL, PhaseEvent.DISK_FULL): PartitionPhase.PAUSED_DISK_FULL,
    (PartitionPhase.PAUSED_DISK_FULL, PhaseEvent.DISK_RETRY): PartitionPhase.FETCHING,
    (PartitionPhase.PAUSED_DISK_FULL, PhaseEvent.DISK_BACK): PartitionPhase.FETCHING,
    **{(phase, PhaseEvent.LOG_UNUSABLE): PartitionPhase.HALTED for phase in PartitionPhase},
    **{(phase, PhaseEvent.TOPIC_RECREATED): PartitionPhase.HALTED for phase in PartitionPhase},
}
# The phases that ask ListOffsets (where to start; how to reconcile), and only they act on
# its answer.
ASKS_OFFSETS = frozenset({PartitionPhase.NEEDS_OFFSET, PartitionPhase.TRUNCATING})


def initial_phase(*, has_local_data: bool) -> PartitionPhase:
    """A new partition's phase: with local data it resumes at its log end; without, it
    asks the leader where to start."""
    return PartitionPhase.FETCHING if has_local_data else PartitionPhase.NEEDS_OFFSET


def next_phase(phase: PartitionPhase, event: PhaseEvent) -> PartitionPhase:
    """The phase `event` moves `phase` to; LocalProtocolError if the table has no such move."""
    return move(TRANSITIONS, phase, event, "partition phase")
