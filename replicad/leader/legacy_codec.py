"""The request/response layouts kio lacks (Kafka 4 dropped them), written by hand:
Fetch v0-v3, ListOffsets v0 and Produce v0-v2. Everything newer goes through kio.

Layouts (all non-flexible, request header v1, response header v0):
- Fetch v0-v3 request: replica_id i32, max_wait_ms i32, min_bytes i32, [v3: max_bytes i32],
  topics [topic str, partitions [partition i32, fetch_offset i64, partition_max_bytes i32]].
  Response: [v1+: throttle_time_ms i32], responses [topic str, partitions [partition i32,
  error_code i16, high_watermark i64, records (i32 size + bytes)]].
- ListOffsets v0 request: replica_id i32, topics [name str, partitions [partition i32,
  timestamp i64, max_num_offsets i32]]. Response: topics [name str, partitions
  [partition i32, error_code i16, old_style_offsets [i64]]].
- Produce v0-v2 request: acks i16, timeout_ms i32, topic_data [name str, partition_data
  [index i32, records (i32 size + bytes)]]. Response: responses [name str, partitions
  [index i32, error_code i16, base_offset i64, [v2: log_append_time_ms i64]]],
  [v1+: throttle_time_ms i32].
Decoding failures are the peer's: RemoteProtocolError. The Fetch response is not encoded
here as one bytes object but as pieces around each partition's records (see `FetchPieces`),
so records can go out by sendfile or by lazy down-conversion.
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from kio.serial import readers
from kio.serial.errors import DecodeError

from replicad.errors import RemoteProtocolError

# Versions each hand-written codec covers.
LEGACY_FETCH_VERSIONS = range(0, 4)
LEGACY_LIST_OFFSETS_VERSIONS = range(0, 1)
LEGACY_PRODUCE_VERSIONS = range(0, 3)
# Fetch v3 added the request's max_bytes (KIP-74); v1 the response's throttle time.
FETCH_MAX_BYTES_VERSION = 3
FETCH_THROTTLE_VERSION = 1
PRODUCE_THROTTLE_VERSION = 1
PRODUCE_LOG_APPEND_TIME_VERSION = 2
# What a request without max_bytes may take (Kafka's default for v0-v2).
NO_RESPONSE_LIMIT = 2**31 - 1
NO_TIMESTAMP = -1

_I16 = struct.Struct(">h")
_I32 = struct.Struct(">i")
_I64 = struct.Struct(">q")


class _Reader:
    """kio's primitive readers over a frame, with a running position; running past the end,
    an array longer than the bytes left, or any other of kio's decode errors (invalid
    UTF-8, a negative length) is the peer's RemoteProtocolError."""

    def __init__(self, data: bytes | memoryview, position: int = 0) -> None:
        self._data = bytes(data)
        self.position = position

    def _read(self, reader: Callable[[bytes, int], tuple[Any, int]]) -> Any:
        try:
            value, size = reader(self._data, self.position)
        except (DecodeError, ValueError, UnicodeDecodeError) as exc:
            raise RemoteProtocolError(f"bad request bytes at byte {self.position}: {exc}") from exc
        self.position += size
        return value

    def i16(self) -> int:
        return int(self._read(readers.read_int16))

    def i32(self) -> int:
        return int(self._read(readers.read_int32))

    def i64(self) -> int:
        return int(self._read(readers.read_int64))

    def nullable_string(self) -> str | None:
        value: str | None = self._read(readers.read_nullable_legacy_string)
        return value

    def string(self) -> str:
        text = self.nullable_string()
        if text is None:
            raise RemoteProtocolError(f"null string at byte {self.position}")
        return text

    def nullable_bytes(self) -> bytes | None:
        value: bytes | None = self._read(readers.read_nullable_legacy_bytes)
        return value

    def count(self) -> int:
        n = self.i32()
        if n < -1 or n > len(self._data) - self.position:
            raise RemoteProtocolError(f"implausible array length {n} at byte {self.position}")
        return max(n, 0)

    def end(self) -> None:
        if self.position != len(self._data):
            raise RemoteProtocolError(
                f"{len(self._data) - self.position} trailing bytes in request"
            )


