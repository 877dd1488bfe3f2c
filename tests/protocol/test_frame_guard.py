"""The frame guard against kio itself: for messages of every API that kio's writer
encodes, the walk ends exactly where kio's reader does; claims past the end are caught
where they are (arrays, strings, bytes, compact and legacy, inside tagged fields); what
kio itself refuses is left to kio.

Everything here runs in-process on frames the guard must pass or refuse *before* kio
reads them; the frames that would abort kio are run in forked children in tests/fuzz.
"""

from __future__ import annotations

import dataclasses
import datetime
import io
import struct
import uuid
from functools import cache
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from kio.schema.errors import ErrorCode
from kio.serial import entity_reader, entity_writer
from kio.serial._implicit_defaults import get_tagged_field_default
from kio.serial._introspect import (
    EntityField,
    EntityTupleField,
    classify_field,
    get_field_tag,
    get_schema_field_type,
    is_optional,
)
from kio.serial.writers import write_unsigned_varint
from kio.static.constants import EntityType

from replicad.errors import RemoteProtocolError
from replicad.protocol.apis import ApiKey
from replicad.protocol.codec import encode_entities, request_type, response_type
from replicad.protocol.frame_guard import (
    FrameCheck,
    ImplausibleLength,
    check_message,
    min_wire_size,
    reject_implausible_lengths,
)
from replicad.protocol.requests import make_entity, nested_type
from tools.chaos.strategies import bounded
from tools.chaos.wire_data import (
    PartitionAnswer,
    fetch_response_body,
    fetch_response_claiming,
    kio_message_types,
)

HUGE = 2**32 - 1


# Every request and response class kio has, every version.
MESSAGES = kio_message_types(EntityType.request, EntityType.response)


def uvarint(value: int) -> bytes:
    buf = io.BytesIO()
    write_unsigned_varint(buf, value)
    return buf.getvalue()


def encode(entity: Any, *, correlation_id: int = 7) -> bytes:
    """Header and body as kio writes them (no size prefix)."""
    cls = type(entity)
    header_cls = cls.__header_schema__
    names = {f.name for f in dataclasses.fields(header_cls)}
    values: dict[str, Any] = {"correlation_id": correlation_id}
    if "request_api_key" in names:
        values.update(
            request_api_key=cls.__api_key__, request_api_version=cls.__version__, client_id="c"
        )
    buf = io.BytesIO()
    entity_writer(header_cls)(buf, header_cls(**values))
    entity_writer(cls)(buf, entity)
    return buf.getvalue()


def kio_size(frame: bytes, cls: type) -> int:
    _, used = entity_reader(cls.__header_schema__)(frame, 0)
    _, size = entity_reader(cls)(frame, used)
    return used + size


def walk(frame: bytes | memoryview, cls: type) -> FrameCheck:
    return check_message(frame, cls.__header_schema__, cls)


# -- kio entities of any type, from the field metadata kio's writer and reader use ------------

_PRIMITIVES: dict[str, st.SearchStrategy[Any]] = {
    "int8": st.integers(-(2**7), 2**7 - 1),
    "int16": st.integers(-(2**15), 2**15 - 1),
    "int32": st.integers(-(2**31), 2**31 - 1),
    "int64": st.integers(-(2**63), 2**63 - 1),
    "uint8": st.integers(0, 2**8 - 1),
    "uint16": st.integers(0, 2**16 - 1),
    "uint32": st.integers(0, 2**32 - 1),
    "uint64": st.integers(0, 2**64 - 1),
    "float64": st.floats(allow_nan=False),
    "bool": st.booleans(),
    "uuid": st.uuids(),
    "error_code": st.sampled_from(list(ErrorCode)),
    "timedelta_i32": st.integers(0, 2**31 - 1).map(lambda ms: datetime.timedelta(milliseconds=ms)),
    "timedelta_i64": st.integers(0, 2**40).map(lambda ms: datetime.timedelta(milliseconds=ms)),
    "datetime_i64": st.integers(0, 2**41).map(
        lambda ms: datetime.datetime.fromtimestamp(ms / 1000, datetime.UTC)
    ),
    "string": st.text(max_size=12),
    "bytes": st.binary(max_size=40),
    "records": st.binary(max_size=40),
}


