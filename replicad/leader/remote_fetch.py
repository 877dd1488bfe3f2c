"""`serve` reading what is only in the bucket (KIP-405's remote fetch), beside the local reads.

Rules (Kafka's ReplicaManager with tiered storage: readFromLog's OffsetOutOfRange below the
local log start becomes a RemoteStorageFetchInfo, served by DelayedRemoteFetch):
- The local read runs first, as without an archive (reads.py, untouched). A partition it
  answers OFFSET_OUT_OF_RANGE at an offset below the local log start is read from the
  bucket (archive/remote_log.py) when the archive holds that offset; otherwise it stays
  OFFSET_OUT_OF_RANGE.
- One partition a Fetch is read from the bucket (the first in the answer's order), as
  Kafka does; other partitions the bucket holds, or whose manifest is not read yet, answer
  no records and no error, with their offsets, so the client asks again (an incremental
  session moves the partition that returned data to the end, so the next fetch reads the
  next one).
- The bucket is read on threads of its own (`archive.read_threads`, bounded concurrency),
  never on the event loop: only the connection that asked waits; consumers of the local
  tail on other connections go on. The bytes come through the read cache
  (`archive.read_cache_bytes`).
- The remote answer's records are whole batches, within the fetch's budget (what the local
  answers already took is subtracted; KIP-74's first batch whole when none had records).
  Its log start offset is the archive's, its high watermark the local one.
- READ_COMMITTED answers from the bucket carry the aborted transactions of their batches,
  found without a transaction index (Kafka's `.txnindex`, which the archive does not
  upload): folded from the batches read, and for a transaction still open at their end,
  its marker looked for further on, in the archive then the local log below the high
  watermark (archive/txn_fold.py), `MARKER_SEARCH_BYTES` a fetch at most. A transaction
  whose marker is not found yet ends the answer before its first batch; the search
  resumes where it stopped at the next fetch (so a marker any distance away is found
  after enough fetches, and the consumer moves), and markers found are kept
  (`KNOWN_TRANSACTIONS` at most, the oldest forgotten first): a consumer reading on does
  not search again. Both are facts about records below the high watermark, which do not
  change.
- The memory a remote answer holds is taken from the request memory pool (request_pool.py,
  `queued.max.request.bytes`) before the bucket is read: the fetch's allowance, plus one
  chunk while a marker search runs; what the read did not use is given back at once, the
  records' bytes once the answer is sent (the server gives back `held()`). A first batch
  larger than the allowance (KIP-74) gives back its grant and takes its own size,
  waiting with nothing held (no two reads can wait on each other). The read cache is
  bounded by its own setting (`archive.read_cache_bytes`).
- A read that fails (the bucket down, a 503, a timeout) answers KAFKA_STORAGE_ERROR, which
  clients retry; it is counted and logged at a limited rate. While the last read failed
  and no read has succeeded since, for `FAILING_FOR_MS` at most after that failure, the
  metrics say `remote_read_failing` (health DEGRADED, `serve_remote_failing`).
- ListOffsets, with an archive of the partition's topic id (another's is ignored, as for
  Fetch):
  - EARLIEST (-2) answers the archive's log start when it is below the local one;
    EARLIEST_LOCAL (-4) stays the local log start; LATEST_TIERED (-5) answers the last
    archived offset; EARLIEST_PENDING_UPLOAD (-6) the first offset not archived.
  - A timestamp (>= 0) is looked for in the archive below the local log start first
    (Kafka's fetchOffsetByTimestamp with remote storage): an archived record found wins,
    else the local answer stands. MAX_TIMESTAMP (-3) answers the first record carrying
    the largest timestamp of both (an archived one when it is at least the local one).
  - The manifests (and indexes) are read on the same threads.
- OffsetForLeaderEpoch: the local leader-epoch cache is truncated from its start by local
  retention; an epoch older than its first entry is answered from the manifest's epochs
  followed by the local ones (manifest.merged_epochs), by the same rule (Kafka's
  LeaderEpochFileCache.endOffsetFor). Newer epochs never wait on the bucket.
"""

