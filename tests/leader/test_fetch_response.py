"""Fetch answers as frames: kio's encoding with the on-disk records spliced in (v4+), the
hand-written layout with lazily down-converted records (v0-v3), read back by kio and by
kafka-python's decoders."""

from __future__ import annotations

import dataclasses
import datetime
import random
import sys
import uuid

import pytest
from kafka.protocol.old.fetch import (
    FetchResponse_v0,
    FetchResponse_v1,
    FetchResponse_v2,
    FetchResponse_v3,
)
from kafka.record import MemoryRecords
from kio.schema.errors import ErrorCode

from replicad.errors import LocalProtocolError
from replicad.leader.catalog import Catalog
from replicad.leader.fetch import FetchHandling, FetchOutcome, Role, legacy_fetch_request
from replicad.leader.fetch_response import _partition_layout, fetch_response_frame
from replicad.leader.frames import ResponseFrame
from replicad.leader.handlers import SUPPORTED_VERSIONS
from replicad.leader.legacy_codec import (
    LEGACY_FETCH_VERSIONS,
    LegacyFetchPartition,
    LegacyFetchRequest,
    LegacyFetchTopic,
)
from replicad.leader.reads import (
    DivergingEpoch,
    Isolation,
    PartitionAnswer,
    ReadLimits,
    TransactionTracker,
    read_partitions,
)
from replicad.leader.settings import ServeSettings
from replicad.leader.transactions import AbortedTransaction
from replicad.log.segment import FileRegion
from replicad.protocol.apis import ApiKey
from replicad.protocol.codec import decode_response, encode_response, response_type
from replicad.protocol.requests import make_entity
from replicad.records.batch import Compression
from replicad.records.downconvert import LazyDownConversion
from replicad.session.cache import FetchSessionCache
from replicad.session.metadata import PartitionFetch
from replicad.types import TopicPartition
from tools.logdata.batches import producer_batch

# The versions written with kio's writers: every one serve answers above the legacy ones.
KIO_VERSIONS = range(LEGACY_FETCH_VERSIONS.stop, SUPPORTED_VERSIONS[ApiKey.FETCH].max + 1)

T0, T1, U0 = TopicPartition("t", 0), TopicPartition("t", 1), TopicPartition("u", 0)
TOPIC_IDS = {"t": uuid.UUID(int=0x7), "u": uuid.UUID(int=0x8)}
OLD_RESPONSES = {0: FetchResponse_v0, 1: FetchResponse_v1, 2: FetchResponse_v2, 3: FetchResponse_v3}


def materialize(frame: ResponseFrame) -> bytes:
    """The bytes a client receives (size prefix removed)."""
    out = bytearray()
    for part in frame.parts:
        if isinstance(part, bytes):
            out += part
        elif isinstance(part, FileRegion):
            out += part.read_bytes()
        else:
            assert isinstance(part, LazyDownConversion)
            out += b"".join(part.chunks())
    assert len(out) == frame.size
    return bytes(out)


@pytest.fixture
def answers(logs, fill) -> list[PartitionAnswer]:
    fill(
        logs, T0, [producer_batch(i, [bytes([i]) * 300]) for i in range(3)], topic_id=TOPIC_IDS["t"]
    )
    fill(logs, T1, [producer_batch(0, [b"x" * 50])], topic_id=TOPIC_IDS["t"])
    fill(
        logs, U0, [producer_batch(0, [b"u" * 50], codec=Compression.GZIP)], topic_id=TOPIC_IDS["u"]
    )
    catalog = Catalog(logs, rng=random.Random(0))
    reads = [(tp, PartitionFetch(0, -1, 1 << 20)) for tp in (T0, U0, T1)]
    return read_partitions(
        catalog,
        reads,
        ReadLimits(1 << 20, Isolation.HIGH_WATERMARK, False),
        TransactionTracker(),
        now_ms=0,
    )


def outcome_of(answers: list[PartitionAnswer], role: Role = Role.CONSUMER) -> FetchOutcome:
    ids = {a.partition: TOPIC_IDS.get(a.partition.topic) for a in answers}
    return FetchOutcome(ErrorCode.none, 1234, tuple(answers), role, ids)