def _string(text: str | None) -> bytes:
    if text is None:
        return _I16.pack(-1)
    data = text.encode()
    return _I16.pack(len(data)) + data


@dataclass(frozen=True, slots=True)
class RequestHeaderV1:
    api_key: int
    api_version: int
    correlation_id: int
    client_id: str | None
    # Where the body starts in the frame.
    body_position: int


def read_request_header_v1(frame: bytes | memoryview) -> RequestHeaderV1:
    r = _Reader(frame)
    api_key, version, correlation_id = r.i16(), r.i16(), r.i32()
    client_id = r.nullable_string()
    return RequestHeaderV1(api_key, version, correlation_id, client_id, r.position)


# -- Fetch v0-v3 -----------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class LegacyFetchPartition:
    partition: int
    fetch_offset: int
    partition_max_bytes: int


@dataclass(frozen=True, slots=True)
class LegacyFetchTopic:
    topic: str
    partitions: tuple[LegacyFetchPartition, ...]


@dataclass(frozen=True, slots=True)
class LegacyFetchRequest:
    version: int
    replica_id: int
    max_wait_ms: int
    min_bytes: int
    max_bytes: int
    topics: tuple[LegacyFetchTopic, ...]


def decode_fetch_request(version: int, body: bytes | memoryview) -> LegacyFetchRequest:
    if version not in LEGACY_FETCH_VERSIONS:
        raise ValueError(f"Fetch v{version} is kio's, not a legacy layout")
    r = _Reader(body)
    replica_id, max_wait_ms, min_bytes = r.i32(), r.i32(), r.i32()
    max_bytes = r.i32() if version >= FETCH_MAX_BYTES_VERSION else NO_RESPONSE_LIMIT
    topics = []
    for _ in range(r.count()):
        name = r.string()
        parts = tuple(LegacyFetchPartition(r.i32(), r.i64(), r.i32()) for _ in range(r.count()))
        topics.append(LegacyFetchTopic(name, parts))
    r.end()
    return LegacyFetchRequest(version, replica_id, max_wait_ms, min_bytes, max_bytes, tuple(topics))


def encode_fetch_request(request: LegacyFetchRequest) -> bytes:
    """The body of a Fetch v0-v3 request (tests and tools speak the old protocol with it)."""
    out = bytearray(_I32.pack(request.replica_id))
    out += _I32.pack(request.max_wait_ms) + _I32.pack(request.min_bytes)
    if request.version >= FETCH_MAX_BYTES_VERSION:
        out += _I32.pack(request.max_bytes)
    out += _I32.pack(len(request.topics))
    for topic in request.topics:
        out += _string(topic.topic) + _I32.pack(len(topic.partitions))
        for p in topic.partitions:
            out += _I32.pack(p.partition) + _I64.pack(p.fetch_offset)
            out += _I32.pack(p.partition_max_bytes)
    return bytes(out)


@dataclass(frozen=True, slots=True)
class LegacyFetchPartitionHead:
    """A partition of a Fetch v0-v3 response, all but its records' bytes."""

    partition: int
    error_code: int
    high_watermark: int
    records_size: int


@dataclass(frozen=True, slots=True)
class FetchPieces:
    """A response body as the bytes between the partitions' records, in order:
    heads[0], records of partition 0, heads[1], records of partition 1, ..., tail."""

    heads: tuple[bytes, ...]
    tail: bytes


def encode_fetch_response(
    version: int,
    topics: Sequence[tuple[str, Sequence[LegacyFetchPartitionHead]]],
    *,
    throttle_time_ms: int = 0,
) -> FetchPieces:
    """The bytes around each partition's records; the records go between them, in order."""
    if version not in LEGACY_FETCH_VERSIONS:
        raise ValueError(f"Fetch v{version} is kio's, not a legacy layout")
    heads: list[bytes] = []
    pending = bytearray()
    if version >= FETCH_THROTTLE_VERSION:
        pending += _I32.pack(throttle_time_ms)
    pending += _I32.pack(len(topics))
    for name, partitions in topics:
        pending += _string(name) + _I32.pack(len(partitions))
        for p in partitions:
            pending += _I32.pack(p.partition) + _I16.pack(p.error_code)
            pending += _I64.pack(p.high_watermark) + _I32.pack(p.records_size)
            heads.append(bytes(pending))
            pending = bytearray()
    return FetchPieces(tuple(heads), bytes(pending))


