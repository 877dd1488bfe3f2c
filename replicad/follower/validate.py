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

from dataclasses import dataclass, replace

from replicad.records.batch import BatchHeader, ScanStop, scan_batches


@dataclass(frozen=True, slots=True)
class FetchedData:
    data: memoryview  # whole, valid batches to append, in order
    batches: list[BatchHeader]  # their headers, positions relative to `data`
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
    view = memoryview(records if records is not None else b"")
    scan = scan_batches(view)
    corrupt = scan.error if scan.stop is ScanStop.CORRUPT else None
    kept: list[BatchHeader] = []
    start_pos: int | None = None
    end_pos = 0
    expected = fetch_offset
    restart_at: int | None = None
    foreign: tuple[int, int] | None = None
    for batch in scan.batches:
        if batch.last_offset < expected and not kept:
            continue  # rule 4
        if batch.base_offset < expected:
            if not kept and log_is_empty and restart_at is None:
                restart_at = batch.base_offset  # rule 5
            elif not kept and restart_at is None:
                foreign = (batch.base_offset, batch.last_offset)  # rule 7
                break
            else:
                corrupt = (
                    f"batch at offset {batch.base_offset} overlaps the previous data "
                    f"(expected offset >= {expected})"
                )
                break
        if start_pos is None:
            start_pos = batch.position
        elif batch.position != end_pos:
            # Defensive: skipped bytes inside the kept run would misalign positions.
            corrupt = f"non-contiguous batches at position {batch.position}"
            break
        kept.append(batch)
        end_pos = batch.position + batch.size
        expected = batch.next_offset
    if start_pos is None:
        data = view[0:0]
        rebased: list[BatchHeader] = []
    else:
        data = view[start_pos:end_pos]
        rebased = [replace(b, position=b.position - start_pos) for b in kept] if start_pos else kept
    return FetchedData(
        data=data,
        batches=rebased,
        next_fetch_offset=expected,
        restart_at=restart_at,
        partial_dropped=scan.stop is ScanStop.PARTIAL,
        corrupt=corrupt,
        foreign=foreign,
    )
