"""Answers to everything but Fetch: ApiVersions, Metadata, ListOffsets, OffsetForLeaderEpoch.

Rules (Kafka's KafkaApis, as they apply to a node that leads every partition it has):
- ApiVersions lists exactly the APIs and versions below, and on a SASL listener the SASL
  ones too (Produce is listed so that a producer gets a clear refusal, see refusals.py).
- Metadata: this node is the only broker and the controller; it leads every local
  partition, which has this node as its only replica and in-sync replica. No topic is
  created on request: a topic named but not held is UNKNOWN_TOPIC_OR_PARTITION (by name)
  or UNKNOWN_TOPIC_ID (by id). An absent topic list (v1+) or an empty one (v0) means all.
  Names starting with "__" that Kafka uses internally are reported as internal.
- ListOffsets: EARLIEST (-2) and EARLIEST_LOCAL (-4) -> the log start offset; LATEST (-1)
  -> the log end for a replica or debug reader, else the high watermark (READ_UNCOMMITTED)
  or the last stable offset (READ_COMMITTED); MAX_TIMESTAMP (-3) -> the first record
  carrying the largest timestamp; LATEST_TIERED (-5) and EARLIEST_PENDING_UPLOAD (-6) -> -1
  (no tiered storage); a timestamp >= 0 -> the first record whose timestamp is >= it, through
  the time index, unless that offset is not yet readable by the asker (then -1). The leader
  epoch reported is the epoch the returned offset belongs to. v0 answers a list of offsets:
  [the bound] for LATEST, [log start] for EARLIEST, else the base offsets (newest first) of
  the segments whose records are all older than the timestamp.
- OffsetForLeaderEpoch: the end offset of the largest epoch <= the one asked for (see
  log/epoch.py), after the current-leader-epoch check.
- Every per-partition answer first checks the partition exists and the current leader epoch
  the request names (KIP-320): FENCED_LEADER_EPOCH when below ours, UNKNOWN_LEADER_EPOCH
  when above.
"""

from __future__ import annotations

import base64
import datetime
import sys
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from kio.schema.errors import ErrorCode

from replicad.leader.catalog import Catalog
from replicad.leader.legacy_codec import (
    LegacyListOffsetsRequest,
    LegacyOffsetsAnswer,
)
from replicad.leader.reads import TransactionTracker, check_leader_epoch
from replicad.log.partition import PartitionLog
from replicad.protocol.apis import ApiKey, VersionRange
from replicad.protocol.codec import response_type
from replicad.protocol.requests import make_entity
from replicad.types import TopicPartition
from replicad.wire import (
    CONSUMER_REPLICA_ID,
    EARLIEST_TIMESTAMP,
    LATEST_TIMESTAMP,
    NO_EPOCH,
    READ_COMMITTED,
    UNKNOWN_OFFSET,
)

# What this server answers (min, max version per API key).
SUPPORTED_VERSIONS: Mapping[int, VersionRange] = {
    ApiKey.PRODUCE: VersionRange(0, 13),
    ApiKey.FETCH: VersionRange(0, 17),
    ApiKey.LIST_OFFSETS: VersionRange(0, 11),
    ApiKey.METADATA: VersionRange(0, 13),
    ApiKey.API_VERSIONS: VersionRange(0, 4),
    ApiKey.OFFSET_FOR_LEADER_EPOCH: VersionRange(2, 4),
}
# What a SASL listener answers besides (Kafka's SaslHandshake v0-1, SaslAuthenticate v0-2).
SASL_VERSIONS: Mapping[int, VersionRange] = {
    ApiKey.SASL_HANDSHAKE: VersionRange(0, 1),
    ApiKey.SASL_AUTHENTICATE: VersionRange(0, 2),
}

