"""Reading a Fetch's partitions from the local log: Kafka's readFromLog, KIP-74 limits included.

Rules (ReplicaManager.readFromLog, Partition.readRecords, LocalLog/LogSegment.read):
- Partitions are read in the order given. The response budget starts at the request's
  max_bytes (capped by the server's fetch.max.bytes) and shrinks by each partition's records
  size; a partition may take min(its max_bytes, what is left).
- From Fetch v3 on (no hard limit) the first partition that returns records returns at least
  its first whole batch, whatever the limits ("min one message"); after it, limits hold. A
  partition whose allowance is smaller than the batch at its fetch offset returns no records
  (v3+), or the cut-off start of that batch (v0-v2, whose clients then ask for more).
- A read never crosses a segment and stops at the reader's bound: the log end for followers,
  the high watermark for consumers, the last stable offset for READ_COMMITTED consumers.
  A fetch offset at or past the bound (but not past the log end) reads nothing.
- Errors: unknown partition -> UNKNOWN_TOPIC_OR_PARTITION; a current leader epoch below ours ->
  FENCED_LEADER_EPOCH, above -> UNKNOWN_LEADER_EPOCH; a fetch offset outside
  [log start, log end] -> OFFSET_OUT_OF_RANGE; a damaged segment where the read starts ->
  CORRUPT_MESSAGE (Kafka's CorruptRecordException); a failing disk -> KAFKA_STORAGE_ERROR.
  With a last fetched epoch (v12+): its end offset unknown -> OFFSET_OUT_OF_RANGE; an epoch
  that ends before the fetch offset, or only a lower epoch known -> no records and
  `diverging` = (that epoch, its end offset).
- High watermark = the partition's checkpointed one: what is replicated and on disk.
- READ_COMMITTED answers carry the last stable offset and the aborted transactions that
  overlap [fetch offset, last stable offset), folded from the log (see transactions.py);
  the fold is done on a partition's first READ_COMMITTED read (the whole log is read once)
  and kept up to date after. Other answers report the high watermark as the last stable
  offset (replicad does not fold transactions nobody asked for).
- Two steps: `plan_reads` answers every partition but its records (the catalog, the
  offsets, the epochs, the transaction fold: serve's event loop); `PlannedReads.read_records`
  finds the records, in request order under the budget. Finding a region reads the batch
  header where it starts (one pread a partition, more when the index points below it), so
  serve runs that step on a worker thread: its loop never waits on those reads. The fold
  still reads the log on the loop (a READ_COMMITTED partition's new batches).
"""

from __future__ import annotations

import enum
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import NamedTuple

import structlog
from kio.schema.errors import ErrorCode

from replicad.errors import DamagedLogError, OffsetOutOfRangeError, ReplicadError
from replicad.leader.catalog import Catalog
from replicad.leader.transactions import AbortedTransaction, TransactionState
from replicad.log import nowait
from replicad.log.epoch import UNDEFINED_EPOCH, UNDEFINED_EPOCH_OFFSET
from replicad.log.nowait import WouldWait
from replicad.log.partition import PartitionLog
from replicad.log.segment import FileRegion
from replicad.records.batch import BatchHeader, header_at, scan_batches
from replicad.records.records import control_marker, decode_batch
from replicad.session.metadata import PartitionFetch
from replicad.types import TopicPartition
from replicad.wire import UNKNOWN_OFFSET

log = structlog.get_logger("replicad.leader")

# How much of a partition the transaction fold reads at a time.
FOLD_READ_BYTES = 1024 * 1024


class Isolation(enum.Enum):
    LOG_END = "log_end"  # followers
    HIGH_WATERMARK = "high_watermark"  # consumers, READ_UNCOMMITTED
    TXN_COMMITTED = "txn_committed"  # consumers, READ_COMMITTED


@dataclass(frozen=True, slots=True)
class DivergingEpoch:
    epoch: int
    end_offset: int


@dataclass(slots=True)
class PartitionAnswer:
    """One partition's part of a Fetch answer, its records still on disk."""

    partition: TopicPartition
    fetch_offset: int
    error_code: int = ErrorCode.none
    high_watermark: int = UNKNOWN_OFFSET
    last_stable_offset: int = UNKNOWN_OFFSET
    log_start_offset: int = UNKNOWN_OFFSET
    # Or the bytes of a read of the archive's bucket (remote_fetch.py: RemoteRecords, bytes
    # with a `size`), or of a small read (RecordBytes), sent as they are.
    records: FileRegion | None = None
    aborted: tuple[AbortedTransaction, ...] | None = None
    diverging: DivergingEpoch | None = None
    # There is readable data at or past the fetch offset (the session re-reads it).
    more_data: bool = False

    @property
    def records_size(self) -> int:
        return self.records.size if self.records is not None else 0


