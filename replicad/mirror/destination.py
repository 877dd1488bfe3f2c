"""The destination cluster as the mirror talks to it: an idempotent producer's requests
(InitProducerId, Produce with acks=all), topic creation (CreateTopics) and the partition
log ends a restart reconciles against (ListOffsets). Each call returns a small named
result; per-partition and per-topic failures are results (Kafka's error names), and only
a cluster that cannot be reached raises (KafkaConnectionError / ProtocolError).
"""

from __future__ import annotations

import asyncio
import datetime
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from kio.schema.errors import ErrorCode

from replicad.errors import ProtocolError
from replicad.mirror.partition_mirror import Failure
from replicad.mirror.produce_frame import produce_frame
from replicad.mirror.restamp import ProducerStamp
from replicad.protocol.admin import (
    TopicToCreate,
    alter_topic_configs_request,
    create_partitions_request,
    create_topics_request,
)
from replicad.protocol.apis import ApiKey
from replicad.protocol.client import KafkaClient
from replicad.protocol.codec import request_type
from replicad.protocol.connection import BrokerConnection, Buffer
from replicad.protocol.error_codes import error_code_of, error_name
from replicad.protocol.requests import (
    OffsetQuery,
    list_offsets_request,
    make_entity,
)
from replicad.types import TopicPartition
from replicad.wire import (
    CONSUMER_REPLICA_ID,
    DEBUGGING_REPLICA_ID,
    LATEST_TIMESTAMP,
)

# What a topic administration request asks about (topics to create, partition counts...).
Asked = TypeVar("Asked")

# Every in-sync replica must have the batch before it is acknowledged.
ACKS_ALL = -1

# Errors after which a resend of the same batch, same sequence, is right (the Java
# producer's RetriableException subclasses that a Produce can carry).
RETRIABLE_PRODUCE_ERRORS = frozenset(
    {
        ErrorCode.not_leader_or_follower,
        ErrorCode.leader_not_available,
        ErrorCode.unknown_topic_or_partition,
        ErrorCode.request_timed_out,
        ErrorCode.network_exception,
        ErrorCode.not_enough_replicas,
        ErrorCode.not_enough_replicas_after_append,
        ErrorCode.kafka_storage_error,
        ErrorCode.fenced_leader_epoch,
        ErrorCode.unknown_leader_epoch,
        ErrorCode.concurrent_transactions,
        ErrorCode.throttling_quota_exceeded,
        ErrorCode.corrupt_message,  # a bit flipped on the way; the broker checked our CRC
    }
)
# Errors that say the destination has forgotten or fenced our producer session, or that
# its sequence disagrees with ours: a new producer id and a reconcile set it right.
SESSION_ERRORS = frozenset(
    {
        ErrorCode.out_of_order_sequence_number,
        ErrorCode.unknown_producer_id,
        ErrorCode.invalid_producer_epoch,
        ErrorCode.producer_fenced,
        ErrorCode.invalid_producer_id_mapping,
    }
)

# The batch exceeds what the destination takes (max.message.bytes, message.max.bytes).
TOO_LARGE_ERRORS = frozenset({ErrorCode.message_too_large, ErrorCode.record_list_too_large})


@dataclass(frozen=True, slots=True)
class ProduceAnswer:
    """The destination's answer for one partition: `error` None means the batch is in
    the log at `base_offset` (a duplicate of an earlier send counts as taken)."""

    base_offset: int
    error: ErrorCode | None = None
    error_name: str | None = None
    message: str | None = None

    @property
    def retriable(self) -> bool:
        return self.error in RETRIABLE_PRODUCE_ERRORS

    @property
    def session_lost(self) -> bool:
        return self.error in SESSION_ERRORS

    @property
    def failure(self) -> Failure | None:
        """The answer as the partition mirror's core takes a failure (None: taken)."""
        if self.error is None:
            return None
        if self.error == ErrorCode.out_of_order_sequence_number:
            return Failure.OUT_OF_ORDER
        if self.session_lost:
            return Failure.SESSION
        if self.error in TOO_LARGE_ERRORS:
            return Failure.TOO_LARGE
        return Failure.RETRY if self.retriable else Failure.FATAL

    @property
    def reason(self) -> str:
        return (self.error_name or "") + (f" ({self.message})" if self.message else "")


