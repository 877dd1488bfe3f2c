"""The replica's side of the daemon's continuous check: a partition's log, read while the
follower writes it.

`replicad run` owns the partition's `PartitionLog`; this reads it as `serve` does: the log
finds the region under its lock (offset index, one segment at a time) and the bytes are
read with pread, never mapped (a segment truncated under a mapping would kill the process
with SIGBUS). Every method blocks on disk: the shell calls them through `asyncio.to_thread`.

Rules:
- The range is [log start, log end) as the log says when asked; a walk keeps that end.
- `slice(low, high)` is every whole batch that ends at or past `low` and starts at or before
  `high` (what compare.py's rules ask for), read `max_bytes` at a time. A damaged entry ends
  it with the offset where reading stopped (`unreadable_at`), and so does a read the log
  refuses as damaged (DamagedLogError: no batch where one must start).
- When the log no longer holds what is asked (local retention moved its start past `low`,
  or deleted the segment between finding and reading it), `ReplicaMoved` is raised: what
  the walk would compare is no longer the replica, so nothing is concluded from it; the
  daemon tries again from the new start on its next pass.
"""

from __future__ import annotations

from replicad.errors import DamagedLogError, OffsetOutOfRangeError, ReplicadError
from replicad.log.partition import PartitionLog
from replicad.records.batch import ScanStop, header_at, scan_batches
from replicad.verify.compare import Batch, OffsetRange, ReplicaSlice


class ReplicaMoved(ReplicadError):
    """The log changed under the read (retention): try again on the next pass."""


class LogReplica:
    def __init__(self, log: PartitionLog, max_bytes: int) -> None:
        self.log = log
        self.max_bytes = max_bytes

    def offsets(self) -> OffsetRange:
        start = self.log.log_start_offset
        return OffsetRange(start, max(start, self.log.log_end_offset))

    def slice(self, low: int, high: int) -> ReplicaSlice:
        batches: list[Batch] = []
        offset = low
        while offset <= high:
            try:
                data, position = self._read(offset, self.max_bytes)
            except DamagedLogError as exc:
                # The log found no batch where one must start (log/partition.py): damage
                # at `offset`, never the batches after it taken for the next.
                return ReplicaSlice(batches, offset, str(exc))
            if data is None:
                break
            scan = scan_batches(data, verify_crc=False)
            for header in scan.batches:
                if header.base_offset > high:
                    return ReplicaSlice(batches)
                batches.append(Batch.from_header(header, data))
            if scan.stop is ScanStop.CORRUPT or not scan.batches:
                # A read starts at a batch and holds at least that batch whole: a scan that
                # finds none there, or stops at a bad entry, found damage.
                at = scan.batches[-1].next_offset if scan.batches else offset
                why = scan.error or "a torn batch"
                return ReplicaSlice(batches, at, f"{self.log.topic_partition}: {why} at {position}")
            offset = scan.batches[-1].next_offset
        return ReplicaSlice(batches)

    def batch_start(self, offset: int) -> int | None:
        """The base offset of the batch that holds `offset` (None: none does any more)."""
        try:
            data, _ = self._read(offset, 0)
        except DamagedLogError:
            return offset  # the walk from here finds the damage and names it
        if data is None:
            return None
        header = header_at(data, 0)
        return None if isinstance(header, str) else header.base_offset

    def _read(self, offset: int, max_bytes: int) -> tuple[bytes | None, int]:
        try:
            read = self.log.read(offset, max_bytes)
            if read.region is None:
                return None, 0
            return read.region.read_bytes(), read.region.position
        except (OffsetOutOfRangeError, FileNotFoundError) as exc:
            raise ReplicaMoved(f"{self.log.topic_partition}: {exc}") from exc