MAX_TIMESTAMP = -3
EARLIEST_LOCAL_TIMESTAMP = -4
LATEST_TIERED_TIMESTAMP = -5
EARLIEST_PENDING_UPLOAD_TIMESTAMP = -6
NO_TIMESTAMP = -1
# Kafka's "authorized operations not asked for".
AUTHORIZED_OPERATIONS_OMITTED = -(2**31)
INTERNAL_TOPICS = frozenset({"__consumer_offsets", "__transaction_state", "__share_group_state"})


@dataclass(frozen=True, slots=True)
class NodeInfo:
    node_id: int
    host: str
    port: int
    cluster_id: str


def cluster_id_for(data_dir: object) -> str:
    """A stable cluster id for a data directory, in Kafka's printed form (base64 uuid)."""
    value = uuid.uuid5(uuid.NAMESPACE_URL, f"replicad:{data_dir}")
    return base64.urlsafe_b64encode(value.bytes).rstrip(b"=").decode()


def _no_throttle() -> datetime.timedelta:
    return datetime.timedelta(0)


# -- ApiVersions ------------------------------------------------------------------------------


def api_versions_response(
    version: int,
    *,
    error: int = ErrorCode.none,
    supported: Mapping[int, VersionRange] = SUPPORTED_VERSIONS,
) -> Any:
    """The ApiVersions answer listing `supported` (a SASL listener adds SASL_VERSIONS)."""
    cls = response_type(ApiKey.API_VERSIONS, version)
    module = sys.modules[cls.__module__]
    keys = tuple(
        make_entity(module.ApiVersion, api_key=int(k), min_version=r.min, max_version=r.max)
        for k, r in sorted(supported.items())
    )
    return make_entity(
        cls, error_code=ErrorCode(error), api_keys=keys, throttle_time=_no_throttle()
    )


# -- Metadata ---------------------------------------------------------------------------------


def metadata_response(
    version: int, body: Any, catalog: Catalog, node: NodeInfo, *, now_ms: int
) -> Any:
    cls = response_type(ApiKey.METADATA, version)
    module = sys.modules[cls.__module__]
    broker = make_entity(
        module.MetadataResponseBroker, node_id=node.node_id, host=node.host, port=node.port
    )
    topics = []
    for name, topic_id in _metadata_topics(version, body, catalog, now_ms):
        entry = catalog.topic(name, now_ms=now_ms) if name is not None else None
        if entry is None:
            error = ErrorCode.unknown_topic_or_partition if name else ErrorCode.unknown_topic_id
            topics.append(
                make_entity(
                    module.MetadataResponseTopic,
                    error_code=error,
                    name=name,
                    topic_id=topic_id or uuid.UUID(int=0),
                    is_internal=False,
                    partitions=(),
                    topic_authorized_operations=AUTHORIZED_OPERATIONS_OMITTED,
                )
            )
            continue
        partitions = tuple(
            make_entity(
                module.MetadataResponsePartition,
                error_code=ErrorCode.none,
                partition_index=index,
                leader_id=node.node_id,
                leader_epoch=Catalog.leader_epoch(plog),
                replica_nodes=(node.node_id,),
                isr_nodes=(node.node_id,),
                offline_replicas=(),
            )
            for index, plog in sorted(entry.partitions.items())
        )
        topics.append(
            make_entity(
                module.MetadataResponseTopic,
                error_code=ErrorCode.none,
                name=entry.name,
                topic_id=entry.topic_id,
                is_internal=entry.name in INTERNAL_TOPICS,
                partitions=partitions,
                topic_authorized_operations=AUTHORIZED_OPERATIONS_OMITTED,
            )
        )
    return make_entity(
        cls,
        throttle_time=_no_throttle(),
        brokers=(broker,),
        cluster_id=node.cluster_id,
        controller_id=node.node_id,
        topics=tuple(topics),
        cluster_authorized_operations=AUTHORIZED_OPERATIONS_OMITTED,
        error_code=ErrorCode.none,
    )


