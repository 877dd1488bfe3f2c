"""The shell of `replicad verify --against-source`: asks the source, reads the replica.

For each partition directory of the data directory (or those of the topics named), one
`PartitionCheck` (compare.py) walks the replica's offsets; this shell performs what it asks:
- a sessionless Fetch (session id 0, epoch -1: no slot taken in the source's session cache)
  to the partition's leader at the offset the check names, read uncommitted as a consumer
  (replica id -1), at most `fetch_max_bytes` in all; only whole batches of the answer are
  compared (a partial trailing batch is asked again from its offset). The command asks the
  partitions of one leader together: a window of at most `partitions_per_fetch` partitions
  is walked at once, and each Fetch names those of the window's first partition's leader
  (KIP-74: the leader returns at least the first one's batch, then what fits). A partition
  the answer left empty below its high watermark (the bytes went to those before it) is
  asked again first in the next, so every request moves its first partition on;
- on OFFSET_OUT_OF_RANGE, ListOffsets for the source's log start (-2) and high watermark (-1);
- on a leader change (NOT_LEADER_OR_FOLLOWER, FENCED/UNKNOWN_LEADER_EPOCH, ...) or a dropped
  connection, fresh metadata and the same fetch again, up to `retries` times in a row; then
  the partition is left unverified with the last error;
- `max_bytes_per_second` paces the fetches: each answer's bytes push the next fetch back by
  bytes / rate from when it was sent, so the load stays under the rate however long the run
  (a daemon's walk that was idle does not burst to catch up: `next_fetch_at`).
One request at a time: memory is one answer and the replica's bytes for the same offsets,
and at most `partitions_per_fetch` replica partitions are open. `resume` (a JSON file)
keeps each partition's `verified_to` after it is done, so a run cut short starts the next
where this one got.

`SourceReader` is the source's side of a walk, shared with the daemon's continuous check
(replicad/verify/continuous.py), which reads the replica through the log it writes.
"""

from __future__ import annotations

import asyncio
import json
import os
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import structlog
from kio.schema.errors import ErrorCode

from replicad.errors import KafkaConnectionError, ProtocolError
from replicad.log.layout import parse_partition_dir
from replicad.protocol.admin import admin_version, describe_topic_configs_request
from replicad.protocol.apis import ApiKey
from replicad.protocol.client import ClientSettings, KafkaClient
from replicad.protocol.error_codes import error_code_of
from replicad.protocol.fetch_request import FetchRequest, RequestedPartition, fetch_request
from replicad.protocol.metadata import ClusterMetadata
from replicad.protocol.requests import OffsetQuery, list_offsets_request
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
    FINAL_EPOCH,
    INVALID_SESSION_ID,
    LATEST_TIMESTAMP,
    READ_UNCOMMITTED,
)

log = structlog.get_logger("replicad.verify")

# Kafka answers at once when it has a byte at the offset; Tansu answers a Fetch that may not
# wait with no partition at all, so let it wait a little (the walk never asks past the end
# it knows but once, at a replica ahead of the source).
_FETCH_MAX_WAIT_MS = 100
_RETRY_DELAY_S = 0.5
# Partitions walked at once by the command, and so at most named in one Fetch.
DEFAULT_PARTITIONS_PER_FETCH = 100
# Failed fetches in a row before a partition is left unverified.
DEFAULT_RETRIES = 5
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
    retries: int = DEFAULT_RETRIES
    resume: Path | None = None
    partitions_per_fetch: int = DEFAULT_PARTITIONS_PER_FETCH


@dataclass(frozen=True, slots=True)
class _Answer:
    error: ErrorCode
    high_watermark: int
    log_start_offset: int
    records: bytes


def next_fetch_at(free_at: float, sent_at: float, fetched_bytes: int, rate: int | None) -> float:
    """When the next fetch may go, after one sent at `sent_at` brought `fetched_bytes`: the
    bytes take their share of the rate from when they were asked for (or from when the last
    share ended, if later). `rate` None: at once."""
    if not rate:
        return sent_at
    return max(free_at, sent_at) + fetched_bytes / rate


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


ReadReplica = Callable[[int, int], Awaitable[ReplicaSlice]]


@dataclass(slots=True, eq=False)
class Walk:
    """One partition's check in a walk of many (`SourceReader.walk_many`), with the way to
    read its replica and its failures in a row."""

    check: PartitionCheck
    read_replica: ReadReplica
    failures: int = 0

    @property
    def tp(self) -> TopicPartition:
        return self.check.result.tp


