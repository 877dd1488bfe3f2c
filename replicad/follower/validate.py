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
"""

from __future__ import annotations

from dataclasses import dataclass

from replicad.records.batch import ScanStop, scan_batches
from replicad.records.run import BASE_OFFSET, LAST_OFFSET_DELTA, BatchRun


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

    @property
    def is_empty(self) -> bool:
        return not self.batches


def validate_fetched(
    records: bytes | memoryview | None, *, fetch_offset: int, log_is_empty: bool
) -> FetchedData:
    """Rules 1-7 over one partition's records. Per batch, only the scan runs (one unpack,
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
    stop = n
    if first < n and fields[first][BASE_OFFSET] < fetch_offset:
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
            stop = overlap
    if stop <= first:
        return FetchedData(
            data=view[0:0],
            batches=BatchRun([], 0, 0),
            next_fetch_offset=fetch_offset,
            restart_at=None,
            partial_dropped=scan.stop is ScanStop.PARTIAL,
            corrupt=corrupt,
            foreign=foreign,
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
    )