def _metadata_topics(
    version: int, body: Any, catalog: Catalog, now_ms: int
) -> list[tuple[str | None, uuid.UUID | None]]:
    requested = body.topics
    if requested is None or (version == 0 and not requested):
        return [(name, None) for name in sorted(catalog.topics(now_ms=now_ms))]
    wanted: list[tuple[str | None, uuid.UUID | None]] = []
    for t in requested:
        name = getattr(t, "name", None)
        topic_id = getattr(t, "topic_id", None)
        if topic_id == uuid.UUID(int=0):
            topic_id = None
        if name is None and topic_id is not None:
            name = catalog.topic_name(topic_id, now_ms=now_ms)
        wanted.append((name, topic_id))
    return wanted


# -- ListOffsets ------------------------------------------------------------------------------
#
# In two steps, so that the disk is read off the event loop: `offset_questions` (on the loop:
# the catalog, the leader epoch, the readable bound) and `answer_offsets` (PartitionLog's
# methods only, which may run on any thread; a search by timestamp reads the time index and
# batches). serve runs the second on a worker thread when a question `reads_disk`.


@dataclass(frozen=True, slots=True)
class OffsetAnswer:
    error_code: int
    timestamp: int = NO_TIMESTAMP
    offset: int = UNKNOWN_OFFSET
    leader_epoch: int = NO_EPOCH


@dataclass(frozen=True, slots=True)
class OffsetQuestion:
    """One partition of a ListOffsets, resolved on the loop: an answer already (`known`),
    or the log to answer it from, with what the asker may read of it."""

    timestamp: int
    known: OffsetAnswer | None = None
    plog: PartitionLog | None = None
    bound: int = UNKNOWN_OFFSET
    leader_epoch: int = NO_EPOCH

    @property
    def reads_disk(self) -> bool:
        return self.known is None and (self.timestamp >= 0 or self.timestamp == MAX_TIMESTAMP)


def list_offsets_response(
    version: int,
    body: Any,
    catalog: Catalog,
    transactions: TransactionTracker,
    *,
    now_ms: int,
) -> Any:
    """The whole answer on the calling thread (serve splits it; see above)."""
    questions = offset_questions(body, catalog, transactions, now_ms=now_ms)
    return offsets_response(version, body, answer_offsets(questions))


def offset_questions(
    body: Any, catalog: Catalog, transactions: TransactionTracker, *, now_ms: int
) -> list[OffsetQuestion]:
    """Each partition of the request, in its order (topics, then partitions)."""
    isolation = int(getattr(body, "isolation_level", 0))
    replica_id = int(body.replica_id)
    return [
        offset_question(
            catalog,
            transactions,
            TopicPartition(t.name, int(p.partition_index)),
            int(p.timestamp),
            current_leader_epoch=int(getattr(p, "current_leader_epoch", -1)),
            replica_id=replica_id,
            isolation_level=isolation,
            now_ms=now_ms,
        )
        for t in body.topics
        for p in t.partitions
    ]


def offset_question(
    catalog: Catalog,
    transactions: TransactionTracker,
    tp: TopicPartition,
    timestamp: int,
    *,
    current_leader_epoch: int,
    replica_id: int,
    isolation_level: int,
    now_ms: int,
) -> OffsetQuestion:
    plog = catalog.partition(tp, now_ms=now_ms)
    if plog is None:
        return OffsetQuestion(timestamp, OffsetAnswer(ErrorCode.unknown_topic_or_partition))
    leader_epoch = Catalog.leader_epoch(plog)
    error = check_leader_epoch(leader_epoch, current_leader_epoch)
    if error != ErrorCode.none:
        return OffsetQuestion(timestamp, OffsetAnswer(error))
    bound = _readable_bound(tp, plog, transactions, replica_id, isolation_level)
    if timestamp == LATEST_TIMESTAMP:
        return OffsetQuestion(
            timestamp, OffsetAnswer(ErrorCode.none, NO_TIMESTAMP, bound, leader_epoch)
        )
    if timestamp in (LATEST_TIERED_TIMESTAMP, EARLIEST_PENDING_UPLOAD_TIMESTAMP):
        return OffsetQuestion(timestamp, OffsetAnswer(ErrorCode.none))
    if timestamp < 0 and timestamp not in (
        EARLIEST_TIMESTAMP,
        EARLIEST_LOCAL_TIMESTAMP,
        MAX_TIMESTAMP,
    ):
        return OffsetQuestion(timestamp, OffsetAnswer(ErrorCode.invalid_request))
    return OffsetQuestion(timestamp, plog=plog, bound=bound, leader_epoch=leader_epoch)


