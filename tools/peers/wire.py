"""One raw Fetch to a broker, for tests that must see what a peer puts on the wire.

Clients hide what a test sometimes has to check: whether the broker opened a
fetch session, which aborted transactions it listed, the exact record bytes of
a partition. `fetch_once` sends a single Fetch v12 (topic names, no topic ids)
built and parsed with kio, on a connection of its own, and returns those
fields. It is a probe of the peer, not a client: no retries, one partition.

`high_watermarks` asks many partitions at once, for a source whose ListOffsets cannot be
trusted (Tansu's "latest" is its last batch's base offset plus one): Fetch requests of many
partitions on one connection, each at an offset past any end, so that the answer carries the
high watermark and no records. Tansu answers such a fetch with its high watermark, no error
and no records (tests/peers/test_tansu_harness.py pins it; Kafka answers
OFFSET_OUT_OF_RANGE).
"""

from __future__ import annotations

import datetime
import io
import socket
import struct
from collections.abc import Iterable
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
from replicad.types import TopicPartition
from replicad.wire import FINAL_EPOCH, INVALID_SESSION_ID, READ_UNCOMMITTED
from tools.peers.process import PeerError
from tools.peers.segments import BrokerBatch, iter_batches

FETCH_VERSION = 12
FRAME_SIZE = struct.Struct(">i")
CORRELATION_ID = 1
CLIENT_ID = "replicad-peer-probe"
# An offset past any partition's end: the answer is the high watermark alone.
PAST_ANY_END = 1 << 62
# Partitions a high-watermark request names. Tansu 0.6 reads a request's partitions until
# its max_wait has passed and leaves the rest out of the answer (max_wait 0: none at all),
# so those left out are asked again; measured, 2,000 partitions past their end answered
# whole in 0.6 s with max_wait 100 ms at load 27.
HW_PARTITIONS_PER_REQUEST = 1000
HW_MAX_WAIT_MS = 500
# Requests in a row that brought no new high watermark before giving up (a hang only).
HW_FRUITLESS_ROUNDS = 5


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
    body = _roundtrip(bootstrap, request_frame(_fetch_header(CORRELATION_ID), request), timeout_s)
    response = _fetch_response(bootstrap, body, CORRELATION_ID)
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


def high_watermarks(
    bootstrap: str,
    partitions: Iterable[TopicPartition],
    *,
    per_request: int = HW_PARTITIONS_PER_REQUEST,
    max_wait_ms: int = HW_MAX_WAIT_MS,
    timeout_s: float = 60,
) -> dict[TopicPartition, int]:
    """Each partition's high watermark from sessionless Fetch requests of up to
    `per_request` partitions at PAST_ANY_END, all on one connection (a source that answers
    such a fetch with its high watermark: Tansu, module doc). A partition the answer leaves
    out is asked again; PeerError when a partition answers an error, or when
    HW_FRUITLESS_ROUNDS requests in a row answered none of those left."""
    left = list(dict.fromkeys(partitions))
    found: dict[TopicPartition, int] = {}
    fruitless = 0
    correlation_id = 0
    host, _, port = bootstrap.rpartition(":")
    try:
        with socket.create_connection((host, int(port)), timeout=timeout_s) as sock:
            while left:
                chunk = left[:per_request]
                correlation_id += 1
                answered = _fetch_many(sock, bootstrap, chunk, correlation_id, max_wait_ms)
                new = {tp: hw for tp, hw in answered.items() if tp not in found and hw >= 0}
                found.update(new)
                left = [tp for tp in left if tp not in found]
                fruitless = 0 if new else fruitless + 1
                if fruitless >= HW_FRUITLESS_ROUNDS:
                    raise PeerError(
                        f"{bootstrap} left {len(left)} partitions (first {left[0]}) out of "
                        f"{fruitless} Fetch answers in a row"
                    )
    except OSError as exc:  # ConnectionError included
        raise PeerError(f"Fetch to {bootstrap}: {exc}") from exc
    return found


def _fetch_many(
    sock: socket.socket,
    bootstrap: str,
    partitions: list[TopicPartition],
    correlation_id: int,
    max_wait_ms: int,
) -> dict[TopicPartition, int]:
    """One sessionless Fetch of `partitions` at PAST_ANY_END: {partition: high watermark}
    for those the answer names."""
    by_topic: dict[str, list[int]] = {}
    for tp in partitions:
        by_topic.setdefault(tp.topic, []).append(tp.partition)
    request = FetchRequest(
        max_wait=i32Timedelta.parse(datetime.timedelta(milliseconds=max_wait_ms)),
        min_bytes=i32(0),
        max_bytes=i32(1024 * 1024),
        isolation_level=i8(READ_UNCOMMITTED),
        session_id=i32(INVALID_SESSION_ID),
        session_epoch=i32(FINAL_EPOCH),
        topics=tuple(
            FetchTopic(
                topic=TopicName(topic),
                partitions=tuple(
                    FetchPartition(
                        partition=i32(p),
                        fetch_offset=i64(PAST_ANY_END),
                        partition_max_bytes=i32(1024),
                    )
                    for p in numbers
                ),
            )
            for topic, numbers in by_topic.items()
        ),
        forgotten_topics_data=(),
        rack_id="",
    )
    sock.sendall(request_frame(_fetch_header(correlation_id), request))
    response = _fetch_response(bootstrap, read_frame(sock), correlation_id)
    if response.error_code:
        raise PeerError(f"{bootstrap} answered the Fetch with error {response.error_code}")
    found: dict[TopicPartition, int] = {}
    for topic in response.responses:
        for data in topic.partitions:
            tp = TopicPartition(str(topic.topic), int(data.partition_index))
            if data.error_code:
                raise PeerError(f"{bootstrap}: {tp} answered error {data.error_code}")
            found[tp] = int(data.high_watermark)
    return found


def _fetch_header(correlation_id: int) -> RequestHeader:
    return RequestHeader(
        request_api_key=i16(ApiKey.FETCH),
        request_api_version=i16(FETCH_VERSION),
        correlation_id=i32(correlation_id),
        client_id=CLIENT_ID,
    )


def _fetch_response(bootstrap: str, body: bytes, correlation_id: int) -> FetchResponse:
    """A Fetch answer's frame decoded; PeerError unless it decodes and answers
    `correlation_id`."""
    try:
        response_header, used = entity_reader(ResponseHeader)(body, 0)
        response, _ = entity_reader(FetchResponse)(body, used)
    except Exception as exc:
        raise PeerError(f"undecodable Fetch response from {bootstrap}: {exc!r}") from exc
    if response_header.correlation_id != correlation_id:
        raise PeerError(f"{bootstrap} answered correlation id {response_header.correlation_id}")
    return response


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