@dataclass(frozen=True, slots=True)
class ReadLimits:
    max_bytes: int
    isolation: Isolation
    # Fetch v0-v2: no "min one message", a too-small allowance returns a cut-off batch.
    hard_max_bytes_limit: bool


def read_partitions(
    catalog: Catalog,
    reads: Sequence[tuple[TopicPartition, PartitionFetch]],
    limits: ReadLimits,
    transactions: TransactionTracker,
    *,
    now_ms: int,
    refuse: Callable[[TopicPartition, PartitionFetch], int] | None = None,
) -> list[PartitionAnswer]:
    """Read `reads` in order under KIP-74's budget; `refuse` may pre-empt a read with an error.
    Both steps on the calling thread (see PlannedReads for the split serve uses)."""
    planned = plan_reads(catalog, reads, limits, transactions, now_ms=now_ms, refuse=refuse)
    return planned.read_records()


def plan_reads(
    catalog: Catalog,
    reads: Sequence[tuple[TopicPartition, PartitionFetch]],
    limits: ReadLimits,
    transactions: TransactionTracker,
    *,
    now_ms: int,
    refuse: Callable[[TopicPartition, PartitionFetch], int] | None = None,
) -> PlannedReads:
    """Every partition's answer but its records: the first step of read_partitions."""
    answers = []
    to_read: list[_RecordsToRead] = []
    for tp, fetch in reads:
        error = refuse(tp, fetch) if refuse is not None else ErrorCode.none
        if error != ErrorCode.none:
            answers.append(PartitionAnswer(tp, fetch.fetch_offset, error_code=error))
            continue
        try:
            answer = _plan_partition(
                catalog, tp, fetch, limits, transactions, to_read, len(answers), now_ms=now_ms
            )
        except (OSError, ReplicadError) as exc:
            answer = _failed(tp, fetch.fetch_offset, exc)
        answers.append(answer)
    return PlannedReads(answers, to_read, limits)


class _RecordsToRead(NamedTuple):
    """A partition whose answer takes records: where, and up to where, to read them."""

    index: int  # its answer's place in PlannedReads.answers
    plog: PartitionLog
    bound: int
    end: int
    max_bytes: int
    # The active segment and its size, taken before `end`: where the bytes below `end` stop
    # in it, however many appends come before the read (it may run on another thread).
    end_path: Path
    end_size: int


@dataclass(slots=True)
class PlannedReads:
    """A Fetch's answers in request order, those that take records still without them.

    The split keeps the disk off serve's event loop: planning needs the catalog and the
    transaction fold, which the loop owns; `read_records` only reads partition logs (safe
    from any thread: log/partition.py's reads) and reads the batch headers that find each
    region, so serve runs it on a worker thread. The budget is spent in request order
    there: answers without records take none of it."""

    answers: list[PartitionAnswer]
    to_read: list[_RecordsToRead]
    limits: ReadLimits
    # The records read_records found, and those it read too, in bytes.
    records_bytes: int = 0
    bytes_read: int = 0

    @property
    def reads_disk(self) -> bool:
        return bool(self.to_read)

    def read_records(self, *, bytes_up_to: int = 0, bytes_from: int = 0) -> list[PartitionAnswer]:
        """The answers with their records (KIP-74's budget; see the module rules). Call once,
        but for a WouldWait: inside log/nowait.py's `not_waiting()` (serve's loop) a read of
        bytes not in the page cache raises it before anything here has changed, and the
        caller reads again where it may wait (a worker thread).
        When the records found are `bytes_from` to `bytes_up_to` bytes in all, they are read
        too, each answer's as RecordBytes: serve asks this of a small read it will answer at
        once, so that reading its bytes takes no second read (a hop) when it is sent."""
        found = self._find_records()
        records_bytes = sum(got.size for _, got in found if isinstance(got, FileRegion))
        bytes_read = 0
        if bytes_up_to > 0 and bytes_from <= records_bytes <= bytes_up_to:
            found = [
                (index, _record_bytes(got) if isinstance(got, FileRegion) else got)
                for index, got in found
            ]
        # Nothing raised: the answers take what was found.
        answers = self.answers
        for index, got in found:
            if isinstance(got, PartitionAnswer):
                answers[index] = got
                continue
            answers[index].records = got
            if isinstance(got, RecordBytes):
                bytes_read += got.size
        self.records_bytes += records_bytes
        self.bytes_read += bytes_read
        return answers

    def _find_records(self) -> list[tuple[int, FileRegion | PartitionAnswer]]:
        """Each partition's region, or the answer that replaces its own (an error), by the
        index of its answer; the answers themselves unchanged (see read_records)."""
        limits = self.limits
        budget = limits.max_bytes
        min_one = not limits.hard_max_bytes_limit
        answers = self.answers
        found: list[tuple[int, FileRegion | PartitionAnswer]] = []
        for where in self.to_read:
            index = where.index
            answer = answers[index]
            allowance = min(where.max_bytes, budget)
            if not (min_one or allowance > 0):
                continue
            try:
                region = _records(where, answer.fetch_offset, allowance, min_one, limits)
            except OffsetOutOfRangeError:
                # Truncated or deleted under us since the offsets were taken.
                found.append(
                    (
                        index,
                        PartitionAnswer(
                            answer.partition,
                            answer.fetch_offset,
                            error_code=ErrorCode.offset_out_of_range,
                        ),
                    )
                )
                continue
            except (OSError, ReplicadError) as exc:
                found.append((index, _failed(answer.partition, answer.fetch_offset, exc)))
                continue
            if region is not None:
                found.append((index, region))
                if region.size > 0:
                    min_one = False
                budget = max(0, budget - region.size)
        return found


