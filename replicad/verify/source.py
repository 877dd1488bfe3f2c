"""The shell of `replicad verify --against-source`: asks the source, reads the replica.

For each partition directory of the data directory (or those of the topics named), one
`PartitionCheck` (compare.py) walks the replica's offsets; this shell performs what it asks:
- a sessionless Fetch (session id 0, epoch -1: no slot taken in the source's session cache)
  to the partition's leader at the offset the check names, read uncommitted as a consumer
  (replica id -1), at most `fetch_max_bytes` for the one partition; only whole batches of the
  answer are compared (a partial trailing batch is asked again from its offset);
- on OFFSET_OUT_OF_RANGE, ListOffsets for the source's log start (-2) and high watermark (-1);
- on a leader change (NOT_LEADER_OR_FOLLOWER, FENCED/UNKNOWN_LEADER_EPOCH, ...) or a dropped
  connection, fresh metadata and the same fetch again, up to `retries` times in a row; then
  the partition is left unverified with the last error;
- `max_bytes_per_second` paces the fetches: after each answer the shell waits until the bytes
  fetched so far fit the rate since the run began.
One partition at a time, one request at a time: memory is one answer and the replica's bytes
for the same offsets. `resume` (a JSON file) keeps each partition's `verified_to` after it is
done, so a run cut short starts the next where this one got.
"""

from __future__ import annotations

import asyncio
import json
import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import structlog
from kio.schema.errors import ErrorCode

from replicad.errors import KafkaConnectionError, ProtocolError
from replicad.log.layout import parse_partition_dir
from replicad.protocol.admin import admin_version, describe_topic_configs_request
from replicad.protocol.apis import ApiKey
from replicad.protocol.client import ClientSettings, KafkaClient
from replicad.protocol.error_codes import error_code_of
from replicad.protocol.metadata import ClusterMetadata
from replicad.protocol.requests import (
    FetchPartitionSpec,
    FetchSpec,
    OffsetQuery,
    fetch_request,
    list_offsets_request,
)
from replicad.records.batch import scan_batches
from replicad.types import TopicPartition
from replicad.verify.compare import (
    Batch,
    OffsetRange,
    PartitionCheck,
    PartitionResult,
    ReplicaSlice,
    SourceAnswer,
)
from replicad.verify.replica import ReplicaPartition
from replicad.wire import (
    CONSUMER_REPLICA_ID,
    EARLIEST_TIMESTAMP,
    FETCH_TOPIC_ID_VERSION,
    LATEST_TIMESTAMP,
    READ_UNCOMMITTED,
)

log = structlog.get_logger("replicad.verify")

# Sessionless: KIP-227's (0, -1) is a full fetch that creates no session.
_NO_SESSION_ID = 0
_NO_SESSION_EPOCH = -1
# Kafka answers at once when it has a byte at the offset; Tansu answers a Fetch that may not
# wait with no partition at all, so let it wait a little (the walk never asks past the end
# it knows but once, at a replica ahead of the source).
_FETCH_MAX_WAIT_MS = 100
_RETRY_DELAY_S = 0.5
# Errors after which fresh metadata (another leader, the topic back) may help.
_REFRESH = frozenset(
    {
        ErrorCode.not_leader_or_follower,
        ErrorCode.fenced_leader_epoch,
        ErrorCode.unknown_leader_epoch,
        ErrorCode.leader_not_available,
        ErrorCode.replica_not_available,
        ErrorCode.kafka_storage_error,
        ErrorCode.offset_not_available,
        ErrorCode.unknown_topic_id,
        ErrorCode.inconsistent_topic_id,
        ErrorCode.request_timed_out,
    }
)


@dataclass(frozen=True, slots=True)
class VerifyOptions:
    topics: Sequence[str] = ()  # none: every partition directory
    sample: int | None = None  # batches a partition, drawn at random; None: all
    seed: int = 0
    fetch_max_bytes: int = 1 << 20
    max_bytes_per_second: int | None = None
    retries: int = 5
    resume: Path | None = None


@dataclass(frozen=True, slots=True)
class _Answer:
    error: ErrorCode
    high_watermark: int
    log_start_offset: int
    records: bytes


def pace_delay_s(fetched_bytes: int, elapsed_s: float, rate: int | None) -> float:
    """How long to wait so that `fetched_bytes` since the start fit `rate` bytes a second."""
    if not rate:
        return 0.0
    return max(0.0, fetched_bytes / rate - elapsed_s)