def unread_answers(
    answers: list[PartitionAnswer], aborted: tuple[AbortedTransaction, ...]
) -> list[PartitionAnswer]:
    """The answers with no records read that both frame tests add after the three read: an
    unknown partition (t-9), a diverging epoch (t-2) and aborted transactions (t-3)."""
    return [
        PartitionAnswer(TopicPartition("t", 9), 0, error_code=ErrorCode.unknown_topic_or_partition),
        dataclasses.replace(
            answers[2],
            partition=TopicPartition("t", 2),
            records=None,
            diverging=DivergingEpoch(3, 17),
        ),
        dataclasses.replace(
            answers[2],
            partition=TopicPartition("t", 3),
            records=None,
            aborted=aborted,
        ),
    ]


@pytest.mark.parametrize("version", KIO_VERSIONS)
def test_kio_reads_back_every_version_with_the_records_from_disk(answers, version) -> None:
    extra = unread_answers(answers, (AbortedTransaction(5, 44, 9),))
    frame = fetch_response_frame(
        outcome_of(answers + extra), version=version, correlation_id=77, settings=ServeSettings()
    )
    # The records are not copied into the frame: they go out by sendfile.
    assert sum(isinstance(p, FileRegion) for p in frame.parts) == 3
    decoded = decode_response(materialize(frame), response_type(ApiKey.FETCH, version))
    assert decoded.correlation_id == 77
    body = decoded.body
    if version >= 7:
        assert body.session_id == 1234
    runs = [
        (t.topic_id if version >= 13 else t.topic, [p.partition_index for p in t.partitions])
        for t in body.responses
    ]
    name = (lambda n: TOPIC_IDS[n]) if version >= 13 else (lambda n: n)
    assert runs == [(name("t"), [0]), (name("u"), [0]), (name("t"), [1, 9, 2, 3])]
    flat = [p for t in body.responses for p in t.partitions]
    for answer, got in zip(answers, flat[:3], strict=True):
        assert got.records == answer.records.read_bytes()
        assert got.high_watermark == answer.high_watermark
    missing = flat[3]
    assert (missing.error_code, missing.high_watermark, missing.records) == (
        ErrorCode.unknown_topic_or_partition,
        -1,
        b"",
    )
    if version >= 12:
        assert (flat[4].diverging_epoch.epoch, flat[4].diverging_epoch.end_offset) == (3, 17)
    if version >= 4:
        assert [(t.producer_id, t.first_offset) for t in flat[5].aborted_transactions] == [(44, 5)]


def kio_encoding(outcome: FetchOutcome, version: int, correlation_id: int) -> bytes:
    """The same answer as kio entities, encoded by kio (records read from disk): the
    reference fetch_response_frame writes without making the entities."""
    cls = response_type(ApiKey.FETCH, version)
    module = sys.modules[cls.__module__]
    by_id = version >= 13
    topics = []
    for a in outcome.answers:
        aborted = (
            None
            if a.aborted is None
            else tuple(
                make_entity(
                    module.AbortedTransaction,
                    producer_id=t.producer_id,
                    first_offset=t.first_offset,
                )
                for t in a.aborted
            )
        )
        values = dict(
            partition_index=a.partition.partition,
            error_code=ErrorCode(a.error_code),
            high_watermark=a.high_watermark,
            last_stable_offset=a.last_stable_offset,
            log_start_offset=a.log_start_offset,
            aborted_transactions=aborted,
            preferred_read_replica=-1,
            records=a.records.read_bytes() if a.records is not None else b"",
        )
        if a.diverging is not None and hasattr(module, "EpochEndOffset"):
            values["diverging_epoch"] = make_entity(
                module.EpochEndOffset, epoch=a.diverging.epoch, end_offset=a.diverging.end_offset
            )
        partition = make_entity(module.PartitionData, **values)
        if topics and topics[-1][0] == a.partition.topic:
            topics[-1][1].append(partition)
        else:
            topics.append((a.partition.topic, [partition]))
    body = make_entity(
        cls,
        throttle_time=datetime.timedelta(0),
        error_code=ErrorCode(outcome.error_code),
        session_id=outcome.session_id,
        responses=tuple(
            make_entity(
                module.FetchableTopicResponse,
                topic=None if by_id else name,
                topic_id=outcome.topic_ids[partitions_of[0]] if by_id else None,
                partitions=tuple(parts),
            )
            for (name, parts), partitions_of in zip(topics, _topic_partitions(outcome), strict=True)
        ),
        node_endpoints=(),
    )
    return encode_response(body, correlation_id)


