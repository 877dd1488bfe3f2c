"""Well-formed Kafka responses, built with kio for any version: the proxy's test input
and the seeds the fuzzers mutate; and `kio_message_types`, every message class kio has,
for the tests that run over the whole protocol.

Each builder fills the superset of fields replicad knows and drops what a version
lacks (`replicad.protocol.requests.make_entity`), so one call covers v4 to v17 of
Fetch and v4 to v12 of Metadata. The bodies carry no size prefix (see
`tools.chaos.frames.frame`).
"""

from __future__ import annotations

import dataclasses
import datetime
import struct
import uuid
from collections.abc import Sequence
from dataclasses import dataclass

from kio.index import load_request_schema, load_response_schema
from kio.schema.errors import ErrorCode
from kio.schema.index import api_key_map, schema_name_map
from kio.static.constants import EntityType

from replicad.protocol.apis import ApiKey
from replicad.protocol.codec import encode_entities, response_type
from replicad.protocol.requests import make_entity, nested_type
from tools.chaos.frames import decode_response

NO_TOPIC_ID = uuid.UUID(int=0)


def kio_message_types(*kinds: EntityType) -> list[type]:
    """Every class kio has of `kinds` (EntityType.request, EntityType.response): each API,
    each version, in API key, then version, then `kinds` order."""
    load = {EntityType.request: load_request_schema, EntityType.response: load_response_schema}
    return [
        load[kind](api_key, version)
        for api_key, name in sorted(api_key_map.items())
        for version, present in sorted(schema_name_map[name].items())
        for kind in kinds
        if kind in present
    ]


@dataclass(frozen=True, slots=True)
class PartitionAnswer:
    """One partition of a Fetch response."""

    topic: str
    partition: int
    records: bytes | None
    high_watermark: int = 0
    log_start_offset: int = 0
    error_code: int = 0
    topic_id: uuid.UUID = NO_TOPIC_ID


@dataclass(frozen=True, slots=True)
class BrokerEntry:
    node_id: int
    host: str
    port: int


def fetch_response_body(
    version: int,
    partitions: Sequence[PartitionAnswer],
    *,
    correlation_id: int = 1,
    session_id: int = 0,
    error_code: int = 0,
) -> bytes:
    """A Fetch response of `version`; partitions of one topic are grouped in order."""
    cls = response_type(ApiKey.FETCH, version)
    topic_cls = nested_type(cls, "FetchableTopicResponse")
    part_cls = nested_type(cls, "PartitionData")
    topics: list[tuple[PartitionAnswer, list[object]]] = []
    for answer in partitions:
        entry = make_entity(
            part_cls,
            partition_index=answer.partition,
            error_code=ErrorCode(answer.error_code),
            high_watermark=answer.high_watermark,
            last_stable_offset=answer.high_watermark,
            log_start_offset=answer.log_start_offset,
            aborted_transactions=(),
            records=answer.records,
        )
        if topics and topics[-1][0].topic == answer.topic:
            topics[-1][1].append(entry)
        else:
            topics.append((answer, [entry]))
    body = make_entity(
        cls,
        throttle_time=datetime.timedelta(0),
        error_code=ErrorCode(error_code),
        session_id=session_id,
        responses=tuple(
            make_entity(
                topic_cls, topic=first.topic, topic_id=first.topic_id, partitions=tuple(parts)
            )
            for first, parts in topics
        ),
    )
    return encode_entities(cls.__header_schema__(correlation_id=correlation_id), body)


