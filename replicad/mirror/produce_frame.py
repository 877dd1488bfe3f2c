"""The mirror's Produce request as the buffers of one frame, its batches never copied.

Why: kio encodes a request into a BytesIO and the codec copies the result twice more; for
the mirror that is three copies of every byte mirrored, on top of the restamp's. Here the
small fields are packed into bytes between the batches, and each batch goes out as the
buffers it already is (restamp.py's new header and the body read from the local log), so
the connection writes them one after the other (`BrokerConnection.send_frame`).

Rules:
- Produce v3-v12 (apis.CLIENT_VERSIONS): the request header v1 (v3-v8) or v2 with its
  empty tagged fields (v9-v12, flexible: compact strings, arrays and bytes, an empty tag
  buffer after each struct); the body's fields in kio's order for the version. kio's
  entity encoding of the same request is the reference the tests hold this to, byte for
  byte, for every version.
- Topics in the order first met, each with its partitions in the order given (one batch
  per partition: the caller packs one batch per partition per request, Kafka's rule).
- No transactional id (the mirror's producer is idempotent, not transactional).
"""

from __future__ import annotations

import struct
from collections.abc import Mapping, Sequence

from replicad.protocol.apis import ApiKey
from replicad.protocol.connection import Buffer
from replicad.records.varint import uvarint
from replicad.types import TopicPartition

FIRST_FLEXIBLE_VERSION = 9
_SIZE = struct.Struct(">i")
_HEAD = struct.Struct(">hhi")
_I16 = struct.Struct(">h")
_I32 = struct.Struct(">i")
_ACKS_TIMEOUT = struct.Struct(">hi")
# Header v1/v2 with a null client id (int16 -1), body v3-v8 with a null transactional id.
_NULL_STRING = _I16.pack(-1)
# Flexible versions: a compact nullable string (uvarint 0: null), an empty tag buffer.
_COMPACT_NULL = b"\x00"
_NO_TAGS = b"\x00"


def produce_frame(
    *,
    version: int,
    correlation_id: int,
    client_id: str | None,
    acks: int,
    timeout_ms: int,
    batches: Mapping[TopicPartition, Sequence[Buffer]],
) -> list[Buffer]:
    """The whole request frame (size prefix first) producing, to each partition, the one
    batch made of its buffers in order (see the module rules)."""
    flexible = version >= FIRST_FLEXIBLE_VERSION
    head = bytearray(_HEAD.pack(ApiKey.PRODUCE, version, correlation_id))
    head += _string(client_id)  # the header's client id is a legacy string in every version
    if flexible:
        head += _NO_TAGS
        head += _COMPACT_NULL  # transactional id
    else:
        head += _NULL_STRING
    head += _ACKS_TIMEOUT.pack(acks, timeout_ms)
    by_topic: dict[str, list[tuple[int, Sequence[Buffer]]]] = {}
    for tp, parts in batches.items():
        by_topic.setdefault(tp.topic, []).append((tp.partition, parts))
    out: list[Buffer] = []
    pending = head  # small fields gathered until the next batch's buffers
    pending += _count(len(by_topic), flexible)
    for topic, partitions in by_topic.items():
        pending += _compact_string(topic) if flexible else _string(topic)
        pending += _count(len(partitions), flexible)
        for index, parts in partitions:
            size = sum(len(p) for p in parts)
            pending += _I32.pack(index)
            pending += uvarint(size + 1) if flexible else _I32.pack(size)
            out.append(pending)
            out.extend(parts)
            pending = bytearray()
            if flexible:
                pending += _NO_TAGS  # the partition's
        if flexible:
            pending += _NO_TAGS  # the topic's
    if flexible:
        pending += _NO_TAGS  # the request's
    out.append(pending)
    total = sum(len(p) for p in out)
    out[0] = _SIZE.pack(total) + out[0]
    return [p for p in out if len(p)]


def _count(n: int, flexible: bool) -> bytes:
    return uvarint(n + 1) if flexible else _I32.pack(n)


def _string(text: str | None) -> bytes:
    if text is None:
        return _NULL_STRING
    data = text.encode()
    return _I16.pack(len(data)) + data


def _compact_string(text: str) -> bytes:
    data = text.encode()
    return uvarint(len(data) + 1) + data