@cache
def entities(cls: type) -> st.SearchStrategy[Any]:
    values = {}
    for f in dataclasses.fields(cls):
        kind = classify_field(f)
        if isinstance(kind, EntityField | EntityTupleField):
            inner = entities(kind.type_)
        elif cls.__name__ == "RequestHeader" and f.name == "client_id":
            inner = st.text(max_size=8)
        else:
            inner = _PRIMITIVES[get_schema_field_type(f)]
        value = st.lists(inner, max_size=3).map(tuple) if kind.is_array else inner
        if get_field_tag(f) is not None:
            # A tagged field is written only when it differs from its default.
            default = f.default if f.default is not dataclasses.MISSING else None
            value = st.one_of(st.just(default), value) if default is not None else value
            if is_optional(f):
                value = st.one_of(st.none(), value)
        elif is_optional(f):
            value = st.one_of(st.none(), value)
        values[f.name] = value
    return st.builds(cls, **values)


BOUNDED = bounded()


@settings(BOUNDED, max_examples=400)
@given(st.data())
def test_the_walk_ends_where_kio_ends_for_every_api(data: st.DataObject) -> None:
    cls = data.draw(st.sampled_from(MESSAGES))
    entity = data.draw(entities(cls))
    frame = encode(entity)
    verdict = walk(frame, cls)
    assert verdict == FrameCheck(end=len(frame)), (cls.__name__, cls.__version__)
    assert kio_size(frame, cls) == len(frame)
    assert verdict.complete


@settings(BOUNDED, max_examples=60)
@given(st.data())
def test_a_memoryview_walks_like_bytes(data: st.DataObject) -> None:
    cls = data.draw(st.sampled_from(MESSAGES))
    frame = encode(data.draw(entities(cls)))
    assert walk(memoryview(frame), cls) == walk(frame, cls) == FrameCheck(end=len(frame))


def test_every_array_element_of_every_api_takes_at_least_one_byte() -> None:
    """The premise of the guard's one verdict: n elements need n bytes or more."""
    seen: set[type] = set()

    def elements(cls: type) -> None:
        if cls in seen:
            return
        seen.add(cls)
        for f in dataclasses.fields(cls):
            kind = classify_field(f)
            if isinstance(kind, EntityTupleField):
                assert min_wire_size(kind.type_) >= 1, (cls.__name__, f.name)
            if isinstance(kind, EntityField | EntityTupleField):
                elements(kind.type_)

    for cls in MESSAGES:
        elements(cls)
        assert min_wire_size(cls) >= 0
    assert len(seen) > len(MESSAGES)


# -- claims past the end ------------------------------------------------------------------


def fetch_response(version: int, partitions: int = 2) -> tuple[type, bytes]:
    cls = response_type(ApiKey.FETCH, version)
    body = fetch_response_body(
        version, [PartitionAnswer("orders", p, b"r" * 50) for p in range(partitions)]
    )
    return cls, body


def test_the_known_abort_frame_is_refused_before_kio_reads_it() -> None:
    # The 40-byte frame of tests/fuzz/test_fetch_response.py: one partition whose
    # aborted_transactions claims 2^32 - 1 entries, the frame cut short after it.
    cls = response_type(ApiKey.FETCH, 12)
    frame = fetch_response_claiming(12, HUGE, correlation_id=1, topic="orders")
    verdict = walk(frame, cls)
    assert verdict.implausible is not None
    assert verdict.implausible.field.startswith("responses[0].partitions")
    with pytest.raises(RemoteProtocolError, match="implausible length"):
        reject_implausible_lengths(frame, cls.__header_schema__, cls)


def test_a_huge_aborted_transactions_count_in_a_whole_frame_is_named_with_its_path() -> None:
    cls, frame = fetch_response(12)
    # Partition 1's aborted_transactions: where kio's writer put partition 1, after its
    # 30 bytes of fixed fields an empty array (1); claim 2^32 - 1 entries there instead.
    part_cls = nested_type(cls, "PartitionData")
    second = make_entity(
        part_cls,
        partition_index=1,
        error_code=ErrorCode.none,
        high_watermark=0,
        last_stable_offset=0,
        log_start_offset=0,
        aborted_transactions=(),
        records=b"r" * 50,
    )
    encoded_partition = io.BytesIO()
    entity_writer(part_cls)(encoded_partition, second)
    at = frame.index(encoded_partition.getvalue()) + 4 + 2 + 8 * 3
    assert frame[at] == 1
    hostile = frame[:at] + uvarint(HUGE + 1) + frame[at + 1 :]
    verdict = walk(hostile, cls)
    assert verdict.implausible == ImplausibleLength(
        field="responses[0].partitions[1].aborted_transactions",
        offset=at,
        claimed=HUGE,
        needs=HUGE * min_wire_size(nested_type(cls, "AbortedTransaction")),
        remaining=len(hostile) - at - 5,
    )
    assert verdict.end == at


