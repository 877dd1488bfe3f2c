"""The hand-written old layouts (Fetch v0-v3, ListOffsets v0, Produce v0-v2), checked
against kafka-python's own encoders and decoders for those versions."""

from __future__ import annotations

import pytest
from kafka.protocol.old.fetch import (
    FetchRequest_v0,
    FetchRequest_v1,
    FetchRequest_v2,
    FetchRequest_v3,
    FetchResponse_v0,
    FetchResponse_v1,
    FetchResponse_v2,
    FetchResponse_v3,
)
from kafka.protocol.old.list_offsets import ListOffsetsRequest_v0, ListOffsetsResponse_v0
from kafka.protocol.old.produce import (
    ProduceRequest_v0,
    ProduceRequest_v2,
    ProduceResponse_v0,
    ProduceResponse_v2,
)

from replicad.errors import RemoteProtocolError
from replicad.leader.legacy_codec import (
    NO_RESPONSE_LIMIT,
    LegacyFetchPartition,
    LegacyFetchPartitionHead,
    LegacyFetchRequest,
    LegacyFetchTopic,
    LegacyOffsetsAnswer,
    decode_fetch_request,
    decode_fetch_response,
    decode_list_offsets_request,
    decode_produce_request,
    encode_fetch_request,
    encode_fetch_response,
    encode_list_offsets_response,
    encode_produce_response,
    read_request_header_v1,
)

FETCH_REQUESTS = {0: FetchRequest_v0, 1: FetchRequest_v1, 2: FetchRequest_v2, 3: FetchRequest_v3}
FETCH_RESPONSES = {
    0: FetchResponse_v0,
    1: FetchResponse_v1,
    2: FetchResponse_v2,
    3: FetchResponse_v3,
}
TOPICS = [("orders", [(0, 5, 1000), (3, 0, 64)]), ("audit", [(1, 99, 1 << 20)])]


@pytest.mark.parametrize("version", [0, 1, 2, 3])
def test_fetch_requests_kafka_python_encodes_are_read(version: int) -> None:
    fields = dict(replica_id=-1, max_wait_ms=250, min_bytes=7, topics=TOPICS)
    if version == 3:
        fields["max_bytes"] = 4096
    body = FETCH_REQUESTS[version](**fields).encode()
    request = decode_fetch_request(version, body)
    assert (request.replica_id, request.max_wait_ms, request.min_bytes) == (-1, 250, 7)
    assert request.max_bytes == (4096 if version == 3 else NO_RESPONSE_LIMIT)
    assert [
        (t.topic, [(p.partition, p.fetch_offset, p.partition_max_bytes) for p in t.partitions])
        for t in request.topics
    ] == TOPICS
    # and our own encoder writes what kafka-python writes
    assert encode_fetch_request(request) == body


@pytest.mark.parametrize("version", [0, 1, 2, 3])
def test_fetch_response_pieces_decode_with_kafka_python(version: int) -> None:
    records = {0: b"A" * 30, 3: b"", 1: b"B" * 5}
    heads = {
        "orders": [
            LegacyFetchPartitionHead(0, 0, 10, len(records[0])),
            LegacyFetchPartitionHead(3, 1, -1, 0),
        ],
        "audit": [LegacyFetchPartitionHead(1, 0, 7, len(records[1]))],
    }
    pieces = encode_fetch_response(version, list(heads.items()), throttle_time_ms=3)
    in_order = [records[0], records[3], records[1]]
    body = b"".join(h + r for h, r in zip(pieces.heads, in_order, strict=True)) + pieces.tail
    decoded = FETCH_RESPONSES[version].decode(body)
    got = decoded.to_object()
    topics = [
        (
            t["topic"],
            [
                (p["partition_index"], p["error_code"], p["high_watermark"], p["records"])
                for p in t["partitions"]
            ],
        )
        for t in got["responses"]
    ]
    assert topics == [
        ("orders", [(0, 0, 10, records[0]), (3, 1, -1, b"")]),
        ("audit", [(1, 0, 7, records[1])]),
    ]
    if version >= 1:
        assert got["throttle_time_ms"] == 3
    assert decode_fetch_response(version, body).topics[1][1][0].records == records[1]


def test_list_offsets_v0_round_trip_with_kafka_python() -> None:
    body = ListOffsetsRequest_v0(replica_id=-1, topics=[("t", [(0, -1, 1), (2, -2, 5)])]).encode()
    request = decode_list_offsets_request(body)
    assert request.replica_id == -1
    assert [
        (n, [(p.partition, p.timestamp, p.max_num_offsets) for p in ps]) for n, ps in request.topics
    ] == [("t", [(0, -1, 1), (2, -2, 5)])]
    answer = encode_list_offsets_response(
        [("t", [LegacyOffsetsAnswer(0, 0, (42,)), LegacyOffsetsAnswer(2, 3, ())])]
    )
    got = ListOffsetsResponse_v0.decode(answer).to_object()
    assert got["topics"][0]["partitions"] == [
        {"partition_index": 0, "error_code": 0, "old_style_offsets": [42]},
        {"partition_index": 2, "error_code": 3, "old_style_offsets": []},
    ]


@pytest.mark.parametrize(
    ("version", "request_cls", "response_cls"),
    [(0, ProduceRequest_v0, ProduceResponse_v0), (2, ProduceRequest_v2, ProduceResponse_v2)],
)
def test_produce_v0_v2_requests_are_read_and_answered_for_kafka_python(
    version, request_cls, response_cls
) -> None:
    body = request_cls(
        acks=1, timeout_ms=500, topic_data=[("t", [(0, b"xyz"), (1, None)])]
    ).encode()
    request = decode_produce_request(body)
    assert (request.acks, request.timeout_ms, request.topics) == (1, 500, (("t", (0, 1)),))
    answer = response_cls.decode(encode_produce_response(version, request.topics, 29)).to_object()
    assert [p["error_code"] for p in answer["responses"][0]["partition_responses"]] == [29, 29]


def test_request_header_v1_gives_client_id_and_body_position() -> None:
    frame = b"\x00\x01\x00\x02\x00\x00\x00\x09\x00\x03abcBODY"
    header = read_request_header_v1(frame)
    assert (header.api_key, header.api_version, header.correlation_id) == (1, 2, 9)
    assert header.client_id == "abc"
    assert frame[header.body_position :] == b"BODY"
    assert read_request_header_v1(b"\x00\x01\x00\x02\x00\x00\x00\x09\xff\xff").client_id is None


@pytest.mark.parametrize("cut", [1, 5, 13, 20, 30])
def test_cut_off_requests_are_the_peers_protocol_error(cut: int) -> None:
    body = encode_fetch_request(
        LegacyFetchRequest(
            3, -1, 100, 1, 1000, (LegacyFetchTopic("t", (LegacyFetchPartition(0, 1, 2),)),)
        )
    )
    with pytest.raises(RemoteProtocolError):
        decode_fetch_request(3, body[:cut])
    with pytest.raises(RemoteProtocolError):
        decode_fetch_request(3, body + b"\x00")


def test_an_absurd_array_length_is_refused_before_allocating() -> None:
    with pytest.raises(RemoteProtocolError, match="array length"):
        decode_fetch_request(0, b"\xff\xff\xff\xff" * 3 + b"\x7f\xff\xff\xff")