from __future__ import annotations

import asyncio
import contextvars
import dataclasses
import functools
import threading
from collections import Counter
from collections.abc import Awaitable, Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

import structlog
from kio.schema.errors import ErrorCode

from replicad.archive.manifest import Manifest, merged_epochs
from replicad.archive.read_cache import CHUNK_BYTES, ReadCache
from replicad.archive.remote_log import RemoteLog, RemoteRead, RemoteRecords
from replicad.archive.store import ArchiveError, BucketSettings
from replicad.archive.txn_fold import Ended, first_markers, transactions_in
from replicad.errors import LogError, OffsetOutOfRangeError
from replicad.leader.catalog import Catalog
from replicad.leader.fetch import FetchHandling, FetchRound
from replicad.leader.reads import Isolation, PartitionAnswer, TransactionTracker
from replicad.leader.request_pool import RequestMemoryPool
from replicad.leader.transactions import AbortedTransaction, TransactionState
from replicad.log.checkpoint import kafka_uuid
from replicad.log.epoch import LeaderEpochCache
from replicad.log.index import TimestampOffset
from replicad.log.partition import PartitionLog
from replicad.ratelimit import RateLimitedLog
from replicad.records.batch import scan_batches
from replicad.types import TopicPartition
from replicad.wire import EARLIEST_TIMESTAMP

T = TypeVar("T")

log = structlog.get_logger("replicad.leader")

MAX_TIMESTAMP = -3
LATEST_TIERED_TIMESTAMP = -5
EARLIEST_PENDING_UPLOAD_TIMESTAMP = -6
# How far one READ_COMMITTED fetch looks for the marker of a transaction open at its end
# (the next fetch goes on from there).
MARKER_SEARCH_BYTES = 64 * 1024 * 1024
# Transactions whose end (or search progress) is kept, at most.
KNOWN_TRANSACTIONS = 10_000
# How long after a failed read of the bucket (with no read succeeding since) the
# metrics say the bucket is failing.
FAILING_FOR_MS = 5 * 60_000
# What a request's remote answer holds from the request pool until it is sent (set per
# request by the server, given back by it after the answer is written).
_HELD: contextvars.ContextVar[list[int]] = contextvars.ContextVar("remote_held")


def hold_for_request() -> list[int]:
    """A new box of the pool bytes this request's remote reads hold (give them back once
    its answer is sent)."""
    box = [0]
    _HELD.set(box)
    return box


# What a read of the bucket raises when the bucket fails or holds what is not an archive
# (a manifest that does not decode is a LogError): KAFKA_STORAGE_ERROR, never a traceback.
_READ_ERRORS = (ArchiveError, LogError, OSError, ValueError)


def remote_fetch_for(
    bucket: BucketSettings, *, cache_bytes: int, threads: int, now_ms: Callable[[], int]
) -> RemoteFetch:
    """serve's remote reads of the archive in `bucket` (boto3 is imported here, only then)."""
    from replicad.archive.store import ObjectStore

    return RemoteFetch(
        RemoteLog(ObjectStore(bucket), ReadCache(cache_bytes)), threads=threads, now_ms=now_ms
    )


