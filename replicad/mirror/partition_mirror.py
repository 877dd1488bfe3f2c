"""The mirror state machine of one partition: which stored batch goes to the destination
next, with which sequence, and where the mirror stands (sans-I/O: the shell feeds log
entries and destination answers in, and asks what to send).

Rules:
- The source is the local log, read in offset order from `scanned_to`; `position` is the
  source offset below which everything is mirrored or deliberately skipped, `dest_next`
  the destination offset the next produced batch lands at. Both move together, after a
  batch is acknowledged, so (position, dest_next) is always a consistent pair to persist.
- Transactions: a consumer reading the destination with read_committed sees what one
  reading the source with read_committed sees, in the same order. A transactional batch
  is held until its producer's next COMMIT or ABORT marker is in the local log: committed
  data is produced (as plain idempotent data: the destination sees no transaction), aborted
  data and every control batch are skipped. A batch held blocks everything after it, as a
  source's last stable offset does for read_committed consumers.
- One batch in flight at a time: its base sequence is `sequence`; a retried send carries
  the same producer and sequence, so the destination drops a duplicate (idempotence).
- Exactly once across restarts and lost producer sessions: the destination log is a prefix
  of what was sent, in order. `reconcile(stamp, dest_end)` takes the destination's log end
  and walks forward from `position` over the batches that must already be there (their
  record counts add up to `dest_end - dest_next`), then the new producer starts at sequence
  0. A destination end below `dest_next`, or one that falls inside a batch, means someone
  else changed the destination: the partition halts with the reason (nothing is guessed).
- A batch that cannot be produced (restamp.mirrorable: magic 0/1) halts the partition.
  A batch thinned by compaction takes as many destination offsets as it has records.
- Halted partitions stay halted until the daemon restarts; `error` says why.
"""

from __future__ import annotations

import enum
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass

from replicad.errors import LocalProtocolError
from replicad.mirror.offset_map import OffsetMap, SyncPoint
from replicad.mirror.restamp import ProducerStamp, mirrorable, next_sequence
from replicad.records.batch import BatchHeader
from replicad.records.records import ControlType


class Phase(enum.Enum):
    # Waiting for the destination's log end under a (new) producer session.
    RECONCILING = "reconciling"
    MIRRORING = "mirroring"
    HALTED = "halted"


class Decision(enum.Enum):
    PRODUCE = "produce"
    SKIP = "skip"
    HOLD = "hold"  # transactional, outcome not in the local log yet


@dataclass(frozen=True, slots=True)
class LogEntry:
    """One stored batch: its header, its control record's type for a control batch, and its
    bytes while the shell still holds them (None: read them again from the log)."""

    header: BatchHeader
    marker: ControlType | None = None
    data: bytes | None = None


class _Pending:
    __slots__ = ("decision", "entry")

    def __init__(self, entry: LogEntry, decision: Decision) -> None:
        self.entry = entry
        self.decision = decision


@dataclass(frozen=True, slots=True)
class Send:
    """Produce `entry`'s batch stamped with `stamp` and `base_sequence`."""

    entry: LogEntry
    stamp: ProducerStamp
    base_sequence: int
    expected_dest: int


@dataclass(frozen=True, slots=True)
class Acked:
    source_base: int
    dest_base: int
    new_sync_point: bool


@dataclass(frozen=True, slots=True)
class Reconciled:
    """`done`: mirroring may go on. Otherwise `need_more` (feed more of the log first) or
    the partition halted (`error`)."""

    done: bool
    batches_found: int = 0
    need_more: bool = False
    error: str | None = None


@dataclass(frozen=True, slots=True)
class Progress:
    """What is persisted: enough to reconcile after a crash."""

    position: int
    dest_next: int | None
    points: tuple[SyncPoint, ...]