@dataclass(frozen=True, slots=True)
class LogEnd:
    """A partition's log end and high watermark at the destination (error: Kafka's name)."""

    log_end: int = -1
    high_watermark: int = -1
    error: str | None = None

    @property
    def settled(self) -> bool:
        """No write of ours is between being appended and being acknowledged."""
        return self.error is None and self.log_end == self.high_watermark


class Destination:
    def __init__(self, client: KafkaClient, *, produce_timeout_ms: int) -> None:
        self.client = client
        self.produce_timeout_ms = produce_timeout_ms

    async def _admin(self, api: ApiKey, build: Callable[[int, Asked], Any], asked: Asked) -> Any:
        """A topic administration request (below) to any destination broker, built by
        `build` at the version of `api` that broker speaks; its answer."""
        conn = await self.client.broker_connection()
        assert conn.versions is not None
        return await conn.request(build(conn.versions.require(api), asked))

    async def init_producer_id(self) -> ProducerStamp:
        """A new idempotent producer session (no transactional id)."""
        conn = await self.client.broker_connection()
        version = conn.versions.require(ApiKey.INIT_PRODUCER_ID) if conn.versions else 0
        body = await conn.request(
            make_entity(
                request_type(ApiKey.INIT_PRODUCER_ID, version),
                transactional_id=None,
                transaction_timeout=datetime.timedelta(milliseconds=60_000),
                producer_id=-1,
                producer_epoch=-1,
            )
        )
        code = error_code_of(int(body.error_code))
        if code != ErrorCode.none:
            raise ProtocolError(f"InitProducerId failed at the destination: {code.name}")
        return ProducerStamp(int(body.producer_id), int(body.producer_epoch))

    async def create_topics(self, topics: Sequence[TopicToCreate]) -> dict[str, str | None]:
        """topic -> None when created (or it already existed), else the error and message."""
        if not topics:
            return {}
        body = await self._admin(ApiKey.CREATE_TOPICS, create_topics_request, topics)
        return _by_topic(body.topics, "name", _CREATED)

    async def create_partitions(self, counts: Mapping[str, int]) -> dict[str, str | None]:
        """topic -> None when it has `count` partitions now, else the error and message."""
        if not counts:
            return {}
        body = await self._admin(ApiKey.CREATE_PARTITIONS, create_partitions_request, counts)
        return _by_topic(body.results, "name")

    async def alter_topic_configs(
        self, changes: Mapping[str, Mapping[str, str]]
    ) -> dict[str, str | None]:
        """Set these configs on these topics (IncrementalAlterConfigs SET); topic -> None
        when set, else the error and message."""
        if not changes:
            return {}
        api = ApiKey.INCREMENTAL_ALTER_CONFIGS
        body = await self._admin(api, alter_topic_configs_request, changes)
        return _by_topic(body.responses, "resource_name")

    async def log_ends(
        self, leader_id: int, partitions: Sequence[TopicPartition]
    ) -> dict[TopicPartition, LogEnd]:
        """Log end offset and high watermark of each partition, from its leader."""
        conn = await self.client.connection(leader_id)
        assert conn.versions is not None
        version = conn.versions.require(ApiKey.LIST_OFFSETS)
        queries = {tp: OffsetQuery(LATEST_TIMESTAMP) for tp in partitions}
        ends = await conn.request(
            list_offsets_request(version, queries, replica_id=DEBUGGING_REPLICA_ID)
        )
        marks = await conn.request(
            list_offsets_request(version, queries, replica_id=CONSUMER_REPLICA_ID)
        )
        found_end = _offsets(ends)
        found_mark = _offsets(marks)
        out: dict[TopicPartition, LogEnd] = {}
        for tp in partitions:
            end, mark = found_end.get(tp), found_mark.get(tp)
            if end is None or mark is None:
                out[tp] = LogEnd(error="missing from the answer")
            elif isinstance(end, str) or isinstance(mark, str):
                out[tp] = LogEnd(error=end if isinstance(end, str) else str(mark))
            else:
                out[tp] = LogEnd(end, mark)
        return out

    def produce(
        self, conn: BrokerConnection, tp: TopicPartition, batch: Buffer | Sequence[Buffer]
    ) -> _ProduceCall:
        """Send one batch to `tp`'s leader (`conn`) now; await the result for its answer."""
        return self.produce_many(conn, {tp: batch})

    def produce_many(
        self, conn: BrokerConnection, batches: Mapping[TopicPartition, Buffer | Sequence[Buffer]]
    ) -> _ProduceCall:
        """Send one Produce of one batch per partition (Kafka takes no more: exactly one
        batch per partition per request) to their leader (`conn`) now; the result's
        `answers()` reads every partition's answer, `answer()` the first's. A batch is
        its bytes, or the buffers it is made of in order (restamp.restamped's header and
        records), written to the socket as they are (produce_frame.py)."""
        assert conn.versions is not None
        version = conn.versions.require(ApiKey.PRODUCE)
        parts = {
            tp: (batch,) if isinstance(batch, (bytes, bytearray, memoryview)) else batch
            for tp, batch in batches.items()
        }

        def frame(correlation_id: int) -> list[Buffer]:
            return produce_frame(
                version=version,
                correlation_id=correlation_id,
                client_id=conn.client_id,
                acks=ACKS_ALL,
                timeout_ms=self.produce_timeout_ms,
                batches=parts,
            )

        # The broker may hold an acks=all request up to its timeout; give the answer time.
        timeout_s = conn.request_timeout_s + self.produce_timeout_ms / 1000
        future = conn.send_frame(ApiKey.PRODUCE, version, frame, timeout_s=timeout_s)
        return _ProduceCall(future, tuple(batches))