class RecordBytes(bytes):
    """A partition's records read with its answer (`read_records`), sent as they are; `size`
    as a FileRegion has (archive's RemoteRecords are the bucket's)."""

    @property
    def size(self) -> int:
        return len(self)


def _record_bytes(region: FileRegion) -> FileRegion | RecordBytes:
    """The region's bytes; those left on disk if its segment was cut since the region was
    found (the answer then says that size); the region itself if the file is gone (its
    send pads it, as any region gone before it is sent)."""
    try:
        fd = os.open(region.path, os.O_RDONLY)  # not `open`: no file object (15.6 -> 6.4 us)
    except OSError:
        return region
    try:
        return RecordBytes(nowait.pread(fd, region.size, region.position))
    except OSError:
        return region
    finally:
        os.close(fd)


def _failed(tp: TopicPartition, offset: int, exc: OSError | ReplicadError) -> PartitionAnswer:
    # Kafka: a failing log dir is KAFKA_STORAGE_ERROR; a damaged segment
    # (CorruptRecordException) CORRUPT_MESSAGE; anything else unknown.
    if isinstance(exc, OSError):
        code = ErrorCode.kafka_storage_error
    elif isinstance(exc, DamagedLogError):
        code = ErrorCode.corrupt_message
    else:
        code = ErrorCode.unknown_server_error
    log.warning("partition read failed", partition=str(tp), error=str(exc))
    return PartitionAnswer(tp, offset, error_code=code)


def _plan_partition(
    catalog: Catalog,
    tp: TopicPartition,
    fetch: PartitionFetch,
    limits: ReadLimits,
    transactions: TransactionTracker,
    to_read: list[_RecordsToRead],
    index: int,
    *,
    now_ms: int,
) -> PartitionAnswer:
    """The partition's answer; when it takes records, `to_read` gets where they are."""
    offset = fetch.fetch_offset
    plog = catalog.partition(tp, now_ms=now_ms)
    if plog is None:
        return PartitionAnswer(tp, offset, error_code=ErrorCode.unknown_topic_or_partition)
    if fetch.current_leader_epoch >= 0:  # KIP-320: only a request naming one is checked
        epoch_error = check_leader_epoch(catalog.leader_epoch(plog), fetch.current_leader_epoch)
        if epoch_error != ErrorCode.none:
            return PartitionAnswer(tp, offset, error_code=epoch_error)
    active = plog.active_segment  # before the log end (see _RecordsToRead)
    end_path, end_size = active.log_path, active.size
    hw = plog.high_watermark
    start = plog.log_start_offset
    end = plog.log_end_offset
    committed = limits.isolation is Isolation.TXN_COMMITTED
    state = transactions.state(tp, plog) if committed else None
    lso = state.last_stable_offset(hw) if state is not None else hw
    # The answer is made once, when its fields are known (a partition costs a few
    # microseconds, not a dataclass copy per field: 200 partitions a Fetch).
    aborted: tuple[AbortedTransaction, ...] | None = () if committed else None
    if fetch.last_fetched_epoch >= 0:
        ours = plog.end_offset_for_epoch(fetch.last_fetched_epoch)
        if ours.end_offset == UNDEFINED_EPOCH_OFFSET or ours.epoch == UNDEFINED_EPOCH:
            return PartitionAnswer(tp, offset, error_code=ErrorCode.offset_out_of_range)
        if offset < start:
            return PartitionAnswer(tp, offset, error_code=ErrorCode.offset_out_of_range)
        if ours.epoch < fetch.last_fetched_epoch or ours.end_offset < offset:
            return _answer_with_offsets(
                tp,
                offset,
                hw,
                lso,
                start,
                aborted,
                diverging=DivergingEpoch(ours.epoch, ours.end_offset),
            )
    if offset < start or offset > end:
        return PartitionAnswer(tp, offset, error_code=ErrorCode.offset_out_of_range)
    isolation = limits.isolation
    if isolation is Isolation.HIGH_WATERMARK:
        bound = hw
    elif isolation is Isolation.LOG_END:
        bound = end
    else:
        bound = lso
    if offset >= bound:
        return _answer_with_offsets(tp, offset, hw, lso, start, aborted)
    if state is not None:
        aborted = tuple(state.aborted_overlapping(offset, bound))
    to_read.append(_RecordsToRead(index, plog, bound, end, fetch.max_bytes, end_path, end_size))
    return _answer_with_offsets(tp, offset, hw, lso, start, aborted, more_data=True)