def test_a_records_length_past_the_end_is_implausible() -> None:
    cls, frame = fetch_response(12, partitions=1)
    at = frame.index(b"r" * 50) - 1
    assert frame[at] == 51
    hostile = frame[:at] + uvarint(10_000) + frame[at + 1 :]
    verdict = walk(hostile, cls)
    assert verdict.implausible is not None
    assert verdict.implausible.field == "responses[0].partitions[0].records"
    assert verdict.implausible.claimed == 9_999


def test_a_legacy_array_length_past_the_end_is_implausible() -> None:
    cls = request_type(ApiKey.METADATA, 8)  # not flexible: i32 array lengths
    topic_cls = nested_type(cls, "MetadataRequestTopic")
    request = make_entity(
        cls,
        topics=(make_entity(topic_cls, name="orders"),),
        allow_auto_topic_creation=False,
        include_cluster_authorized_operations=False,
        include_topic_authorized_operations=False,
    )
    frame = encode(request)
    assert walk(frame, cls).complete
    header_size = kio_size(frame, cls) - len(encode_entities(request))
    assert frame[header_size : header_size + 4] == struct.pack(">i", 1)
    hostile = frame[:header_size] + struct.pack(">i", 2**31 - 1) + frame[header_size + 4 :]
    verdict = walk(hostile, cls)
    assert verdict.implausible is not None
    assert verdict.implausible.field == "topics"
    assert verdict.implausible.claimed == 2**31 - 1


def test_a_legacy_string_length_past_the_end_is_implausible() -> None:
    cls = request_type(ApiKey.METADATA, 8)
    frame = encode(
        make_entity(
            cls,
            topics=None,
            allow_auto_topic_creation=False,
            include_cluster_authorized_operations=False,
            include_topic_authorized_operations=False,
        )
    )
    # The request header's client_id ("c") is a legacy string: i16 length 1 at byte 8.
    assert frame[8:11] == b"\x00\x01c"
    hostile = frame[:8] + struct.pack(">h", 2**15 - 1) + frame[10:]
    verdict = walk(hostile, cls)
    assert verdict.implausible is not None
    assert verdict.implausible.field == "client_id"


def test_an_array_inside_a_tagged_field_is_checked_whatever_size_the_tag_declares() -> None:
    # Fetch v16's node_endpoints is a tagged array at the top level. kio reads a tagged
    # field by its schema and ignores the declared size, so a tag declaring 1 byte may
    # still hold an array length that kio will believe.
    cls, frame = fetch_response(16, partitions=1)
    assert frame[-1] == 0  # no tagged fields at the top level
    hostile = frame[:-1] + uvarint(1) + uvarint(0) + uvarint(1) + uvarint(HUGE + 1)
    verdict = walk(hostile, cls)
    assert verdict.implausible is not None
    assert verdict.implausible.field == "node_endpoints"
    assert verdict.implausible.claimed == HUGE


def test_what_kio_refuses_itself_is_left_to_kio() -> None:
    cls, frame = fetch_response(12)
    short = walk(frame[:-3], cls)
    assert short.implausible is None and short.unreadable is not None
    assert not short.complete
    unknown_tag = frame[:-1] + uvarint(1) + uvarint(9) + uvarint(0)
    verdict = walk(unknown_tag, cls)
    assert verdict.unreadable == "tag 9 is not a field of FetchResponse"
    assert verdict.end == len(frame) - 1 + 1
    long_varint = frame[:-1] + b"\xff" * 6
    assert walk(long_varint, cls).unreadable == "varint longer than 5 bytes"
    with pytest.raises(Exception):  # noqa: B017 - kio's own error, whichever it is
        kio_size(unknown_tag, cls)
    reject_implausible_lengths(unknown_tag, cls.__header_schema__, cls)  # not the guard's


def test_a_null_array_and_an_absent_nullable_entity_take_their_marker_only() -> None:
    cls = response_type(ApiKey.FETCH, 12)
    body = fetch_response_body(12, [])
    assert walk(body, cls).complete
    null_topics = body[:-2] + b"\x00" + body[-1:]
    assert walk(null_topics, cls) == FrameCheck(end=len(null_topics))


def test_a_nullable_entity_field_reads_its_presence_marker() -> None:
    # ConsumerGroupHeartbeat v0's response: assignment is a nullable struct (marker -1/1).
    cls = response_type(68, 0)
    field = {f.name: f for f in dataclasses.fields(cls)}["assignment"]
    assert is_optional(field)
    absent = make_entity(
        cls,
        throttle_time=datetime.timedelta(0),
        error_code=ErrorCode.none,
        error_message=None,
        member_id=None,
        member_epoch=1,
        heartbeat_interval=datetime.timedelta(0),
        assignment=None,
    )
    frame = encode(absent)
    assert frame[-2:] == b"\xff\x00"
    assert walk(frame, cls) == FrameCheck(end=len(frame)) and kio_size(frame, cls) == len(frame)


