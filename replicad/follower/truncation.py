"""Where a follower truncates when its log may have diverged from the leader's
(sans-I/O; Kafka's AbstractFetcherThread.getOffsetTruncationState).

The leader tells us, for an epoch, where that epoch ends in its log -- either in
a Fetch response's DivergingEpoch (Fetch v12+) or in an OffsetForLeaderEpoch
answer (older leaders). Rules, in order:

1. Leader's end offset undefined: it knows nothing of the epoch; keep only what
   was known committed: truncate to our high watermark.
2. Leader's epoch undefined: truncate to min(leader end, our log end).
3. We have no epoch at or below the leader's: truncate to min(leader end, log end).
4. Our largest epoch at or below it is a different one: truncate to where that
   epoch ends for us, and ask again with it (truncation not complete).
5. Same epoch: truncate to min(leader end, our end for the epoch, log end).

Truncation never moves the log end forward.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from replicad.log.epoch import UNDEFINED_EPOCH, UNDEFINED_EPOCH_OFFSET, EpochEndOffset


@dataclass(frozen=True, slots=True)
class TruncationDecision:
    offset: int
    complete: bool  # False: truncate, then ask the leader again (rule 4)
    rule: int


def decide_truncation(
    leader: EpochEndOffset,
    *,
    local_end_for: Callable[[int], EpochEndOffset],
    log_end_offset: int,
    high_watermark: int,
) -> TruncationDecision:
    if leader.end_offset == UNDEFINED_EPOCH_OFFSET:
        return TruncationDecision(min(high_watermark, log_end_offset), True, 1)
    if leader.epoch == UNDEFINED_EPOCH:
        return TruncationDecision(min(leader.end_offset, log_end_offset), True, 2)
    local = local_end_for(leader.epoch)
    if local.end_offset == UNDEFINED_EPOCH_OFFSET:
        return TruncationDecision(min(leader.end_offset, log_end_offset), True, 3)
    if local.epoch != leader.epoch:
        return TruncationDecision(min(local.end_offset, log_end_offset), False, 4)
    return TruncationDecision(min(leader.end_offset, local.end_offset, log_end_offset), True, 5)