def _topic_partitions(outcome: FetchOutcome) -> list[list[TopicPartition]]:
    runs: list[list[TopicPartition]] = []
    for a in outcome.answers:
        if runs and runs[-1][0].topic == a.partition.topic:
            runs[-1].append(a.partition)
        else:
            runs.append([a.partition])
    return runs


@pytest.mark.parametrize("version", KIO_VERSIONS)
def test_the_frame_is_kios_encoding_byte_for_byte(answers, version) -> None:
    """Written with kio's writers, the answer is what kio's entities encode, for every
    version serve answers: errors, a diverging epoch (v12+: a tagged field), aborted
    transactions (none, an empty list and a list), no records, and topics that come back."""
    extra = [
        *unread_answers(answers, (AbortedTransaction(5, 44, 9), AbortedTransaction(8, 2, 1))),
        dataclasses.replace(answers[0], partition=TopicPartition("t", 4), aborted=()),
        # A diverging epoch with kio's default values is no tagged field, as kio rules.
        dataclasses.replace(
            answers[2],
            partition=TopicPartition("t", 5),
            records=None,
            diverging=DivergingEpoch(-1, -1),
        ),
        dataclasses.replace(answers[1], partition=TopicPartition("u", 7)),
    ]
    outcome = dataclasses.replace(
        outcome_of(answers + extra), error_code=ErrorCode.fetch_session_id_not_found
    )
    frame = fetch_response_frame(
        outcome, version=version, correlation_id=-5, settings=ServeSettings()
    )
    assert materialize(frame) == kio_encoding(outcome, version, -5)
    assert frame.parts[1:] and not any(isinstance(p, bytes) and not p for p in frame.parts)


def test_partition_fields_in_a_layout_not_written_here_are_refused() -> None:
    """A Fetch version serve would answer with partition fields the writer does not know
    is refused when its writer is made, never written wrong."""
    v12 = (
        "partition_index",
        "error_code",
        "high_watermark",
        "last_stable_offset",
        "log_start_offset",
        "aborted_transactions",
        "preferred_read_replica",
        "records",
    )
    assert _partition_layout(v12) == (v12[:5], v12[5:])
    for fields in [(*v12, "new_field"), (v12[0], "new_field", *v12[1:]), v12[1:]]:
        with pytest.raises(LocalProtocolError, match="not a layout written here"):
            _partition_layout(fields)


def test_records_longer_than_a_one_byte_varint_get_a_longer_length_prefix(logs, fill) -> None:
    fill(logs, T0, [producer_batch(0, [bytes(70_000)])], topic_id=TOPIC_IDS["t"])
    catalog = Catalog(logs, rng=random.Random(0))
    answers = read_partitions(
        catalog,
        [(T0, PartitionFetch(0, -1, 1 << 20))],
        ReadLimits(1 << 20, Isolation.HIGH_WATERMARK, False),
        TransactionTracker(),
        now_ms=0,
    )
    for version in (11, 12, 17):
        frame = fetch_response_frame(
            outcome_of(answers), version=version, correlation_id=1, settings=ServeSettings()
        )
        body = decode_response(materialize(frame), response_type(ApiKey.FETCH, version)).body
        assert body.responses[0].partitions[0].records == answers[0].records.read_bytes()


def legacy_fetch(logs, version: int, *, topic: str = "t", max_bytes: int = 1 << 20) -> FetchOutcome:
    request = LegacyFetchRequest(
        version,
        -1,
        0,
        1,
        2**31 - 1,
        (LegacyFetchTopic(topic, (LegacyFetchPartition(0, 0, max_bytes),)),),
    )
    handling = FetchHandling(
        version,
        legacy_fetch_request(request),
        cache=FetchSessionCache(rng=random.Random(0)),
        catalog=Catalog(logs, rng=random.Random(0)),
        transactions=TransactionTracker(),
        settings=ServeSettings(),
        allowed_followers=frozenset(),
        now_ms=0,
    )
    return handling.finish(handling.read(now_ms=0), now_ms=0)


