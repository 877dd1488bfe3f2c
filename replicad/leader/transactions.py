"""Transaction state of one partition, folded from its batches: what a READ_COMMITTED Fetch
answer needs (Kafka keeps it in the producer state and the `.txnindex` files; the replica's
log store keeps neither, so the server folds it from the batches it serves). Sans-I/O: the
shell feeds batch headers in offset order, plus the marker of each control batch.

Rules (Kafka's ProducerStateManager / TransactionIndex):
- A transactional, non-control magic 2 batch of producer P opens a transaction of P at its
  base offset unless P already has one open.
- A control batch of P carrying COMMIT or ABORT closes P's open transaction at the marker's
  offset; an ABORT is kept as an AbortedTransaction (P, first offset, marker offset).
  A marker without an open transaction (its data is below the log start) closes nothing.
- Last stable offset at high watermark HW: the first offset of the earliest transaction
  that begins below HW and is not closed below HW; HW when there is none.
- `aborted_overlapping(fetch_offset, upper)`: aborted transactions with a marker offset
  >= fetch_offset and a first offset < upper -- Kafka's collectAbortedTxns -- ordered by
  first offset.
- Committed transactions closed below the last HW asked about matter no more and are
  dropped; aborted ones below `log_start` are dropped by `forget_below`.
- `folded_to` is the offset after the last batch folded; feeding a batch below it is a bug
  (LocalProtocolError). A log that was truncated below `folded_to` is folded again from
  scratch by the shell (a new TransactionState).
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass, field

from replicad.errors import LocalProtocolError
from replicad.records.batch import MAGIC_V2, BatchHeader
from replicad.records.records import ControlType


@dataclass(frozen=True, slots=True, order=True)
class AbortedTransaction:
    first_offset: int
    producer_id: int
    # Offset of the ABORT marker.
    last_offset: int


@dataclass(frozen=True, slots=True)
class _Closed:
    first_offset: int
    marker_offset: int


@dataclass(slots=True)
class TransactionState:
    folded_to: int = 0
    _open: dict[int, int] = field(default_factory=dict)  # producer id -> first offset
    # Committed or aborted, by marker offset: still able to hold the LSO back.
    _recently_closed: list[_Closed] = field(default_factory=list)
    _aborted: list[AbortedTransaction] = field(default_factory=list)  # by first offset

    def fold(self, header: BatchHeader, marker: ControlType | None = None) -> None:
        """Take in the next batch; `marker` is its control record's type for a control batch."""
        if header.base_offset < self.folded_to:
            raise LocalProtocolError(
                f"batch at {header.base_offset} folded after {self.folded_to - 1}"
            )
        self.folded_to = header.next_offset
        if header.magic < MAGIC_V2 or not header.is_transactional:
            return
        pid = header.producer_id
        if not header.is_control:
            self._open.setdefault(pid, header.base_offset)
            return
        if marker not in (ControlType.COMMIT, ControlType.ABORT):
            return
        first = self._open.pop(pid, None)
        if first is None:
            return
        self._recently_closed.append(_Closed(first, header.base_offset))
        if marker is ControlType.ABORT:
            bisect.insort(self._aborted, AbortedTransaction(first, pid, header.base_offset))

    def last_stable_offset(self, high_watermark: int) -> int:
        # Closed at or above HW: still open as far as a reader below HW can tell.
        self._recently_closed = [
            c for c in self._recently_closed if c.marker_offset >= high_watermark
        ]
        firsts = [c.first_offset for c in self._recently_closed if c.first_offset < high_watermark]
        firsts += [f for f in self._open.values() if f < high_watermark]
        return min(firsts, default=high_watermark)

    def aborted_overlapping(self, fetch_offset: int, upper: int) -> list[AbortedTransaction]:
        end = bisect.bisect_left(self._aborted, AbortedTransaction(upper, -(2**63), 0))
        return [a for a in self._aborted[:end] if a.last_offset >= fetch_offset]

    def forget_below(self, log_start: int) -> None:
        self._aborted = [a for a in self._aborted if a.last_offset >= log_start]