def answer_offsets(questions: list[OffsetQuestion]) -> list[OffsetAnswer]:
    """The answers, reading the disk for a search by timestamp; any thread."""
    return [q.known if q.known is not None else _answer_offset(q) for q in questions]


def _answer_offset(question: OffsetQuestion) -> OffsetAnswer:
    plog, timestamp = question.plog, question.timestamp
    assert plog is not None
    if timestamp in (EARLIEST_TIMESTAMP, EARLIEST_LOCAL_TIMESTAMP):
        start = plog.log_start_offset
        return OffsetAnswer(ErrorCode.none, NO_TIMESTAMP, start, epoch_of(plog, start))
    if timestamp == MAX_TIMESTAMP:
        peak = plog.largest_timestamp()
        # Kafka 4 answers the first record carrying the largest timestamp (KAFKA-16310),
        # not the last offset of the batch that holds it.
        found = None if peak is None else plog.offset_for_timestamp(peak)
    else:
        found = plog.offset_for_timestamp(timestamp)
    if found is None or found.offset >= question.bound or found.timestamp < 0:
        return OffsetAnswer(ErrorCode.none)
    return OffsetAnswer(ErrorCode.none, found.timestamp, found.offset, epoch_of(plog, found.offset))


def offsets_response(version: int, body: Any, answers: list[OffsetAnswer]) -> Any:
    """The response of `version` to `body`, its partitions answered by `answers` in order."""
    cls = response_type(ApiKey.LIST_OFFSETS, version)
    module = sys.modules[cls.__module__]
    each = iter(answers)
    topics = []
    for t in body.topics:
        partitions = []
        for p in t.partitions:
            answer = next(each)
            partitions.append(
                make_entity(
                    module.ListOffsetsPartitionResponse,
                    partition_index=p.partition_index,
                    error_code=ErrorCode(answer.error_code),
                    timestamp=answer.timestamp,
                    offset=answer.offset,
                    leader_epoch=answer.leader_epoch,
                    old_style_offsets=(),
                )
            )
        topics.append(
            make_entity(module.ListOffsetsTopicResponse, name=t.name, partitions=tuple(partitions))
        )
    return make_entity(cls, throttle_time=_no_throttle(), topics=tuple(topics))


def _readable_bound(
    tp: TopicPartition,
    plog: PartitionLog,
    transactions: TransactionTracker,
    replica_id: int,
    isolation_level: int,
) -> int:
    if replica_id != CONSUMER_REPLICA_ID:
        return plog.log_end_offset
    if isolation_level == READ_COMMITTED:
        return transactions.state(tp, plog).last_stable_offset(plog.high_watermark)
    return plog.high_watermark


def epoch_of(plog: PartitionLog, offset: int) -> int:
    """The leader epoch the record at `offset` was written in (-1 if none is known)."""
    epoch = NO_EPOCH
    for entry in plog.epoch_entries():
        if entry.start_offset > offset:
            break
        epoch = entry.epoch
    return epoch


@dataclass(frozen=True, slots=True)
class LegacyOffsetsQuestion:
    """One partition of a ListOffsets v0, resolved on the loop (as OffsetQuestion)."""

    partition: int
    timestamp: int
    max_num_offsets: int
    plog: PartitionLog | None = None
    bound: int = UNKNOWN_OFFSET

    @property
    def reads_disk(self) -> bool:
        return self.plog is not None and self.timestamp not in (
            LATEST_TIMESTAMP,
            EARLIEST_TIMESTAMP,
        )


