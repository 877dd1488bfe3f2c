"""Build kio request entities for whichever version was negotiated.

kio generates one class per API version; their fields differ (topic names vs
ids, replica_id in the body vs ReplicaState). `_make` fills a class from the
superset of fields replicad knows and drops the ones that version lacks, so
each builder below is written once for every version.
"""

from __future__ import annotations

import datetime
import sys
import uuid
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, fields
from functools import cache
from typing import Any

from replicad.errors import LocalProtocolError
from replicad.protocol.apis import ApiKey
from replicad.protocol.codec import request_type
from replicad.types import TopicPartition
from replicad.wire import (
    CONSUMER_REPLICA_ID,
    FETCH_TOPIC_ID_VERSION,
    READ_UNCOMMITTED,
)

# Fetch v7 introduced fetch sessions (KIP-227).
FETCH_SESSION_VERSION = 7
# Fetch v15 moved replica_id from the body into the tagged ReplicaState (KIP-903).
FETCH_REPLICA_STATE_VERSION = 15


@cache
def _field_names(cls: type) -> frozenset[str]:
    return frozenset(f.name for f in fields(cls))


def make_entity(cls: type, **values: Any) -> Any:
    """An instance of a kio class from the fields it has; extra values are dropped."""
    names = _field_names(cls)
    return cls(**{k: v for k, v in values.items() if k in names})


def nested_type(request_cls: type, name: str) -> type:
    return getattr(sys.modules[request_cls.__module__], name)


def metadata_request(version: int, topics: Sequence[str] | None) -> Any:
    """Metadata for the named topics, or for all topics when `topics` is None."""
    cls = request_type(ApiKey.METADATA, version)
    topic_cls = nested_type(cls, "MetadataRequestTopic")
    wanted = (
        None
        if topics is None
        else tuple(make_entity(topic_cls, name=t, topic_id=None) for t in topics)
    )
    return make_entity(
        cls,
        topics=wanted,
        allow_auto_topic_creation=False,
        include_cluster_authorized_operations=False,
        include_topic_authorized_operations=False,
    )


@dataclass(frozen=True, slots=True)
class OffsetQuery:
    timestamp: int
    current_leader_epoch: int = -1


def list_offsets_request(
    version: int,
    queries: Mapping[TopicPartition, OffsetQuery],
    *,
    replica_id: int = CONSUMER_REPLICA_ID,
    isolation_level: int = READ_UNCOMMITTED,
) -> Any:
    cls = request_type(ApiKey.LIST_OFFSETS, version)
    topic_cls = nested_type(cls, "ListOffsetsTopic")
    part_cls = nested_type(cls, "ListOffsetsPartition")
    partitions = (
        (
            tp.topic,
            make_entity(
                part_cls,
                partition_index=tp.partition,
                current_leader_epoch=q.current_leader_epoch,
                timestamp=q.timestamp,
                max_num_offsets=1,
            ),
        )
        for tp, q in queries.items()
    )
    return make_entity(
        cls,
        replica_id=replica_id,
        isolation_level=isolation_level,
        topics=_by_topic(topic_cls, "name", partitions),
        timeout=datetime.timedelta(seconds=30),
    )


def offset_for_leader_epoch_request(
    version: int,
    queries: Mapping[TopicPartition, tuple[int, int]],
    *,
    replica_id: int = CONSUMER_REPLICA_ID,
) -> Any:
    """queries: partition -> (current leader epoch, epoch whose end offset we want)."""
    cls = request_type(ApiKey.OFFSET_FOR_LEADER_EPOCH, version)
    topic_cls = nested_type(cls, "OffsetForLeaderTopic")
    part_cls = nested_type(cls, "OffsetForLeaderPartition")
    partitions = (
        (
            tp.topic,
            make_entity(
                part_cls, partition=tp.partition, current_leader_epoch=current, leader_epoch=epoch
            ),
        )
        for tp, (current, epoch) in queries.items()
    )
    return make_entity(cls, replica_id=replica_id, topics=_by_topic(topic_cls, "topic", partitions))


def _by_topic(
    topic_cls: type, name_field: str, partitions: Iterable[tuple[str, Any]]
) -> tuple[Any, ...]:
    """One `topic_cls` entity per topic (its name in `name_field`) holding that topic's
    partition entities, topics in the order they first appear."""
    by_topic: dict[str, list[Any]] = {}
    for topic, entity in partitions:
        by_topic.setdefault(topic, []).append(entity)
    return tuple(
        make_entity(topic_cls, **{name_field: t}, partitions=tuple(p)) for t, p in by_topic.items()
    )


