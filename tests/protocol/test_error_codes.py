"""Error codes newer than us: read as UNKNOWN_SERVER_ERROR where they stand, never a whole
response refused (Kafka's `Errors.forCode` rule)."""

from __future__ import annotations

import dataclasses
import datetime
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from kio.schema.errors import ErrorCode
from kio.static.constants import EntityType
from kio.static.primitive import i16, i32, i32Timedelta, i64

from replicad.errors import RemoteProtocolError
from replicad.protocol.apis import ApiKey
from replicad.protocol.codec import decode_response, encode_entities, response_type
from replicad.protocol.error_codes import (
    error_code_of,
    error_name,
    unknown_error_codes,
    with_known_error_codes,
)
from replicad.protocol.requests import make_entity, nested_type
from tools.chaos.frames import NewerErrorCode

# Importing the fuzz strategies registers kio's Records type for st.from_type.
from tools.chaos.strategies import records  # noqa: F401
from tools.chaos.wire_data import kio_message_types

UNKNOWN = 777


def test_raw_codes_are_named_and_mapped_by_kafkas_rule() -> None:
    assert error_code_of(3) is ErrorCode.unknown_topic_or_partition
    assert error_code_of(UNKNOWN) is ErrorCode.unknown_server_error
    assert error_code_of(-1) is ErrorCode.unknown_server_error
    assert error_name(6) == "not_leader_or_follower"
    assert error_name(UNKNOWN) == f"error code {UNKNOWN}"


def _response(api: ApiKey, version: int, body: Any) -> bytes:
    cls = response_type(api, version)
    return encode_entities(cls.__header_schema__(correlation_id=3), body)


def _list_offsets(version: int, codes: list[Any]) -> Any:
    cls = response_type(ApiKey.LIST_OFFSETS, version)
    partition_cls = nested_type(cls, "ListOffsetsPartitionResponse")
    topic_cls = nested_type(cls, "ListOffsetsTopicResponse")
    partitions = tuple(
        make_entity(
            partition_cls,
            partition_index=i32(p),
            error_code=code,
            offset=i64(10 + p),
            timestamp=i64(-1),
            leader_epoch=i32(0),
        )
        for p, code in enumerate(codes)
    )
    topics = (make_entity(topic_cls, name="orders", partitions=partitions),)
    return make_entity(cls, throttle_time=i32Timedelta.parse(datetime.timedelta(0)), topics=topics)


@pytest.mark.parametrize("version", [1, 4, 6, 9])
def test_one_unknown_code_in_list_offsets_spoils_only_its_partition(version: int) -> None:
    body = _list_offsets(version, [NewerErrorCode(i16(UNKNOWN)), ErrorCode.none, ErrorCode.none])
    frame = _response(ApiKey.LIST_OFFSETS, version, body)
    decoded = decode_response(frame, response_type(ApiKey.LIST_OFFSETS, version))
    partitions = decoded.body.topics[0].partitions
    assert [p.error_code for p in partitions] == [
        ErrorCode.unknown_server_error,
        ErrorCode.none,
        ErrorCode.none,
    ]
    assert [int(p.offset) for p in partitions[1:]] == [11, 12]
    assert decoded.unknown_error_codes == (UNKNOWN,)


def test_a_frame_that_is_bad_for_another_reason_is_still_the_peers_error() -> None:
    body = _list_offsets(9, [NewerErrorCode(i16(UNKNOWN))])
    frame = _response(ApiKey.LIST_OFFSETS, 9, body).replace(b"orders", b"\xffrders")
    with pytest.raises(RemoteProtocolError, match="undecodable"):
        decode_response(frame, response_type(ApiKey.LIST_OFFSETS, 9))


def test_the_walk_finds_the_codes_and_the_copy_reads_them_as_unknown_server_error() -> None:
    cls = response_type(ApiKey.LIST_OFFSETS, 9)
    body = _list_offsets(9, [ErrorCode.none, NewerErrorCode(i16(UNKNOWN)), NewerErrorCode(i16(-2))])
    frame = _response(ApiKey.LIST_OFFSETS, 9, body)
    found = unknown_error_codes(frame, cls.__header_schema__, cls)
    assert [u.code for u in found] == [UNKNOWN, -2]
    known = with_known_error_codes(frame, found)
    assert len(known) == len(frame)
    assert unknown_error_codes(known, cls.__header_schema__, cls) == ()


# -- every response of every API kio knows --------------------------------------------------


RESPONSES = kio_message_types(EntityType.response)


def _plant(entity: Any, unknown: list[bool], planted: list[int]) -> tuple[Any, Any]:
    """(entity with some error codes replaced by codes kio lacks, what decoding must give)."""
    if not dataclasses.is_dataclass(entity):
        return entity, entity
    sent: dict[str, Any] = {}
    expected: dict[str, Any] = {}
    for f in dataclasses.fields(entity):
        value = getattr(entity, f.name)
        if isinstance(value, ErrorCode) and (unknown.pop(0) if unknown else False):
            code = UNKNOWN + len(planted)
            planted.append(code)
            sent[f.name] = NewerErrorCode(i16(code))
            expected[f.name] = ErrorCode.unknown_server_error
            continue
        if isinstance(value, tuple):
            pairs = [_plant(v, unknown, planted) for v in value]
            sent[f.name] = tuple(p[0] for p in pairs)
            expected[f.name] = tuple(p[1] for p in pairs)
        elif dataclasses.is_dataclass(value):
            sent[f.name], expected[f.name] = _plant(value, unknown, planted)
    return dataclasses.replace(entity, **sent), dataclasses.replace(entity, **expected)


@settings(
    derandomize=True,
    database=None,
    deadline=None,
    max_examples=300,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(st.data())
def test_any_response_with_codes_newer_than_ours_decodes_with_only_those_replaced(
    data: st.DataObject,
) -> None:
    cls = data.draw(st.sampled_from(RESPONSES))
    entity = data.draw(st.from_type(cls))
    planted: list[int] = []
    sent, expected = _plant(entity, data.draw(st.lists(st.booleans(), max_size=12)), planted)
    frame = encode_entities(cls.__header_schema__(correlation_id=9), sent)
    decoded = decode_response(frame, cls)
    assert decoded.body == expected, (cls.__name__, cls.__version__)
    assert sorted(decoded.unknown_error_codes) == sorted(planted)