class _ProduceCall:
    """A Produce in flight; `await call.answers()` reads each partition's answer."""

    def __init__(self, future: asyncio.Future[Any], partitions: tuple[TopicPartition, ...]) -> None:
        self.future = future
        self.partitions = partitions

    async def answer(self) -> ProduceAnswer:
        return (await self.answers())[self.partitions[0]]

    async def answers(self) -> dict[TopicPartition, ProduceAnswer]:
        return produce_answers(await self.future, self.partitions)


def produce_answers(
    body: Any, partitions: Sequence[TopicPartition]
) -> dict[TopicPartition, ProduceAnswer]:
    """Each asked partition's answer in a Produce response body (a partition missing from
    it is an unknown server error: resent)."""
    out: dict[TopicPartition, ProduceAnswer] = {}
    for topic in body.responses:
        name = str(topic.name)
        for p in topic.partition_responses:
            tp = TopicPartition(name, int(p.index))
            code = error_code_of(int(p.error_code))
            if code in (ErrorCode.none, ErrorCode.duplicate_sequence_number):
                out[tp] = ProduceAnswer(int(p.base_offset))
            else:
                out[tp] = ProduceAnswer(
                    -1, code, error_name(int(p.error_code)), getattr(p, "error_message", None)
                )
    missing = ProduceAnswer(-1, ErrorCode.unknown_server_error, "missing from the answer")
    return {tp: out.get(tp, missing) for tp in partitions}


def _offsets(body: object) -> dict[TopicPartition, int | str]:
    out: dict[TopicPartition, int | str] = {}
    for topic in body.topics:  # type: ignore[attr-defined]
        for p in topic.partitions:
            tp = TopicPartition(str(topic.name), int(p.partition_index))
            code = int(p.error_code)
            out[tp] = error_name(code) if code != ErrorCode.none else int(p.offset)
    return out


_DONE = frozenset({ErrorCode.none})
# A topic that already exists counts as created: a restarted mirror asks again.
_CREATED = frozenset({ErrorCode.none, ErrorCode.topic_already_exists})


def _by_topic(
    results: Sequence[Any], name_field: str, done: frozenset[ErrorCode] = _DONE
) -> dict[str, str | None]:
    """An administration answer's per-topic results as topic -> None when its error code
    is one of `done`, else the error and message (the topic is in `name_field`)."""
    by_topic: dict[str, str | None] = {}
    for r in results:
        code = error_code_of(int(r.error_code))
        by_topic[str(getattr(r, name_field))] = None if code in done else _error_text(code, r)
    return by_topic


def _error_text(code: ErrorCode, result: object) -> str:
    """A per-topic failure: Kafka's error name, and its message when it sent one."""
    message = getattr(result, "error_message", None)
    return code.name + (f": {message}" if message else "")
