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
  watermark (archive/txn_fold.py), `MARKER_SEARCH_BYTES` at most. A transaction whose
  marker is not found ends the answer before its first batch.
- A read that fails (the bucket down, a 503, a timeout) answers KAFKA_STORAGE_ERROR, which
  clients retry; it is counted and logged at a limited rate.
- ListOffsets, with an archive: EARLIEST (-2) answers the archive's log start when it is
  below the local one, EARLIEST_LOCAL (-4) stays the local log start,
  LATEST_TIERED (-5) answers the last archived offset. Their manifests are read on the
  same threads.
"""

from __future__ import annotations

import asyncio
import dataclasses
import itertools
from collections import Counter
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import structlog
from kio.schema.errors import ErrorCode

from replicad.archive.manifest import Manifest
from replicad.archive.read_cache import CHUNK_BYTES, ReadCache
from replicad.archive.remote_log import RemoteLog, RemoteRead, RemoteRecords
from replicad.archive.store import ArchiveError, BucketSettings
from replicad.archive.txn_fold import Ended, first_markers, transactions_in
from replicad.errors import LogError, OffsetOutOfRangeError
from replicad.leader.catalog import Catalog
from replicad.leader.fetch import FetchHandling, FetchRound
from replicad.leader.reads import Isolation, PartitionAnswer, TransactionTracker
from replicad.leader.transactions import AbortedTransaction
from replicad.log.checkpoint import kafka_uuid
from replicad.log.partition import PartitionLog
from replicad.ratelimit import RateLimitedLog
from replicad.records.batch import scan_batches
from replicad.types import TopicPartition
from replicad.wire import EARLIEST_TIMESTAMP

log = structlog.get_logger("replicad.leader")

LATEST_TIERED_TIMESTAMP = -5
# How far a READ_COMMITTED read looks for the marker of a transaction open at its end.
MARKER_SEARCH_BYTES = 64 * 1024 * 1024
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

    def close(self) -> None:
        self._executor.shutdown(wait=False, cancel_futures=True)

    async def _on_thread(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        loop = asyncio.get_running_loop()
        self.in_flight += 1
        try:
            return await loop.run_in_executor(self._executor, lambda: fn(*args, **kwargs))
        finally:
            self.in_flight -= 1

    # -- Fetch ----------------------------------------------------------------------------------

    async def complete(
        self,
        handling: FetchHandling,
        last: FetchRound,
        catalog: Catalog,
        transactions: TransactionTracker,
    ) -> FetchRound:
        """`last` with the partitions below the local log start read from the bucket."""
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
            records, aborted = RemoteRecords(), None
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
                if read is not None:
                    records = read.records
                    if handling.limits.isolation is Isolation.TXN_COMMITTED:
                        # The marker search reads the bucket too: its failures are the read's.
                        records, aborted = await self._on_thread(
                            self._committed, tp, plog, read.records, hw, now_ms
                        )
            except _READ_ERRORS as error:
                if isinstance(error, FileNotFoundError):
                    self.remote.forget(tp)  # deleted by remote retention since: read it again
                self.counters["remote_fetch_errors_total"] += 1
                self._warn(
                    "reading the bucket failed: KAFKA_STORAGE_ERROR",
                    now_ms,
                    partition=str(tp),
                    offset=offset,
                    error=str(error),
                )
                answers[tp] = PartitionAnswer(tp, offset, error_code=ErrorCode.kafka_storage_error)
                continue
            if read is None:
                continue  # not in the archive either: OFFSET_OUT_OF_RANGE
            lso = hw
            if handling.limits.isolation is Isolation.TXN_COMMITTED:
                lso = transactions.state(tp, plog).last_stable_offset(hw)
            self.counters["remote_fetches_total"] += 1
            self.counters["remote_fetch_bytes_total"] += records.size
            readable += records.size
            answers[tp] = _answer(
                answer, hw, read.log_start_offset, records if records else None, lso, aborted
            )
        return FetchRound(answers, readable, last.complete)

    def _committed(
        self, tp: TopicPartition, plog: PartitionLog, records: RemoteRecords, hw: int, now_ms: int
    ) -> tuple[RemoteRecords, tuple[AbortedTransaction, ...]]:
        """On a reading thread: `records` up to the first transaction whose end is not
        known, and the aborted transactions among them (see the module rules)."""
        found = transactions_in(records)
        ended = list(found.ended)
        cut_offset = None
        if found.still_open:
            last = scan_batches(records, verify_crc=False).next_offset or 0
            blocks = itertools.chain(
                self.remote.blocks_from(tp, last, now_ms=now_ms, max_bytes=MARKER_SEARCH_BYTES),
                _local_blocks(plog, hw, MARKER_SEARCH_BYTES),
            )
            markers = first_markers(blocks, set(found.still_open))
            for pid, first in found.still_open.items():
                if pid in markers:
                    ended.append(Ended(first, pid, *markers[pid]))
                else:
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

    # -- ListOffsets ----------------------------------------------------------------------------

    async def list_offsets(self, request: Any, response: Any) -> Any:
        """The response of handlers.list_offsets_response, with the archive's offsets where
        the request asked for EARLIEST or LATEST_TIERED (see the module rules)."""
        wanted = {EARLIEST_TIMESTAMP, LATEST_TIERED_TIMESTAMP}
        # Only partitions this server has (answered without error): the names are the
        # client's, and each read of a manifest is a GET and an entry kept in RemoteLog.
        known = {
            (t.name, int(p.partition_index))
            for t in response.topics
            for p in t.partitions
            if p.error_code == ErrorCode.none
        }
        asked = {
            (t.name, int(p.partition_index)): int(p.timestamp)
            for t in request.topics
            for p in t.partitions
            if int(p.timestamp) in wanted and (t.name, int(p.partition_index)) in known
        }
        if not asked:
            return response
        now_ms = self._now_ms()
        try:
            manifests = await self._on_thread(
                lambda: {
                    key: self.remote.manifest(TopicPartition(*key), now_ms=now_ms) for key in asked
                }
            )
        except _READ_ERRORS as error:
            self.counters["remote_fetch_errors_total"] += 1
            self._warn(
                "reading the bucket's manifests failed: ListOffsets answers the local log",
                now_ms,
                error=str(error),
            )
            return response
        topics = []
        for t in response.topics:
            partitions = []
            for p in t.partitions:
                key = (t.name, int(p.partition_index))
                manifest = manifests.get(key)
                if manifest is not None and p.error_code == ErrorCode.none:
                    p = _archived_offset(p, asked[key], manifest)
                partitions.append(p)
            topics.append(dataclasses.replace(t, partitions=tuple(partitions)))
        return dataclasses.replace(response, topics=tuple(topics))

    def _warn(self, message: str, now_ms: int, **fields: Any) -> None:
        emit = self._limit.should_emit(message, now_ms)
        if emit.emit:
            log.warning(message, repeated=emit.suppressed, **fields)

    def metrics(self) -> dict[str, Any]:
        stats = self.remote.cache.stats()
        return {
            **self.counters,
            "remote_fetches_in_flight": self.in_flight,
            "remote_cache_bytes": stats.held_bytes,
            "remote_cache_hits_total": stats.hits,
            "remote_cache_misses_total": stats.misses,
            "remote_get_requests_total": self.remote.store.requests["GET"],
        }


def _local_blocks(plog: PartitionLog, hw: int, max_bytes: int) -> Iterator[bytes]:
    """Whole batches of the local log from its start up to `hw`, a chunk at a time (on a
    reading thread; a segment deleted meanwhile ends the scan)."""
    offset, read_so_far = plog.log_start_offset, 0
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


def _archived_offset(p: Any, timestamp: int, manifest: Manifest) -> Any:
    end = manifest.end_offset
    if end is None or not hasattr(p, "offset"):
        return p  # nothing archived; or ListOffsets v0, whose answers are lists
    if timestamp == LATEST_TIERED_TIMESTAMP:
        offset = end - 1
    elif manifest.log_start_offset < int(p.offset):
        offset = manifest.log_start_offset
    else:
        return p
    fields: dict[str, Any] = {"offset": offset}
    if hasattr(p, "leader_epoch"):
        fields["leader_epoch"] = _epoch_at(manifest, offset)
    return dataclasses.replace(p, **fields)


def _epoch_at(manifest: Manifest, offset: int) -> int:
    epoch = -1
    for entry in manifest.epochs:
        if entry.start_offset > offset:
            break
        epoch = entry.epoch
    return epoch