class RemoteFetch:
    """The remote reads of one LeaderServer."""

    def __init__(self, remote: RemoteLog, *, threads: int, now_ms: Callable[[], int]) -> None:
        self.remote = remote
        self._now_ms = now_ms
        self._executor = ThreadPoolExecutor(max_workers=threads, thread_name_prefix="serve-remote")
        self.counters: Counter[str] = Counter()
        self.in_flight = 0
        self._limit = RateLimitedLog(interval_ms=10_000)
        # The server's request pool (set by the LeaderServer; None: nothing charged).
        self.pool: RequestMemoryPool | None = None
        self._last_failure_ms: int | None = None
        self._last_success_ms: int | None = None
        self.last_error: str | None = None
        # (partition, topic id, producer id, first offset) -> (marker offset, aborted), and
        # -> the offset a marker search went up to without finding it (module rules).
        self._ends: dict[tuple[TopicPartition, str, int, int], tuple[int, bool]] = {}
        self._searched: dict[tuple[TopicPartition, str, int, int], int] = {}
        self._txn_lock = threading.Lock()

    def close(self) -> None:
        self._executor.shutdown(wait=False, cancel_futures=True)

    async def _on_thread(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        loop = asyncio.get_running_loop()
        self.in_flight += 1
        try:
            return await loop.run_in_executor(self._executor, lambda: fn(*args, **kwargs))
        finally:
            self.in_flight -= 1

    async def _take(self, size: int) -> int:
        """`size` bytes from the request pool (waiting for room); what was taken."""
        if self.pool is None or size <= 0:
            return 0
        return await self.pool.take_exactly(size)

    def _give_back(self, taken: int) -> None:
        if self.pool is not None and taken > 0:
            self.pool.give_back(taken)

    def _keep_until_sent(self, taken: int) -> None:
        """The request's answer holds `taken` pool bytes until it is sent."""
        box = _HELD.get(None)
        if box is None:
            self._give_back(taken)  # no server to give it back after the send
        else:
            box[0] += taken

    async def _bucket_read(self, read: Callable[[], T], now_ms: int, failed_event: str) -> T | None:
        """`read` on a bucket thread; a failure is counted, said at a limited rate and None
        (the caller answers from the local log alone)."""
        try:
            found: T = await self._on_thread(read)
        except _READ_ERRORS as error:
            self._failed(now_ms, error)
            self._warn(failed_event, now_ms, error=str(error))
            return None
        self._succeeded(now_ms)
        return found

    def _failed(self, now_ms: int, error: BaseException) -> None:
        self.counters["remote_fetch_errors_total"] += 1
        self._last_failure_ms = now_ms
        self.last_error = str(error)

    def _succeeded(self, now_ms: int) -> None:
        self._last_success_ms = now_ms

    def failing(self, now_ms: int) -> bool:
        """The last read of the bucket failed, none succeeded since, and it is recent."""
        failed = self._last_failure_ms
        if failed is None or now_ms - failed > FAILING_FOR_MS:
            return False
        return self._last_success_ms is None or self._last_success_ms < failed

    # -- Fetch ----------------------------------------------------------------------------------

    async def complete(
        self,
        handling: FetchHandling,
        last: FetchRound,
        catalog: Catalog,
        transactions: TransactionTracker,
        *,
        without_waiting: Callable[[Callable[[], TransactionState]], Awaitable[TransactionState]]
        | None = None,
    ) -> FetchRound:
        """`last` with the partitions below the local log start read from the bucket. A
        READ_COMMITTED answer's last stable offset comes from the local log's transaction
        fold (the batches appended since the plan folded it), through `without_waiting`
        where given (serve's: the fold does not wait on the disk on the loop)."""
        below = [a for a in last.answers.values() if a.error_code == ErrorCode.offset_out_of_range]
        if not below:
            return last
        now_ms = self._now_ms()
        fetches = dict(handling.last_reads)
        answers = dict(last.answers)
        readable = last.bytes_readable
        served = False
        for answer in below:
            tp, offset = answer.partition, answer.fetch_offset
            plog = catalog.partition(tp, now_ms=now_ms)
            fetch = fetches.get(tp)
            if plog is None or fetch is None or offset >= plog.log_start_offset:
                continue
            topic_id = kafka_uuid(plog.topic_id) if plog.topic_id is not None else None
            hw = plog.high_watermark
            if served:
                manifest = self.remote.known_manifest(tp)
                if manifest is None:
                    # Not read yet: its turn comes; OFFSET_OUT_OF_RANGE now would have the
                    # client reset it past what the bucket may hold.
                    answers[tp] = _answer(answer, hw, plog.log_start_offset, None)
                elif _holds(manifest, offset):
                    answers[tp] = _answer(answer, hw, manifest.log_start_offset, None)
                continue
            served = True
            allowance = max(0, min(fetch.max_bytes, handling.limits.max_bytes - readable))
            committed = handling.limits.isolation is Isolation.TXN_COMMITTED
            records, aborted = RemoteRecords(), None
            # The answer's bytes, and a chunk of the marker search, before they are read.
            taken = await self._take(allowance + (CHUNK_BYTES if committed else 0))
            try:
                read: RemoteRead | None = await self._on_thread(
                    self.remote.read,
                    tp,
                    offset,
                    allowance,
                    min_one=readable == 0 and not handling.limits.hard_max_bytes_limit,
                    hard_limit=handling.limits.hard_max_bytes_limit,
                    topic_id=topic_id,
                    now_ms=now_ms,
                )
                if read is not None and committed:
                    # The marker search reads the bucket too: its failures are the read's.
                    records, aborted = await self._on_thread(
                        self._committed, tp, topic_id or "", plog, read.records, hw, now_ms
                    )
                elif read is not None:
                    records = read.records
            except _READ_ERRORS as error:
                self._give_back(taken)
                if isinstance(error, FileNotFoundError):
                    self.remote.forget(tp)  # deleted by remote retention since: read it again
                self._failed(now_ms, error)
                self._warn(
                    "reading the bucket failed: KAFKA_STORAGE_ERROR",
                    now_ms,
                    partition=str(tp),
                    offset=offset,
                    error=str(error),
                )
                answers[tp] = PartitionAnswer(tp, offset, error_code=ErrorCode.kafka_storage_error)
                continue
            except BaseException:
                self._give_back(taken)
                raise
            self._succeeded(now_ms)
            if records.size > taken:
                # A first batch above the allowance (KIP-74): its own size, with nothing
                # else held while waiting for it.
                self._give_back(taken)
                taken = await self._take(records.size)
            self._give_back(taken - records.size)
            self._keep_until_sent(min(taken, records.size))
            if read is None:
                continue  # not in the archive either: OFFSET_OUT_OF_RANGE
            lso = hw
            if handling.limits.isolation is Isolation.TXN_COMMITTED:
                fold = functools.partial(transactions.state, tp, plog)
                state = fold() if without_waiting is None else await without_waiting(fold)
                lso = state.last_stable_offset(hw)
            self.counters["remote_fetches_total"] += 1
            self.counters["remote_fetch_bytes_total"] += records.size
            readable += records.size
            answers[tp] = _answer(
                answer, hw, read.log_start_offset, records if records else None, lso, aborted
            )
        return FetchRound(answers, readable, last.complete)

    def _committed(
        self,
        tp: TopicPartition,
        topic_id: str,
        plog: PartitionLog,
        records: RemoteRecords,
        hw: int,
        now_ms: int,
    ) -> tuple[RemoteRecords, tuple[AbortedTransaction, ...]]:
        """On a reading thread: `records` up to the first transaction whose end is not
        known yet, and the aborted transactions among them (see the module rules)."""
        found = transactions_in(records)
        ended = list(found.ended)
        cut_offset = None
        if found.still_open:
            last = scan_batches(records, verify_crc=False).next_offset or 0
            unknown: dict[int, int] = {}
            with self._txn_lock:
                for pid, first in found.still_open.items():
                    known = self._ends.get((tp, topic_id, pid, first))
                    if known is not None:
                        ended.append(Ended(first, pid, *known))
                    else:
                        unknown[pid] = first
                start = min(
                    (
                        self._searched.get((tp, topic_id, pid, f), last)
                        for pid, f in unknown.items()
                    ),
                    default=last,
                )
            markers: dict[int, tuple[int, bool]] = {}
            scanned_to = max(start, last)
            if unknown:
                markers, scanned_to = self._search_markers(
                    tp, plog, scanned_to, hw, set(unknown), now_ms
                )
            with self._txn_lock:
                for pid, first in unknown.items():
                    key = (tp, topic_id, pid, first)
                    if pid in markers:
                        ended.append(Ended(first, pid, *markers[pid]))
                        _bounded_put(self._ends, key, markers[pid])
                        self._searched.pop(key, None)
                    else:
                        _bounded_put(self._searched, key, scanned_to)
                        cut_offset = first if cut_offset is None else min(cut_offset, first)
        if cut_offset is not None:
            keep = next(
                b.position
                for b in scan_batches(records, verify_crc=False).batches
                if b.base_offset >= cut_offset
            )
            records = RemoteRecords(records[:keep])
        aborted = sorted(
            AbortedTransaction(e.first_offset, e.producer_id, e.marker_offset)
            for e in ended
            if e.aborted and (cut_offset is None or e.first_offset < cut_offset)
        )
        return records, tuple(aborted)

    def _search_markers(
        self,
        tp: TopicPartition,
        plog: PartitionLog,
        start: int,
        hw: int,
        producers: set[int],
        now_ms: int,
    ) -> tuple[dict[int, tuple[int, bool]], int]:
        """The first COMMIT/ABORT markers of `producers` from offset `start` on, in the
        archive then the local log below `hw`, `MARKER_SEARCH_BYTES` at most; and the
        offset the search went up to (where the next one resumes)."""
        budget = MARKER_SEARCH_BYTES
        markers: dict[int, tuple[int, bool]] = {}
        offset = start

        def take(blocks: Iterator[bytes]) -> bool:
            """Scans `blocks`; True once every producer's marker is found."""
            nonlocal budget, offset
            for data in blocks:
                budget -= len(data)
                markers.update(first_markers([data], producers - markers.keys()))
                offset = scan_batches(data, verify_crc=False).next_offset or offset
                if len(markers) == len(producers):
                    return True
            return False

        if take(self.remote.blocks_from(tp, offset, now_ms=now_ms, max_bytes=budget)):
            return markers, offset
        if budget > 0:
            take(_local_blocks(plog, max(offset, plog.log_start_offset), hw, budget))
        return markers, offset

    # -- ListOffsets ----------------------------------------------------------------------------

    async def list_offsets(self, request: Any, response: Any, catalog: Catalog) -> Any:
        """The response of handlers.list_offsets_response, with the archive's answers where
        the archive has one (see the module rules)."""
        now_ms = self._now_ms()
        # Only partitions this server has (answered without error): the names are the
        # client's, and each read of a manifest is a GET and an entry kept in RemoteLog.
        plogs: dict[tuple[str, int], PartitionLog] = {}
        for t in response.topics:
            for p in t.partitions:
                if p.error_code == ErrorCode.none:
                    plog = catalog.partition(
                        TopicPartition(t.name, int(p.partition_index)), now_ms=now_ms
                    )
                    if plog is not None and plog.topic_id is not None:
                        plogs[(t.name, int(p.partition_index))] = plog
        asked = {
            key: int(p.timestamp)
            for t in request.topics
            for p in t.partitions
            if (key := (t.name, int(p.partition_index))) in plogs
            and _asks_archive(int(p.timestamp), plogs[key])
        }
        if not asked:
            return response

        def read() -> dict[tuple[str, int], tuple[Manifest, TimestampOffset | None]]:
            found: dict[tuple[str, int], tuple[Manifest, TimestampOffset | None]] = {}
            for key, timestamp in asked.items():
                tp, plog = TopicPartition(*key), plogs[key]
                manifest = self.remote.manifest(tp, now_ms=now_ms)
                assert plog.topic_id is not None
                if manifest is None or manifest.topic_id != kafka_uuid(plog.topic_id):
                    continue  # nothing archived, or another topic's archive
                below = plog.log_start_offset
                hit = None
                if timestamp == MAX_TIMESTAMP:
                    peak = self.remote.max_timestamp(manifest, below=below)
                    if peak >= 0:
                        hit = self.remote.offset_for_timestamp(tp, manifest, peak, below=below)
                elif timestamp >= 0:
                    hit = self.remote.offset_for_timestamp(tp, manifest, timestamp, below=below)
                found[key] = (manifest, hit)
            return found

        archived = await self._bucket_read(
            read, now_ms, "reading the bucket failed: ListOffsets answers the local log"
        )
        if archived is None:
            return response
        topics = []
        for t in response.topics:
            partitions = []
            for p in t.partitions:
                key = (t.name, int(p.partition_index))
                if key in archived:
                    p = _archived_offset(p, asked[key], *archived[key])
                partitions.append(p)
            topics.append(dataclasses.replace(t, partitions=tuple(partitions)))
        return dataclasses.replace(response, topics=tuple(topics))

    # -- OffsetForLeaderEpoch -------------------------------------------------------------------

    async def offset_for_leader_epoch(self, request: Any, response: Any, catalog: Catalog) -> Any:
        """The response of handlers.offset_for_leader_epoch_response, with the epochs older
        than the local history answered from the manifest's (see the module rules)."""
        now_ms = self._now_ms()
        answered = {
            (t.topic, int(p.partition))
            for t in response.topics
            for p in t.partitions
            if p.error_code == ErrorCode.none
        }
        asked: dict[tuple[str, int], tuple[int, PartitionLog]] = {}
        for t in request.topics:
            for p in t.partitions:
                key = (t.topic, int(p.partition))
                plog = catalog.partition(TopicPartition(*key), now_ms=now_ms)
                if key not in answered or plog is None or plog.topic_id is None:
                    continue
                local = plog.epoch_entries()
                epoch = int(p.leader_epoch)
                if (
                    plog.log_start_offset > 0
                    and epoch >= 0
                    and (not local or epoch < local[0].epoch)
                ):
                    asked[key] = (epoch, plog)
        if not asked:
            return response

        def read() -> dict[tuple[str, int], tuple[int, int]]:
            ends: dict[tuple[str, int], tuple[int, int]] = {}
            for key, (epoch, plog) in asked.items():
                manifest = self.remote.manifest(TopicPartition(*key), now_ms=now_ms)
                assert plog.topic_id is not None
                if manifest is None or manifest.topic_id != kafka_uuid(plog.topic_id):
                    continue
                history = merged_epochs(manifest.epochs, tuple(plog.epoch_entries()))
                end = LeaderEpochCache(list(history)).end_offset_for(epoch, plog.log_end_offset)
                ends[key] = (end.epoch, end.end_offset)
            return ends

        ends = await self._bucket_read(
            read,
            now_ms,
            "reading the bucket failed: OffsetForLeaderEpoch answers the local history",
        )
        if ends is None:
            return response
        topics = []
        for t in response.topics:
            partitions = []
            for p in t.partitions:
                end = ends.get((t.topic, int(p.partition)))
                if end is not None and p.error_code == ErrorCode.none:
                    p = dataclasses.replace(p, leader_epoch=end[0], end_offset=end[1])
                partitions.append(p)
            topics.append(dataclasses.replace(t, partitions=tuple(partitions)))
        return dataclasses.replace(response, topics=tuple(topics))

    def _warn(self, message: str, now_ms: int, **fields: Any) -> None:
        emit = self._limit.should_emit(message, now_ms)
        if emit.emit:
            log.warning(message, repeated=emit.suppressed, **fields)

    def metrics(self) -> dict[str, Any]:
        stats = self.remote.cache.stats()
        failing = self.failing(self._now_ms())
        return {
            **self.counters,
            "remote_read_failing": int(failing),
            **({"remote_last_error": self.last_error} if failing else {}),
            "remote_fetches_in_flight": self.in_flight,
            "remote_cache_bytes": stats.held_bytes,
            "remote_cache_hits_total": stats.hits,
            "remote_cache_misses_total": stats.misses,
            "remote_get_requests_total": self.remote.store.requests["GET"],
        }


def _bounded_put(table: dict[Any, Any], key: Any, value: Any) -> None:
    """table[key] = value, the oldest entry forgotten past KNOWN_TRANSACTIONS."""
    table.pop(key, None)
    table[key] = value
    while len(table) > KNOWN_TRANSACTIONS:
        del table[next(iter(table))]


def _local_blocks(plog: PartitionLog, start: int, hw: int, max_bytes: int) -> Iterator[bytes]:
    """Whole batches of the local log from offset `start` up to `hw`, a chunk at a time (on
    a reading thread; a segment deleted meanwhile ends the scan)."""
    offset, read_so_far = start, 0
    while offset < hw and read_so_far < max_bytes:
        try:
            region = plog.read(offset, CHUNK_BYTES).region
            data = region.read_bytes() if region is not None else b""
        except (OffsetOutOfRangeError, OSError):
            return
        next_offset = scan_batches(data, verify_crc=False).next_offset
        if next_offset is None:
            return
        read_so_far += len(data)
        yield data
        offset = next_offset


def _holds(manifest: Manifest, offset: int) -> bool:
    end = manifest.end_offset
    return end is not None and manifest.log_start_offset <= offset < end


def _answer(
    answer: PartitionAnswer,
    hw: int,
    log_start: int,
    records: Any,
    lso: int | None = None,
    aborted: tuple[AbortedTransaction, ...] | None = None,
) -> PartitionAnswer:
    return PartitionAnswer(
        answer.partition,
        answer.fetch_offset,
        high_watermark=hw,
        last_stable_offset=hw if lso is None else lso,
        log_start_offset=log_start,
        records=records,
        aborted=aborted,
        more_data=True,
    )


def _asks_archive(timestamp: int, plog: PartitionLog) -> bool:
    """Whether a ListOffsets query's answer may come from the archive."""
    if timestamp in (
        EARLIEST_TIMESTAMP,
        LATEST_TIERED_TIMESTAMP,
        EARLIEST_PENDING_UPLOAD_TIMESTAMP,
    ):
        return True
    # By time: only records below the local log start are the archive's to answer.
    return (timestamp >= 0 or timestamp == MAX_TIMESTAMP) and plog.log_start_offset > 0


def _archived_offset(
    p: Any, timestamp: int, manifest: Manifest, hit: TimestampOffset | None
) -> Any:
    end = manifest.end_offset
    if end is None or not hasattr(p, "offset"):
        return p  # nothing archived; or ListOffsets v0, whose answers are lists
    fields: dict[str, Any] = {}
    if timestamp == LATEST_TIERED_TIMESTAMP:
        fields["offset"] = end - 1
    elif timestamp == EARLIEST_PENDING_UPLOAD_TIMESTAMP:
        fields["offset"] = end
    elif timestamp == EARLIEST_TIMESTAMP:
        if manifest.log_start_offset >= int(p.offset):
            return p
        fields["offset"] = manifest.log_start_offset
    elif hit is None:
        return p
    elif timestamp == MAX_TIMESTAMP and int(p.offset) >= 0 and hit.timestamp < int(p.timestamp):
        return p  # the local log holds a larger timestamp
    else:
        fields.update(offset=hit.offset, timestamp=hit.timestamp)
    if hasattr(p, "leader_epoch"):
        fields["leader_epoch"] = _epoch_at(manifest, fields["offset"])
    return dataclasses.replace(p, **fields)


def _epoch_at(manifest: Manifest, offset: int) -> int:
    epoch = -1
    for entry in manifest.epochs:
        if entry.start_offset > offset:
            break
        epoch = entry.epoch
    return epoch
