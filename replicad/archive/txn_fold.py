"""Which transactions of a range of archived records were aborted, without a transaction
index: what a READ_COMMITTED answer read from the bucket must carry (Kafka answers it from
the segment's `.txnindex`, which the archive does not hold).

Rules (sans-I/O: whole batches in, transactions out):
- In a range of batches, a producer's transaction opens at its first transactional data
  batch and closes at its COMMIT or ABORT marker; a marker whose transaction opened before
  the range closes nothing the range needs (the client filters a producer's batches only
  from an aborted transaction's first offset on).
- A transaction still open at the range's end is looked for further on (`first_markers`
  over the blocks that follow: the rest of the archive, then the local log). One whose
  marker is nowhere yet is still open: the answer must stop before its first batch (it is
  at or above the last stable offset).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from replicad.errors import CorruptRecordError
from replicad.records.batch import BatchHeader, scan_batches
from replicad.records.records import ControlType, control_marker, decode_batch


@dataclass(frozen=True, slots=True)
class Ended:
    first_offset: int
    producer_id: int
    marker_offset: int
    aborted: bool


@dataclass(slots=True)
class RangeTransactions:
    ended: list[Ended] = field(default_factory=list)
    # Producer id -> first offset in the range, for transactions with no marker in it.
    still_open: dict[int, int] = field(default_factory=dict)


def _marker(data: bytes, header: BatchHeader) -> ControlType | None:
    try:
        records = decode_batch(data, header).records
        return control_marker(records[0]).type if records else None
    except (CorruptRecordError, ValueError):
        return None


def transactions_in(data: bytes) -> RangeTransactions:
    """The transactions whose data batches are in `data` (whole batches)."""
    found = RangeTransactions()
    for header in scan_batches(data, verify_crc=False).batches:
        if not header.is_transactional:
            continue
        pid = header.producer_id
        if not header.is_control:
            found.still_open.setdefault(pid, header.base_offset)
            continue
        marker = _marker(data, header)
        first = found.still_open.get(pid)
        if first is not None and marker in (ControlType.COMMIT, ControlType.ABORT):
            del found.still_open[pid]
            found.ended.append(Ended(first, pid, header.base_offset, marker is ControlType.ABORT))
    return found


def first_markers(blocks: Iterable[bytes], producers: set[int]) -> dict[int, tuple[int, bool]]:
    """Producer id -> (offset, aborted) of its first COMMIT/ABORT marker in `blocks` (whole
    batches, in offset order); stops once every producer has one."""
    found: dict[int, tuple[int, bool]] = {}
    for data in blocks:
        for header in scan_batches(data, verify_crc=False).batches:
            if header.is_control and header.producer_id in producers:
                if header.producer_id in found:
                    continue
                marker = _marker(data, header)
                if marker in (ControlType.COMMIT, ControlType.ABORT):
                    found[header.producer_id] = (header.base_offset, marker is ControlType.ABORT)
        if len(found) == len(producers):
            break
    return found
