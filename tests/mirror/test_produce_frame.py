"""The mirror's hand-built Produce frame (replicad/mirror/produce_frame.py): byte for byte
kio's encoding of the same request, at every version replicad speaks, and its batches
handed on as the very buffers they came in."""

from __future__ import annotations

import datetime
import random

import pytest

from replicad.mirror.produce_frame import produce_frame
from replicad.protocol.apis import CLIENT_VERSIONS, ApiKey
from replicad.protocol.codec import encode_request, request_type
from replicad.protocol.requests import make_entity, nested_type
from replicad.types import TopicPartition

PRODUCE = CLIENT_VERSIONS[ApiKey.PRODUCE]


def kio_request(version: int, batches: dict[TopicPartition, bytes], timeout_ms: int) -> object:
    cls = request_type(ApiKey.PRODUCE, version)
    topic_cls = nested_type(cls, "TopicProduceData")
    part_cls = nested_type(cls, "PartitionProduceData")
    by_topic: dict[str, list[tuple[int, bytes]]] = {}
    for tp, batch in batches.items():
        by_topic.setdefault(tp.topic, []).append((tp.partition, batch))
    return make_entity(
        cls,
        transactional_id=None,
        acks=-1,
        timeout=datetime.timedelta(milliseconds=timeout_ms),
        topic_data=tuple(
            make_entity(
                topic_cls,
                name=topic,
                partition_data=tuple(make_entity(part_cls, index=p, records=r) for p, r in parts),
            )
            for topic, parts in by_topic.items()
        ),
    )


@pytest.mark.parametrize("version", range(PRODUCE.min, PRODUCE.max + 1))
@pytest.mark.parametrize("client_id", [None, "replicad-mirror"])
def test_the_frame_is_kios_encoding_byte_for_byte(version: int, client_id: str | None) -> None:
    rng = random.Random(version)
    # Topics interleaved (the second "orders" partition comes after "payments"), a batch
    # of two buffers, one of a single buffer, sizes across the one-byte varint boundary.
    parts = {
        TopicPartition("orders", 0): [rng.randbytes(61), memoryview(rng.randbytes(300))],
        TopicPartition("payments", 7): [rng.randbytes(61)],
        TopicPartition("orders", 2): [bytearray(rng.randbytes(61)), rng.randbytes(20_000)],
        TopicPartition("é" * 70, 1): [rng.randbytes(126)],
    }
    joined = {tp: b"".join(p) for tp, p in parts.items()}
    want = encode_request(
        kio_request(version, joined, 30_000), correlation_id=1234, client_id=client_id
    )
    frame = produce_frame(
        version=version,
        correlation_id=1234,
        client_id=client_id,
        acks=-1,
        timeout_ms=30_000,
        batches=parts,
    )
    assert b"".join(frame) == want


def test_the_batches_are_handed_on_not_copied() -> None:
    body = memoryview(bytes(100_000))
    head = bytearray(61)
    frame = produce_frame(
        version=PRODUCE.max,
        correlation_id=1,
        client_id="c",
        acks=-1,
        timeout_ms=1000,
        batches={TopicPartition("t", 0): [head, body]},
    )
    assert any(part is body for part in frame) and any(part is head for part in frame)