def replica_partitions(data_dir: Path, topics: Sequence[str]) -> dict[TopicPartition, Path]:
    """The data directory's partition directories (of `topics`, when named), sorted."""
    found: dict[TopicPartition, Path] = {}
    for name in sorted(os.listdir(data_dir)):
        tp = parse_partition_dir(name)
        if tp is None or not (data_dir / name).is_dir():
            continue
        if topics and tp.topic not in topics:
            continue
        found[tp] = data_dir / name
    return dict(sorted(found.items()))


def _load_resume(path: Path | None) -> dict[str, int]:
    if path is None or not path.exists():
        return {}
    data = json.loads(path.read_text())
    return {str(k): int(v) for k, v in data.items()}


def _save_resume(path: Path | None, state: dict[str, int]) -> None:
    if path is None:
        return
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(state, sort_keys=True))
    os.replace(tmp, path)


class SourceVerifier:
    def __init__(
        self,
        data_dir: Path,
        bootstrap_servers: Sequence[str],
        settings: ClientSettings,
        options: VerifyOptions,
        *,
        on_result: Callable[[PartitionResult], None] | None = None,
    ) -> None:
        self.data_dir = Path(data_dir)
        self.client = KafkaClient(bootstrap_servers, settings)
        self.options = options
        self.on_result = on_result
        self._cluster: ClusterMetadata | None = None
        self._fetched = 0
        self._started = time.monotonic()

    async def run(self) -> list[PartitionResult]:
        partitions = replica_partitions(self.data_dir, self.options.topics)
        resume = _load_resume(self.options.resume)
        results: list[PartitionResult] = []
        try:
            topics = sorted({tp.topic for tp in partitions})
            if topics:
                self._cluster = await self.client.metadata(topics)
            compacted = await self._compacted(topics)
            for tp, directory in partitions.items():
                result = await self._verify_partition(
                    tp, directory, compacted=tp.topic in compacted, start=resume.get(str(tp))
                )
                results.append(result)
                if self.options.resume is not None and self.options.sample is None:
                    resume[str(tp)] = result.verified_to
                    _save_resume(self.options.resume, resume)
                if self.on_result is not None:
                    self.on_result(result)
        finally:
            await self.client.close()
        return results

    async def _compacted(self, topics: Sequence[str]) -> set[str]:
        """The topics whose cleanup.policy includes compact (none when the source does not
        say: then a rewritten batch is reported as a mismatch, the safe side)."""
        if not topics:
            return set()
        try:
            conn = await self.client.broker_connection()
            version = admin_version(conn, ApiKey.DESCRIBE_CONFIGS)
            if version is None:
                return set()
            body = await conn.request(describe_topic_configs_request(version, topics))
        except (KafkaConnectionError, ProtocolError) as exc:
            log.warning("cannot read the source's topic configs", error=str(exc))
            return set()
        compacted = set()
        for resource in body.results:
            for entry in resource.configs or ():
                if entry.name == "cleanup.policy" and "compact" in (entry.value or ""):
                    compacted.add(resource.resource_name)
        return compacted

    async def _verify_partition(
        self, tp: TopicPartition, directory: Path, *, compacted: bool, start: int | None
    ) -> PartitionResult:
        replica = ReplicaPartition(directory)
        try:
            offsets = replica.offsets()
            targets = None
            if self.options.sample is not None:
                targets = replica.sample(self.options.sample, self.options.seed)
            check = PartitionCheck(tp, offsets, compacted=compacted, targets=targets, start=start)
            failures = 0
            while (offset := check.next_fetch()) is not None:
                try:
                    answer = await self._fetch(tp, offset)
                    bounds = (
                        await self._bounds(tp)
                        if answer.error is ErrorCode.offset_out_of_range
                        else None
                    )
                except (KafkaConnectionError, ProtocolError, _Retry) as exc:
                    failures += 1
                    if failures > self.options.retries:
                        check.on_failure(str(exc))
                        break
                    await asyncio.sleep(_RETRY_DELAY_S * failures)
                    await self._refresh(tp)
                    continue
                failures = 0
                if bounds is not None:
                    check.on_out_of_range(*bounds)
                    continue
                self._feed(check, replica, offset, answer)
                await self._pace()
            return check.result
        finally:
            replica.close()

    def _feed(
        self, check: PartitionCheck, replica: ReplicaPartition, offset: int, answer: _Answer
    ) -> None:
        scan = scan_batches(answer.records, verify_crc=False)
        theirs = [Batch.from_header(h, answer.records) for h in scan.batches]
        ours = replica.slice(offset, theirs[-1].last_offset) if theirs else ReplicaSlice(())
        check.on_answer(SourceAnswer(answer.high_watermark, answer.log_start_offset, theirs), ours)

    async def _pace(self) -> None:
        delay = pace_delay_s(
            self._fetched, time.monotonic() - self._started, self.options.max_bytes_per_second
        )
        if delay > 0:
            await asyncio.sleep(delay)

    async def _refresh(self, tp: TopicPartition) -> None:
        try:
            self._cluster = await self.client.metadata([tp.topic])
        except (KafkaConnectionError, ProtocolError) as exc:
            log.info("metadata refresh failed", partition=str(tp), error=str(exc))

    def _leader(self, tp: TopicPartition) -> int:
        leader = self._cluster.leader_of(tp) if self._cluster is not None else None
        if leader is None:
            raise _Retry(f"{tp}: the source does not know this partition")
        if leader.leader_id < 0:
            raise _Retry(f"{tp}: no leader at the source ({leader.error.name})")
        return leader.leader_id

    async def _fetch(self, tp: TopicPartition, offset: int) -> _Answer:
        conn = await self.client.connection(self._leader(tp))
        assert conn.versions is not None and self._cluster is not None
        version = conn.versions.require(ApiKey.FETCH)
        topic_id = self._cluster.topic_id(tp.topic)
        if topic_id is None:
            version = min(version, FETCH_TOPIC_ID_VERSION - 1)
        spec = FetchSpec(
            max_wait_ms=_FETCH_MAX_WAIT_MS,
            min_bytes=1,
            max_bytes=self.options.fetch_max_bytes,
            isolation_level=READ_UNCOMMITTED,
            session_id=_NO_SESSION_ID,
            session_epoch=_NO_SESSION_EPOCH,
            partitions={
                tp: FetchPartitionSpec(
                    fetch_offset=offset,
                    log_start_offset=-1,
                    max_bytes=self.options.fetch_max_bytes,
                    topic_id=topic_id,
                )
            },
            replica_id=CONSUMER_REPLICA_ID,
        )
        body = await conn.request(fetch_request(version, spec))
        top = error_code_of(getattr(body, "error_code", 0))
        if top is not ErrorCode.none:
            raise _Retry(f"{tp}: the source answered {top.name}")
        partition = _only_partition(body)
        error = error_code_of(partition.error_code)
        if error in _REFRESH or (
            error is not ErrorCode.none and error is not ErrorCode.offset_out_of_range
        ):
            raise _Retry(f"{tp}: the source answered {error.name}")
        records = bytes(partition.records or b"")
        self._fetched += len(records)
        return _Answer(
            error, int(partition.high_watermark), int(partition.log_start_offset), records
        )

    async def _bounds(self, tp: TopicPartition) -> tuple[int, int]:
        """The source's log start and high watermark for `tp` (ListOffsets -2 and -1)."""
        conn = await self.client.connection(self._leader(tp))
        assert conn.versions is not None
        version = conn.versions.require(ApiKey.LIST_OFFSETS)
        found = []
        for timestamp in (EARLIEST_TIMESTAMP, LATEST_TIMESTAMP):
            body = await conn.request(list_offsets_request(version, {tp: OffsetQuery(timestamp)}))
            partition = body.topics[0].partitions[0]
            error = error_code_of(partition.error_code)
            if error is not ErrorCode.none:
                raise _Retry(f"{tp}: ListOffsets answered {error.name}")
            found.append(int(partition.offset))
        return found[0], found[1]


class _Retry(Exception):
    """A transient answer: fresh metadata and the same request again."""


def _only_partition(body: Any) -> Any:
    for topic in body.responses:
        for partition in topic.partitions:
            return partition
    raise _Retry("the source's Fetch answer names no partition")


def replica_offsets(directory: Path) -> OffsetRange:
    """The replica's range in one partition directory (for reports and tests)."""
    replica = ReplicaPartition(directory)
    try:
        return replica.offsets()
    finally:
        replica.close()
