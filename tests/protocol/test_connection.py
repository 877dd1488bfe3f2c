"""BrokerConnection against the real Kafka broker, and against a stand-in leader
for what no real broker does (a malformed frame, silence)."""

from __future__ import annotations

import asyncio
import struct

import pytest

from replicad.errors import KafkaConnectionError, RemoteProtocolError, RequestTimeoutError
from replicad.protocol.apis import ApiKey
from replicad.protocol.client import parse_host_port
from replicad.protocol.connection import BrokerAddress, BrokerConnection
from replicad.protocol.requests import metadata_request


def _conn(host: str, port: int, **kw) -> BrokerConnection:
    return BrokerConnection(
        BrokerAddress(-1, host, port),
        client_id="test",
        connect_timeout_s=kw.pop("connect_timeout_s", 5),
        request_timeout_s=kw.pop("request_timeout_s", 10),
        **kw,
    )


async def test_negotiates_and_pipelines_requests_against_kafka(kafka_broker, unique_topic):
    topic = unique_topic()
    kafka_broker.create_topic(topic, 2)
    conn = _conn(*parse_host_port(kafka_broker.bootstrap))
    await conn.connect()
    try:
        assert conn.versions is not None
        assert conn.versions.require(ApiKey.FETCH) == 17  # Kafka 4.x speaks our newest
        version = conn.versions.require(ApiKey.METADATA)
        # Twenty requests in flight on one connection; each answer finds its caller.
        names = [[topic], None] * 10
        answers = await asyncio.gather(*(conn.request(metadata_request(version, n)) for n in names))
        for wanted, body in zip(names, answers, strict=True):
            got = {t.name for t in body.topics}
            if wanted is None:
                assert topic in got and len(got) >= 1
            else:
                assert got == {topic}
        assert conn.bytes_received > 0 and conn.bytes_sent > 0
    finally:
        await conn.close()
    assert not conn.is_open


async def _standin(handler) -> tuple[asyncio.Server, int]:
    server = await asyncio.start_server(handler, "127.0.0.1", 0)
    return server, server.sockets[0].getsockname()[1]


async def test_malformed_frame_fails_the_connection_not_the_process():
    async def leader(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        size = struct.unpack(">i", await reader.readexactly(4))[0]
        request = await reader.readexactly(size)
        correlation = request[4:8]
        garbage = correlation + b"\xff" * 9  # not an ApiVersions response
        writer.write(struct.pack(">i", len(garbage)) + garbage)
        await writer.drain()
        await reader.read()  # until the client hangs up

    server, port = await _standin(leader)
    async with server:
        conn = _conn("127.0.0.1", port)
        with pytest.raises(RemoteProtocolError, match=r"undecodable|trailing bytes"):
            await conn.connect()
        assert not conn.is_open


async def test_implausible_frame_size_closes_the_connection():
    async def leader(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.read(100)
        writer.write(b"HTTP/1.1 400 Bad Request\r\n\r\n")  # another protocol on the port
        await writer.drain()
        await reader.read()  # until the client hangs up

    server, port = await _standin(leader)
    async with server:
        conn = _conn("127.0.0.1", port)
        with pytest.raises((RemoteProtocolError, KafkaConnectionError)):
            await conn.connect()
        assert not conn.is_open


async def test_request_timeout_closes_the_connection():
    async def leader(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.read()  # never answers; waits for the client to hang up

    server, port = await _standin(leader)
    async with server:
        conn = _conn("127.0.0.1", port, request_timeout_s=0.3)
        with pytest.raises(RequestTimeoutError, match="no response"):
            await conn.connect()
        assert not conn.is_open


async def test_refused_connection_is_a_clear_error(free_port):
    conn = _conn("127.0.0.1", free_port, connect_timeout_s=2)
    with pytest.raises(KafkaConnectionError, match=f"cannot connect to 127.0.0.1:{free_port}"):
        await conn.connect()


def _api_versions_frame(correlation: bytes) -> bytes:
    """A real ApiVersions v3 response body (no size prefix) for the given correlation id."""
    import datetime
    import io

    from kio.schema.api_versions.v3.response import ApiVersion, ApiVersionsResponse
    from kio.schema.errors import ErrorCode
    from kio.serial import entity_writer

    buf = io.BytesIO()
    header_cls = ApiVersionsResponse.__header_schema__
    entity_writer(header_cls)(buf, header_cls(correlation_id=struct.unpack(">i", correlation)[0]))
    keys = tuple(
        ApiVersion(api_key=k, min_version=lo, max_version=hi)
        for k, lo, hi in ((1, 4, 17), (2, 1, 9), (3, 4, 12), (18, 0, 3))
    )
    entity_writer(ApiVersionsResponse)(
        buf,
        ApiVersionsResponse(
            error_code=ErrorCode.none, api_keys=keys, throttle_time=datetime.timedelta(0)
        ),
    )
    return buf.getvalue()


async def test_a_frame_dribbled_byte_by_byte_arrives_whole_in_its_own_buffer():
    """The size prefix and the body may arrive in any pieces; a raw decoder sees the
    whole frame once, as a view of the buffer that frame alone was read into."""
    from kio.schema.api_versions.v3.request import ApiVersionsRequest

    sent: list[bytes] = []

    async def leader(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        for _ in range(2):
            size = struct.unpack(">i", await reader.readexactly(4))[0]
            body = _api_versions_frame((await reader.readexactly(size))[4:8])
            sent.append(body)
            for byte in struct.pack(">i", len(body)) + body:
                writer.write(bytes([byte]))
                await writer.drain()
                await asyncio.sleep(0)
        await reader.read()

    server, port = await _standin(leader)
    async with server:
        conn = _conn("127.0.0.1", port)
        await conn.connect()  # the negotiation's answer came byte by byte too
        try:
            seen = await conn.request(
                ApiVersionsRequest(client_software_name="t", client_software_version="1"),
                decode=lambda view: (view.obj, bytes(view)),
            )
        finally:
            await conn.close()
    buffer, frame = seen
    assert frame == sent[1]
    assert isinstance(buffer, bytearray) and len(buffer) == len(sent[1])
    assert conn.bytes_received == sum(len(b) + 4 for b in sent)


async def test_a_raw_decoders_error_is_the_requests_error_not_the_connections():
    from kio.schema.api_versions.v3.request import ApiVersionsRequest

    async def leader(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while True:
            size = struct.unpack(">i", await reader.readexactly(4))[0]
            body = _api_versions_frame((await reader.readexactly(size))[4:8])
            writer.write(struct.pack(">i", len(body)) + body)
            await writer.drain()

    def refuse(view: memoryview) -> object:
        raise RemoteProtocolError("not what I expected")

    server, port = await _standin(leader)
    async with server:
        conn = _conn("127.0.0.1", port)
        await conn.connect()
        request = ApiVersionsRequest(client_software_name="t", client_software_version="1")
        try:
            with pytest.raises(RemoteProtocolError, match="not what I expected"):
                await conn.request(request, decode=refuse)
            assert conn.is_open
            body = await conn.request(request)
            assert {k.api_key for k in body.api_keys} == {1, 2, 3, 18}
        finally:
            await conn.close()
