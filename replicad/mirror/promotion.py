"""The cut-over of mirrored topics (`replicad mirror promote`), as decisions: when a
partition is done, and what the final report says (sans-I/O: the shell passes each
partition's figures in and performs the waiting, the last group sync and the stop; time is
passed in as `now_ms`).

Rules (Cluster Linking's `promote`, in our terms; `--force` is their `failover`):
- A partition is done when the local replica holds the source's high watermark as the
  source last reported it (`source_high_watermark` <= the local high watermark) and the
  mirror has produced everything below the local high watermark (`mirrored_offset`), with
  nothing in flight. A halted partition is never done: it needs `--force`.
- Without `--force`, promotion waits until every partition is done or the timeout passes;
  on timeout nothing is promoted and the partitions not done are named with why. It looks
  again every POLL_MS (the shell steps the partitions' cores first), and once more at the
  deadline (`PromotionWait`).
- With `--force`, or once all are done: one last group sync, then the topics stop being
  mirrored and their groups synced, for good (persisted; a restart does not resume them).
- The report gives per partition the source's high watermark, the local one, the mirrored
  offset, the destination's log end (read after the stop) and what was left behind
  (source offsets not mirrored), and per group the final destination offsets.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from replicad.types import TopicPartition

# How often a promotion looks whether its partitions are done.
POLL_MS = 100


@dataclass(frozen=True, slots=True)
class PartitionFigures:
    """One partition as the follower and the mirror see it now."""

    source: TopicPartition
    destination: TopicPartition
    # The leader's high watermark as last reported (-1: never).
    source_high_watermark: int
    local_high_watermark: int
    mirrored_offset: int
    in_flight: bool
    halted: str | None = None


def not_done(p: PartitionFigures) -> str | None:
    """Why `p` is not cut-over ready, or None when it is."""
    if p.halted is not None:
        return f"mirror halted: {p.halted}"
    if p.source_high_watermark < 0:
        return "the source has not reported its high watermark yet"
    if p.local_high_watermark < p.source_high_watermark:
        return (
            f"local replica at {p.local_high_watermark}, source high watermark "
            f"{p.source_high_watermark}"
        )
    if p.mirrored_offset < p.local_high_watermark or p.in_flight:
        return f"mirrored to {p.mirrored_offset} of {p.local_high_watermark}"
    return None


def pending(partitions: list[PartitionFigures]) -> dict[str, str]:
    """The partitions not done yet, by name, with why."""
    out = {}
    for p in partitions:
        why = not_done(p)
        if why is not None:
            out[str(p.source)] = why
    return out


def partition_report(
    p: PartitionFigures, destination_log_end: int | str | None
) -> dict[str, object]:
    high = max(p.source_high_watermark, p.local_high_watermark)
    return {
        "topic": p.source.topic,
        "partition": p.source.partition,
        "destination_topic": p.destination.topic,
        "source_high_watermark": p.source_high_watermark,
        "local_high_watermark": p.local_high_watermark,
        "mirrored_offset": p.mirrored_offset,
        "destination_log_end": destination_log_end,
        "left_behind": max(0, high - p.mirrored_offset),
        "halted": p.halted,
    }


class Verdict(enum.Enum):
    PROMOTE = "promote"  # every partition done, or --force
    TIMED_OUT = "timed out"  # nothing is promoted
    LOOK_AGAIN = "look again"  # at `wake_ms`


@dataclass(frozen=True, slots=True)
class Look:
    """What one look decided, and the partitions not done yet (with why)."""

    verdict: Verdict
    waiting: dict[str, str]
    wake_ms: int | None = None


class PromotionWait:
    """One promotion's wait for its partitions (see the rules): the shell looks when told,
    with the partitions' figures as they are then."""

    def __init__(self, now_ms: int, timeout_ms: int, *, force: bool) -> None:
        self.deadline_ms = now_ms + timeout_ms
        self.force = force

    def look(self, partitions: list[PartitionFigures], now_ms: int) -> Look:
        waiting = pending(partitions)
        if not waiting or self.force:
            return Look(Verdict.PROMOTE, waiting)
        if now_ms >= self.deadline_ms:
            return Look(Verdict.TIMED_OUT, waiting)
        return Look(Verdict.LOOK_AGAIN, waiting, min(now_ms + POLL_MS, self.deadline_ms))
