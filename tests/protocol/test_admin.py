"""The topic administration requests encode at every version replicad negotiates, and kio
reads back what was meant (sorted topics and keys, topic resources, SET)."""

from __future__ import annotations

import pytest

from replicad.protocol.admin import (
    SET_CONFIG,
    TopicToCreate,
    alter_topic_configs_request,
    create_partitions_request,
    create_topics_request,
    describe_topic_configs_request,
)
from replicad.protocol.apis import CLIENT_VERSIONS, ApiKey
from replicad.protocol.codec import decode_request, encode_request
from replicad.wire import TOPIC_RESOURCE


def _roundtrip(request):
    """What a broker reads of `request` (the whole frame, nothing left over)."""
    frame = encode_request(request, correlation_id=1, client_id="t")
    return decode_request(frame[4:], type(request)).body


def _versions(api: ApiKey) -> range:
    wanted = CLIENT_VERSIONS[api]
    return range(wanted.min, wanted.max + 1)


@pytest.mark.parametrize("version", _versions(ApiKey.CREATE_TOPICS))
def test_create_topics(version):
    topics = [TopicToCreate("a", 3, {"retention.ms": "1", "cleanup.policy": "compact"}, 2)]
    body = _roundtrip(create_topics_request(version, topics))
    (topic,) = body.topics
    assert (topic.name, topic.num_partitions, topic.replication_factor) == ("a", 3, 2)
    assert [(c.name, c.value) for c in topic.configs] == [
        ("cleanup.policy", "compact"),
        ("retention.ms", "1"),
    ]
    assert not body.validate_only


@pytest.mark.parametrize("version", _versions(ApiKey.CREATE_PARTITIONS))
def test_create_partitions(version):
    body = _roundtrip(create_partitions_request(version, {"b": 4, "a": 2}))
    assert [(t.name, t.count) for t in body.topics] == [("a", 2), ("b", 4)]


@pytest.mark.parametrize("version", _versions(ApiKey.INCREMENTAL_ALTER_CONFIGS))
def test_alter_topic_configs(version):
    body = _roundtrip(alter_topic_configs_request(version, {"b": {"x": "1"}, "a": {"z": "2"}}))
    assert [(r.resource_type, r.resource_name) for r in body.resources] == [
        (TOPIC_RESOURCE, "a"),
        (TOPIC_RESOURCE, "b"),
    ]
    (config,) = body.resources[0].configs
    assert (config.name, config.value, config.config_operation) == ("z", "2", SET_CONFIG)


@pytest.mark.parametrize("version", _versions(ApiKey.DESCRIBE_CONFIGS))
def test_describe_topic_configs(version):
    body = _roundtrip(describe_topic_configs_request(version, ["t1", "t2"]))
    assert [(r.resource_type, r.resource_name) for r in body.resources] == [
        (TOPIC_RESOURCE, "t1"),
        (TOPIC_RESOURCE, "t2"),
    ]
    assert all(r.configuration_keys is None for r in body.resources)
