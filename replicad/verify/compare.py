"""Is the replica the source? One partition compared batch by batch (sans-I/O).

`replicad verify --against-source` walks each replicated partition at the replica's own
offsets. The shell (`replicad/verify/source.py`) fetches the source at the offset this core
names, reads the replica's batches over the same offsets, and hands both here; this core says
what they prove. It opens no socket and reads no file.

Rules:
- Batches are compared whole: the same base and last offset and the same bytes (hence the same
  length, CRC, leader epoch, producer fields, records). Transaction markers (control batches)
  and aborted data are batches like any other: the source is read uncommitted, as the follower
  reads it, so they are compared too.
- A cursor walks the replica's range [replica start, replica end) and only moves forward;
  every offset below it is settled: verified, a mismatch, no longer at the source, rewritten
  by the source's log cleaner, or not yet at the source. `verified_to` is the cursor.
- Kafka answers a fetch from the start of the batch that holds the fetch offset, so a source
  batch that ends below the cursor is passed over, and one that straddles it is compared
  whole (as after a log start moved into the middle of a batch).
- The replica's batches the shell hands over are every one that ends at or past the fetch
  offset and starts at or before the last offset of the source's answer: so a source batch
  with no replica batch at its offsets, inside the replica's range, is a batch the replica
  lacks (MISSING_IN_REPLICA), and a replica batch with none at the source, while the source
  answered later batches, is one the source lacks (MISSING_AT_SOURCE).
- A replica batch whose offsets the source still has but in other bytes is DIFFERENT_BYTES;
  the detail says whether the replica's copy fails its own CRC (damaged on disk) or both are
  valid batches (the source's differs). Overlapping batches with other boundaries are
  DIFFERENT_BOUNDARIES.
- A compacted topic: the source's log cleaner rewrites batches after we copied them (same
  offsets, fewer records or the delete-horizon flag) and drops batches it emptied. On a topic
  whose cleanup.policy includes compact, those two cases are counted as rewritten at the
  source, not as mismatches: this check cannot prove such a batch, and says so.
- Retention: OFFSET_OUT_OF_RANGE below the source's log start settles [cursor, log start) as
  no longer at the source, never as a mismatch, and the walk goes on from the log start.
- The source's high watermark bounds what it can be asked (a consumer's fetch stops there):
  replica offsets at or past it are not yet at the source (the replica fetched as a follower,
  or the source lost them in an unclean election), reported, not failed.
- A replica that cannot be read past some offset (a torn or damaged entry) is a mismatch at
  that offset, and the walk ends there.
- Sampling (`targets`): only the replica batches starting at the given offsets are compared,
  each against the source's batch at its offsets; the rest of the range is not settled.
- The walk ends (phase DONE) when the cursor reaches the replica's end or the source's high
  watermark, when every target is done, or on a failure the shell reports (the rest is
  unverified, with the reason). An answer that does not move the cursor is such a failure,
  so a misbehaving source cannot keep the walk in place.
- Moves between phases go through TRANSITIONS; a move not in it is our bug
  (LocalProtocolError).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from enum import Enum
from typing import Any

from replicad.errors import LocalProtocolError
from replicad.records.batch import (
    DELETE_HORIZON_FLAG_MASK,
    MAGIC_POSITION,
    MAGIC_V2,
    V2_CRC_START,
    V2_HEADER,
    BatchHeader,
)
from replicad.records.crc import crc32c
from replicad.transitions import move
from replicad.types import TopicPartition

_CRC_FIELD = 4  # V2_HEADER's CRC


@dataclass(frozen=True, slots=True)
class Batch:
    """One log entry, whole: its offsets, and its bytes from base offset to the end."""

    base_offset: int
    last_offset: int
    record_count: int
    attributes: int
    data: bytes

    @classmethod
    def from_header(cls, header: BatchHeader, buffer: bytes | memoryview) -> Batch:
        """The entry `header` describes, its bytes copied out of `buffer`."""
        return cls(
            header.base_offset,
            header.last_offset,
            header.record_count,
            header.attributes,
            bytes(buffer[header.position : header.end_position]),
        )


class Kind(Enum):
    DIFFERENT_BYTES = "different_bytes"
    DIFFERENT_BOUNDARIES = "different_boundaries"
    MISSING_IN_REPLICA = "missing_in_replica"
    MISSING_AT_SOURCE = "missing_at_source"
    REPLICA_UNREADABLE = "replica_unreadable"


@dataclass(frozen=True, slots=True)
class Mismatch:
    offset: int
    last_offset: int
    kind: Kind
    detail: str

    def as_dict(self) -> dict[str, Any]:
        """Its JSON form (`replicad verify --json`, the continuous check's status)."""
        return {**asdict(self), "kind": self.kind.value}


@dataclass(frozen=True, slots=True)
class OffsetRange:
    """[start, end): end exclusive."""

    start: int
    end: int

    def __str__(self) -> str:
        return f"{self.start}..{self.end - 1}"


@dataclass(frozen=True, slots=True)
class SourceAnswer:
    """A fetch answered without error: the whole batches it returned, in order."""

    high_watermark: int
    log_start_offset: int
    batches: Sequence[Batch]


@dataclass(frozen=True, slots=True)
class ReplicaSlice:
    """The replica's batches the shell read for one answer (see the rules), and, when its
    reading stopped at a damaged entry, the offset where it could not go on."""

    batches: Sequence[Batch]
    unreadable_at: int | None = None
    unreadable_detail: str = ""


class Phase(Enum):
    COMPARING = "comparing"
    DONE = "done"


class Event(Enum):
    ANSWERED = "answered"
    OUT_OF_RANGE = "out-of-range"
    FINISHED = "finished"
    FAILED = "failed"


TRANSITIONS: Mapping[tuple[Phase, Event], Phase] = {
    (Phase.COMPARING, Event.ANSWERED): Phase.COMPARING,
    (Phase.COMPARING, Event.OUT_OF_RANGE): Phase.COMPARING,
    (Phase.COMPARING, Event.FINISHED): Phase.DONE,
    (Phase.COMPARING, Event.FAILED): Phase.DONE,
}


def next_phase(phase: Phase, event: Event) -> Phase:
    return move(TRANSITIONS, phase, event, "verify")


@dataclass
class PartitionResult:
    """What one partition's walk proved: the report's line (and JSON object)."""

    tp: TopicPartition
    replica: OffsetRange
    verified_to: int
    batches_compared: int = 0
    bytes_compared: int = 0
    mismatches: list[Mismatch] = field(default_factory=list)
    gone_at_source: list[OffsetRange] = field(default_factory=list)
    rewritten_at_source: list[OffsetRange] = field(default_factory=list)
    not_at_source: OffsetRange | None = None
    unverified: str | None = None  # why the walk stopped before the end
    sample: tuple[int, ...] | None = None  # the sampled batches' offsets

    @property
    def clean(self) -> bool:
        return not self.mismatches and self.unverified is None


def _crc_ok(data: bytes) -> bool | None:
    """Whether a magic 2 batch's CRC32C matches its bytes (None: another format)."""
    if len(data) < V2_HEADER.size or data[MAGIC_POSITION] != MAGIC_V2:
        return None
    return crc32c(data[V2_CRC_START:]) == V2_HEADER.unpack_from(data)[_CRC_FIELD]


def _describe_difference(ours: Batch, theirs: Batch) -> str:
    at = next(
        (i for i, (a, b) in enumerate(zip(ours.data, theirs.data, strict=False)) if a != b),
        min(len(ours.data), len(theirs.data)),
    )
    why = ""
    if _crc_ok(ours.data) is False:
        why = "; the replica's copy fails its CRC (damaged after it was written)"
    elif _crc_ok(theirs.data) is False:
        why = "; the source's batch fails its CRC"
    return (
        f"{len(ours.data)} bytes in the replica, {len(theirs.data)} at the source, "
        f"first difference at byte {at} of the batch{why}"
    )


def _cleaned(ours: Batch, theirs: Batch) -> bool:
    """The source's batch is ours after its log cleaner: same offsets, fewer records, or
    the delete horizon set (KIP-534)."""
    horizon_set = theirs.attributes & ~ours.attributes & DELETE_HORIZON_FLAG_MASK
    return theirs.record_count < ours.record_count or bool(horizon_set)


class PartitionCheck:
    """One partition's walk (the module's rules). The shell asks `next_fetch` and reports
    what it got through `on_answer`, `on_out_of_range` or `on_failure`."""

    def __init__(
        self,
        tp: TopicPartition,
        replica: OffsetRange,
        *,
        compacted: bool = False,
        targets: Sequence[int] | None = None,
        start: int | None = None,
    ) -> None:
        self.phase = Phase.COMPARING
        self.compacted = compacted
        self._targets = None if targets is None else sorted(set(targets))
        self._target_index = 0
        cursor = replica.start if start is None else max(replica.start, start)
        self.result = PartitionResult(
            tp,
            replica,
            verified_to=cursor,
            sample=None if self._targets is None else tuple(self._targets),
        )
        self._cursor = cursor
        self._high_watermark: int | None = None
        if self._empty_range():
            self._move(Event.FINISHED)

    # -- what to ask ------------------------------------------------------------------

    def next_fetch(self) -> int | None:
        """The offset to fetch at next (None: the walk is done)."""
        if self.phase is Phase.DONE:
            return None
        if self._targets is not None:
            return self._targets[self._target_index]
        return self._cursor

    # -- what came back ---------------------------------------------------------------

    def on_answer(self, answer: SourceAnswer, replica: ReplicaSlice) -> None:
        offset = self.next_fetch()
        if offset is None:
            raise LocalProtocolError("verify: an answer after the walk ended")
        self._high_watermark = answer.high_watermark
        if self._targets is not None:
            self._sampled(offset, answer, replica)
        else:
            self._walk(offset, answer, replica)

    def on_out_of_range(self, log_start: int, high_watermark: int) -> None:
        """The fetch at `next_fetch()` was OFFSET_OUT_OF_RANGE; ListOffsets said where the
        source's log starts and ends."""
        offset = self.next_fetch()
        if offset is None:
            raise LocalProtocolError("verify: an answer after the walk ended")
        self._high_watermark = high_watermark
        self._move(Event.OUT_OF_RANGE)
        if log_start > offset:
            # Sampled: everything below the log start is gone, not only this batch.
            first = offset if self._targets is None else self.result.replica.start
            self._gone(OffsetRange(first, min(log_start, self.result.replica.end)))
            if self._targets is not None:
                self._next_target()
            else:
                self._cursor = log_start
                self._settle()
            return
        # Not below the start: past the source's end. The rest is not at the source.
        self._not_at_source(offset)

    def on_failure(self, reason: str) -> None:
        """The source could not be asked (left unverified, with the reason)."""
        if self.phase is Phase.DONE:
            return
        self.result.unverified = f"at offset {self.next_fetch()}: {reason}"
        self._finish(Event.FAILED)

    # -- the full walk ----------------------------------------------------------------

    def _walk(self, offset: int, answer: SourceAnswer, replica: ReplicaSlice) -> None:
        ours = [b for b in replica.batches if b.last_offset >= self._cursor]
        theirs = [b for b in answer.batches if b.last_offset >= self._cursor]
        end = self.result.replica.end
        i = j = 0
        while self._cursor < end and j < len(theirs):
            s = theirs[j]
            if s.last_offset < self._cursor:
                j += 1
                continue
            if i < len(ours) and ours[i].last_offset < self._cursor:
                i += 1
                continue
            if i == len(ours):
                if replica.unreadable_at is not None:
                    break
                if s.base_offset >= end:
                    break  # the source goes on past the replica: not replicated yet
                self._mismatch(
                    s.base_offset,
                    s.last_offset,
                    Kind.MISSING_IN_REPLICA,
                    "the source has this batch, the replica has none at its offsets",
                )
                self._cursor = s.last_offset + 1
                j += 1
                continue
            self._compare_pair(ours[i], s)
        if replica.unreadable_at is not None and self._cursor >= replica.unreadable_at:
            self._mismatch(
                replica.unreadable_at,
                replica.unreadable_at,
                Kind.REPLICA_UNREADABLE,
                replica.unreadable_detail,
            )
            self.result.unverified = f"the replica cannot be read past offset {self._cursor}"
            self._finish(Event.FAILED)
            return
        self._move(Event.ANSWERED)
        self._settle()
        if self.phase is Phase.DONE:
            return
        if not theirs and self._cursor >= answer.high_watermark:
            self._not_at_source(self._cursor)
        elif self._cursor == offset:
            self.on_failure(
                f"the source's answer moved nothing (high watermark {answer.high_watermark}, "
                f"{len(answer.batches)} batches)"
            )

    def _compare_pair(self, ours: Batch, theirs: Batch) -> None:
        """One step of the walk: the replica's next batch against the source's next."""
        if ours.base_offset == theirs.base_offset and ours.last_offset == theirs.last_offset:
            self._same_offsets(ours, theirs)
            self._cursor = ours.last_offset + 1
        elif theirs.last_offset < ours.base_offset:
            self._mismatch(
                theirs.base_offset,
                theirs.last_offset,
                Kind.MISSING_IN_REPLICA,
                "the source has this batch, the replica has none at its offsets",
            )
            self._cursor = theirs.last_offset + 1
        elif ours.last_offset < theirs.base_offset:
            if self.compacted:
                self._rewritten(OffsetRange(ours.base_offset, ours.last_offset + 1))
            else:
                self._mismatch(
                    ours.base_offset,
                    ours.last_offset,
                    Kind.MISSING_AT_SOURCE,
                    f"the source's next batch starts at {theirs.base_offset}",
                )
            self._cursor = ours.last_offset + 1
        else:
            self._mismatch(
                max(ours.base_offset, theirs.base_offset),
                min(ours.last_offset, theirs.last_offset),
                Kind.DIFFERENT_BOUNDARIES,
                f"replica batch {ours.base_offset}..{ours.last_offset}, source batch "
                f"{theirs.base_offset}..{theirs.last_offset}",
            )
            self._cursor = max(ours.last_offset, theirs.last_offset) + 1

    def _same_offsets(self, ours: Batch, theirs: Batch) -> None:
        if ours.data == theirs.data:
            self.result.batches_compared += 1
            self.result.bytes_compared += len(ours.data)
        elif self.compacted and _cleaned(ours, theirs) and _crc_ok(ours.data) is not False:
            self._rewritten(OffsetRange(ours.base_offset, ours.last_offset + 1))
        else:
            self.result.batches_compared += 1
            self._mismatch(
                ours.base_offset,
                ours.last_offset,
                Kind.DIFFERENT_BYTES,
                _describe_difference(ours, theirs),
            )

    # -- the sampled walk -------------------------------------------------------------

    def _sampled(self, offset: int, answer: SourceAnswer, replica: ReplicaSlice) -> None:
        ours = next((b for b in replica.batches if b.base_offset == offset), None)
        self._move(Event.ANSWERED)
        if ours is None:
            detail = replica.unreadable_detail or "no replica batch starts at this offset"
            self._mismatch(offset, offset, Kind.REPLICA_UNREADABLE, detail)
        else:
            theirs = next((b for b in answer.batches if b.last_offset >= offset), None)
            if theirs is None:
                if offset >= answer.high_watermark:
                    self._not_at_source(offset)
                    return
                self.on_failure(
                    f"the source answered no batch below its high watermark {answer.high_watermark}"
                )
                return
            self._compare_pair(ours, theirs)
        self._next_target()

    def _next_target(self) -> None:
        assert self._targets is not None
        self._target_index += 1
        if self._target_index >= len(self._targets):
            self._finish()

    # -- settling ---------------------------------------------------------------------

    def _empty_range(self) -> bool:
        if self._targets is not None:
            return not self._targets
        return self._cursor >= self.result.replica.end

    def _settle(self) -> None:
        self.result.verified_to = max(self.result.verified_to, self._cursor)
        if self._cursor >= self.result.replica.end:
            self._finish()

    def _not_at_source(self, start: int) -> None:
        end = self.result.replica.end
        if start < end:
            self.result.not_at_source = OffsetRange(start, end)
        self._finish()

    def _gone(self, gone: OffsetRange) -> None:
        ranges = self.result.gone_at_source
        if gone.end <= gone.start:
            return
        if ranges and ranges[-1].end >= gone.start:
            ranges[-1] = OffsetRange(ranges[-1].start, max(ranges[-1].end, gone.end))
        else:
            ranges.append(gone)

    def _rewritten(self, rewritten: OffsetRange) -> None:
        ranges = self.result.rewritten_at_source
        if ranges and ranges[-1].end == rewritten.start:
            ranges[-1] = OffsetRange(ranges[-1].start, rewritten.end)
        else:
            ranges.append(rewritten)

    def _mismatch(self, offset: int, last_offset: int, kind: Kind, detail: str) -> None:
        self.result.mismatches.append(Mismatch(offset, last_offset, kind, detail))

    def _move(self, event: Event) -> None:
        self.phase = next_phase(self.phase, event)

    def _finish(self, event: Event = Event.FINISHED) -> None:
        if self._targets is None:
            self.result.verified_to = max(self.result.verified_to, self._cursor)
        self._move(event)
