"""The Fetch response scanner against kio: same frames, same fields, every version we speak;
and hostile frames (hypothesis, seeded and bounded): only RemoteProtocolError, never
another exception, never a length believed past the end of the frame."""

from __future__ import annotations

import datetime
import io
import struct
import sys
import uuid

import pytest
from hypothesis import HealthCheck, given, seed, settings
from hypothesis import strategies as st
from kio.schema.errors import ErrorCode
from kio.serial import entity_writer

from replicad.errors import RemoteProtocolError
from replicad.follower.fetch_response import (
    FLEXIBLE_VERSION,
    MAX_VERSION,
    MIN_VERSION,
    scan_fetch_response,
)
from replicad.protocol.codec import decode_response, response_type
from replicad.wire import FETCH_TOPIC_ID_VERSION

VERSIONS = range(MIN_VERSION, MAX_VERSION + 1)


def _module(version: int):
    return sys.modules[response_type(1, version).__module__]


def _partition(version: int, draw_values: dict) -> object:
    mod = _module(version)
    values = dict(
        partition_index=draw_values["index"],
        error_code=ErrorCode(draw_values["error"]),
        high_watermark=draw_values["hw"],
        last_stable_offset=draw_values["lso"],
        log_start_offset=draw_values["lso"] - 7,
        aborted_transactions=(
            None
            if draw_values["aborted"] is None
            else tuple(
                mod.AbortedTransaction(producer_id=p, first_offset=o)
                for p, o in draw_values["aborted"]
            )
        ),
        preferred_read_replica=draw_values["preferred"],
        records=draw_values["records"],
    )
    if version >= FLEXIBLE_VERSION:
        if draw_values["diverging"] is not None:
            epoch, end = draw_values["diverging"]
            values["diverging_epoch"] = mod.EpochEndOffset(epoch=epoch, end_offset=end)
        values["current_leader"] = mod.LeaderIdAndEpoch(leader_id=3, leader_epoch=9)
    fields = mod.PartitionData.__dataclass_fields__
    return mod.PartitionData(**{k: v for k, v in values.items() if k in fields})


def frame_of(version: int, spec: dict) -> bytes:
    """A whole response frame (no size prefix) written by kio."""
    cls = response_type(1, version)
    mod = _module(version)
    topics = []
    for name, topic_id, parts in spec["topics"]:
        partitions = tuple(_partition(version, p) for p in parts)
        if version >= FETCH_TOPIC_ID_VERSION:
            topics.append(mod.FetchableTopicResponse(topic_id=topic_id, partitions=partitions))
        else:
            topics.append(mod.FetchableTopicResponse(topic=name, partitions=partitions))
    values = dict(
        throttle_time=datetime.timedelta(milliseconds=spec["throttle"]),
        error_code=ErrorCode(spec["error"]),
        session_id=spec["session"],
        responses=tuple(topics),
    )
    fields = cls.__dataclass_fields__
    body = cls(**{k: v for k, v in values.items() if k in fields})
    header_cls = cls.__header_schema__
    buf = io.BytesIO()
    entity_writer(header_cls)(buf, header_cls(correlation_id=spec["correlation"]))
    entity_writer(cls)(buf, body)
    return buf.getvalue()


i32s = st.integers(-(2**31), 2**31 - 1)
i64s = st.integers(-(2**63), 2**63 - 1)
partitions = st.fixed_dictionaries(
    {
        "index": st.integers(0, 2**31 - 1),
        "error": st.sampled_from([0, 1, 6, 74]),
        "hw": i64s,
        "lso": st.integers(-(2**62), 2**62),
        "aborted": st.none() | st.lists(st.tuples(i64s, i64s), max_size=3),
        "preferred": i32s,
        "records": st.none() | st.binary(max_size=300),
        "diverging": st.none() | st.tuples(i32s, i64s),
    }
)
responses = st.fixed_dictionaries(
    {
        "correlation": i32s,
        "throttle": st.integers(0, 10_000),
        "error": st.sampled_from([0, 70, 71]),
        "session": i32s,
        "topics": st.lists(
            st.tuples(
                st.text(min_size=1, max_size=20),
                st.uuids(),
                st.lists(partitions, max_size=4),
            ),
            max_size=4,
        ),
    }
)


@pytest.mark.parametrize("version", VERSIONS)
@seed(20261122)
@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(spec=responses)
def test_scanner_reads_what_kio_reads(version, spec):
    frame = frame_of(version, spec)
    expected = decode_response(frame, response_type(1, version))
    got = scan_fetch_response(memoryview(frame), version)
    body = expected.body
    assert got.correlation_id == expected.correlation_id
    assert got.throttle_time_ms == int(body.throttle_time.total_seconds() * 1000)
    assert got.error_code == int(getattr(body, "error_code", 0))
    assert got.session_id == int(getattr(body, "session_id", 0))
    assert len(got.responses) == len(body.responses)
    for ours, theirs in zip(got.responses, body.responses, strict=True):
        if version >= FETCH_TOPIC_ID_VERSION:
            assert ours.topic_id == theirs.topic_id and ours.topic is None
        else:
            assert ours.topic == theirs.topic and ours.topic_id is None
        assert len(ours.partitions) == len(theirs.partitions)
        for p, q in zip(ours.partitions, theirs.partitions, strict=True):
            assert p.partition_index == q.partition_index
            assert p.error_code == q.error_code
            assert p.high_watermark == q.high_watermark
            assert p.last_stable_offset == q.last_stable_offset
            assert p.log_start_offset == getattr(q, "log_start_offset", -1)
            assert p.preferred_read_replica == getattr(q, "preferred_read_replica", -1)
            assert p.aborted_transactions == (
                -1 if q.aborted_transactions is None else len(q.aborted_transactions)
            )
            if q.records is None:
                assert p.records is None
            else:
                assert p.records is not None and bytes(p.records) == bytes(q.records)
            kio_div = getattr(q, "diverging_epoch", None)
            if kio_div is not None:
                assert (p.diverging_epoch.epoch, p.diverging_epoch.end_offset) == (
                    kio_div.epoch,
                    kio_div.end_offset,
                )
            else:
                assert (p.diverging_epoch.epoch, p.diverging_epoch.end_offset) == (-1, -1)