def legacy_list_offsets(
    request: LegacyListOffsetsRequest,
    catalog: Catalog,
    transactions: TransactionTracker,
    *,
    now_ms: int,
) -> list[tuple[str, list[LegacyOffsetsAnswer]]]:
    """ListOffsets v0: lists of offsets (see the module rules), on the calling thread."""
    return legacy_offsets_answers(
        legacy_offsets_questions(request, catalog, transactions, now_ms=now_ms)
    )


def legacy_offsets_questions(
    request: LegacyListOffsetsRequest,
    catalog: Catalog,
    transactions: TransactionTracker,
    *,
    now_ms: int,
) -> list[tuple[str, list[LegacyOffsetsQuestion]]]:
    topics = []
    for name, partitions in request.topics:
        questions = []
        for p in partitions:
            tp = TopicPartition(name, p.partition)
            plog = catalog.partition(tp, now_ms=now_ms)
            if plog is None:
                questions.append(LegacyOffsetsQuestion(p.partition, p.timestamp, p.max_num_offsets))
                continue
            bound = _readable_bound(tp, plog, transactions, request.replica_id, 0)
            questions.append(
                LegacyOffsetsQuestion(p.partition, p.timestamp, p.max_num_offsets, plog, bound)
            )
        topics.append((name, questions))
    return topics


def legacy_offsets_answers(
    topics: list[tuple[str, list[LegacyOffsetsQuestion]]],
) -> list[tuple[str, list[LegacyOffsetsAnswer]]]:
    """The answers; reads the segments' largest timestamps (maybe from disk): any thread."""
    return [(name, [_legacy_answer(q) for q in questions]) for name, questions in topics]


def _legacy_answer(q: LegacyOffsetsQuestion) -> LegacyOffsetsAnswer:
    if q.plog is None:
        return LegacyOffsetsAnswer(q.partition, ErrorCode.unknown_topic_or_partition, ())
    if q.timestamp == LATEST_TIMESTAMP:
        offsets: tuple[int, ...] = (q.bound,)
    elif q.timestamp == EARLIEST_TIMESTAMP:
        offsets = (q.plog.log_start_offset,)
    else:
        older = [
            base for base, largest in q.plog.segment_timestamps() if 0 <= largest < q.timestamp
        ]
        offsets = tuple(o for o in reversed(older) if o < q.bound)
    return LegacyOffsetsAnswer(q.partition, ErrorCode.none, offsets[: max(q.max_num_offsets, 0)])


# -- OffsetForLeaderEpoch ---------------------------------------------------------------------


def offset_for_leader_epoch_response(
    version: int, body: Any, catalog: Catalog, *, now_ms: int
) -> Any:
    cls = response_type(ApiKey.OFFSET_FOR_LEADER_EPOCH, version)
    module = sys.modules[cls.__module__]
    topics = []
    for t in body.topics:
        partitions = []
        for p in t.partitions:
            plog = catalog.partition(TopicPartition(t.topic, int(p.partition)), now_ms=now_ms)
            values: dict[str, Any] = {"partition": p.partition}
            if plog is None:
                values["error_code"] = ErrorCode.unknown_topic_or_partition
            else:
                error = check_leader_epoch(
                    Catalog.leader_epoch(plog), int(getattr(p, "current_leader_epoch", -1))
                )
                values["error_code"] = ErrorCode(error)
                if error == ErrorCode.none:
                    end = plog.end_offset_for_epoch(int(p.leader_epoch))
                    values.update(leader_epoch=end.epoch, end_offset=end.end_offset)
            partitions.append(make_entity(module.EpochEndOffset, **values))
        topics.append(
            make_entity(
                module.OffsetForLeaderTopicResult, topic=t.topic, partitions=tuple(partitions)
            )
        )
    return make_entity(cls, throttle_time=_no_throttle(), topics=tuple(topics))