class SourceReader:
    """The source's side of walks: one client, its metadata, paced sessionless fetches.
    `walk` drives one partition's check to its end, reading the replica through
    `read_replica(low, high)` (the batches the core's rules ask for)."""

    def __init__(
        self,
        bootstrap_servers: Sequence[str],
        settings: ClientSettings,
        *,
        fetch_max_bytes: int,
        max_bytes_per_second: int | None,
        retries: int = DEFAULT_RETRIES,
    ) -> None:
        self.client = KafkaClient(bootstrap_servers, settings)
        self.fetch_max_bytes = fetch_max_bytes
        self.max_bytes_per_second = max_bytes_per_second
        self.retries = retries
        self.fetched_bytes = 0
        self.fetches = 0  # partitions asked, one per partition in each request
        self.requests = 0  # Fetch requests sent
        self._cluster: ClusterMetadata | None = None
        self._free_at = 0.0

    async def close(self) -> None:
        await self.client.close()

    async def load_metadata(self, topics: Sequence[str]) -> None:
        self._cluster = await self.client.metadata(list(topics))

    async def compacted(self, topics: Sequence[str]) -> set[str]:
        """The topics whose cleanup.policy includes compact (none when the source does not
        say: then a rewritten batch is reported as a mismatch, the safe side)."""
        if not topics:
            return set()
        try:
            conn = await self.client.broker_connection()
            version = admin_version(conn, ApiKey.DESCRIBE_CONFIGS)
            if version is None:
                return set()
            body = await conn.request(describe_topic_configs_request(version, list(topics)))
        except (KafkaConnectionError, ProtocolError) as exc:
            log.warning("cannot read the source's topic configs", error=str(exc))
            return set()
        compacted = set()
        for resource in body.results:
            for entry in resource.configs or ():
                if entry.name == "cleanup.policy" and "compact" in (entry.value or ""):
                    compacted.add(resource.resource_name)
        return compacted

    async def walk(self, check: PartitionCheck, read_replica: ReadReplica) -> PartitionResult:
        tp = check.result.tp
        failures = 0
        while (offset := check.next_fetch()) is not None:
            try:
                await self._pace()
                sent_at = time.monotonic()
                answer = await self._fetch(tp, offset)
                self._free_at = next_fetch_at(
                    self._free_at, sent_at, len(answer.records), self.max_bytes_per_second
                )
                out_of_range = answer.error is ErrorCode.offset_out_of_range
                bounds = await self._bounds(tp) if out_of_range else None
            except (KafkaConnectionError, ProtocolError, _Retry) as exc:
                failures += 1
                if failures > self.retries:
                    check.on_failure(str(exc))
                    break
                await asyncio.sleep(_RETRY_DELAY_S * failures)
                await self._refresh(tp)
                continue
            failures = 0
            if bounds is not None:
                check.on_out_of_range(*bounds)
                continue
            await _compare(check, offset, answer, read_replica)
        return check.result

    async def walk_many(
        self,
        walks: Callable[[], Walk | None],
        *,
        at_once: int,
        done: Callable[[Walk], None],
    ) -> None:
        """Drive many checks to their ends, the partitions of one leader in one Fetch: a
        window of at most `at_once` walks (taken from `walks()` until it gives None), each
        request naming those of the window's first walk's leader, in window order. `done`
        is called with each walk as it ends (then the next one joins the window)."""
        window: list[Walk] = []
        exhausted = False
        while True:
            while not exhausted and len(window) < at_once:
                walk = walks()
                if walk is None:
                    exhausted = True
                elif walk.check.next_fetch() is None:
                    done(walk)
                else:
                    window.append(walk)
            if not window:
                return
            answered = await self._one_request(window)
            # Those answered go to the back; those left empty (or not asked) go first next.
            window = [w for w in window if w not in answered] + [w for w in window if w in answered]
            for walk in [w for w in window if w.check.next_fetch() is None]:
                window.remove(walk)
                done(walk)

    async def _one_request(self, window: list[Walk]) -> list[Walk]:
        """One Fetch for the window's first walk's leader and the walks it also leads; the
        walks whose answer was taken (or failed them)."""
        try:
            leader = self._leader(window[0].tp)
        except _Retry as exc:
            await self._failed([window[0]], str(exc))
            return [window[0]]
        group: list[Walk] = []
        for walk in window:
            try:
                if self._leader(walk.tp) == leader:
                    group.append(walk)
            except _Retry:
                continue  # asked when it comes first (its own failure then)
        asks = [(w.tp, w.check.next_fetch()) for w in group]
        try:
            await self._pace()
            sent_at = time.monotonic()
            answers = await self._fetch_many(leader, asks)  # type: ignore[arg-type]
        except (KafkaConnectionError, ProtocolError, _Retry) as exc:
            await self._failed(group, str(exc))
            return group
        self._free_at = next_fetch_at(
            self._free_at,
            sent_at,
            sum(len(a.records) for a in answers.values() if isinstance(a, _Answer)),
            self.max_bytes_per_second,
        )
        taken: list[Walk] = []
        retry: list[tuple[Walk, str]] = []
        for i, (walk, (tp, offset)) in enumerate(zip(group, asks, strict=True)):
            answer = answers.get(tp)
            if isinstance(answer, _Retry):
                retry.append((walk, str(answer)))
                continue
            if answer is None:
                answer = _Retry(f"{tp}: the source's Fetch answer left this partition out")
                if i == 0:
                    retry.append((walk, str(answer)))
                continue
            theirs = _whole_batches(answer)
            if (
                i > 0
                and answer.error is ErrorCode.none
                and not theirs
                and offset < answer.high_watermark
            ):
                # The bytes went to the partitions before it (nothing, or a part of a
                # batch): asked first next time, when the leader owes it a whole batch.
                continue
            walk.failures = 0
            taken.append(walk)
            if answer.error is ErrorCode.offset_out_of_range:
                try:
                    bounds = await self._bounds(tp)
                except (KafkaConnectionError, ProtocolError, _Retry) as exc:
                    retry.append((walk, str(exc)))
                    continue
                walk.check.on_out_of_range(*bounds)
                continue
            await _compare(walk.check, offset, answer, walk.read_replica, theirs)  # type: ignore[arg-type]
        if retry:
            await self._failed([w for w, _ in retry], "; ".join(r for _, r in retry)[:500])
            taken += [w for w, _ in retry if w not in taken]
        return taken

    async def _failed(self, walks: list[Walk], reason: str) -> None:
        """A failed ask of `walks`: each fails after `retries` in a row; else a pause and
        fresh metadata before they are asked again."""
        worst = 0
        for walk in walks:
            walk.failures += 1
            if walk.failures > self.retries:
                walk.check.on_failure(reason)
            else:
                worst = max(worst, walk.failures)
        if worst:
            await asyncio.sleep(_RETRY_DELAY_S * worst)
            await self._refresh_topics(sorted({w.tp.topic for w in walks}))

    async def _refresh_topics(self, topics: list[str]) -> None:
        try:
            self._cluster = await self.client.metadata(topics)
        except (KafkaConnectionError, ProtocolError) as exc:
            log.info("metadata refresh failed", topics=topics, error=str(exc))

    async def _fetch_many(
        self, leader: int, asks: Sequence[tuple[TopicPartition, int]]
    ) -> dict[TopicPartition, _Answer | _Retry]:
        """One sessionless Fetch to `leader` for every (partition, offset) of `asks`: each
        partition's answer, or the _Retry its error calls for."""
        conn = await self.client.connection(leader)
        assert conn.versions is not None and self._cluster is not None
        version = conn.versions.require(ApiKey.FETCH)
        ids = {tp.topic: self._cluster.topic_id(tp.topic) for tp, _ in asks}
        if any(topic_id is None for topic_id in ids.values()):
            version = min(version, FETCH_TOPIC_ID_VERSION - 1)
        by_id = version >= FETCH_TOPIC_ID_VERSION
        names = {topic_id: name for name, topic_id in ids.items()}
        # Sessionless: KIP-227's (INVALID_SESSION_ID, FINAL_EPOCH) is a full fetch that
        # creates no session.
        request = FetchRequest(
            max_wait_ms=_FETCH_MAX_WAIT_MS,
            min_bytes=1,
            max_bytes=self.fetch_max_bytes,
            isolation_level=READ_UNCOMMITTED,
            session_id=INVALID_SESSION_ID,
            session_epoch=FINAL_EPOCH,
            partitions=tuple(
                RequestedPartition.of(tp, offset, self.fetch_max_bytes, topic_id=ids[tp.topic])
                for tp, offset in asks
            ),
            replica_id=CONSUMER_REPLICA_ID,
        )
        body = await conn.request(fetch_request(version, request))
        self.requests += 1
        top = error_code_of(getattr(body, "error_code", 0))
        if top is not ErrorCode.none:
            raise _Retry(f"the source answered {top.name}")
        found: dict[TopicPartition, _Answer | _Retry] = {}
        for topic in body.responses:
            name = names.get(topic.topic_id) if by_id else topic.topic
            if name is None:
                continue
            for partition in topic.partitions:
                tp = TopicPartition(name, int(partition.partition_index))
                error = error_code_of(partition.error_code)
                if error in _REFRESH or (
                    error is not ErrorCode.none and error is not ErrorCode.offset_out_of_range
                ):
                    found[tp] = _Retry(f"{tp}: the source answered {error.name}")
                    continue
                records = bytes(partition.records or b"")
                self.fetched_bytes += len(records)
                self.fetches += 1
                found[tp] = _Answer(
                    error, int(partition.high_watermark), int(partition.log_start_offset), records
                )
        return found

    async def _pace(self) -> None:
        delay = self._free_at - time.monotonic()
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
        """One sessionless Fetch of `tp` alone from `offset` (_fetch_many's request)."""
        answer = (await self._fetch_many(self._leader(tp), [(tp, offset)])).get(tp)
        if answer is None:
            raise _Retry(f"{tp}: the source's Fetch answer does not name it")
        if isinstance(answer, _Retry):
            raise answer
        return answer

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


