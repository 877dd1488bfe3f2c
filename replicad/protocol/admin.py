"""Kafka's topic administration requests, built in one place for every client that sends
them: the mirror's destination (CreateTopics, CreatePartitions, IncrementalAlterConfigs)
and the groups reader (DescribeConfigs).

Rules:
- An admin request goes to any broker (`KafkaClient.broker_connection`), at the version
  that broker speaks: `admin_version` says which, or None when it does not speak the API.
- Each builder takes plain values and returns the kio request of that version (fields a
  version lacks are dropped by `make_entity`); answers are read by the caller, which knows
  what an error means to it.
- Topics and config keys go out in sorted order, so a request is the same for the same input.
- Pure: no I/O.
"""

from __future__ import annotations

import datetime
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from replicad.protocol.apis import ApiKey
from replicad.protocol.codec import request_type
from replicad.protocol.connection import BrokerConnection
from replicad.protocol.requests import make_entity, nested_type
from replicad.wire import TOPIC_RESOURCE

# IncrementalAlterConfigs' SET operation.
SET_CONFIG = 0
# CreateTopics: the destination's default.replication.factor.
DEFAULT_REPLICATION_FACTOR = -1
# How long the controller may take over a CreateTopics / CreatePartitions.
ADMIN_TIMEOUT = datetime.timedelta(seconds=30)


@dataclass(frozen=True, slots=True)
class TopicToCreate:
    name: str
    partitions: int
    configs: Mapping[str, str]
    replication_factor: int = DEFAULT_REPLICATION_FACTOR


def admin_version(conn: BrokerConnection, api: ApiKey) -> int | None:
    """The version of `api` this broker speaks (None: it does not speak it)."""
    assert conn.versions is not None  # a connection is usable once its versions are known
    return conn.versions.get(api)


def create_topics_request(version: int, topics: Iterable[TopicToCreate]) -> Any:
    cls = request_type(ApiKey.CREATE_TOPICS, version)
    topic_cls = nested_type(cls, "CreatableTopic")
    config_cls = nested_type(cls, "CreatableTopicConfig")
    return make_entity(
        cls,
        topics=tuple(
            make_entity(
                topic_cls,
                name=t.name,
                num_partitions=t.partitions,
                replication_factor=t.replication_factor,
                assignments=(),
                configs=_configs(config_cls, t.configs),
            )
            for t in topics
        ),
        timeout=ADMIN_TIMEOUT,
        validate_only=False,
    )


def create_partitions_request(version: int, counts: Mapping[str, int]) -> Any:
    """Each topic grows to `count` partitions."""
    cls = request_type(ApiKey.CREATE_PARTITIONS, version)
    topic_cls = nested_type(cls, "CreatePartitionsTopic")
    return make_entity(
        cls,
        topics=tuple(
            make_entity(topic_cls, name=t, count=n, assignments=None)
            for t, n in sorted(counts.items())
        ),
        timeout=ADMIN_TIMEOUT,
        validate_only=False,
    )


def alter_topic_configs_request(version: int, changes: Mapping[str, Mapping[str, str]]) -> Any:
    """IncrementalAlterConfigs: SET these configs on these topics (others are left alone)."""
    cls = request_type(ApiKey.INCREMENTAL_ALTER_CONFIGS, version)
    config_cls = nested_type(cls, "AlterableConfig")
    per_topic = {
        topic: {"configs": _configs(config_cls, configs, config_operation=SET_CONFIG)}
        for topic, configs in sorted(changes.items())
    }
    return make_entity(
        cls, resources=_topic_resources(cls, "AlterConfigsResource", per_topic), validate_only=False
    )


def describe_topic_configs_request(version: int, topics: Iterable[str]) -> Any:
    """DescribeConfigs: every config key of these topics, without synonyms or documentation."""
    cls = request_type(ApiKey.DESCRIBE_CONFIGS, version)
    per_topic = {topic: {"configuration_keys": None} for topic in topics}
    return make_entity(
        cls,
        resources=_topic_resources(cls, "DescribeConfigsResource", per_topic),
        include_synonyms=False,
        include_documentation=False,
    )


def _topic_resources(
    cls: type, resource_type_name: str, per_topic: Mapping[str, Mapping[str, Any]]
) -> tuple[Any, ...]:
    resource_cls = nested_type(cls, resource_type_name)
    return tuple(
        make_entity(resource_cls, resource_type=TOPIC_RESOURCE, resource_name=topic, **fields)
        for topic, fields in per_topic.items()
    )


def _configs(config_cls: type, configs: Mapping[str, str], **fields: Any) -> tuple[Any, ...]:
    return tuple(
        make_entity(config_cls, name=k, value=v, **fields) for k, v in sorted(configs.items())
    )