class PartitionMirror:
    def __init__(
        self,
        *,
        position: int,
        dest_next: int | None = None,
        points: Iterable[SyncPoint] = (),
    ) -> None:
        self.position = position
        self.scanned_to = position
        # None until the first reconcile reads an empty-or-not destination.
        self.dest_next = dest_next
        self.offset_map = OffsetMap.of(points)
        self.phase = Phase.RECONCILING
        self.error: str | None = None
        self.stamp: ProducerStamp | None = None
        self.sequence = 0
        self.in_flight: Send | None = None
        self.records_mirrored = 0
        self.batches_mirrored = 0
        self.batches_skipped = 0
        self.gap_offsets = 0
        self._pending: deque[_Pending] = deque()
        self._open: dict[int, list[_Pending]] = {}
        self._pending_bytes = 0

    # -- the log, in ------------------------------------------------------------------

    def feed(self, entries: Iterable[LogEntry]) -> None:
        """Take in the next stored batches, in offset order from `scanned_to`."""
        for entry in entries:
            h = entry.header
            if h.base_offset < self.scanned_to:
                raise LocalProtocolError(
                    f"batch at {h.base_offset} fed after {self.scanned_to - 1} was scanned"
                )
            if h.is_control:
                pending = _Pending(entry, Decision.SKIP)
                if entry.marker in (ControlType.COMMIT, ControlType.ABORT):
                    outcome = (
                        Decision.PRODUCE if entry.marker == ControlType.COMMIT else Decision.SKIP
                    )
                    for held in self._open.pop(h.producer_id, ()):
                        held.decision = outcome
            elif h.is_transactional:
                pending = _Pending(entry, Decision.HOLD)
                self._open.setdefault(h.producer_id, []).append(pending)
            else:
                pending = _Pending(entry, Decision.PRODUCE)
            self._pending.append(pending)
            if entry.data is not None:
                self._pending_bytes += len(entry.data)
            self.scanned_to = h.next_offset

    def wants_more(self, budget_bytes: int) -> bool:
        """Whether the shell should read further: below the memory budget, or when the
        batch at the head waits for a marker that only further reading can find."""
        if self._pending_bytes < budget_bytes:
            return True
        return bool(self._pending) and self._pending[0].decision is Decision.HOLD

    @property
    def held_transactions(self) -> int:
        return len(self._open)

    # -- the destination, out and in --------------------------------------------------

    def reconcile(self, stamp: ProducerStamp, dest_end: int) -> Reconciled:
        """See the module rules; call again after feeding when it asks for more."""
        if self.phase is Phase.HALTED:
            return Reconciled(False, error=self.error)
        if self.in_flight is not None:
            raise LocalProtocolError("reconcile with a batch in flight")
        if self.dest_next is None:
            self.dest_next = dest_end
        if dest_end < self.dest_next:
            return self._halt_result(
                f"destination log end {dest_end} is below the mirrored end {self.dest_next}: "
                "records the mirror wrote are gone (topic recreated, unclean election?)"
            )
        found = 0
        while dest_end > self.dest_next:
            self._drop_skipped()
            if not self._pending or self._pending[0].decision is Decision.HOLD:
                return Reconciled(False, found, need_more=True)
            head = self._pending[0].entry.header
            if self.dest_next + head.record_count > dest_end:
                return self._halt_result(
                    f"destination log end {dest_end} falls inside the batch of source offset "
                    f"{head.base_offset} (expected at {self.dest_next}): something else "
                    "writes to the destination partition"
                )
            self._advance(self.dest_next)
            found += 1
        self._drop_skipped()
        self.stamp = stamp
        self.sequence = 0
        self.phase = Phase.MIRRORING
        return Reconciled(True, found)

    def next_send(self) -> Send | None:
        """The batch to produce now, or None (one in flight, none decided, or halted)."""
        if self.phase is not Phase.MIRRORING or self.in_flight is not None:
            return None
        self._drop_skipped()
        if not self._pending or self._pending[0].decision is not Decision.PRODUCE:
            return None
        entry = self._pending[0].entry
        refused = mirrorable(entry.header)
        if refused is not None:
            self.halt(f"source offset {refused.base_offset}: {refused.reason}")
            return None
        assert self.stamp is not None and self.dest_next is not None
        self.in_flight = Send(entry, self.stamp, self.sequence, self.dest_next)
        return self.in_flight

    def with_data(self, send: Send, data: bytes) -> Send:
        """`send` with its batch bytes read again by the shell."""
        entry = LogEntry(send.entry.header, send.entry.marker, data)
        self.in_flight = Send(entry, send.stamp, send.base_sequence, send.expected_dest)
        return self.in_flight

    def acked(self, dest_base: int) -> Acked:
        """The destination took the batch in flight at `dest_base`."""
        send = self.in_flight
        if send is None:
            raise LocalProtocolError("acknowledgement without a batch in flight")
        self.in_flight = None
        source_base = send.entry.header.base_offset
        new_point = self._advance(dest_base)
        self.sequence = next_sequence(self.sequence, send.entry.header.record_count)
        self._drop_skipped()
        return Acked(source_base, dest_base, new_point)

    def retry(self) -> None:
        """The batch in flight failed in a way a resend with the same sequence fixes."""
        self.in_flight = None

    def lost_session(self) -> None:
        """The destination no longer knows our producer's sequence (or fenced it): a new
        producer must reconcile before anything more is sent."""
        self.in_flight = None
        if self.phase is Phase.MIRRORING:
            self.phase = Phase.RECONCILING

    def skip_to(self, offset: int) -> int:
        """The local log no longer holds [position, offset) (its retention deleted records
        not mirrored yet): go on from `offset`; returns how many offsets were lost. Only
        when nothing is pending (the shell calls it when the log start passed scanned_to)."""
        if self._pending or self.in_flight is not None:
            raise LocalProtocolError("skip_to with batches pending")
        lost = max(0, offset - self.position)
        self.position = self.scanned_to = max(self.position, offset)
        self.gap_offsets += lost
        return lost

    def halt(self, reason: str) -> None:
        self.phase = Phase.HALTED
        self.error = reason
        self.in_flight = None

    def progress(self) -> Progress:
        return Progress(self.position, self.dest_next, tuple(self.offset_map.points))

    # -- internals ------------------------------------------------------------------------

    def _advance(self, dest_base: int) -> bool:
        pending = self._pending.popleft()
        h = pending.entry.header
        if pending.entry.data is not None:
            self._pending_bytes -= len(pending.entry.data)
        new_point = self.offset_map.record(h.base_offset, dest_base)
        self.position = h.next_offset
        self.dest_next = dest_base + h.record_count
        self.records_mirrored += h.record_count
        self.batches_mirrored += 1
        return new_point

    def _drop_skipped(self) -> None:
        while self._pending and self._pending[0].decision is Decision.SKIP:
            pending = self._pending.popleft()
            if pending.entry.data is not None:
                self._pending_bytes -= len(pending.entry.data)
            self.position = pending.entry.header.next_offset
            self.batches_skipped += 1

    def _halt_result(self, reason: str) -> Reconciled:
        self.halt(reason)
        return Reconciled(False, error=reason)
