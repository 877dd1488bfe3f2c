"""`replicad serve` (a real process) against clients that send one hostile request each:
a kafka-python request whose array length is rewritten to 2^32 - 1. kio's native reader
would abort the server reserving memory for that many elements; the frame guard refuses
the frame first, the server counts and logs it and closes that one connection, and every
other client -- one connected before, one after -- is served as before.
"""

from __future__ import annotations

import datetime
import json
import socket
import struct
import uuid
from pathlib import Path

import pytest
from kio.schema.create_topics.v7.request import CreatableTopic, CreateTopicsRequest
from kio.schema.create_topics.v7.response import CreateTopicsResponse
from kio.static.primitive import i16, i32

from replicad.log.config import LogConfig
from replicad.log.manager import LogManager
from replicad.protocol.apis import ApiKey
from replicad.protocol.codec import decode_response, encode_request, response_type
from replicad.records.batch import scan_batches
from replicad.types import TopicPartition
from tests.fuzz.kafka_python_requests import (
    encoded,
    fetch_request,
    list_offsets_request,
    metadata_request,
)
from tools.logdata.batches import producer_batch
from tools.peers.process import free_port
from tools.replica import replicad_serve
from tools.wait import DEADLINE_S

HUGE_VARINT = b"\xff\xff\xff\xff\x0f"  # a compact array of 2^32 - 1 elements
SIZE = struct.Struct(">i")
CLIENT_ID = "hostile"
TOPIC = "orders"
# Bytes of a flexible request header: api key, version, correlation id (8), client id
# (i16 length + text), the tagged-field count.
HEADER_BYTES = 8 + 2 + len(CLIENT_ID) + 1
# An answer or a close is waited for; only a hung server reaches this.
RECEIVE_TIMEOUT_S = DEADLINE_S


def data_dir_with_records(path: Path) -> bytes:
    logs = LogManager.open(path, LogConfig(), now_ms=0)
    batch = producer_batch(0, [b"first", b"second", b"third"])
    plog = logs.get_or_create(TopicPartition(TOPIC, 0), topic_id=uuid.uuid4())
    plog.append(batch, scan_batches(batch).batches, now_ms=0)
    logs.checkpoint({TopicPartition(TOPIC, 0): 3})
    logs.close()
    return batch


def metadata(correlation_id: int) -> bytes:
    return encoded(metadata_request(TOPIC, 12), correlation_id, CLIENT_ID)


def fetch(correlation_id: int) -> bytes:
    request = fetch_request(TOPIC, [0], 12, partition_max_bytes=65536)
    return encoded(request, correlation_id, CLIENT_ID)


def list_offsets(correlation_id: int) -> bytes:
    return encoded(list_offsets_request(TOPIC, [0], 7), correlation_id, CLIENT_ID)


def claiming_huge(frame: bytes, body_offset: int) -> bytes:
    """`frame` with the one-element compact array at `body_offset` (bytes into the body)
    claiming 2^32 - 1 elements."""
    at = HEADER_BYTES + body_offset
    assert frame[at] == 2, f"expected a one-element compact array at byte {at}"
    return frame[:at] + HUGE_VARINT + frame[at + 1 :]


def send(sock: socket.socket, frame: bytes) -> None:
    sock.sendall(SIZE.pack(len(frame)) + frame)


def receive(sock: socket.socket) -> bytes | None:
    """One response frame, or None when the server closed the connection."""
    head = read(sock, SIZE.size)
    if head is None:
        return None
    return read(sock, SIZE.unpack(head)[0])


def read(sock: socket.socket, n: int) -> bytes | None:
    data = bytearray()
    while len(data) < n:
        chunk = sock.recv(n - len(data))
        if not chunk:
            return None
        data += chunk
    return bytes(data)


def connect(port: int) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", port), timeout=RECEIVE_TIMEOUT_S)
    return sock


HOSTILE = {
    # name: (frame, bytes into the body where its first compact array starts)
    "metadata v12 topics": (metadata, 0),
    # replica id, max wait, min bytes, max bytes (4 x i32), isolation (i8), session id and
    # epoch (2 x i32): then topics.
    "fetch v12 topics": (fetch, 25),
    "list-offsets v7 topics": (list_offsets, 5),  # replica id (i32), isolation (i8)
}


@pytest.fixture
def served(tmp_path: Path):
    batch = data_dir_with_records(tmp_path / "data")
    port = free_port()
    server = replicad_serve(tmp_path / "data", port, log_path=tmp_path / "serve.log")
    try:
        yield server, port, batch
    finally:
        if server.running:
            server.kill()


def test_hostile_requests_close_their_connection_and_the_server_serves_on(served) -> None:
    server, port, batch = served
    before = connect(port)  # a client connected before the hostile ones
    try:
        for i, (name, (build, body_offset)) in enumerate(HOSTILE.items()):
            good = build(10 + i)
            with connect(port) as sock:
                send(sock, claiming_huge(good, body_offset))
                assert receive(sock) is None, f"{name}: the connection should be closed"
            assert server.running, f"{name} killed serve: {server.output()[-2000:]}"
        # The client connected before is still served, on its open connection...
        send(before, metadata(1))
        answer = receive(before)
        assert answer is not None
        body = decode_response(answer, response_type(ApiKey.METADATA, 12)).body
        assert [t.name for t in body.topics] == [TOPIC]
    finally:
        before.close()
    # ... and a new client reads the records.
    with connect(port) as after:
        send(after, fetch(2))
        answer = receive(after)
    assert answer is not None
    body = decode_response(answer, response_type(ApiKey.FETCH, 12)).body
    assert body.responses[0].partitions[0].records == batch
    assert server.stop() == 0
    lines = server.output().splitlines()
    # Logged at a bounded rate (leader/events.py: a client's faults never write a line
    # each), counted every time.
    refused = [line for line in lines if "client broke the protocol" in line]
    assert 1 <= len(refused) <= len(HOSTILE), lines[-20:]
    assert all("implausible length" in line for line in refused), refused
    stopped = json.loads(next(line for line in lines if "serve stopped" in line))
    assert stopped["protocol_errors_total"] == len(HOSTILE), stopped
    assert not [line for line in lines if "Traceback" in line or "connection failed" in line]


def test_a_hostile_request_to_an_api_serve_refuses_is_answered_with_the_refusal(
    served,
) -> None:
    """An API `replicad serve` does not serve is answered with its own error, from the
    request if it decodes; a hostile one does not, and is answered all the same."""
    server, port, _ = served
    request = CreateTopicsRequest(
        topics=(
            CreatableTopic(
                name="t",
                num_partitions=i32(1),
                replication_factor=i16(1),
                assignments=(),
                configs=(),
            ),
        ),
        timeout=datetime.timedelta(seconds=1),
    )
    frame = encode_request(request, correlation_id=5, client_id=CLIENT_ID)[SIZE.size :]
    hostile = claiming_huge(frame, 0)  # topics first
    with connect(port) as sock:
        send(sock, hostile)
        answer = receive(sock)
    assert answer is not None and server.running
    decoded = decode_response(answer, CreateTopicsResponse)
    assert decoded.correlation_id == 5
    assert decoded.body.topics == ()  # nothing of the request could be read
    assert server.stop() == 0
