"""Which transactional batches of a split a read_committed reader may show (sans-I/O).

Rules (Kafka's: a transaction of producer P ends with P's next COMMIT or ABORT marker):
- A transactional data batch of producer P at offset o belongs to the transaction that the
  first end-transaction marker of P at an offset > o closes. COMMIT: its records are
  visible. ABORT: they are not. No such marker in the log (as far as it was planned): the
  transaction is undecided and not visible either -- a Kafka read_committed consumer would
  stop at the last stable offset before it.
- The reader feeds every batch header of its split in offset order (`observe`, with the
  marker of control batches), then, while `needs_more`, the headers after the split, until
  every producer with a transactional batch in the split has a marker after its last one,
  or the log ends. Only markers matter after the split; new transactions there do not.
- Markers other than COMMIT/ABORT (KRaft's LEADER_CHANGE, snapshots) end no transaction.
"""

from __future__ import annotations

import bisect
import enum
from dataclasses import dataclass, field

from replicad.records.batch import BatchHeader
from replicad.records.records import ControlType


class Outcome(enum.Enum):
    COMMITTED = "committed"
    ABORTED = "aborted"
    UNDECIDED = "undecided"


_END_MARKERS = {ControlType.COMMIT: Outcome.COMMITTED, ControlType.ABORT: Outcome.ABORTED}


@dataclass(slots=True)
class _Producer:
    marker_offsets: list[int] = field(default_factory=list)  # ascending
    outcomes: list[Outcome] = field(default_factory=list)
    last_data_offset: int = -1  # last offset of its transactional data in the split


@dataclass(slots=True)
class TransactionOutcomes:
    _producers: dict[int, _Producer] = field(default_factory=dict)
    # Producers with transactional data in the split and no marker after it yet.
    _waiting: set[int] = field(default_factory=set)

    def observe(self, header: BatchHeader, marker: ControlType | None, *, in_split: bool) -> None:
        """Take the next batch header; `marker` is the control record's type of a control batch."""
        if not header.is_transactional:
            return
        producer_id = header.producer_id
        if header.is_control:
            outcome = _END_MARKERS.get(marker) if marker is not None else None
            if outcome is None:
                return
            if not in_split and producer_id not in self._waiting:
                return
            state = self._producers.setdefault(producer_id, _Producer())
            state.marker_offsets.append(header.base_offset)
            state.outcomes.append(outcome)
            self._waiting.discard(producer_id)
            return
        if not in_split:
            return
        state = self._producers.setdefault(producer_id, _Producer())
        state.last_data_offset = header.last_offset
        self._waiting.add(producer_id)

    @property
    def needs_more(self) -> bool:
        """Whether some transaction of the split has not met its marker yet."""
        return bool(self._waiting)

    def outcome(self, producer_id: int, offset: int) -> Outcome:
        """How the transaction holding `offset` of `producer_id` ended."""
        state = self._producers.get(producer_id)
        if state is None:
            return Outcome.UNDECIDED
        i = bisect.bisect_right(state.marker_offsets, offset)
        if i == len(state.marker_offsets):
            return Outcome.UNDECIDED
        return state.outcomes[i]
