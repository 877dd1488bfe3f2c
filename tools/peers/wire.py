"""One raw Fetch to a broker, for tests that must see what a peer puts on the wire.

Clients hide what a test sometimes has to check: whether the broker opened a
fetch session, which aborted transactions it listed, the exact record bytes of
a partition. `fetch_once` sends a single Fetch v12 (topic names, no topic ids)
built and parsed with kio, on a connection of its own, and returns those
fields. It is a probe of the peer, not a client: no retries, one partition.
"""

from __future__ import annotations

import datetime
import io
import socket
import struct
from dataclasses import dataclass
from typing import Any

from kio.schema.fetch.v12.request import FetchPartition, FetchRequest, FetchTopic
from kio.schema.fetch.v12.response import FetchResponse
from kio.schema.request_header.v2.header import RequestHeader
from kio.schema.response_header.v1.header import ResponseHeader
from kio.schema.types import TopicName
from kio.serial import entity_reader, entity_writer
from kio.static.primitive import i8, i16, i32, i32Timedelta, i64

from replicad.protocol.apis import ApiKey
from replicad.wire import FINAL_EPOCH, INVALID_SESSION_ID, READ_UNCOMMITTED
from tools.peers.process import PeerError
from tools.peers.segments import BrokerBatch, iter_batches

FETCH_VERSION = 12
FRAME_SIZE = struct.Struct(">i")
CORRELATION_ID = 1
CLIENT_ID = "replicad-peer-probe"


@dataclass(frozen=True, slots=True)
class AbortedTransaction:
    producer_id: int
    first_offset: int


@dataclass(frozen=True, slots=True)
class FetchOnce:
    """The one partition's answer, plus the response's session fields."""

    error_code: int  # top-level
    session_id: int
    partition_error_code: int
    high_watermark: int
    last_stable_offset: int
    log_start_offset: int
    aborted_transactions: tuple[AbortedTransaction, ...]
    records: bytes  # as sent: may end in a partial batch

    def batches(self) -> list[BrokerBatch]:
        """The whole batches in `records`; a trailing partial batch is left out."""
        return list(iter_batches(self.records, partial_tail=True))


def fetch_once(
    bootstrap: str,
    topic: str,
    partition: int,
    offset: int,
    *,
    session_id: int = INVALID_SESSION_ID,
    session_epoch: int = FINAL_EPOCH,
    isolation_level: int = READ_UNCOMMITTED,
    max_bytes: int = 64 * 1024 * 1024,
    max_wait_ms: int = 100,
    timeout_s: float = 10,
) -> FetchOnce:
    """Fetch `topic`/`partition` from `offset` once; raises PeerError if the answer is malformed."""
    request = FetchRequest(
        max_wait=i32Timedelta.parse(datetime.timedelta(milliseconds=max_wait_ms)),
        min_bytes=i32(1),
        max_bytes=i32(max_bytes),
        isolation_level=i8(isolation_level),
        session_id=i32(session_id),
        session_epoch=i32(session_epoch),
        topics=(
            FetchTopic(
                topic=TopicName(topic),
                partitions=(
                    FetchPartition(
                        partition=i32(partition),
                        fetch_offset=i64(offset),
                        partition_max_bytes=i32(max_bytes),
                    ),
                ),
            ),
        ),
        forgotten_topics_data=(),
        rack_id="",
    )
    header = RequestHeader(
        request_api_key=i16(ApiKey.FETCH),
        request_api_version=i16(FETCH_VERSION),
        correlation_id=i32(CORRELATION_ID),
        client_id=CLIENT_ID,
    )
    body = _roundtrip(bootstrap, request_frame(header, request), timeout_s)
    try:
        response_header, used = entity_reader(ResponseHeader)(body, 0)
        response, _ = entity_reader(FetchResponse)(body, used)
    except Exception as exc:
        raise PeerError(f"undecodable Fetch response from {bootstrap}: {exc!r}") from exc
    if response_header.correlation_id != CORRELATION_ID:
        raise PeerError(f"{bootstrap} answered correlation id {response_header.correlation_id}")
    found = [
        p
        for t in response.responses
        if t.topic == topic
        for p in t.partitions
        if p.partition_index == partition
    ]
    if len(found) != 1:
        raise PeerError(
            f"{bootstrap}: Fetch response has {len(found)} entries for {topic}-{partition}"
        )
    data = found[0]
    return FetchOnce(
        error_code=int(response.error_code),
        session_id=int(response.session_id),
        partition_error_code=int(data.error_code),
        high_watermark=int(data.high_watermark),
        last_stable_offset=int(data.last_stable_offset),
        log_start_offset=int(data.log_start_offset),
        aborted_transactions=tuple(
            AbortedTransaction(int(a.producer_id), int(a.first_offset))
            for a in data.aborted_transactions or ()
        ),
        records=bytes(data.records or b""),
    )


def request_frame(header: RequestHeader, request: Any) -> bytes:
    """A request as it goes on the wire: its size, the header, then the body (kio's)."""
    buffer = io.BytesIO()
    entity_writer(RequestHeader)(buffer, header)
    entity_writer(type(request))(buffer, request)
    payload = buffer.getvalue()
    return FRAME_SIZE.pack(len(payload)) + payload


def read_frame(sock: socket.socket) -> bytes:
    """The next size-prefixed frame from a blocking socket, without its size."""
    (size,) = FRAME_SIZE.unpack(read_exactly(sock, FRAME_SIZE.size))
    return read_exactly(sock, size)


def read_exactly(sock: socket.socket, count: int) -> bytes:
    """`count` bytes from a blocking socket; ConnectionError if the peer closes first."""
    chunks: list[bytes] = []
    left = count
    while left:
        chunk = sock.recv(min(left, 1 << 20))
        if not chunk:
            raise ConnectionError(f"connection closed with {left} of {count} bytes unread")
        chunks.append(chunk)
        left -= len(chunk)
    return b"".join(chunks)


def _roundtrip(bootstrap: str, frame: bytes, timeout_s: float) -> bytes:
    host, _, port = bootstrap.rpartition(":")
    try:
        with socket.create_connection((host, int(port)), timeout=timeout_s) as sock:
            sock.sendall(frame)
            return read_frame(sock)
    except OSError as exc:  # ConnectionError included
        raise PeerError(f"Fetch to {bootstrap}: {exc}") from exc