def _answer_with_offsets(
    tp: TopicPartition,
    offset: int,
    hw: int,
    lso: int,
    start: int,
    aborted: tuple[AbortedTransaction, ...] | None,
    *,
    records: FileRegion | None = None,
    diverging: DivergingEpoch | None = None,
    more_data: bool = False,
) -> PartitionAnswer:
    """An answer without an error: the partition's offsets and aborted transactions, with
    what the read found: records, a diverging epoch, or nothing (an offset at or past the bound)."""
    return PartitionAnswer(
        tp,
        offset,
        high_watermark=hw,
        last_stable_offset=lso,
        log_start_offset=start,
        records=records,
        aborted=aborted,
        diverging=diverging,
        more_data=more_data,
    )


def _records(
    where: _RecordsToRead, offset: int, allowance: int, min_one: bool, limits: ReadLimits
) -> FileRegion | None:
    """The records to send from `offset`, below `where.bound`, within `allowance` (KIP-74:
    the first batch whole when `min_one`); None when nothing may go."""
    plog = where.plog
    # One read: from the batch holding `offset`, max(allowance, its first batch) bytes at
    # most, so the first batch fits the allowance exactly when the region does.
    whole = plog.read(offset, max(allowance, 0)).region
    if whole is None:
        return None
    size = whole.size
    if not min_one and allowance < size:
        if not limits.hard_max_bytes_limit:
            return None  # the first batch does not fit
        size = allowance
    if where.bound < where.end:
        size = min(size, _position_of(plog, where.bound, whole) - whole.position)
    elif whole.path == where.end_path:
        # Batches appended since the plan took the log end are past the bound: a consumer
        # must not get what its answer's high watermark does not cover.
        size = min(size, where.end_size - whole.position)
    elif whole.path > where.end_path:  # a segment rolled since (names: base offsets)
        size = min(size, _position_of(plog, where.bound, whole) - whole.position)
    if size <= 0:
        return None
    return whole if size == whole.size else FileRegion(whole.path, whole.position, size)


def check_leader_epoch(ours: int, theirs: int) -> int:
    """KIP-320: a request that names a leader epoch must name ours."""
    if theirs < 0 or theirs == ours:
        return ErrorCode.none
    return ErrorCode.fenced_leader_epoch if ours > theirs else ErrorCode.unknown_leader_epoch


def _position_of(plog: PartitionLog, bound: int, region: FileRegion) -> int:
    """Where, in `region`'s segment, the batches at or past offset `bound` start."""
    at = plog.read(bound, 0).region
    if at is None or at.path != region.path:
        return region.position + region.size
    return at.position


# -- transaction state, folded from the log -----------------------------------------------------


@dataclass(slots=True)
class _Folded:
    plog: PartitionLog
    state: TransactionState
    # The last batch folded, to notice a truncation that was followed by new appends.
    last: BatchHeader | None = None


