"""Fetch responses read in place: the follower's hot-path scanner (sans-I/O).

kio decodes a whole Fetch response into frozen entities and copies every partition's
record bytes; on the replication path that is most of the work per byte. This module
reads the same frame per the FetchResponse schema for the versions the follower speaks
(v4..v17; response header v0 below v12, v1 with tagged fields from v12) and hands each
partition's records out as a memoryview of the frame: records are never copied before
they are written. kio stays the codec for every other message.

Rules the scanner keeps:
- Every length and count a peer sends is held to the bytes left before anything is read:
  a string, bytes or tagged field longer than the rest of the frame, or an array claiming
  more elements than the rest of the frame could hold at its elements' smallest size, is
  the peer's RemoteProtocolError. Nothing is allocated by a peer's number.
- Fields the schema does not allow to be null (the topic and partition arrays, topic
  names) sent as null are the peer's error too, as codec.decode_response rules for kio.
- Varints are at most 5 bytes (32 bits); topic names must be UTF-8.
- Tagged fields: a partition's diverging_epoch (tag 0) is read; every other tag
  (current_leader, snapshot_id, node_endpoints, tags from future versions) is skipped
  by its declared size, which must fit the frame.
- The frame is consumed exactly; trailing bytes are an error.
- Results use kio's field names (`responses`, `topic`/`topic_id`, `partitions`,
  `partition_index`, `error_code`, `high_watermark`, `last_stable_offset`,
  `log_start_offset`, `diverging_epoch`, `records`), so the fetcher reads them alike.
"""

from __future__ import annotations

import struct
import uuid
from dataclasses import dataclass

from replicad.errors import RemoteProtocolError
from replicad.wire import FETCH_TOPIC_ID_VERSION

MIN_VERSION = 4
MAX_VERSION = 17
# Fetch v7 added the top-level error code and session id (KIP-227).
SESSION_VERSION = 7
# v5: log_start_offset per partition; v11: preferred_read_replica.
LOG_START_OFFSET_VERSION = 5
PREFERRED_READ_REPLICA_VERSION = 11
# v12: flexible encoding (compact arrays and strings, tagged fields, response header v1).
FLEXIBLE_VERSION = 12

# PartitionData's tagged field holding the diverging epoch (v12+).
DIVERGING_EPOCH_TAG = 0
# EpochEndOffset: epoch int32, end_offset int64.
_EPOCH_END_OFFSET = struct.Struct(">iq")

UUID_SIZE = 16
# Smallest encodings, for holding array counts to the bytes left.
_ABORTED_TXN_SIZE = 16  # producer_id int64, first_offset int64 (+ tags when flexible)
_MAX_VARINT_BYTES = 5

_I16 = struct.Struct(">h")
_I32 = struct.Struct(">i")
_I64 = struct.Struct(">q")
# partition_index int32, error_code int16, high_watermark int64, last_stable_offset int64
_PARTITION_HEAD = struct.Struct(">ihqq")
_THROTTLE_ERROR_SESSION = struct.Struct(">ihi")


@dataclass(frozen=True, slots=True)
class EpochEndOffset:
    """A partition's diverging epoch; -1s when the leader sent none (kio's defaults)."""

    epoch: int = -1
    end_offset: int = -1


NO_DIVERGING_EPOCH = EpochEndOffset()


@dataclass(frozen=True, slots=True)
class FetchedPartition:
    partition_index: int
    error_code: int
    high_watermark: int
    last_stable_offset: int
    log_start_offset: int
    diverging_epoch: EpochEndOffset
    aborted_transactions: int  # how many the leader listed (-1: null); not kept
    preferred_read_replica: int
    records: memoryview | None  # a view of the frame: valid while the frame is held


@dataclass(frozen=True, slots=True)
class FetchedTopic:
    topic: str | None  # below v13
    topic_id: uuid.UUID | None  # v13+
    partitions: tuple[FetchedPartition, ...]


@dataclass(frozen=True, slots=True)
class FetchResponseView:
    version: int
    correlation_id: int
    throttle_time_ms: int
    error_code: int
    session_id: int
    responses: tuple[FetchedTopic, ...]


