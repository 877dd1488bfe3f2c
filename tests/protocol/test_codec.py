import io
import struct

import pytest
from kio.schema.api_versions.v3.request import ApiVersionsRequest
from kio.schema.metadata.v12.request import MetadataRequest
from kio.schema.metadata.v12.response import MetadataResponse
from kio.schema.request_header.v2.header import RequestHeader
from kio.schema.response_header.v1.header import ResponseHeader
from kio.serial import entity_reader, entity_writer

from replicad.errors import RemoteProtocolError
from replicad.protocol.codec import (
    decode_request,
    decode_response,
    encode_request,
    frame_size,
    peek_request_head,
)
from replicad.protocol.requests import make_entity

SIZE = struct.Struct(">i")


def test_request_frame_has_size_prefix_and_header():
    frame = encode_request(
        ApiVersionsRequest(client_software_name="replicad", client_software_version="1"),
        correlation_id=42,
        client_id="cid",
    )
    (size,) = struct.unpack_from(">i", frame)
    assert size == len(frame) - 4
    header, used = entity_reader(RequestHeader)(frame[4:], 0)
    assert (header.request_api_key, header.request_api_version) == (18, 3)
    assert header.correlation_id == 42 and header.client_id == "cid"
    body, _ = entity_reader(ApiVersionsRequest)(frame[4:], used)
    assert body.client_software_name == "replicad"


def _metadata_frame(correlation_id: int) -> bytes:
    buf = io.BytesIO()
    entity_writer(ResponseHeader)(buf, ResponseHeader(correlation_id=correlation_id))
    import datetime

    entity_writer(MetadataResponse)(
        buf,
        MetadataResponse(
            throttle_time=datetime.timedelta(0),
            brokers=(),
            cluster_id="c",
            controller_id=1,
            topics=(),
        ),
    )
    return buf.getvalue()


def test_decode_round_trip():
    decoded = decode_response(_metadata_frame(9), MetadataResponse)
    assert decoded.correlation_id == 9
    assert decoded.body.cluster_id == "c"


def test_truncated_frame_is_the_peers_fault():
    frame = _metadata_frame(9)
    with pytest.raises(RemoteProtocolError, match="undecodable MetadataResponse"):
        decode_response(frame[:-3], MetadataResponse)


def test_trailing_garbage_is_rejected():
    with pytest.raises(RemoteProtocolError, match="trailing bytes"):
        decode_response(_metadata_frame(9) + b"xx", MetadataResponse)


@pytest.mark.parametrize("size", [-1, 0, 3, (1 << 30) + 1])
def test_implausible_frame_sizes(size):
    with pytest.raises(RemoteProtocolError, match="implausible frame size"):
        frame_size(struct.pack(">i", size))


# A request of a version that has a request header v2 (client id, tagged fields).
METADATA_REQUEST = make_entity(
    MetadataRequest,
    topics=None,
    allow_auto_topic_creation=False,
    include_topic_authorized_operations=False,
)


def test_a_request_frame_is_read_back_with_kio() -> None:
    frame = encode_request(METADATA_REQUEST, correlation_id=42, client_id="cli")[SIZE.size :]
    head = peek_request_head(frame)
    assert (head.api_key, head.api_version, head.correlation_id) == (3, 12, 42)
    decoded = decode_request(frame, MetadataRequest)
    assert (decoded.client_id, decoded.body) == ("cli", METADATA_REQUEST)


def test_bad_request_bytes_are_the_peers_error() -> None:
    frame = encode_request(METADATA_REQUEST, correlation_id=1, client_id=None)[SIZE.size :]
    with pytest.raises(RemoteProtocolError, match="trailing"):
        decode_request(frame + b"\x00", MetadataRequest)
    with pytest.raises(RemoteProtocolError):
        decode_request(frame[:9], MetadataRequest)
    with pytest.raises(RemoteProtocolError):
        peek_request_head(b"\x00\x01")
