"""The replica's side of `verify --against-source`: one partition directory read as batches.

Read only, and safe while `replicad run` writes the directory: each segment is scanned
header by header (no CRC check here: the comparison finds a changed byte, and says whether
the replica's CRC still holds); the last segment may end in a batch being written, which is
left out. Memory: one segment's batch headers at a time, and the bytes of the batches asked
for (about one fetch answer's worth).
"""

from __future__ import annotations

import bisect
import mmap
import os
import random
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from replicad.log.layout import LOG_SUFFIX, classify_partition_files, segment_file_name
from replicad.records.batch import BatchHeader, ScanStop, scan_batches
from replicad.verify.compare import Batch, OffsetRange, ReplicaSlice


@dataclass(slots=True)
class _Segment:
    base: int
    name: str
    headers: list[BatchHeader]
    last_offsets: list[int]
    data: mmap.mmap | None
    damage: str | None  # why the scan stopped before the segment's end


class ReplicaPartition:
    def __init__(self, directory: Path) -> None:
        self.directory = Path(directory)
        listing = classify_partition_files(sorted(os.listdir(self.directory)))
        self.bases = list(listing.segments)
        self._open: _Segment | None = None

    # -- segments ---------------------------------------------------------------------

    def _segment(self, index: int) -> _Segment:
        base = self.bases[index]
        if self._open is not None and self._open.base == base:
            return self._open
        self.close()
        name = segment_file_name(base, LOG_SUFFIX)
        with open(self.directory / name, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            data = mmap.mmap(f.fileno(), size, access=mmap.ACCESS_READ) if size else None
        view = memoryview(data) if data is not None else memoryview(b"")
        try:
            scan = scan_batches(view, verify_crc=False)
            headers = scan.batches
        finally:
            view.release()
        damage = None
        last = index == len(self.bases) - 1
        if scan.stop is ScanStop.CORRUPT:
            damage = f"{name}: {scan.error}"
        elif scan.stop is ScanStop.PARTIAL and not last:
            damage = f"{name}: torn batch at position {scan.valid_bytes}"
        self._open = _Segment(base, name, headers, [h.last_offset for h in headers], data, damage)
        return self._open

    def close(self) -> None:
        if self._open is not None and self._open.data is not None:
            self._open.data.close()
        self._open = None

    # -- what the shell asks ----------------------------------------------------------

    def offsets(self) -> OffsetRange:
        """[first batch's base offset, next offset after the last whole batch); empty
        (0, 0) when there is no batch. Reads the first and the last segments that hold a
        batch, not those between: damage there is found by the walk, at its offset."""
        first = next(
            (
                self._segment(i).headers[0].base_offset
                for i in range(len(self.bases))
                if self._segment(i).headers
            ),
            None,
        )
        end = next(
            (
                self._segment(i).headers[-1].next_offset
                for i in reversed(range(len(self.bases)))
                if self._segment(i).headers
            ),
            None,
        )
        if first is None or end is None:
            return OffsetRange(0, 0)
        return OffsetRange(first, end)

    def batch_offsets(self) -> Iterator[int]:
        """Every whole batch's base offset, in order (up to any damage)."""
        for i in range(len(self.bases)):
            segment = self._segment(i)
            for header in segment.headers:
                yield header.base_offset
            if segment.damage is not None:
                return

    def sample(self, count: int, seed: int) -> list[int]:
        """`count` batches' base offsets drawn at random over the whole log, in offset
        order; seeded, so the same seed over the same replica draws the same batches.
        Memory: `count` offsets (a reservoir), whatever the log's length."""
        rng = random.Random(seed)
        chosen: list[int] = []
        for seen, offset in enumerate(self.batch_offsets()):
            if seen < count:
                chosen.append(offset)
            else:
                slot = rng.randrange(seen + 1)
                if slot < count:
                    chosen[slot] = offset
        return sorted(chosen)

    def slice(self, low: int, high: int) -> ReplicaSlice:
        """Every whole batch that ends at or past `low` and starts at or before `high`;
        and where reading stopped, when a damaged entry stopped it first."""
        batches: list[Batch] = []
        index = max(bisect.bisect_right(self.bases, low) - 1, 0)
        while index < len(self.bases):
            segment = self._segment(index)
            start = bisect.bisect_left(segment.last_offsets, low)
            for header in segment.headers[start:]:
                if header.base_offset > high:
                    return ReplicaSlice(batches)
                assert segment.data is not None
                batches.append(Batch.from_header(header, segment.data))
            if segment.damage is not None:
                after = segment.headers[-1].next_offset if segment.headers else segment.base
                return ReplicaSlice(batches, after, segment.damage)
            index += 1
        return ReplicaSlice(batches)