@dataclass(slots=True)
class TransactionTracker:
    """Each READ_COMMITTED partition's TransactionState, folded up to its log end on demand."""

    fold_read_bytes: int = FOLD_READ_BYTES
    _folded: dict[TopicPartition, _Folded] = field(default_factory=dict)
    # Bytes read by folds (a measure for tests and benchmarks).
    bytes_read: int = 0

    def state(self, tp: TopicPartition, plog: PartitionLog) -> TransactionState:
        """`tp`'s state, folded up to its log end. Inside log/nowait.py's `not_waiting()`
        (serve's loop) a fold that would read bytes not in the page cache stops at a batch
        (the state is whole, folded less far) and raises FoldWouldWait: its `read_ahead`,
        on a worker thread, reads what it needs next into the cache, and a call again
        folds on from where this one stopped."""
        entry = self._folded.get(tp)
        if entry is None or entry.plog is not plog or not self._still_valid(entry):
            entry = _Folded(plog, TransactionState())
            self._folded[tp] = entry
        self._fold_forward(entry)
        entry.state.forget_below(plog.log_start_offset)
        return entry.state

    def forget(self, tp: TopicPartition) -> None:
        self._folded.pop(tp, None)

    def _still_valid(self, entry: _Folded) -> bool:
        plog, folded_to = entry.plog, entry.state.folded_to
        if plog.log_end_offset < folded_to or plog.log_start_offset > folded_to:
            return False
        if entry.last is None:
            return True
        try:
            region = plog.read(entry.last.base_offset, 0).region
            if region is None:
                return False
            head = header_at(_read_region(region, min(region.size, 64)), region.position)
        except OffsetOutOfRangeError:
            return False
        except WouldWait as exc:
            raise FoldWouldWait(plog, entry.last.base_offset, exc.cannot_tell) from None
        return not isinstance(head, str) and (head.base_offset, head.crc) == (
            entry.last.base_offset,
            entry.last.crc,
        )

    def _fold_forward(self, entry: _Folded) -> None:
        plog, state = entry.plog, entry.state
        offset = max(state.folded_to, plog.log_start_offset)
        while offset < plog.log_end_offset:
            try:
                region = plog.read(offset, self.fold_read_bytes).region
                if region is None:
                    return
                data = _read_region(region, region.size)
            except OffsetOutOfRangeError:
                return
            except WouldWait as exc:  # the batches before `offset` are folded: a whole state
                raise FoldWouldWait(plog, offset, exc.cannot_tell) from None
            self.bytes_read += len(data)
            scan = scan_batches(data, verify_crc=False)
            if not scan.batches:
                return
            for header in scan.batches:
                if header.base_offset < state.folded_to:
                    continue
                marker = None
                if header.is_control:
                    records = decode_batch(data, header).records
                    marker = control_marker(records[0]).type if records else None
                state.fold(header, marker)
                entry.last = header
            offset = scan.batches[-1].next_offset


def _read_region(region: FileRegion, size: int) -> bytes:
    """The first `size` bytes of `region` (fewer where its file ends), through nowait.pread
    (so a fold on serve's loop does not wait: see TransactionTracker.state)."""
    fd = os.open(region.path, os.O_RDONLY)
    try:
        return nowait.pread(fd, size, region.position)
    finally:
        os.close(fd)


# How far a fold that would have waited is read ahead (FoldWouldWait.read_ahead): a fold
# of a whole log on the loop (its first READ_COMMITTED read) then hops once per this many
# bytes, not once per FOLD_READ_BYTES.
FOLD_READ_AHEAD_BYTES = 16 * FOLD_READ_BYTES


class FoldWouldWait(WouldWait):
    """A transaction fold inside `not_waiting()` stopped at `offset` of `plog`: its next
    bytes are not in the page cache (TransactionTracker.state)."""

    def __init__(self, plog: PartitionLog, offset: int, cannot_tell: bool) -> None:
        super().__init__(
            f"{plog.topic_partition}: the fold's read at offset {offset} would wait",
            cannot_tell=cannot_tell,
        )
        self.plog = plog
        self.offset = offset

    def read_ahead(self) -> int:
        """On a worker thread: the fold's next bytes (FOLD_READ_AHEAD_BYTES at most, in one
        segment) read into the page cache; the bytes read. A log changed since (cut, rolled,
        gone) reads what is there, or nothing: the fold that follows finds out."""
        try:
            region = self.plog.read(self.offset, FOLD_READ_AHEAD_BYTES).region
        except (OSError, ReplicadError):
            return 0
        if region is None:
            return 0
        scratch = bytearray(min(region.size, FOLD_READ_BYTES))
        got = 0
        try:
            fd = os.open(region.path, os.O_RDONLY)
        except OSError:
            return 0
        try:
            while got < region.size:
                view = memoryview(scratch)[: min(len(scratch), region.size - got)]
                n = os.preadv(fd, [view], region.position + got)
                if n <= 0:
                    break
                got += n
        except OSError:
            pass
        finally:
            os.close(fd)
        return got