def test_records_are_views_of_the_frame_not_copies():
    spec = {
        "correlation": 1,
        "throttle": 0,
        "error": 0,
        "session": 5,
        "topics": [("t", uuid.uuid4(), [_plain_partition(b"x" * 1000)])],
    }
    frame = bytearray(frame_of(16, spec))
    got = scan_fetch_response(memoryview(frame), 16)
    records = got.responses[0].partitions[0].records
    assert records is not None and records.obj is frame
    frame[frame.index(b"x" * 1000)] = ord("y")
    assert bytes(records[:1]) == b"y"


def _plain_partition(records: bytes | None) -> dict:
    return {
        "index": 0,
        "error": 0,
        "hw": 10,
        "lso": 10,
        "aborted": None,
        "preferred": -1,
        "records": records,
        "diverging": None,
    }


def _one_partition_frame(version: int, records: bytes) -> bytes:
    spec = {
        "correlation": 1,
        "throttle": 0,
        "error": 0,
        "session": 0,
        "topics": [("t", uuid.uuid4(), [_plain_partition(records)])],
    }
    return frame_of(version, spec)


@pytest.mark.parametrize("version", [11, 16])
def test_a_records_length_past_the_frame_is_the_peers_error(version):
    frame = bytearray(_one_partition_frame(version, b"r" * 40))
    at = frame.index(b"r" * 40)
    if version >= FLEXIBLE_VERSION:
        # compact bytes: uvarint(len + 1) of 41 is one byte, just before the data
        frame[at - 1 : at] = b"\xff\xff\xff\xff\x07"
    else:
        struct.pack_into(">i", frame, at - 4, 2**31 - 1)
    with pytest.raises(RemoteProtocolError, match="records"):
        scan_fetch_response(memoryview(bytes(frame)), version)


def test_a_huge_compact_array_count_is_refused_before_anything_is_read():
    frame = bytearray(_one_partition_frame(16, b""))
    # correlation id (4), header tags (1), throttle/error/session (10): the topic count.
    frame[15:16] = b"\xfe\xff\xff\xff\x0f"  # 2^32 - 1, i.e. 2^32 - 2 topics
    with pytest.raises(RemoteProtocolError, match="responses claims"):
        scan_fetch_response(memoryview(bytes(frame)), 16)


@pytest.mark.parametrize("version", [7, 12])
def test_null_topic_array_is_the_peers_error(version):
    frame = bytearray(_one_partition_frame(version, b""))
    header = 4 + (1 if version >= FLEXIBLE_VERSION else 0)
    at = header + 10
    tail = b"\x00" if version >= FLEXIBLE_VERSION else b""
    if version >= FLEXIBLE_VERSION:
        null = bytes(frame[:at]) + b"\x00" + tail
    else:
        null = bytes(frame[:at]) + struct.pack(">i", -1)
    with pytest.raises(RemoteProtocolError, match="null"):
        scan_fetch_response(memoryview(null), version)


@pytest.mark.parametrize("version", [4, 16])
def test_trailing_bytes_are_the_peers_error(version):
    frame = _one_partition_frame(version, b"abc") + b"\0"
    with pytest.raises(RemoteProtocolError, match="trailing"):
        scan_fetch_response(memoryview(frame), version)


def test_an_overlong_varint_is_the_peers_error():
    frame = bytearray(_one_partition_frame(16, b""))
    frame[4:5] = b"\x80\x80\x80\x80\x80\x01"  # the header's tag count
    with pytest.raises(RemoteProtocolError, match="varint"):
        scan_fetch_response(memoryview(bytes(frame)), 16)


@seed(8)
@settings(max_examples=300, deadline=None)
@given(
    version=st.sampled_from(list(VERSIONS)),
    spec=responses,
    edits=st.lists(st.tuples(st.integers(0, 10_000), st.integers(0, 255)), min_size=1, max_size=6),
    cut=st.integers(0, 64),
)
def test_damaged_frames_raise_only_the_peers_error(version, spec, edits, cut):
    frame = bytearray(frame_of(version, spec))
    for position, value in edits:
        frame[position % len(frame)] = value
    if cut:
        del frame[max(len(frame) - cut, 0) :]
    try:
        got = scan_fetch_response(memoryview(bytes(frame)), version)
    except RemoteProtocolError:
        return
    # Accepted: every records view lies inside the frame.
    for topic in got.responses:
        for p in topic.partitions:
            if p.records is not None:
                assert len(p.records) <= len(frame)


@seed(9)
@settings(max_examples=300, deadline=None)
@given(version=st.sampled_from(list(VERSIONS)), data=st.binary(max_size=200))
def test_random_bytes_raise_only_the_peers_error(version, data):
    try:
        got = scan_fetch_response(memoryview(data), version)
    except RemoteProtocolError:
        return
    # Accepted: the frame held at least the correlation id and the top-level fields.
    assert len(data) >= 4 + 4 and got.version == version