class SourceVerifier:
    """`replicad verify --against-source`: every partition directory, one after another."""

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
        self.options = options
        self.on_result = on_result
        self.source = SourceReader(
            bootstrap_servers,
            settings,
            fetch_max_bytes=options.fetch_max_bytes,
            max_bytes_per_second=options.max_bytes_per_second,
            retries=options.retries,
        )

    async def run(self) -> list[PartitionResult]:
        """Every partition's result, in partition order (`on_result` is called as each
        ends, in the order they end)."""
        partitions = replica_partitions(self.data_dir, self.options.topics)
        resume = _load_resume(self.options.resume)
        results: dict[TopicPartition, PartitionResult] = {}
        replicas: dict[int, ReplicaPartition] = {}
        try:
            topics = sorted({tp.topic for tp in partitions})
            if topics:
                await self.source.load_metadata(topics)
            compacted = await self.source.compacted(topics)
            pending = iter(partitions.items())

            def next_walk() -> Walk | None:
                for tp, directory in pending:
                    replica = ReplicaPartition(directory)
                    try:
                        walk = self._walk_of(
                            tp, replica, compacted=tp.topic in compacted, start=resume.get(str(tp))
                        )
                    except BaseException:
                        replica.close()
                        raise
                    replicas[id(walk)] = replica
                    return walk
                return None

            def done(walk: Walk) -> None:
                replica = replicas.pop(id(walk), None)
                if replica is not None:
                    replica.close()
                result = walk.check.result
                results[walk.tp] = result
                if self.options.resume is not None and self.options.sample is None:
                    resume[str(walk.tp)] = result.verified_to
                    _save_resume(self.options.resume, resume)
                if self.on_result is not None:
                    self.on_result(result)

            await self.source.walk_many(
                next_walk, at_once=max(1, self.options.partitions_per_fetch), done=done
            )
        finally:
            for replica in replicas.values():
                replica.close()
            await self.source.close()
        return [results[tp] for tp in partitions if tp in results]

    def _walk_of(
        self, tp: TopicPartition, replica: ReplicaPartition, *, compacted: bool, start: int | None
    ) -> Walk:
        async def read_replica(low: int, high: int) -> ReplicaSlice:
            # A one-shot command's own reads of a replica at rest (no daemon to keep going).
            return replica.slice(low, high)

        offsets = replica.offsets()
        targets = None
        if self.options.sample is not None:
            targets = replica.sample(self.options.sample, self.options.seed)
        check = PartitionCheck(tp, offsets, compacted=compacted, targets=targets, start=start)
        return Walk(check, read_replica)


class _Retry(Exception):
    """A transient answer: fresh metadata and the same request again."""


def _whole_batches(answer: _Answer) -> list[Batch]:
    scan = scan_batches(answer.records, verify_crc=False)
    return [Batch.from_header(h, answer.records) for h in scan.batches]


async def _compare(
    check: PartitionCheck,
    offset: int,
    answer: _Answer,
    read_replica: ReadReplica,
    theirs: list[Batch] | None = None,
) -> None:
    """The check takes the source's whole batches of `answer` (`theirs`, when already
    found) and the replica's at the same offsets."""
    if theirs is None:
        theirs = _whole_batches(answer)
    ours = ReplicaSlice(())
    if theirs:
        ours = await read_replica(offset, theirs[-1].last_offset)
    check.on_answer(SourceAnswer(answer.high_watermark, answer.log_start_offset, theirs), ours)


def replica_offsets(directory: Path) -> OffsetRange:
    """The replica's range in one partition directory (for reports and tests)."""
    replica = ReplicaPartition(directory)
    try:
        return replica.offsets()
    finally:
        replica.close()
