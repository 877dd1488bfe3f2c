"""Requests the server does not serve get their API's own error in their own version."""

from __future__ import annotations

import datetime
import sys
import uuid
from typing import Any

import pytest
from kio.index import load_request_schema, load_response_schema
from kio.schema.errors import ErrorCode
from kio.static.constants import EntityType

from replicad.leader.refusals import READ_ONLY_MESSAGE, error_response
from replicad.protocol.codec import decode_response, encode_entities
from replicad.protocol.requests import make_entity
from tools.chaos.wire_data import kio_message_types


def test_there_is_an_error_answer_for_every_api_and_version_kio_knows() -> None:
    answered = 0
    for cls in kio_message_types(EntityType.response):
        body = error_response(cls, ErrorCode.unsupported_version)
        assert encode_entities(body)
        if any(f == "error_code" for f in cls.__dataclass_fields__):
            assert body.error_code == ErrorCode.unsupported_version
        answered += 1
    assert answered > 300


def produce_request(version: int) -> Any:
    cls = load_request_schema(0, version)
    module = sys.modules[cls.__module__]
    topic_key = "topic_id" if version >= 13 else "name"
    topic = make_entity(
        module.TopicProduceData,
        **{topic_key: uuid.UUID(int=5) if version >= 13 else "orders"},
        partition_data=(
            make_entity(module.PartitionProduceData, index=0, records=b"x"),
            make_entity(module.PartitionProduceData, index=3, records=None),
        ),
    )
    return make_entity(
        cls,
        acks=-1,
        timeout=datetime.timedelta(seconds=1),
        topic_data=(topic,),
        transactional_id=None,
    )


@pytest.mark.parametrize("version", [3, 8, 9, 12, 13])
def test_produce_is_refused_for_every_partition_it_names(version: int) -> None:
    cls = load_response_schema(0, version)
    body = error_response(
        cls,
        ErrorCode.topic_authorization_failed,
        produce_request(version),
        message=READ_ONLY_MESSAGE,
    )
    decoded = decode_response(
        b"\x00\x00\x00\x01" + (b"\x00" if version >= 9 else b"") + encode_entities(body), cls
    ).body
    [topic] = decoded.responses
    assert [(p.index, p.error_code, p.base_offset) for p in topic.partition_responses] == [
        (0, ErrorCode.topic_authorization_failed, -1),
        (3, ErrorCode.topic_authorization_failed, -1),
    ]
    if version >= 13:
        assert topic.topic_id is not None and topic.topic_id.int == 5
    else:
        assert topic.name == "orders"
    if version >= 8:
        assert {p.error_message for p in topic.partition_responses} == {READ_ONLY_MESSAGE}


def test_a_batched_request_gets_an_error_for_each_key_it_named() -> None:
    # FindCoordinator v4 batches its keys (serve answers it in group_wire.py; this is the
    # builder's rule for any request that names entries as plain values).
    request_cls = load_request_schema(10, 4)
    request = make_entity(request_cls, key_type=0, coordinator_keys=("group-a", "group-b"))
    body = error_response(load_response_schema(10, 4), ErrorCode.coordinator_not_available, request)
    assert [(c.key, c.error_code) for c in body.coordinators] == [
        ("group-a", ErrorCode.coordinator_not_available),
        ("group-b", ErrorCode.coordinator_not_available),
    ]
    old = error_response(load_response_schema(10, 1), ErrorCode.coordinator_not_available)
    assert old.error_code == ErrorCode.coordinator_not_available
