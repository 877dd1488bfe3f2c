"""Kafka frames as the fault proxy sees them (sans-I/O): who asked what, where the
record batches of a Fetch response lie, and the rewrites and damage it applies.

Rules:
- A frame here is a body without its 4-byte size prefix. Framing is replicad's own
  (replicad/protocol/codec.py: heads, size prefixes, kio behind the frame guard), as the
  follower and `replicad serve` use it; nothing else of a request than its head is read.
- Bytes that are not the frame they should be are a `FrameError` (replicad's
  RemoteProtocolError: from the proxy's seat, the peer's bad bytes).
- Response bodies are decoded and re-encoded with kio only where the proxy must
  understand them: Metadata (to advertise the proxy instead of the broker) and Fetch
  (to find the record batches). Every other frame passes through as bytes.
- Damage to record batches stays inside the bytes their checksum covers (magic 2:
  attributes to the end, CRC32C; magic 0/1: magic to the end, CRC32), so a follower
  that checks checksums must catch every flipped byte. Fields outside the checksum
  (base offset, length, leader epoch) are Kafka's unprotected header: flipping those
  tests nothing a follower could detect, so the proxy never does it on purpose.
- Only whole batches are damaged: a trailing partial batch is dropped by the follower
  unchecked (KIP-74), so damaging it would count a fault no one can see.
"""

from __future__ import annotations

import dataclasses
import random
import struct
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from kio.static.primitive import i32

from replicad.errors import RemoteProtocolError
from replicad.protocol.apis import ApiKey
from replicad.protocol.codec import CORRELATION, decode_entities, encode_entities, response_type
from replicad.records.batch import (
    LEGACY_CRC_START,
    LENGTH_POSITION,
    LOG_OVERHEAD,
    MAGIC_POSITION,
    MAGIC_V2,
    V2_CRC_START,
)

_LENGTH = struct.Struct(">i")

Address = tuple[str, int]


# The bytes are not the Kafka frame the caller said they were.
FrameError = RemoteProtocolError


@dataclass(frozen=True, slots=True)
class BatchSpan:
    """One whole record batch inside a response body: body[start:end]."""

    start: int
    end: int
    magic: int

    @property
    def checked_start(self) -> int:
        """The first byte of the batch its checksum covers."""
        return self.start + (V2_CRC_START if self.magic >= MAGIC_V2 else LEGACY_CRC_START)


@dataclass(frozen=True, slots=True)
class MetadataRewrite:
    body: bytes
    brokers_rewritten: int


@dataclass(frozen=True, slots=True)
class Flip:
    """One byte of one batch XORed with a non-zero mask."""

    body: bytes
    position: int
    mask: int
    batch: BatchSpan


def decode_response(body: bytes, api_key: int, api_version: int) -> tuple[Any, Any]:
    """(header, body entity) of a response to the request of `api_key` v`api_version`."""
    return decode_entities(body, response_type(api_key, api_version))


def rewrite_metadata(
    body: bytes, api_version: int, addresses: Mapping[Address, Address]
) -> MetadataRewrite:
    """The Metadata response with every broker at a key of `addresses` moved to its value.

    This is how the proxy stays in the path: a client connects to the brokers that
    Metadata names, so the proxy names itself.
    """
    header, entity = decode_response(body, ApiKey.METADATA, api_version)
    rewritten = 0
    brokers = []
    for broker in entity.brokers:
        target = addresses.get((broker.host, int(broker.port)))
        if target is None:
            brokers.append(broker)
            continue
        brokers.append(dataclasses.replace(broker, host=target[0], port=i32(target[1])))
        rewritten += 1
    if not rewritten:
        return MetadataRewrite(body, 0)
    entity = dataclasses.replace(entity, brokers=tuple(brokers))
    return MetadataRewrite(encode_entities(header, entity), rewritten)


def fetch_batch_spans(body: bytes, api_version: int) -> tuple[BatchSpan, ...]:
    """The whole record batches of every partition of a Fetch response, in body order."""
    _, entity = decode_response(body, ApiKey.FETCH, api_version)
    spans: list[BatchSpan] = []
    cursor = 0
    for topic in entity.responses:
        for partition in topic.partitions:
            records = partition.records
            if not records:
                continue
            # kio hands out the records as a copy; the copy's bytes sit in the body
            # after everything decoded before them.
            start = body.find(records, cursor)
            if start < 0:
                raise FrameError("records of a partition not found in the response body")
            spans.extend(whole_batches(records, start))
            cursor = start + len(records)
    return tuple(spans)


def whole_batches(records: bytes, base: int = 0) -> list[BatchSpan]:
    """The whole entries of a records blob (a trailing partial one left out), at `base`."""
    spans: list[BatchSpan] = []
    pos = 0
    while len(records) - pos > MAGIC_POSITION:
        (length,) = _LENGTH.unpack_from(records, pos + LENGTH_POSITION)
        end = pos + LOG_OVERHEAD + length
        if length <= 0 or end > len(records):
            break
        spans.append(BatchSpan(base + pos, base + end, records[pos + MAGIC_POSITION]))
        pos = end
    return spans


def flip_in_batch(body: bytes, span: BatchSpan, rng: random.Random) -> Flip:
    """Flip bits of one byte that `span`'s checksum covers."""
    if span.checked_start >= span.end:
        raise FrameError(f"batch at {span.start} has no checksummed bytes")
    position = rng.randrange(span.checked_start, span.end)
    mask = rng.randrange(1, 256)
    damaged = bytearray(body)
    damaged[position] ^= mask
    return Flip(bytes(damaged), position, mask, span)


def flip_anywhere(body: bytes, rng: random.Random, *, keep: int = CORRELATION.size) -> Flip:
    """Flip one byte anywhere after the first `keep` bytes (the correlation id by default):
    hostile bytes, including fields no checksum covers."""
    if len(body) <= keep:
        raise FrameError(f"a body of {len(body)} bytes has nothing after its first {keep}")
    position = rng.randrange(keep, len(body))
    mask = rng.randrange(1, 256)
    damaged = bytearray(body)
    damaged[position] ^= mask
    return Flip(bytes(damaged), position, mask, BatchSpan(keep, len(body), -1))


@dataclass(frozen=True, slots=True)
class NewerErrorCode:
    """An error code kio does not know (a broker newer than us), in the one form kio's
    writer needs of an error code: its `.value`."""

    value: int


def with_partition_error(entity: Any, partition: int, code: Any) -> Any:
    """A ListOffsets, OffsetForLeaderEpoch or Metadata response entity whose `partition`
    of every topic carries error `code` instead of its own."""

    def number(p: Any) -> int:
        return int(p.partition_index if hasattr(p, "partition_index") else p.partition)

    topics = tuple(
        dataclasses.replace(
            topic,
            partitions=tuple(
                dataclasses.replace(p, error_code=code) if number(p) == partition else p
                for p in topic.partitions
            ),
        )
        for topic in entity.topics
    )
    return dataclasses.replace(entity, topics=topics)