class _Reader:
    """A cursor over one frame; every read is bounds-checked."""

    __slots__ = ("end", "pos", "view")

    def __init__(self, view: memoryview) -> None:
        self.view = view
        self.pos = 0
        self.end = len(view)

    def need(self, size: int, what: str) -> None:
        if size < 0 or size > self.end - self.pos:
            raise RemoteProtocolError(
                f"Fetch response: {what} of {size} bytes at position {self.pos}, "
                f"{self.end - self.pos} left in the frame"
            )

    def fixed(self, fmt: struct.Struct, what: str) -> tuple[int, ...]:
        self.need(fmt.size, what)
        values = fmt.unpack_from(self.view, self.pos)
        self.pos += fmt.size
        return values

    def i16(self, what: str) -> int:
        return self.fixed(_I16, what)[0]

    def i32(self, what: str) -> int:
        return self.fixed(_I32, what)[0]

    def i64(self, what: str) -> int:
        return self.fixed(_I64, what)[0]

    def uvarint(self, what: str) -> int:
        view, pos, end = self.view, self.pos, self.end
        value = 0
        for i in range(_MAX_VARINT_BYTES):
            if pos >= end:
                raise RemoteProtocolError(f"Fetch response: {what} cut off at position {pos}")
            byte = view[pos]
            pos += 1
            value |= (byte & 0x7F) << (7 * i)
            if not byte & 0x80:
                self.pos = pos
                return value
        raise RemoteProtocolError(f"Fetch response: {what} varint longer than 5 bytes")

    def count(self, flexible: bool, min_size: int, what: str) -> int:
        """An array's element count (-1: null), held to the bytes left."""
        n = self.uvarint(what) - 1 if flexible else self.i32(what)
        if n < -1:
            raise RemoteProtocolError(f"Fetch response: {what} count {n}")
        if n > 0 and n * min_size > self.end - self.pos:
            raise RemoteProtocolError(
                f"Fetch response: {what} claims {n} elements, {self.end - self.pos} bytes left"
            )
        return n

    def take(self, size: int, what: str) -> memoryview:
        self.need(size, what)
        start = self.pos
        self.pos += size
        return self.view[start : self.pos]

    def string(self, flexible: bool, what: str) -> str:
        size = self.uvarint(what) - 1 if flexible else self.i16(what)
        if size < 0:
            raise RemoteProtocolError(f"Fetch response: {what} is null, which it may not be")
        try:
            return str(self.take(size, what), "utf-8")
        except UnicodeDecodeError as exc:
            raise RemoteProtocolError(f"Fetch response: {what} is not UTF-8") from exc

    def nullable_bytes(self, flexible: bool, what: str) -> memoryview | None:
        size = self.uvarint(what) - 1 if flexible else self.i32(what)
        if size == -1:
            return None
        if size < -1:
            raise RemoteProtocolError(f"Fetch response: {what} length {size}")
        return self.take(size, what)

    def skip_tags(self, what: str) -> None:
        for _ in range(self.uvarint(f"{what} tag count")):
            self.uvarint(f"{what} tag")
            self.take(self.uvarint(f"{what} tag size"), f"{what} tagged field")


def scan_fetch_response(frame: memoryview, version: int) -> FetchResponseView:
    """Read a Fetch response frame (size prefix removed, correlation id first)."""
    if not MIN_VERSION <= version <= MAX_VERSION:
        raise ValueError(f"Fetch v{version} is outside v{MIN_VERSION}..v{MAX_VERSION}")
    if frame.format != "B" or frame.ndim != 1:
        frame = frame.cast("B")
    r = _Reader(frame)
    flexible = version >= FLEXIBLE_VERSION
    correlation_id = r.i32("correlation id")
    if flexible:
        r.skip_tags("header")
    if version >= SESSION_VERSION:
        throttle_ms, error_code, session_id = r.fixed(_THROTTLE_ERROR_SESSION, "top level")
    else:
        throttle_ms, error_code, session_id = r.i32("throttle time"), 0, 0
    # A topic is at least its name or id, a partition count and (flexible) its tags.
    min_topic = (UUID_SIZE if version >= FETCH_TOPIC_ID_VERSION else 1) + (2 if flexible else 6)
    n_topics = r.count(flexible, min_topic, "responses")
    if n_topics < 0:
        raise RemoteProtocolError("Fetch response: responses is null, which it may not be")
    topics = []
    for _ in range(n_topics):
        topics.append(_topic(r, version, flexible))
    if flexible:
        r.skip_tags("response")
    if r.pos != r.end:
        raise RemoteProtocolError(f"Fetch response: {r.end - r.pos} trailing bytes in frame")
    return FetchResponseView(
        version, correlation_id, throttle_ms, error_code, session_id, tuple(topics)
    )


def _topic(r: _Reader, version: int, flexible: bool) -> FetchedTopic:
    name: str | None = None
    topic_id: uuid.UUID | None = None
    if version >= FETCH_TOPIC_ID_VERSION:
        topic_id = uuid.UUID(bytes=bytes(r.take(UUID_SIZE, "topic id")))
    else:
        name = r.string(flexible, "topic name")
    min_partition = _PARTITION_HEAD.size + (3 if flexible else 8)
    n = r.count(flexible, min_partition, "partitions")
    if n < 0:
        raise RemoteProtocolError("Fetch response: partitions is null, which it may not be")
    partitions = tuple(_partition(r, version, flexible) for _ in range(n))
    if flexible:
        r.skip_tags("topic")
    return FetchedTopic(name, topic_id, partitions)


def _partition(r: _Reader, version: int, flexible: bool) -> FetchedPartition:
    index, error_code, high_watermark, last_stable = r.fixed(_PARTITION_HEAD, "partition")
    log_start = r.i64("log start offset") if version >= LOG_START_OFFSET_VERSION else -1
    aborted = r.count(flexible, _ABORTED_TXN_SIZE + flexible, "aborted transactions")
    for _ in range(max(aborted, 0)):
        r.take(_ABORTED_TXN_SIZE, "aborted transaction")
        if flexible:
            r.skip_tags("aborted transaction")
    preferred = r.i32("preferred read replica") if version >= PREFERRED_READ_REPLICA_VERSION else -1
    records = r.nullable_bytes(flexible, "records")
    diverging = NO_DIVERGING_EPOCH
    if flexible:
        for _ in range(r.uvarint("partition tag count")):
            tag = r.uvarint("partition tag")
            field = _Reader(r.take(r.uvarint("partition tag size"), "partition tagged field"))
            if tag == DIVERGING_EPOCH_TAG:
                epoch, end_offset = field.fixed(_EPOCH_END_OFFSET, "diverging epoch")
                field.skip_tags("diverging epoch")
                diverging = EpochEndOffset(epoch, end_offset)
    return FetchedPartition(
        index,
        error_code,
        high_watermark,
        last_stable,
        log_start,
        diverging,
        aborted,
        preferred,
        records,
    )
