"""Build kio request entities for whichever version was negotiated.

kio generates one class per API version; their fields differ (topic names vs
ids, replica_id in the body vs ReplicaState). `_make` fills a class from the
superset of fields replicad knows and drops the ones that version lacks, so
each builder below is written once for every version. Fetch has a module of its own
(fetch_request.py: its one model, built and read).
"""

from __future__ import annotations

import datetime
import sys
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, fields
from functools import cache
from typing import Any

from replicad.protocol.apis import ApiKey
from replicad.protocol.codec import request_type
from replicad.types import TopicPartition
from replicad.wire import (
    CONSUMER_REPLICA_ID,
    READ_UNCOMMITTED,
)


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