@pytest.mark.parametrize(("version", "magic"), [(0, 0), (1, 0), (2, 1), (3, 1)])
def test_old_versions_get_down_converted_records_kafka_python_reads(
    logs, fill, version, magic
) -> None:
    values = [f"value-{i}".encode() * 20 for i in range(6)]
    fill(
        logs,
        T0,
        [
            producer_batch(0, values[:3], codec=Compression.SNAPPY, keys=[b"k0", b"k1", b"k2"]),
            # headers are dropped: the conversion is smaller and every record fits
            producer_batch(3, values[3:], headers=[("dropped", b"x" * 200)]),
        ],
    )
    frame = fetch_response_frame(
        legacy_fetch(logs, version), version=version, correlation_id=5, settings=ServeSettings()
    )
    assert any(isinstance(p, LazyDownConversion) for p in frame.parts)
    raw = materialize(frame)
    assert int.from_bytes(raw[:4], "big") == 5
    response = OLD_RESPONSES[version].decode(raw[4:]).to_object()
    [partition] = response["responses"][0]["partitions"]
    assert (partition["error_code"], partition["high_watermark"]) == (0, 6)
    records = MemoryRecords(partition["records"])
    got = []
    while (batch := records.next_batch()) is not None:
        assert batch.magic == magic
        got += [(r.offset, r.value) for r in batch]
    assert got == list(enumerate(values))


def test_down_conversion_disabled_for_a_topic_refuses_consumers_but_not_followers(
    logs, fill
) -> None:
    fill(logs, T0, [producer_batch(0, [b"a"])])
    fill(logs, U0, [])
    settings = ServeSettings(topic_downconversion_enable={"t": False, "u": False})
    outcome = legacy_fetch(logs, 2)
    frame = fetch_response_frame(outcome, version=2, correlation_id=1, settings=settings)
    [partition] = FetchResponse_v2.decode(materialize(frame)[4:]).to_object()["responses"][0][
        "partitions"
    ]
    assert (partition["error_code"], partition["high_watermark"], partition["records"]) == (
        ErrorCode.unsupported_version,
        -1,
        b"",
    )
    empty = legacy_fetch(logs, 2, topic="u")  # refused with no data to convert, as Kafka does
    frame = fetch_response_frame(empty, version=2, correlation_id=1, settings=settings)
    [partition] = FetchResponse_v2.decode(materialize(frame)[4:]).to_object()["responses"][0][
        "partitions"
    ]
    assert partition["error_code"] == ErrorCode.unsupported_version
    follower = dataclasses.replace(outcome, role=Role.FOLLOWER)
    frame = fetch_response_frame(follower, version=2, correlation_id=1, settings=settings)
    [partition] = FetchResponse_v2.decode(materialize(frame)[4:]).to_object()["responses"][0][
        "partitions"
    ]
    assert partition["error_code"] == 0 and partition["records"]
    enabled = fetch_response_frame(
        outcome,
        version=2,
        correlation_id=1,
        settings=ServeSettings(
            downconversion_enable=False, topic_downconversion_enable={"t": True}
        ),
    )
    [partition] = FetchResponse_v2.decode(materialize(enabled)[4:]).to_object()["responses"][0][
        "partitions"
    ]
    assert partition["error_code"] == 0


def test_a_zstd_batch_first_is_unsupported_compression_type_for_old_clients(logs, fill) -> None:
    fill(logs, T0, [producer_batch(0, [b"z" * 500], codec=Compression.ZSTD)])
    frame = fetch_response_frame(
        legacy_fetch(logs, 3), version=3, correlation_id=1, settings=ServeSettings()
    )
    [partition] = FetchResponse_v3.decode(materialize(frame)[4:]).to_object()["responses"][0][
        "partitions"
    ]
    assert partition["error_code"] == ErrorCode.unsupported_compression_type
