"""Decide what of a partition's fetched bytes may be written (sans-I/O).

Rules, in order:
1. Batches are checked by scan_batches: length, magic, CRC. Scanning stops at
   the first bad batch; what came before it is whole and valid.
2. A trailing partial batch is normal (KIP-74 / KIP-283 responses are cut at a
   byte limit): it is dropped and refetched, not an error.
3. Offsets only move forward: each batch starts at or after the end of the one
   before it, and the first at or after our fetch offset. Gaps are fine (the
   leader compacted, or skipped transaction markers); overlap is corruption.
4. A batch wholly below the fetch offset is skipped (the leader returned the
   batch holding our offset; we already have it).
5. On an empty local log, a first batch that straddles the fetch offset (the
   leader's log start is inside a batch, e.g. after DeleteRecords) is taken
   whole, and the log restarts at its base offset — as Kafka's follower does.
6. Nothing of a corrupt batch is ever written; the caller counts, logs and
   refetches it with backoff.
7. On a non-empty local log, a first batch that straddles the fetch offset is not
   corruption: the leader's log holds another lineage than ours at our log end (its log
   starts inside a batch another leader wrote, e.g. after an unclean election and
   DeleteRecords). Our batches end where a batch of the same lineage ends, always;
   nothing is written (`foreign` says which batch) and the caller halts the partition,
   as Kafka's follower fails it (UnexpectedAppendOffsetException on a non-empty log).
8. Epochs (checked before rule 7: a batch of another epoch holding our log end is a
   divergence to check first, not yet another lineage). Nothing from the first batch
   whose partition leader epoch is above `max_epoch` (the leader epoch the follower
   knows) on is kept, as Kafka's follower keeps nothing above the epoch it fetched with
   (KAFKA-18723): a leader we have not checked our log against wrote it. And when
   `end_epoch` is given (the epoch our log ends with, for a leader that checked nothing:
   no fencing, no DivergingEpoch), the batch at our log end must carry it: a batch of
   another epoch there starts a new epoch at our end (a leader change we have not
   checked: maybe our tail is not the leader's), so nothing is kept. `epoch_stop` says
   which batch stopped it; the caller checks divergence before fetching again. Magic 0/1
   batches carry no epoch and pass.
"""

from __future__ import annotations

from dataclasses import dataclass

from replicad.records.batch import ScanStop, scan_batches
from replicad.records.header import MAGIC_V2
from replicad.records.run import BASE_OFFSET, LAST_OFFSET_DELTA, LEADER_EPOCH, MAGIC, BatchRun


@dataclass(frozen=True, slots=True)
class FetchedData:
    data: memoryview  # whole, valid batches to append, in order
    batches: BatchRun  # their headers, positions relative to `data`
    next_fetch_offset: int  # where the next fetch starts if `data` is appended
    restart_at: int | None  # rule 5: truncate fully and start the log here first
    partial_dropped: bool  # rule 2
    corrupt: str | None  # rule 6: what was wrong (None if nothing)
    # Rule 7: (base offset, last offset) of the leader's batch holding our log end.
    foreign: tuple[int, int] | None = None
    # Rule 8: (base offset, partition leader epoch) of the first batch not kept for its
    # epoch.
    epoch_stop: tuple[int, int] | None = None

    @property
    def is_empty(self) -> bool:
        return not self.batches


def validate_fetched(
    records: bytes | memoryview | None,
    *,
    fetch_offset: int,
    log_is_empty: bool,
    max_epoch: int | None = None,
    end_epoch: int | None = None,
) -> FetchedData:
    """Rules 1-8 over one partition's records. Per batch, only the scan runs (one unpack,
    one CRC, one compare of offsets); no object is made per batch. The batches kept are
    known to rise (`BatchRun.rising`), so the log does not check them again."""
    view = memoryview(records if records is not None else b"")
    scan = scan_batches(view)
    corrupt = scan.error if scan.stop is ScanStop.CORRUPT else None
    run = scan.run
    fields = run.fields
    n = len(fields)
    first = 0
    while first < n and fields[first][BASE_OFFSET] + fields[first][LAST_OFFSET_DELTA] < (
        fetch_offset
    ):
        first += 1  # rule 4
    restart_at: int | None = None
    foreign: tuple[int, int] | None = None
    stop, epoch_stop = _epoch_stop(run, first, max_epoch, end_epoch)  # rule 8
    if first < stop and fields[first][BASE_OFFSET] < fetch_offset:
        base = fields[first][BASE_OFFSET]
        if log_is_empty:
            restart_at = base  # rule 5
        else:
            foreign = (base, base + fields[first][LAST_OFFSET_DELTA])  # rule 7
            stop = first
    if stop > first:
        overlap = run.first_overlap(first)  # rule 3 within the response
        if overlap is not None:
            previous = fields[overlap - 1]
            corrupt = (
                f"batch at offset {fields[overlap][BASE_OFFSET]} overlaps the previous data "
                f"(expected offset >= "
                f"{previous[BASE_OFFSET] + previous[LAST_OFFSET_DELTA] + 1})"
            )
            stop = min(stop, overlap)
    if stop <= first:
        return FetchedData(
            data=view[0:0],
            batches=BatchRun([], 0, 0),
            next_fetch_offset=fetch_offset,
            restart_at=None,
            partial_dropped=scan.stop is ScanStop.PARTIAL,
            corrupt=corrupt,
            foreign=foreign,
            epoch_stop=epoch_stop,
        )
    kept = run[first:stop] if first or stop < n else run
    return FetchedData(
        data=view[kept.start : kept.end],
        batches=BatchRun(kept.fields, 0, kept.size, rising=True),
        next_fetch_offset=kept.next_offset,
        restart_at=restart_at,
        partial_dropped=scan.stop is ScanStop.PARTIAL,
        corrupt=corrupt,
        foreign=foreign,
        epoch_stop=epoch_stop,
    )


def _epoch_stop(
    run: BatchRun, first: int, max_epoch: int | None, end_epoch: int | None
) -> tuple[int, tuple[int, int] | None]:
    """Rule 8: where the kept batches stop for their epochs (len(run) if they do not), and
    the batch there. One pass in C when every epoch is at most `max_epoch`."""
    fields = run.fields
    n = len(fields)
    if first >= n:
        return n, None
    head = fields[first]
    if (
        end_epoch is not None
        and end_epoch >= 0
        and head[MAGIC] >= MAGIC_V2
        and head[LEADER_EPOCH] >= 0
        and head[LEADER_EPOCH] != end_epoch
    ):
        return first, (head[BASE_OFFSET], head[LEADER_EPOCH])
    if max_epoch is None or max_epoch < 0:
        return n, None
    above = run.first_epoch_above(max_epoch, first)
    if above is None:
        return n, None
    return above, (fields[above][BASE_OFFSET], fields[above][LEADER_EPOCH])