@dataclass(frozen=True, slots=True)
class LegacyFetchResponsePartition:
    partition: int
    error_code: int
    high_watermark: int
    records: bytes


@dataclass(frozen=True, slots=True)
class LegacyFetchResponse:
    throttle_time_ms: int
    topics: tuple[tuple[str, tuple[LegacyFetchResponsePartition, ...]], ...]


def decode_fetch_response(version: int, body: bytes | memoryview) -> LegacyFetchResponse:
    """Read a Fetch v0-v3 response body (tests check what the server sent with it)."""
    r = _Reader(body)
    throttle = r.i32() if version >= FETCH_THROTTLE_VERSION else 0
    topics = []
    for _ in range(r.count()):
        name = r.string()
        parts = []
        for _ in range(r.count()):
            partition, error, hw = r.i32(), r.i16(), r.i64()
            parts.append(
                LegacyFetchResponsePartition(partition, error, hw, r.nullable_bytes() or b"")
            )
        topics.append((name, tuple(parts)))
    r.end()
    return LegacyFetchResponse(throttle, tuple(topics))


# -- ListOffsets v0 ---------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class LegacyListOffsetsPartition:
    partition: int
    timestamp: int
    max_num_offsets: int


@dataclass(frozen=True, slots=True)
class LegacyListOffsetsRequest:
    replica_id: int
    topics: tuple[tuple[str, tuple[LegacyListOffsetsPartition, ...]], ...]


def decode_list_offsets_request(body: bytes | memoryview) -> LegacyListOffsetsRequest:
    r = _Reader(body)
    replica_id = r.i32()
    topics = []
    for _ in range(r.count()):
        name = r.string()
        parts = tuple(
            LegacyListOffsetsPartition(r.i32(), r.i64(), r.i32()) for _ in range(r.count())
        )
        topics.append((name, parts))
    r.end()
    return LegacyListOffsetsRequest(replica_id, tuple(topics))


@dataclass(frozen=True, slots=True)
class LegacyOffsetsAnswer:
    partition: int
    error_code: int
    offsets: tuple[int, ...]


def encode_list_offsets_response(
    topics: Sequence[tuple[str, Sequence[LegacyOffsetsAnswer]]],
) -> bytes:
    out = bytearray(_I32.pack(len(topics)))
    for name, partitions in topics:
        out += _string(name) + _I32.pack(len(partitions))
        for p in partitions:
            out += _I32.pack(p.partition) + _I16.pack(p.error_code) + _I32.pack(len(p.offsets))
            for offset in p.offsets:
                out += _I64.pack(offset)
    return bytes(out)


# -- Produce v0-v2 -----------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class LegacyProduceRequest:
    acks: int
    timeout_ms: int
    # (topic, partitions named); the records themselves are not kept.
    topics: tuple[tuple[str, tuple[int, ...]], ...]


def decode_produce_request(body: bytes | memoryview) -> LegacyProduceRequest:
    r = _Reader(body)
    acks, timeout_ms = r.i16(), r.i32()
    topics = []
    for _ in range(r.count()):
        name = r.string()
        partitions = []
        for _ in range(r.count()):
            partitions.append(r.i32())
            r.nullable_bytes()
        topics.append((name, tuple(partitions)))
    r.end()
    return LegacyProduceRequest(acks, timeout_ms, tuple(topics))


def encode_produce_response(
    version: int, topics: Sequence[tuple[str, Sequence[int]]], error_code: int
) -> bytes:
    """Every named partition answered with `error_code` (replicad never appends)."""
    out = bytearray(_I32.pack(len(topics)))
    for name, partitions in topics:
        out += _string(name) + _I32.pack(len(partitions))
        for index in partitions:
            out += _I32.pack(index) + _I16.pack(error_code) + _I64.pack(-1)
            if version >= PRODUCE_LOG_APPEND_TIME_VERSION:
                out += _I64.pack(NO_TIMESTAMP)
    if version >= PRODUCE_THROTTLE_VERSION:
        out += _I32.pack(0)
    return bytes(out)
