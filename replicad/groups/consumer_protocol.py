"""The "consumer" embedded protocol: what Kafka's consumers put in a JoinGroup's protocol
metadata (their subscription) and in a SyncGroup's assignment.

Rules (Kafka's ConsumerProtocol, as the group coordinator reads it):
- Both start with an int16 version; every later version of the schema extends version 0,
  so reading version 0's fields from any version gives the topics (subscription) or the
  assigned partitions (assignment), whatever follows them. A coordinator must not depend
  on the consumer's version.
- Bytes that do not read as version 0 are not the consumer protocol: None, never an error
  (the coordinator then does not know the subscription, as Kafka's does not). They are a
  client's bytes: every length in them is checked before kio reads them.
- Pure: bytes in, names out.
"""

from __future__ import annotations

import struct
from functools import cache
from typing import Any

from kio.schema.consumer_protocol_assignment.v0 import ConsumerProtocolAssignment
from kio.schema.consumer_protocol_subscription.v0 import ConsumerProtocolSubscription
from kio.serial import entity_reader

from replicad.protocol.frame_guard import check_message
from replicad.types import TopicPartition

PROTOCOL_TYPE = "consumer"
_VERSION = struct.Struct(">h")


@cache
def _reader(cls: type) -> Any:
    return entity_reader(cls)


def subscribed_topics(metadata: bytes) -> frozenset[str] | None:
    """The topics a consumer's JoinGroup metadata subscribes to; None if unreadable."""
    body = _read(metadata, ConsumerProtocolSubscription)
    return None if body is None else frozenset(body.topics)


def assigned_partitions(assignment: bytes) -> tuple[TopicPartition, ...] | None:
    """The partitions a SyncGroup assignment gives a consumer; None if unreadable (an empty
    assignment, as a member gets before its first sync, is no partitions)."""
    if not assignment:
        return ()
    body = _read(assignment, ConsumerProtocolAssignment)
    if body is None:
        return None
    return tuple(
        TopicPartition(t.topic, int(p)) for t in body.assigned_partitions for p in t.partitions
    )


def _read(data: bytes, cls: type) -> Any:
    if len(data) < _VERSION.size:
        return None
    (version,) = _VERSION.unpack_from(data, 0)
    if version < 0:
        return None
    # These bytes come from clients: kio's native reader must never see a length it would
    # abort the process over (see replicad/protocol/frame_guard.py).
    if check_message(data, cls, offset=_VERSION.size).implausible is not None:
        return None
    try:
        body, _size = _reader(cls)(data, _VERSION.size)
    except Exception:  # kio raises several types on bytes that are not this schema
        return None
    return body
