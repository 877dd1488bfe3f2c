"""What the follower's partition table is told and what it says: its inputs (parsed
answers, the facts it reads of a local log) and its actions, as small frozen values.

Rules:
- Actions are decisions, performed in order by `perform.py:ActionPerformer` (or tools/sim);
  each log-changing one is answered with the table's outcome handler it names.
- Inputs are already parsed: raw error codes stay raw (the table applies Kafka's
  unknown-code rule), and nothing here holds a connection, a file or a clock.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Protocol

from kio.schema.errors import ErrorCode

from replicad.follower.validate import FetchedData
from replicad.log.epoch import EpochEndOffset
from replicad.protocol.fetch_request import FetchRequest
from replicad.session.client import FetchRequestPlan
from replicad.types import TopicPartition


class LocalLog(Protocol):
    """What the core reads of a partition's local log (in-memory facts, no I/O)."""

    log_start_offset: int
    high_watermark: int

    @property
    def log_end_offset(self) -> int: ...

    def latest_epoch(self) -> int | None: ...

    def end_offset_for_epoch(self, epoch: int) -> EpochEndOffset: ...


# -- actions -----------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Truncate:
    """Remove P's records at and above `offset`; then tell `truncated(this)`."""

    tp: TopicPartition
    offset: int
    reason: str
    # The high watermark the answer that asked for this carried (R5): applied once the log
    # is truncated. None: no fresh one (an older leader's must not be trusted here).
    high_watermark: int | None = None


@dataclass(frozen=True, slots=True)
class StartAt:
    """Empty P's log and start it at `offset`; then tell `truncated(this)`."""

    tp: TopicPartition
    offset: int
    reason: str


@dataclass(frozen=True, slots=True)
class Append:
    """Append validated batches to P; then tell `appended` or `append_failed`."""

    tp: TopicPartition
    fetched: FetchedData


@dataclass(frozen=True, slots=True)
class SetHighWatermark:
    tp: TopicPartition
    high_watermark: int


@dataclass(frozen=True, slots=True)
class Halt:
    """P stopped for an operator to decide (it is HALTED already and logged why)."""

    tp: TopicPartition
    reason: str


@dataclass(frozen=True, slots=True)
class RequestMetadata:
    reason: str


Action = Truncate | StartAt | Append | SetHighWatermark | Halt | RequestMetadata


# -- inputs ------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class NextFetch:
    """A Fetch request to send: the session plan, the version and what it says."""

    plan: FetchRequestPlan
    version: int
    request: FetchRequest


@dataclass(frozen=True, slots=True)
class ResponseOutcome:
    """A Fetch response judged. Not accepted: the session handler refused it (back off)."""

    accepted: bool
    # Everything but appends, to perform first (truncations, high watermarks, metadata).
    actions: tuple[Action, ...] = ()
    appends: tuple[Append, ...] = ()
    # Refused: wait this long before the next request (growing while refusals go on).
    retry_in_ms: int = 0


@dataclass(frozen=True, slots=True)
class EpochAnswer:
    """One partition of an OffsetForLeaderEpoch answer (raw error code)."""

    tp: TopicPartition
    error_code: int
    leader_epoch: int = -1
    end_offset: int = -1


@dataclass(frozen=True, slots=True)
class OffsetAnswer:
    """One partition of a ListOffsets answer (raw error code)."""

    tp: TopicPartition
    error_code: int
    offset: int = -1


@dataclass(frozen=True, slots=True)
class OffsetsAnswer:
    """A ListOffsets answer: the offsets found, and the partitions that got an error."""

    offsets: Mapping[TopicPartition, int]
    errors: Mapping[TopicPartition, ErrorCode]


@dataclass(frozen=True, slots=True)
class EpochQuestion:
    current_leader_epoch: int
    leader_epoch: int  # ours: the latest in the local log