@dataclass(frozen=True, slots=True)
class FetchPartitionSpec:
    fetch_offset: int
    log_start_offset: int
    max_bytes: int
    current_leader_epoch: int = -1
    last_fetched_epoch: int = -1
    topic_id: uuid.UUID | None = None  # required from v13


@dataclass(frozen=True, slots=True)
class FetchSpec:
    """Everything one Fetch request says, independent of its version."""

    max_wait_ms: int
    min_bytes: int
    max_bytes: int
    isolation_level: int
    session_id: int
    session_epoch: int
    partitions: Mapping[TopicPartition, FetchPartitionSpec]  # request order matters (KIP-74)
    forgotten: Sequence[TopicPartition] = ()  # v7..v12: by name
    forgotten_ids: Sequence[tuple[uuid.UUID, int]] = ()  # v13+: (topic id, partition)
    replica_id: int = CONSUMER_REPLICA_ID
    replica_epoch: int = -1
    rack_id: str = ""


def fetch_request(version: int, spec: FetchSpec) -> Any:
    cls = request_type(ApiKey.FETCH, version)
    topic_cls = nested_type(cls, "FetchTopic")
    part_cls = nested_type(cls, "FetchPartition")
    use_ids = version >= FETCH_TOPIC_ID_VERSION
    topics = []
    # Consecutive partitions of one topic share an entry; a topic that reappears
    # later (after rotation) starts a new entry, which Kafka accepts: the order of
    # partitions is the priority order (KIP-74).
    for topic, tps in _ordered_runs(spec.partitions):
        parts = tuple(
            make_entity(
                part_cls,
                partition=tp.partition,
                current_leader_epoch=spec.partitions[tp].current_leader_epoch,
                fetch_offset=spec.partitions[tp].fetch_offset,
                last_fetched_epoch=spec.partitions[tp].last_fetched_epoch,
                log_start_offset=spec.partitions[tp].log_start_offset,
                partition_max_bytes=spec.partitions[tp].max_bytes,
            )
            for tp in tps
        )
        if use_ids:
            topic_id = spec.partitions[tps[0]].topic_id
            if topic_id is None:
                raise LocalProtocolError(f"Fetch v{version} needs a topic id for {topic!r}")
            topics.append(make_entity(topic_cls, topic_id=topic_id, partitions=parts))
        else:
            topics.append(make_entity(topic_cls, topic=topic, partitions=parts))
    if (spec.forgotten or spec.forgotten_ids) and version < FETCH_SESSION_VERSION:
        raise LocalProtocolError(f"Fetch v{version} has no sessions: cannot forget partitions")
    forgotten = []
    if version >= FETCH_SESSION_VERSION:
        forgotten_cls = nested_type(cls, "ForgottenTopic")
        if use_ids:
            by_id: dict[uuid.UUID, list[int]] = {}
            for topic_id, partition in spec.forgotten_ids:
                by_id.setdefault(topic_id, []).append(partition)
            forgotten = [
                make_entity(forgotten_cls, topic_id=k, partitions=tuple(v))
                for k, v in by_id.items()
            ]
        else:
            by_name: dict[str, list[int]] = {}
            for tp in spec.forgotten:
                by_name.setdefault(tp.topic, []).append(tp.partition)
            forgotten = [
                make_entity(forgotten_cls, topic=k, partitions=tuple(v)) for k, v in by_name.items()
            ]
    values: dict[str, Any] = dict(
        max_wait=datetime.timedelta(milliseconds=spec.max_wait_ms),
        min_bytes=spec.min_bytes,
        max_bytes=spec.max_bytes,
        isolation_level=spec.isolation_level,
        session_id=spec.session_id,
        session_epoch=spec.session_epoch,
        topics=tuple(topics),
        forgotten_topics_data=tuple(forgotten),
        rack_id=spec.rack_id,
    )
    if version >= FETCH_REPLICA_STATE_VERSION:
        state_cls = nested_type(cls, "ReplicaState")
        values["replica_state"] = state_cls(
            replica_id=spec.replica_id, replica_epoch=spec.replica_epoch
        )
    else:
        values["replica_id"] = spec.replica_id
    return make_entity(cls, **values)


def _ordered_runs(
    partitions: Mapping[TopicPartition, Any],
) -> list[tuple[str, list[TopicPartition]]]:
    runs: list[tuple[str, list[TopicPartition]]] = []
    for tp in partitions:
        if runs and runs[-1][0] == tp.topic:
            runs[-1][1].append(tp)
        else:
            runs.append((tp.topic, [tp]))
    return runs
