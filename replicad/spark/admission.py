"""How far the next micro-batch of a stream reads (sans-I/O: what the replica holds in, the
end offsets out; time passed in as `now_ms`).

Rules (Spark's Kafka source's, where it has them):
- Offsets are Spark's Kafka source JSON, `{"topic": {"0": 42}}`: per partition the next
  offset to read. They are written sorted (topic, then partition number), so that the same
  offsets are the same text: Spark ends a Trigger.AvailableNow run when the latest offset
  equals the start.
- A partition's readable end (`Available.end`) is the replica's high watermark, and with
  read_committed its last stable offset: a micro-batch never ends past it.
- Without a limit (ReadAllAvailable, as Spark asks for Trigger.Once) every partition ends
  at its readable end. With one, the options' limits all apply:
  - `maxOffsetsPerTrigger` N: divided among the partitions in proportion to what each has
    to read (a share below 1 rounds up, others down), so a batch never holds more than N
    records plus one per partition;
  - `maxBytesPerTrigger` B: the same division in bytes, each share turned into an offset
    by the caller (an indexed batch start, so at least one batch moves);
  - `minOffsetsPerTrigger` M with `maxTriggerDelay` D: fewer than M offsets to read and
    less than D since the last batch -> no batch (the start is returned).
- Trigger.AvailableNow: the readable ends when the run began are a ceiling (`target`);
  partitions that appear later wait for the next run; the minimum is not waited for
  (nothing else would end the run).
- Data loss (`DataLoss`): offsets the stream has not read are gone -- retention deleted
  them (the start is below the log start), a partition joined later than its offset 0, or
  the partition was truncated below the stream's position (an unclean leader election:
  its readable end is below the start). failOnDataLoss=true: the query stops with the
  loss's line; false: the offsets are skipped (the caller counts and logs them), and a
  truncated partition goes on from its new end.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from replicad.types import TopicPartition

Offsets = dict[TopicPartition, int]


@dataclass(frozen=True, slots=True)
class Available:
    """What a partition of the replica holds: [log_start, end) may be read."""

    log_start: int
    end: int


@dataclass(frozen=True, slots=True)
class Limits:
    max_offsets: int | None = None
    min_offsets: int | None = None
    max_trigger_delay_ms: int = 0
    max_bytes: int | None = None


@dataclass(frozen=True, slots=True)
class DataLoss:
    """Offsets [first, end) of a partition that the stream will not read."""

    tp: TopicPartition
    first: int
    end: int
    reason: str

    @property
    def count(self) -> int:
        return max(self.end - self.first, 0)

    def line(self) -> str:
        return (
            f"data lost in {self.tp.topic}-{self.tp.partition}: offsets "
            f"{self.first}..{self.end - 1} ({self.reason}); failOnDataLoss=false skips them"
        )


def to_json(offsets: Mapping[TopicPartition, int]) -> dict[str, dict[str, int]]:
    out: dict[str, dict[str, int]] = {}
    for tp in sorted(offsets, key=lambda t: (t.topic, t.partition)):
        out.setdefault(tp.topic, {})[str(tp.partition)] = offsets[tp]
    return out


def from_json(offsets: Mapping[str, Mapping[str, int]]) -> Offsets:
    return {
        TopicPartition(topic, int(partition)): int(offset)
        for topic, partitions in offsets.items()
        for partition, offset in partitions.items()
    }


def start_of(
    tp: TopicPartition, start: Offsets, available: Available | None, *, joined: bool
) -> tuple[int, DataLoss | None]:
    """Where a partition's next batch begins, and what is lost before it. `joined`: the
    partition is not in `start` because it appeared after the stream began."""
    begin = start.get(tp)
    if available is None:
        return (begin if begin is not None else 0), None
    if begin is None:
        if joined and available.log_start > 0:
            reason = "the partition joined the stream after retention deleted its start"
            return available.log_start, DataLoss(tp, 0, available.log_start, reason)
        return available.log_start, None
    if begin < available.log_start:
        reason = "deleted by retention before the stream read them"
        return available.log_start, DataLoss(tp, begin, available.log_start, reason)
    return begin, None


def truncation(tp: TopicPartition, begin: int, available: Available) -> DataLoss | None:
    """A readable end below the stream's position: the log was truncated under it."""
    if available.end >= begin:
        return None
    reason = "the replica's log was truncated below the stream's position"
    return DataLoss(tp, available.end, begin, reason)


@dataclass
class TriggerDelay:
    """minOffsetsPerTrigger with maxTriggerDelay: the one piece of state between batches."""

    last_batch_ms: int | None = None

    def admits(self, offsets: int, limits: Limits, now_ms: int) -> bool:
        if limits.min_offsets is None or offsets >= limits.min_offsets:
            return True
        if self.last_batch_ms is None:
            self.last_batch_ms = now_ms  # the delay counts from the stream's first look
            return False
        return now_ms - self.last_batch_ms >= limits.max_trigger_delay_ms

    def batch_planned(self, now_ms: int) -> None:
        self.last_batch_ms = now_ms


def _prorate(limit: int, size: int, total: int) -> int:
    share = limit * (size / total)
    return math.ceil(share) if share < 1 else math.floor(share)


def next_ends(
    begins: Offsets,
    ends: Offsets,
    limits: Limits | None,
    *,
    offset_after_bytes: Callable[[TopicPartition, int, int], int],
    bytes_between: Callable[[TopicPartition, int, int], int],
) -> Offsets:
    """The end of the next batch per partition, from where each begins and may end.
    `limits` None: read all available. Minimum and delay are the caller's (TriggerDelay)."""
    chosen = dict(ends)
    if limits is None:
        return chosen
    if limits.max_offsets is not None:
        sizes = {tp: chosen[tp] - begins[tp] for tp in chosen if chosen[tp] > begins[tp]}
        total = sum(sizes.values())
        if total > limits.max_offsets:
            for tp, size in sizes.items():
                share = _prorate(limits.max_offsets, size, total)
                chosen[tp] = min(chosen[tp], begins[tp] + share)
    if limits.max_bytes is not None:
        sizes = {
            tp: bytes_between(tp, begins[tp], chosen[tp])
            for tp in chosen
            if chosen[tp] > begins[tp]
        }
        total = sum(sizes.values())
        if total > limits.max_bytes:
            for tp, size in sizes.items():
                if size == 0:
                    continue
                share = _prorate(limits.max_bytes, size, total)
                cut = offset_after_bytes(tp, begins[tp], share)
                chosen[tp] = min(chosen[tp], max(cut, begins[tp] + 1))
    return chosen


def pending(begins: Offsets, ends: Offsets) -> int:
    """Offsets between where the partitions begin and where they may end."""
    return sum(max(ends[tp] - begins.get(tp, ends[tp]), 0) for tp in ends)