def metadata_response_body(
    version: int,
    brokers: Sequence[BrokerEntry],
    topics: Sequence[tuple[str, int]] = (),
    *,
    correlation_id: int = 1,
    leader: int | None = None,
) -> bytes:
    """A Metadata response naming `brokers` and `topics` (name, partition count), every
    partition led by `leader` (default: the first broker)."""
    cls = response_type(ApiKey.METADATA, version)
    broker_cls = nested_type(cls, "MetadataResponseBroker")
    topic_cls = nested_type(cls, "MetadataResponseTopic")
    part_cls = nested_type(cls, "MetadataResponsePartition")
    leader_id = leader if leader is not None else (brokers[0].node_id if brokers else -1)
    body = make_entity(
        cls,
        throttle_time=datetime.timedelta(0),
        brokers=tuple(
            make_entity(broker_cls, node_id=b.node_id, host=b.host, port=b.port, rack=None)
            for b in brokers
        ),
        cluster_id="chaos",
        controller_id=leader_id,
        topics=tuple(
            make_entity(
                topic_cls,
                error_code=ErrorCode.none,
                name=name,
                topic_id=uuid.uuid5(uuid.NAMESPACE_URL, name),
                is_internal=False,
                partitions=tuple(
                    make_entity(
                        part_cls,
                        error_code=ErrorCode.none,
                        partition_index=p,
                        leader_id=leader_id,
                        leader_epoch=0,
                        replica_nodes=(leader_id,),
                        isr_nodes=(leader_id,),
                        offline_replicas=(),
                    )
                    for p in range(count)
                ),
            )
            for name, count in topics
        ),
    )
    return encode_entities(cls.__header_schema__(correlation_id=correlation_id), body)


# Fetch v12 made the response flexible (compact arrays, uvarint lengths).
FIRST_FLEXIBLE_FETCH = 12
FIRST_TOPIC_ID_FETCH = 13


def _uvarint(n: int) -> bytes:
    out = bytearray()
    while True:
        low, n = n & 0x7F, n >> 7
        out.append(low | (0x80 if n else 0))
        if not n:
            return bytes(out)


def fetch_response_claiming(
    version: int,
    aborted_transactions: int,
    *,
    correlation_id: int,
    topic: str = "t",
    topic_id: uuid.UUID = NO_TOPIC_ID,
) -> bytes:
    """A flexible Fetch response cut short after one partition whose aborted_transactions
    array claims `aborted_transactions` entries: a length no honest broker sends, and one
    a decoder must refuse by the bytes left rather than believe."""
    if version < FIRST_FLEXIBLE_FETCH:
        raise ValueError(f"Fetch v{version} has no compact arrays")
    name = (
        topic_id.bytes
        if version >= FIRST_TOPIC_ID_FETCH
        else _uvarint(len(topic.encode()) + 1) + topic.encode()
    )
    return (
        struct.pack(">i", correlation_id)
        + b"\x00"  # no header tags
        + struct.pack(">ihi", 0, 0, 0)  # throttle, error code, session id
        + _uvarint(2)  # one topic
        + name
        + _uvarint(2)  # one partition
        + struct.pack(">ihqqq", 0, 0, 0, 0, 0)  # index, error, hw, lso, log start
        + _uvarint(aborted_transactions + 1)
    )


# Metadata v9 made the response flexible; its brokers array follows the header (correlation
# id, tag section) and throttle_time_ms.
FIRST_FLEXIBLE_METADATA = 9
_METADATA_BROKERS_POSITION = 4 + 1 + 4
_COMPACT_NULL = b"\x00"
_COMPACT_EMPTY = b"\x01"


def metadata_with_null_brokers(body: bytes, version: int) -> bytes:
    """The Metadata response `body` with its brokers array sent as a compact *null* array
    (length 0), which the schema does not allow for that field."""
    if version < FIRST_FLEXIBLE_METADATA:
        raise ValueError(f"Metadata v{version} has no compact arrays")
    header, entity = decode_response(body, ApiKey.METADATA, version)
    emptied = encode_entities(header, dataclasses.replace(entity, brokers=()))
    position = _METADATA_BROKERS_POSITION
    if emptied[position : position + 1] != _COMPACT_EMPTY:
        raise ValueError("unexpected Metadata layout")
    return emptied[:position] + _COMPACT_NULL + emptied[position + 1 :]