@pytest.mark.parametrize("size", [0, 126, 127, 128, 16_382, 16_383, 16_384, 3 << 20])
def test_records_lengths_of_every_varint_width_are_walked_whole(size: int) -> None:
    cls = response_type(ApiKey.FETCH, 12)
    frame = fetch_response_body(12, [PartitionAnswer("orders", 0, b"r" * size)])
    assert walk(frame, cls) == FrameCheck(end=len(frame)) and kio_size(frame, cls) == len(frame)
    # The last byte of the records cut off (with the three tag sections after them): the
    # same length prefix now claims more than is left.
    cut = walk(frame[:-4], cls)
    if size:
        assert cut.implausible is not None
        assert cut.implausible.field == "responses[0].partitions[0].records"
        assert (cut.implausible.claimed, cut.implausible.remaining) == (size, size - 1)
    else:  # no records: the partition itself no longer fits its smallest size
        assert cut.implausible is not None
        assert cut.implausible.field == "responses[0].partitions"


def test_a_null_struct_inside_array_elements_counts_one_byte_toward_their_smallest_size() -> None:
    # StreamsGroupDescribe v0: each described group holds a nullable `topology` struct.
    # Groups whose topology is null are smaller than any group with one; were the guard
    # to count the struct's fields in a group's smallest size, honest frames with many
    # such groups would be refused.
    cls = response_type(89, 0)
    group_cls = nested_type(cls, "DescribedGroup")
    groups = tuple(
        make_entity(
            group_cls,
            error_code=ErrorCode.none,
            error_message=None,
            group_id="",
            group_state="",
            group_epoch=1,
            assignment_epoch=1,
            topology=None,
            members=(),
            authorized_operations=0,
        )
        for _ in range(8)
    )
    frame = encode(make_entity(cls, throttle_time=datetime.timedelta(0), groups=groups))
    assert walk(frame, cls) == FrameCheck(end=len(frame)) and kio_size(frame, cls) == len(frame)
    # The smallest group there can be (empty strings and arrays, no topology) is exactly
    # the guard's smallest size.
    assert min_wire_size(group_cls) == len(encode_entities(groups[0]))
    assert min_wire_size(nested_type(cls, "Topology"), nullable=True) == 1


_SMALLEST: dict[str, Any] = {
    "float64": 0.0,
    "bool": False,
    "uuid": uuid.UUID(int=0),
    "error_code": ErrorCode.none,
    "timedelta_i32": datetime.timedelta(0),
    "timedelta_i64": datetime.timedelta(0),
    "datetime_i64": datetime.datetime.fromtimestamp(0, datetime.UTC),
    "string": "",
    "bytes": b"",
    "records": b"",
}


def smallest(cls: type) -> Any:
    """The instance of `cls` with the fewest bytes: empty strings and arrays, absent
    structs where allowed, tagged fields left at their defaults (so not written)."""
    values: dict[str, Any] = {}
    for f in dataclasses.fields(cls):
        kind = classify_field(f)
        if get_field_tag(f) is not None:
            values[f.name] = get_tagged_field_default(f)
        elif kind.is_array:
            values[f.name] = ()
        elif isinstance(kind, EntityField):
            values[f.name] = None if is_optional(f) else smallest(kind.type_)
        elif cls.__name__ == "RequestHeader" and f.name == "client_id":
            values[f.name] = None
        else:
            values[f.name] = _SMALLEST.get(get_schema_field_type(f), 0)
    return cls(**values)


def test_the_smallest_size_of_every_entity_is_exactly_its_smallest_encoding() -> None:
    """A smallest size above the real one would refuse honest frames; one below it is a
    weaker guard. Both are checked for every entity of every API, nested ones included."""
    checked: set[type] = set()

    def check(cls: type) -> None:
        if cls in checked:
            return
        checked.add(cls)
        assert min_wire_size(cls) == len(encode_entities(smallest(cls))), cls
        for f in dataclasses.fields(cls):
            kind = classify_field(f)
            if isinstance(kind, EntityField | EntityTupleField):
                check(kind.type_)

    for cls in MESSAGES:
        check(cls)
        check(cls.__header_schema__)
    assert len(checked) > 2 * len(MESSAGES)
